#include "proxy/verbs/verbs_link.h"

#include <cstring>

#include "railnet/error.h"

namespace railnet::verbs {

VerbsLink::VerbsLink(std::shared_ptr<VerbsDevice> device, tcp::Fd control, const tcp::SocketAddress& peer,
                     const char* direction, const QpOptions& options)
    : device_(device), control_(std::move(control), {}, peer, direction), qps_(std::move(device), options, this),
      counters_(&nicCounters(device_->port().info.name, device_->port().info.railId)) {
  control_.start(nullptr);
  QpInfo info = qps_.localInfo();
  control_.sendControl(&info, sizeof(info));
}

bool VerbsLink::ready() {
  if (ready_ || control_.failed()) return ready_;
  if (!control_.flushControl()) return false;
  if (control_.controlSize() < sizeof(QpInfo)) {
    ssize_t got = control_.readControl();
    if (got == tcp::kEndOfStream) {
      control_.recordFailure("the peer closed the connection during the QP handshake");
      return false;
    }
    if (got < 0) {
      control_.recordFailure("control connection: " + errnoText(static_cast<int>(-got)));
      return false;
    }
    if (control_.controlSize() < sizeof(QpInfo)) return false;
  }
  QpInfo remote;
  memcpy(&remote, control_.controlData(), sizeof(remote));
  control_.consumeControl(sizeof(remote));
  try {
    qps_.connect(remote);
  } catch (const Error& error) {
    control_.recordFailure(error.what());
    return false;
  }
  counters_->addConnection(device_->port().info.railId, qps_.remoteRail());
  ready_ = true;
  return true;
}

void VerbsLink::onQpAsyncError(const std::string& what) noexcept {
  try {
    control_.recordFailure(what);
  } catch (...) {  // bad_alloc copying the text: the WARN the device logged still names it
  }
}

std::string VerbsLink::describe(const ibv_wc& completion) const {
  return "QP " + std::to_string(completion.qp_num) + " on " + device_->port().device + ": work completion " +
         device_->api().wcStatusStr(completion.status) + " (status " + std::to_string(completion.status) +
         ", vendor error 0x" + [&] {
           char hex[16];
           snprintf(hex, sizeof(hex), "%x", completion.vendor_err);
           return std::string(hex);
         }() + ")";
}

}  // namespace railnet::verbs
