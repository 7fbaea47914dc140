// Verbs path failover, the part both comms share (docs/failover.md "Verbs"): taking a path out, watching the ports,
// the probe schedule, and making a path again with new QPs. The comms own what travels: the sender's query and
// resend, the receiver's answer and its clear-to-sends.
#include <algorithm>
#include <cstdio>
#include <cstring>

#include "proxy/verbs/verbs_connection.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {
namespace {
constexpr std::chrono::milliseconds kFirstProbe{1000};
constexpr std::chrono::milliseconds kLongestProbeWait{30000};

uint64_t millisecondsSince(std::chrono::steady_clock::time_point since) {
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - since).count());
}
}  // namespace

VerbsConnection::~VerbsConnection() {
  for (Path& path : paths_) {
    if (path.state != PathState::kLive && !path.standby) path.counters->addDegraded(millisecondsSince(path.downSince));
  }
}

int VerbsConnection::livePath(uint64_t k) const {
  if (livePaths_ == static_cast<int>(paths_.size())) return static_cast<int>(k % paths_.size());
  if (livePaths_ == 0) return -1;
  uint64_t index = k % static_cast<uint64_t>(livePaths_);
  for (size_t p = 0; p < paths_.size(); ++p) {
    if (paths_[p].state != PathState::kLive) continue;
    if (index-- == 0) return static_cast<int>(p);
  }
  return -1;
}

bool VerbsConnection::nicInUse(int nic) const {
  for (const Path& path : paths_) {
    if (path.nic == nic && !path.resting) return true;
  }
  return false;
}

std::string VerbsConnection::nicName(int path) const {
  return nics_[static_cast<size_t>(nicOf(path))]->port().info.name;
}

std::string VerbsConnection::triedNicNames() const {
  std::string tried;
  for (size_t p = 0; p < paths_.size(); ++p) {
    const std::string name = nicName(static_cast<int>(p));
    if (tried.find(name) == std::string::npos) tried += (tried.empty() ? "" : ", ") + name;
  }
  return tried;
}

std::string VerbsConnection::liveNicNames() const {
  std::string names;
  for (size_t p = 0; p < paths_.size(); ++p) {
    if (paths_[p].state != PathState::kLive) continue;
    const std::string name = nicName(static_cast<int>(p));
    if (names.find(name) != std::string::npos) continue;
    names += (names.empty() ? "" : ", ") + name;
  }
  return names.empty() ? "none" : names;
}

void VerbsConnection::failedCompletion(int path, const ibv_wc& completion) {
  if (!failover()) {
    control_.recordFailure(describe(path, completion));
    return;
  }
  // A flushed work request of a path already out is expected; any other failure takes its path out.
  if (live(path)) failPath(path, describe(path, completion));
}

bool VerbsConnection::failPath(int path, const std::string& why, bool tellPeer) {
  Path& p = paths_[static_cast<size_t>(path)];
  if (p.state != PathState::kLive) return false;
  // The standby hands its traffic back to a path made again: no failure (D96).
  p.retiring = p.standby && livePaths_ > 1;
  p.state = PathState::kDraining;
  --livePaths_;
  p.why = why;
  p.downSince = std::chrono::steady_clock::now();
  if (!p.retiring) p.counters->addFailure();
  // The error state completes every work request the QPs hold (flushed) and stops their traffic: nothing of this
  // path lands after its chunks are sent again elsewhere.
  const IbvApi& api = device(p.nic).api();
  for (int i = 0; i < p.qps->created(); ++i) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_ERR;
    if (int rc = api.modifyQp(p.qps->qp(i), &attr, IBV_QP_STATE); rc != 0) {
      control_.recordFailure("moving QP " + std::to_string(p.qps->qp(i)->qp_num) + " of a failed path to the error "
                             "state failed: " + errnoText(rc), protocol::FailureKind::kLocal);
      return true;
    }
  }
  RN_INFO(NCCL_NET, "NET/railnet: %s connection with %s: path %d (%s) %s: %s", control_.direction(),
          control_.peerName().c_str(), path, nicName(path).c_str(),
          p.retiring ? "hands its traffic back" : "taken out", why.c_str());
  if (tellPeer) sendPathFrame(protocol::FrameType::kPathDown, path, nullptr, 0);
  if (!p.retiring) moveControlOff(path);
  const bool standbyUsable = standbyPath_ >= 0 && path != standbyPath_ && nicUp(standbyPath_);
  if (livePaths() == 0 && standbyUsable) {
    // Requests wait for the standby path (the sender makes it at once) or for a failed path to be made again. With
    // its port down too, nothing can come back soon: the connection fails below, as when every path failed.
    strandedSince_ = p.downSince;
    strandedWhy_ = nicName(path) + ": " + why;
    Path& standby = paths_[static_cast<size_t>(standbyPath_)];
    if (standby.resting) {
      standby.resting = false;
      --restingPaths_;
      standby.downSince = p.downSince;
      standby.nextProbe = p.downSince;
      standby.probeInterval = kFirstProbe;
      standby.probes = 0;
      RN_INFO(NCCL_NET, "NET/railnet: %s connection with %s: its only path failed; its standby path %d (%s) is made "
              "now", control_.direction(), control_.peerName().c_str(), standbyPath_, nicName(standbyPath_).c_str());
    }
    return true;
  }
  if (livePaths() == 0) {
    control_.recordFailure("every path failed (NICs tried: " + triedNicNames() + "); the last: " + why);
  }
  return true;
}

