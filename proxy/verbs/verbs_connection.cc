#include "proxy/verbs/verbs_connection.h"

#include <algorithm>
#include <cstring>

#include "railnet/error.h"

namespace railnet::verbs {

VerbsConnection::VerbsConnection(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
                     const protocol::SocketAddress& peer, const char* direction, const QpOptions& options,
                     int standbyNic)
    : nics_(std::move(nics)),
      control_(std::move(control), peer, direction),
      options_(options),
      peerNics_(peerNics),
      sender_(strcmp(direction, "send") == 0) {
  if (nics_.empty() || nics_.size() > kMaxNics || standbyNic >= static_cast<int>(nics_.size())) {
    fail(ncclInternalError, "NET/railnet: a verbs connection over %zu NICs", nics_.size());
  }
  if (peerNics < 1 || peerNics > kMaxNics) {
    fail(ncclSystemError, "NET/railnet: %s announces a device of %d NICs; railnet fuses 1 to %d",
         control_.peerName().c_str(), peerNics, kMaxNics);
  }
  for (const std::shared_ptr<VerbsDevice>& nic : nics_) {
    seenPortDowns_.push_back(nic->portDowns());
    seenPortUps_.push_back(nic->portUps());
  }
  // A standby NIC after the device's own is not one of the device's NICs: it carries only the standby path.
  const int deviceNics = static_cast<int>(nics_.size()) - (standbyNic > 0 ? 1 : 0);
  const int pathCount = std::max(deviceNics, peerNics);
  paths_.resize(static_cast<size_t>(pathCount + (standbyNic >= 0 ? 1 : 0)));
  livePaths_ = pathCount;
  for (size_t p = 0; p < paths_.size(); ++p) {
    Path& path = paths_[p];
    path.nic = static_cast<int>(p) < pathCount ? static_cast<int>(p) % deviceNics : standbyNic;
    const VerbsPort& port = nics_[static_cast<size_t>(path.nic)]->port();
    // The standby has no QPs while it rests: they are made with it (replaceQps).
    if (static_cast<int>(p) < pathCount) {
      path.qps = std::make_unique<QueuePairs>(nics_[static_cast<size_t>(path.nic)], options, this);
    }
    path.counters = &nicCounters(port.info.name, port.info.railId);
  }
  if (standbyNic >= 0) {
    standbyPath_ = pathCount;
    Path& standby = paths_.back();
    standby.standby = true;
    standby.resting = true;
    standby.state = PathState::kDown;
    restingPaths_ = 1;
  }
  for (int p = 0; p < pathCount; ++p) {
    QpInfo info = paths_[static_cast<size_t>(p)].qps->localInfo();
    info.path = static_cast<uint8_t>(p);
    info.paths = static_cast<uint8_t>(paths_.size());
    control_.send(&info, sizeof(info));
  }
}

bool VerbsConnection::ready() {
  if (ready_ || control_.failed()) return ready_;
  if (!control_.flush()) return false;
  // No record for the standby path: it is made when it is needed (kPathRenew).
  const size_t records = paths_.size() - (standbyPath_ >= 0 ? 1 : 0);
  const size_t recordBytes = sizeof(QpInfo) * records;
  if (control_.size() < recordBytes) {
    ssize_t got = control_.read();
    if (got == protocol::kEndOfStream) {
      control_.recordFailure("the peer closed the connection during the QP handshake");
      return false;
    }
    if (got < 0) {
      control_.recordSocketFailure("control connection", got);
      return false;
    }
    // The first record tells whether the peer planned the same paths; checked before waiting for the rest,
    // so a disagreement fails at once instead of waiting for records that never come.
    if (control_.size() >= sizeof(QpInfo)) {
      QpInfo first;
      memcpy(&first, control_.data(), sizeof(first));
      if (first.magic == kQpInfoMagic && first.version == kQpInfoVersion && first.paths != paths_.size()) {
        control_.recordFailure("the peer planned " + std::to_string(first.paths) + " QP path(s), this end " +
                               std::to_string(paths_.size()) + " (NIC counts disagree)");
        return false;
      }
    }
    if (control_.size() < recordBytes) return false;
  }
  std::vector<QpInfo> remote(records);
  memcpy(remote.data(), control_.data(), recordBytes);
  control_.consume(recordBytes);
  try {
    for (size_t p = 0; p < records; ++p) {
      if (remote[p].magic == kQpInfoMagic && (remote[p].path != p || remote[p].paths != paths_.size())) {
        fail(ncclSystemError, "NET/railnet: QP record %zu of %s names path %u of %u", p, control_.peerName().c_str(),
             remote[p].path, remote[p].paths);
      }
      paths_[p].qps->connect(remote[p]);
    }
  } catch (const Error& error) {
    control_.recordFailure(error.what());
    return false;
  }
  // Numbering starts here at both ends: after the QP records, before any other frame (D94).
  if (resumePlan_ && failover()) {
    try {
      control_.enableResume(*resumePlan_);
    } catch (const Error& error) {
      control_.recordFailure(error.what(), protocol::FailureKind::kLocal);
      return false;
    }
  }
  for (Path& path : paths_) {
    if (path.standby) continue;  // counted when it is made (addMoved)
    path.counters->addConnection(nics_[static_cast<size_t>(path.nic)]->port().info.railId, path.qps->remoteRail());
  }
  ready_ = true;
  return true;
}

std::unique_ptr<LinkRegion> VerbsConnection::registerMemory(void* data, size_t size, int type) {
  std::vector<std::unique_ptr<MemoryRegion>> perNic;
  for (const std::shared_ptr<VerbsDevice>& nic : nics_) perNic.push_back(nic->registerMemory(data, size, type));
  return std::make_unique<LinkRegion>(std::move(perNic));
}

std::unique_ptr<LinkRegion> VerbsConnection::registerDmabuf(void* data, size_t size, int type, uint64_t offset, int fd) {
  std::vector<std::unique_ptr<MemoryRegion>> perNic;
  for (const std::shared_ptr<VerbsDevice>& nic : nics_) {
    perNic.push_back(nic->registerDmabuf(data, size, type, offset, fd));
  }
  return std::make_unique<LinkRegion>(std::move(perNic));
}

void VerbsConnection::onQpAsyncError(const std::string& what) noexcept {
  // With failover the QP's work requests complete in error (flushed), which takes its path out; the device's
  // thread has logged the event.
  if (failover()) return;
  try {
    control_.recordFailure(what);
  } catch (...) {  // bad_alloc copying the text: the WARN the device logged still names it
  }
}

std::string VerbsConnection::describe(int path, const ibv_wc& completion) const {
  const VerbsDevice& device = *nics_[static_cast<size_t>(paths_[static_cast<size_t>(path)].nic)];
  return "QP " + std::to_string(completion.qp_num) + " on " + device.port().device + ": work completion " +
         device.api().wcStatusStr(completion.status) + " (status " + std::to_string(completion.status) +
         ", vendor error 0x" + [&] {
           char hex[16];
           snprintf(hex, sizeof(hex), "%x", completion.vendor_err);
           return std::string(hex);
         }() + ")";
}

}  // namespace railnet::verbs
