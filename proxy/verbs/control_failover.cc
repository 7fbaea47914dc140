// The verbs control socket's failover (docs/failover.md "Verbs", D94): with path failover on, the control channel
// is resumable (protocol/control_channel.h), and the sender moves it off a failed or silent NIC. Across hosts the
// socket runs through NIC 0's address, so without this NIC 0's failure would strand the path frames that fail the
// path over, and the connection would fail.
#include <algorithm>

#include "proxy/verbs/verbs_connection.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::verbs {

void VerbsConnection::moveControlOff(int path) {
  if (!sender_ || !control_.resumable() || control_.failed() || livePaths_ == 0) return;
  // No local addresses to choose from (InfiniBand meeting on RAILNET_IFNAME's interface): the socket does not ride
  // the rails, and the kernel picks its route.
  if (!resumePlan_ || resumePlan_->locals.empty()) return;
  const int nic = nicOf(path);
  control_.avoidNic(nic);
  if (control_.broken()) return;  // being re-made already; the plan read the avoided NIC
  const protocol::ControlChannel::Route route = control_.route();
  if (!control_.leavesFrom(nic) && route.target != peerNicOf(path)) return;
  // Nothing more leaves through the old socket; the session service re-makes it.
  control_.cut(textf("path %d (%s) failed and the control connection ran through it", path, nicName(path).c_str()));
}

void VerbsConnection::watchControl(uint64_t workStarted, bool waiting) {
  if (!sender_ || !control_.resumable() || control_.failed()) return;
  const auto now = std::chrono::steady_clock::now();
  if (now < nextControlLook_) return;
  const std::chrono::milliseconds limit = controlSilenceLimit_;
  nextControlLook_ = now + std::max(limit / 8, std::chrono::milliseconds(10));
  if (control_.broken()) {
    controlSilence_.reset();
    return;
  }
  // Busy: work started since the last look, or some still out. An idle connection sends nothing (TCP keepalive
  // watches it).
  const bool busy = waiting || workStarted != workAtLastLook_;
  workAtLastLook_ = workStarted;
  if (busy) control_.keepAlive(now, std::max(limit / 4, std::chrono::milliseconds(25)));
  protocol::AckState state;
  if (!protocol::readAckState(control_.fd(), &state)) return;
  const auto silence = controlSilence_.look(state, now);
  // Every path out too: the peer's host, not a path, is the likelier loss; the re-made socket's limit judges it.
  if (silence < limit || livePaths_ == 0) return;
  controlSilence_.reset();
  const protocol::ControlChannel::Route route = control_.route();
  if (route.local >= 0) control_.avoidNic(route.local);
  if (route.target != route.local) control_.avoidNic(route.target);
  control_.cut(textf("it acknowledged nothing for %.1f s (%u segments unacknowledged) while %d of %d paths work",
                     std::chrono::duration<double>(silence).count(), state.unacknowledged, livePaths_,
                     static_cast<int>(paths_.size())));
}

}  // namespace railnet::verbs