void VerbsConnection::watchPorts() {
  for (size_t nic = 0; nic < nics_.size(); ++nic) {
    const uint64_t downs = nics_[nic]->portDowns();
    const uint64_t ups = nics_[nic]->portUps();
    if (downs == seenPortDowns_[nic] && ups == seenPortUps_[nic]) continue;
    const bool wentDown = downs != seenPortDowns_[nic];
    seenPortDowns_[nic] = downs;
    seenPortUps_[nic] = ups;
    for (size_t p = 0; p < paths_.size(); ++p) {
      Path& path = paths_[p];
      if (path.nic != static_cast<int>(nic) || path.resting) continue;
      if (wentDown && path.state == PathState::kLive) {
        failPath(static_cast<int>(p), "port " + std::to_string(nics_[nic]->port().port) + " of " +
                                          nics_[nic]->port().device + " went down (async event PORT_ERR)");
      } else if (path.state == PathState::kDown && nics_[nic]->portActive()) {
        path.nextProbe = std::chrono::steady_clock::now();  // its port is back: probe at once
      }
    }
  }
}

void VerbsConnection::sendPathFrame(protocol::FrameType type, int path, const void* payload, size_t bytes,
                                    uint32_t generation, uint16_t flags) {
  protocol::FrameHeader frame{static_cast<uint8_t>(type), static_cast<uint8_t>(path), flags,
                              generation == UINT32_MAX ? this->generation(path) : generation, bytes};
  control_.send(&frame, sizeof(frame), payload, bytes);  // one call: a resumable channel logs whole frames
}

int VerbsConnection::framePath(const protocol::FrameHeader& frame, bool* current) {
  const int path = frame.slot;
  if (path >= paths()) {
    control_.recordFailure("protocol error: a path frame for path " + std::to_string(path) + " of " +
                           std::to_string(paths()));
    return -1;
  }
  *current = frame.recvId == generation(path);
  return path;
}

bool VerbsConnection::unexpectedFrame(const protocol::FrameHeader& frame) {
  control_.recordFailure("protocol error: unexpected control frame type " + std::to_string(frame.type));
  return false;
}

void VerbsConnection::failIfStranded() {
  if (standbyPath_ < 0 || livePaths_ != 0 || control_.failed()) return;
  const uint64_t limit = static_cast<uint64_t>(settings().failoverResumeMs);
  // Every local port of the connection down: nothing comes back soon, so it fails now.
  bool portUp = false;
  for (size_t q = 0; q < paths_.size(); ++q) portUp = portUp || nicUp(static_cast<int>(q));
  if (portUp && millisecondsSince(strandedSince_) <= limit) return;
  control_.recordFailure("every path failed and none was made again " +
                         (portUp ? "within " + std::to_string(limit) + " ms" : std::string("(every port is down)")) +
                         " (NICs tried: " + triedNicNames() + "); the last: " + strandedWhy_);
}

bool VerbsConnection::rest(int path) {
  Path& p = paths_[static_cast<size_t>(path)];
  if (!p.retiring) return false;
  p.retiring = false;
  if (livePaths_ == 0) {
    // The own path failed again while the standby handed its traffic back: it is needed at once (markDown).
    p.nextProbe = std::chrono::steady_clock::now();
    p.probeInterval = kFirstProbe;
    return false;
  }
  p.resting = true;
  ++restingPaths_;
  p.state = PathState::kDown;
  p.probeInterval = std::chrono::milliseconds(0);
  p.qps.reset();  // drained: nothing of it is in flight; made again with the path (replaceQps)
  RN_INFO(NCCL_NET, "NET/railnet: %s connection with %s: standby path %d (%s) rests again", control_.direction(),
          control_.peerName().c_str(), path, nicName(path).c_str());
  return true;
}

