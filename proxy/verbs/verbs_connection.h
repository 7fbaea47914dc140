// What a verbs send comm and recv comm share: the TCP control socket (QP handshake, oversize notices, and the
// fastest sign that the peer process is gone) and the connection's paths.
//
// A path is one set of RC QPs (and their CQ) on one local NIC, connected to one set on one NIC of the peer.
// A physical device has one NIC and a connection has one path. A fused device (NIC fusion, ABI v9+) has L NICs
// ; with a peer of R NICs a connection has P = max(L, R) paths, path p on local NIC p % L and the
// peer's NIC p % R, so every NIC at both ends carries traffic (docs/fusion.md, "The fused verbs connection").
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/protocol/control_channel.h"
#include "proxy/verbs/queue_pairs.h"

namespace railnet::verbs {

constexpr int kMaxNics = 8;  // NCCL fuses at most 8 devices (ABI v12)
constexpr int kMaxPaths = kMaxNics;

// A buffer registered with every local NIC of a link (one memory region per protection domain): what the
// comms' regMr returns. A physical device's has one NIC.
class LinkRegion final : public MemoryRegion {
 public:
  explicit LinkRegion(std::vector<std::unique_ptr<MemoryRegion>> perNic) : perNic_(std::move(perNic)) {}
  const VerbsRegion& nic(int index) const { return static_cast<const VerbsRegion&>(*perNic_[static_cast<size_t>(index)]); }
  int nics() const { return static_cast<int>(perNic_.size()); }
  bool gpuMemory() const { return nic(0).gpuMemory(); }

 private:
  std::vector<std::unique_ptr<MemoryRegion>> perNic_;  // VerbsRegion each, [i] on the connection's NIC i
};

class VerbsConnection final : public QpEventSink, public MemoryRegistrar {
 public:
  // nics: the local device's NICs (1 for a physical device); peerNics: the peer's count from the handshake
  // (PeerInfo::nicCount). Creates the paths' QPs (INIT) and sends one QP record per path. Throws railnet::Error.
  VerbsConnection(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
            const protocol::SocketAddress& peer, const char* direction, const QpOptions& options);

  // Advances the QP handshake; true once every path's QPs are at RTS. Caller holds the comm's lock. A failure
  // is recorded on control() and reported by the caller.
  bool ready();

  protocol::ControlChannel& control() { return control_; }
  int nics() const { return static_cast<int>(nics_.size()); }
  int paths() const { return static_cast<int>(paths_.size()); }
  int nicOf(int path) const { return paths_[static_cast<size_t>(path)].nic; }
  QueuePairs& qps(int path) { return *paths_[static_cast<size_t>(path)].qps; }
  VerbsDevice& device(int nic) { return *nics_[static_cast<size_t>(nic)]; }
  std::shared_ptr<VerbsDevice> devicePtr(int nic) const { return nics_[static_cast<size_t>(nic)]; }
  // The traffic counters (proxy/nic_counters.h) of the NIC a path leaves from, shared by every link on it.
  NicCounters& counters(int path) { return *paths_[static_cast<size_t>(path)].counters; }

  // Registers memory with every NIC of the connection (regMr / regMrDmaBuf of the comms). Throws railnet::Error.
  std::unique_ptr<LinkRegion> registerMemory(void* data, size_t size, int type);
  std::unique_ptr<LinkRegion> registerDmabuf(void* data, size_t size, int type, uint64_t offset, int fd);
  // MemoryRegistrar: what both comms' regMr / regMrDmaBuf do.
  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) override {
    return registerMemory(data, size, type);
  }
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) override {
    return registerDmabuf(data, size, type, offset, fd);
  }

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
        control_.recordFailure("ibv_poll_cq failed", protocol::FailureKind::kLocal);
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
    int nic = 0;
    std::unique_ptr<QueuePairs> qps;
    NicCounters* counters = nullptr;
  };
  std::vector<std::shared_ptr<VerbsDevice>> nics_;
  protocol::ControlChannel control_;
  std::vector<Path> paths_;
  bool ready_ = false;
};

}  // namespace railnet::verbs
