// What a verbs send comm and recv comm share: the TCP control socket (QP handshake, oversize notices, and the
// fastest sign that the peer process is gone) and the connection's paths.
//
// A path is one set of RC QPs (and their CQ) on one local NIC, connected to one set on one NIC of the peer.
// A physical device has one NIC and a connection has one path. A fused device (NIC fusion, ABI v9+) has L NICs
// ("lanes"); with a peer of R NICs a connection has P = max(L, R) paths, path p on local lane p % L and the
// peer's lane p % R, so every NIC at both ends carries traffic (docs/fusion.md, "The fused verbs connection").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/protocol/control_channel.h"
#include "proxy/verbs/queue_pairs.h"

namespace railnet::verbs {

constexpr int kMaxLanes = 8;  // NCCL fuses at most 8 devices (ABI v12)
constexpr int kMaxPaths = kMaxLanes;

// A buffer registered with every local NIC of a link (one memory region per protection domain): what the
// comms' regMr returns. A physical device's has one lane.
class LinkRegion final : public MemoryRegion {
 public:
  explicit LinkRegion(std::vector<std::unique_ptr<MemoryRegion>> perLane) : perLane_(std::move(perLane)) {}
  const VerbsRegion& lane(int index) const { return static_cast<const VerbsRegion&>(*perLane_[static_cast<size_t>(index)]); }
  int lanes() const { return static_cast<int>(perLane_.size()); }
  bool gpuMemory() const { return lane(0).gpuMemory(); }

 private:
  std::vector<std::unique_ptr<MemoryRegion>> perLane_;  // VerbsRegion each, [i] on the link's lane i
};

class VerbsLink final : public QpEventSink {
 public:
  // lanes: the local device's NICs (1 for a physical device); peerLanes: the peer's count from the handshake
  // (PeerInfo::nicCount). Creates the paths' QPs (INIT) and sends one QP record per path. Throws railnet::Error.
  VerbsLink(std::vector<std::shared_ptr<VerbsDevice>> lanes, int peerLanes, protocol::Fd control,
            const protocol::SocketAddress& peer, const char* direction, const QpOptions& options);

  // Advances the QP handshake; true once every path's QPs are at RTS. Caller holds the comm's lock. A failure
  // is recorded on control() and reported by the caller.
  bool ready();

  protocol::ControlChannel& control() { return control_; }
  int lanes() const { return static_cast<int>(lanes_.size()); }
  int paths() const { return static_cast<int>(paths_.size()); }
  int laneOf(int path) const { return paths_[static_cast<size_t>(path)].lane; }
  QueuePairs& qps(int path) { return *paths_[static_cast<size_t>(path)].qps; }
  VerbsDevice& device(int lane) { return *lanes_[static_cast<size_t>(lane)]; }
  std::shared_ptr<VerbsDevice> devicePtr(int lane) const { return lanes_[static_cast<size_t>(lane)]; }
  // The traffic counters (proxy/nic_counters.h) of the NIC a path leaves from, shared by every link on it.
  NicCounters& counters(int path) { return *paths_[static_cast<size_t>(path)].counters; }

  // Registers memory with every lane's NIC (regMr / regMrDmaBuf of the comms). Throws railnet::Error.
  std::unique_ptr<LinkRegion> registerMemory(void* data, size_t size, int type);
  std::unique_ptr<LinkRegion> registerDmabuf(void* data, size_t size, int type, uint64_t offset, int fd);

  // A QP of this link hit a fatal asynchronous error (async-event thread): fails the connection's requests.
  void onQpAsyncError(const std::string& what) noexcept override;

  // Names a failed work completion for the failure record: QP, NIC, opcode, status, vendor error.
  std::string describe(int path, const ibv_wc& completion) const;

  // Takes every finished work request off a path's CQ: failures are recorded, successes go to onSuccess.
  template <class OnSuccess>
  void drainCompletions(int path, OnSuccess&& onSuccess) {
    ibv_wc completions[32];
    for (;;) {
      int count = ibv_poll_cq(qps(path).cq(), 32, completions);
      if (count < 0) {
        control_.recordFailure("ibv_poll_cq failed");
        return;
      }
      for (int i = 0; i < count; ++i) {
        if (completions[i].status == IBV_WC_SUCCESS) {
          onSuccess(completions[i]);
        } else {
          control_.recordFailure(describe(path, completions[i]));
        }
      }
      if (count < 32) return;
    }
  }

 private:
  struct Path {
    int lane = 0;
    std::unique_ptr<QueuePairs> qps;
    NicCounters* counters = nullptr;
  };
  std::vector<std::shared_ptr<VerbsDevice>> lanes_;
  protocol::ControlChannel control_;
  std::vector<Path> paths_;
  bool ready_ = false;
};

}  // namespace railnet::verbs