void VerbsConnection::markDown(int path) {
  if (rest(path)) return;
  Path& p = paths_[static_cast<size_t>(path)];
  p.state = PathState::kDown;
  if (p.probeInterval.count() == 0) {
    p.probeInterval = kFirstProbe;
    p.nextProbe = p.downSince + kFirstProbe;
  }
}

bool VerbsConnection::probeDue(int path, std::chrono::steady_clock::time_point now) {
  Path& p = paths_[static_cast<size_t>(path)];
  if (p.state != PathState::kDown || p.resting || now < p.nextProbe || !nicUp(path)) return false;
  const uint64_t cap = static_cast<uint64_t>(settings().failoverProbes);
  if (cap != 0 && p.probes >= cap) return false;
  ++p.probes;
  p.nextProbe = now + p.probeInterval;
  p.probeInterval = std::min(p.probeInterval * 2, kLongestProbeWait);
  return true;
}

void VerbsConnection::probeRefused(int path, const std::string& why) {
  Path& p = paths_[static_cast<size_t>(path)];
  p.state = PathState::kDown;
  RN_INFO(NCCL_NET, "NET/railnet: %s connection with %s: probe %llu of path %d (%s) failed (%s); next in %lld ms",
          control_.direction(), control_.peerName().c_str(), static_cast<unsigned long long>(p.probes), path,
          nicName(path).c_str(), why.c_str(),
          static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     p.nextProbe - std::chrono::steady_clock::now()).count()));
}

void VerbsConnection::replaceQps(int path) {
  Path& p = paths_[static_cast<size_t>(path)];
  p.qps.reset();  // destroyed first: a QP's work requests point into buffers the new QPs get posted again
  p.qps = std::make_unique<QueuePairs>(nics_[static_cast<size_t>(p.nic)], options_, this);
  p.sendsInFlight = 0;
  p.recvsInFlight = 0;
}

void VerbsConnection::connectPath(int path, const QpInfo& remote) {
  Path& p = paths_[static_cast<size_t>(path)];
  if (remote.magic == kQpInfoMagic && remote.path != path) {
    fail(ncclSystemError, "NET/railnet: %s sent a QP record for path %u to make path %d again",
         control_.peerName().c_str(), remote.path, path);
  }
  p.qps->connect(remote);
  const uint64_t outMs = millisecondsSince(p.downSince);
  if (p.resting) {  // the receiver's standby, made by the sender before this end saw its path fail
    p.resting = false;
    --restingPaths_;
  }
  p.state = PathState::kLive;
  ++livePaths_;
  ++p.generation;
  p.probeInterval = std::chrono::milliseconds(0);
  char event[256];
  if (p.standby) {
    // The move (D96): the standby's NIC counts a moved connection, cross-rail when the rails differ; the failed
    // path's NIC counts the time out when it is made again.
    const int16_t rail = nics_[static_cast<size_t>(p.nic)]->port().info.railId;
    const int16_t peerRail = p.qps->remoteRail();
    p.counters->addMoved(rail, peerRail);
    snprintf(event, sizeof(event),
             "moved to its standby path %d (%s, rail %d; the peer's rail %d%s), degraded until its own path answers "
             "again",
             path, nicName(path).c_str(), rail, peerRail,
             rail >= 0 && peerRail >= 0 && rail != peerRail ? ", cross-rail" : "");
  } else {
    p.counters->addDegraded(outMs);
    snprintf(event, sizeof(event),
             "path %d (%s) answers again %.1f s after it failed (probe %llu): new QPs carry its traffic", path,
             nicName(path).c_str(), static_cast<double>(outMs) / 1000.0, static_cast<unsigned long long>(p.probes));
  }
  // One WARN per event: the sender's (it made the path); the receiver's side of it is INFO.
  if (sender_) {
    RN_WARN("NET/railnet: %s connection with %s: %s", control_.direction(), control_.peerName().c_str(), event);
  } else {
    RN_INFO(NCCL_NET, "NET/railnet: %s connection with %s: %s", control_.direction(), control_.peerName().c_str(),
            event);
  }
  p.probes = 0;
  if (sender_ && control_.resumable()) control_.stopAvoiding(p.nic);
}

}  // namespace railnet::verbs
