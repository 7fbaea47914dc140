// What a verbs send comm and recv comm share: the TCP control socket (QP handshake, oversize notices, and the
// fastest sign that the peer process is gone) and the connection's paths.
//
// A path is one set of RC QPs (and their CQ) on one local NIC, connected to one set on one NIC of the peer.
// A physical device has one NIC and a connection has one path. A fused device (NIC fusion, ABI v9+) has L NICs
// ; with a peer of R NICs a connection has P = max(L, R) paths, path p on local NIC p % L and the
// peer's NIC p % R, so every NIC at both ends carries traffic (docs/fusion.md, "The fused verbs connection").
// A connection between two single-NIC devices that fail over has one more path, its standby (D96): on this host's
// nearest other NIC (or its own, when it has none) and the peer's; it rests, carrying nothing, until every other path
// has failed, then the sender makes it, and it hands the traffic back once the original path is made again.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/protocol/control_channel.h"
#include "proxy/protocol/host_silence.h"
#include "proxy/verbs/queue_pairs.h"

namespace railnet::verbs {

constexpr int kMaxNics = 8;  // NCCL fuses at most 8 devices (ABI v12)
constexpr int kMaxPaths = kMaxNics;
// A path frame's payload (wire.h kPathQuery: a chunk header per failed work request of a path, at most its QPs' send
// queues, group notices counting their members): larger is a broken peer.
constexpr uint64_t kMaxPathFramePayload = uint64_t{1} << 20;

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

// Verbs path failover (docs/failover.md "Verbs"): where a path stands. Changed under the comm's lock only.
enum class PathState : uint8_t {
  kLive,      // carries traffic
  kDraining,  // taken out: its QPs are in the error state; its work requests are completing (flushed)
  kQuerying,  // sender: asked the receiver which chunks of its failed work requests landed (kPathQuery)
  kDown,      // drained (and, on the sender, answered); probed until its NIC is back, then made again
  kRenewing,  // sender: new QPs offered (kPathRenew), waiting for the receiver's record
};

class VerbsConnection final : public QpEventSink, public MemoryRegistrar {
 public:
  // nics: the local device's NICs (1 for a physical device), then its standby NIC when that is another one;
  // peerNics: the peer's count from the handshake (PeerInfo::nicCount); standbyNic: the NIC (an index into nics) of
  // the standby path, or -1 for none (wire.h kFeatureStandbyPath). Creates the paths' QPs (INIT) and sends one QP
  // record per path but the standby. Throws railnet::Error.
  VerbsConnection(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
            const protocol::SocketAddress& peer, const char* direction, const QpOptions& options,
            int standbyNic = -1);
  ~VerbsConnection() override;  // counts the time paths still out were degraded
  VerbsConnection(const VerbsConnection&) = delete;
  VerbsConnection& operator=(const VerbsConnection&) = delete;

  // Advances the QP handshake; true once every path's QPs are at RTS. Caller holds the comm's lock. A failure
  // is recorded on control() and reported by the caller.
  bool ready();

  protocol::ControlChannel& control() { return control_; }
  int nics() const { return static_cast<int>(nics_.size()); }
  int paths() const { return static_cast<int>(paths_.size()); }
  int nicOf(int path) const { return paths_[static_cast<size_t>(path)].nic; }
  // The standby path's peer NIC is the peer's first listener after its device's own (its spare, when it has one).
  int peerNicOf(int path) const { return standby(path) ? peerNics_ : path % peerNics_; }
  bool standby(int path) const { return paths_[static_cast<size_t>(path)].standby; }
  int standbyPath() const { return standbyPath_; }  // -1: none
  // The standby path while it carries nothing and is not being made: no traffic, no probes, not counted as out.
  bool resting(int path) const { return paths_[static_cast<size_t>(path)].resting; }
  // Some path that is not resting leaves from the NIC (an iflush reads through those only).
  bool nicInUse(int nic) const;
  // The QPs each path creates (RAILNET_IB_QPS_PER_CONNECTION): a path's buffers are laid out by it, whether or not
  // the path has its QPs now.
  int qpsPerPath() const { return options_.count; }
  // A path's QPs; the standby has none until it is made (replaceQps) and none once it rests again.
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

  // Takes every finished work request off a path's CQ: successes go to onSuccess, failures to onFailed (whose
  // opcode field is undefined: tell them by wr_id) after the connection took them in: without failover a failure
  // is recorded and fails the connection; with it, the path is taken out (failPath) unless it already is.
  // A path without QPs (the standby until it is made) has nothing to take.
  template <class OnSuccess, class OnFailed>
  void drainCompletions(int path, OnSuccess&& onSuccess, OnFailed&& onFailed) {
    if (!paths_[static_cast<size_t>(path)].qps) return;
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
          failedCompletion(path, completions[i]);
          onFailed(completions[i]);
        }
      }
      if (count < 32) return;
    }
  }

  // ---- path failover (path_failover.cc; docs/failover.md "Verbs"); caller holds the comm's lock ----
  // Both ends turn it on for a connection of two or more paths whose sender asked (wire.h kFeaturePathFailover).
  void enableFailover() { failover_.store(paths_.size() > 1, std::memory_order_release); }
  bool failover() const { return failover_.load(std::memory_order_acquire); }
  PathState state(int path) const { return paths_[static_cast<size_t>(path)].state; }
  // A change between the states a path is out in (kDraining .. kRenewing); failPath and connectPath go in and out.
  void setState(int path, PathState state) { paths_[static_cast<size_t>(path)].state = state; }
  bool live(int path) const { return state(path) == PathState::kLive; }
  uint32_t generation(int path) const { return paths_[static_cast<size_t>(path)].generation; }
  // Kept by failPath and connectPath, the only changes into or out of kLive: the data path asks on every message.
  int livePaths() const { return livePaths_; }
  // Every path but a resting standby carries traffic: the usual case, nothing to do for failover.
  bool allLive() const { return livePaths_ + restingPaths_ == static_cast<int>(paths_.size()); }
  // The (k mod n)-th of the n live paths: where new traffic goes; -1 when none is live.
  int livePath(uint64_t k) const;
  // Signaled work requests posted on a path and not yet completed, per direction of the work (send queue, receive
  // queue): a failed path is drained when both are 0.
  int& sendsInFlight(int path) { return paths_[static_cast<size_t>(path)].sendsInFlight; }
  int& recvsInFlight(int path) { return paths_[static_cast<size_t>(path)].recvsInFlight; }
  bool drained(int path) const {
    const Path& p = paths_[static_cast<size_t>(path)];
    return p.sendsInFlight == 0 && p.recvsInFlight == 0;
  }
  // Takes a live path out: its QPs go to the error state (their work requests complete, flushed), its NIC counts a
  // failure, and the peer hears of it (kPathDown) unless it told us. With no live path left the connection fails,
  // naming the peer and the NICs tried, unless it has a standby path: that is made then (the sender's probe, at
  // once), and the connection fails only when no path is live for RAILNET_FAILOVER_RESUME_MS (failIfStranded).
  // A standby path taken out while another path is live hands its traffic back (retiring): no failure is counted,
  // and once drained it rests again. False when the path was not live.
  bool failPath(int path, const std::string& why, bool tellPeer = true);
  // A connection with a standby path and no live path for RAILNET_FAILOVER_RESUME_MS fails (both ends' calls).
  void failIfStranded();
  // A drained standby path that was retiring rests again; true when it did (markDown's alternative).
  bool rest(int path);
  bool retiring(int path) const { return paths_[static_cast<size_t>(path)].retiring; }
  // Port events since the last look: every live path on a NIC whose port went down is taken out; a down path whose
  // NIC's port came back is due for a probe at once.
  void watchPorts();
  // A path frame (wire.h kPathDown..kPathReady) about `path`'s current generation (or `generation`: the receiver's
  // answer to a renewal names the one it replaced), with its payload; `flags` go in the header's extraKeys field
  // (kRenewPortDown).
  void sendPathFrame(protocol::FrameType type, int path, const void* payload, size_t bytes,
                     uint32_t generation = UINT32_MAX, uint16_t flags = 0);
  // A path frame's path: -1 (a protocol error, recorded) when the connection has none such; *current false for a
  // frame about an earlier incarnation of the path (ignored). unexpectedFrame records a frame of no use here.
  int framePath(const protocol::FrameHeader& frame, bool* current);
  bool unexpectedFrame(const protocol::FrameHeader& frame);
  // A drained path: the sender's next probe (1 s after the failure, doubling to 30 s; RAILNET_FAILOVER_PROBES caps
  // them), due when its NIC's port is up. markDown starts the schedule; probeDue counts a probe it allows.
  void markDown(int path);
  bool probeDue(int path, std::chrono::steady_clock::time_point now);
  void probeRefused(int path, const std::string& why);
  // Making a path again: new QPs (INIT) replace the failed ones, which are destroyed; connectPath moves them to RTS
  // against the peer's record (throws railnet::Error) and puts the path back to work, with a new generation.
  void replaceQps(int path);
  void connectPath(int path, const QpInfo& remote);
  // A path's NIC is up by its port's events (a peer's refusal is what tells of the other end).
  bool nicUp(int path) const { return nics_[static_cast<size_t>(nicOf(path))]->portActive(); }
  std::string nicName(int path) const;
  const std::string& whyDown(int path) const { return paths_[static_cast<size_t>(path)].why; }
  std::string liveNicNames() const;
  std::string triedNicNames() const;  // every path's NIC, once each: what a connection that failed had tried

  // ---- the resumable control channel (control_failover.cc; docs/failover.md "Verbs", D94); comm's lock ----
  // With path failover on, the control socket is resumable as TCP's is (D87): frames are numbered from the end of
  // the QP handshake, and the sender re-makes the socket over another pair of NICs when a path through its NIC fails
  // or it falls silent, so across hosts NIC 0's failure costs a path, not the connection. The comm plans it before
  // the handshake ends; ready() turns it on when failover is on.
  // silenceLimit: RAILNET_FAILOVER_SILENCE_MS, for watchControl.
  void planResume(const protocol::ResumeOptions& options, std::chrono::milliseconds silenceLimit) {
    resumePlan_ = options;
    controlSilenceLimit_ = silenceLimit;
  }
  // Sender: a failed path's NICs are tried last by a re-made control socket; a socket that runs through them is
  // re-made at once.
  void moveControlOff(int path);
  // Sender, from its data path and the watchdog (at most every eighth of the silence limit): a kAck every quarter of
  // it while busy (`workStarted`, the work requests it ever started, moved since the last look, or `waiting`: work in
  // flight or a path out), so a control socket whose path went silent holds unacknowledged bytes; a socket that
  // waited the limit for an acknowledgement while a path still works is re-made through another pair of NICs.
  void watchControl(uint64_t workStarted, bool waiting);

 private:
  struct Path {
    int nic = 0;
    bool standby = false;   // the standby path (D96)
    bool resting = false;   // guarded by the comm's lock, as below
    bool retiring = false;  // taken out to hand its traffic back to the path that was made again
    std::unique_ptr<QueuePairs> qps;
    NicCounters* counters = nullptr;
    // Failover, guarded by the comm's lock.
    PathState state = PathState::kLive;
    uint32_t generation = 0;
    int sendsInFlight = 0;
    int recvsInFlight = 0;
    std::chrono::steady_clock::time_point downSince;
    std::chrono::steady_clock::time_point nextProbe;
    std::chrono::milliseconds probeInterval{0};
    uint64_t probes = 0;
    std::string why;  // what took it out
  };
  void failedCompletion(int path, const ibv_wc& completion);
  std::vector<std::shared_ptr<VerbsDevice>> nics_;
  protocol::ControlChannel control_;
  std::vector<Path> paths_;
  QpOptions options_;
  std::vector<uint64_t> seenPortDowns_;  // per NIC, guarded by the comm's lock
  std::vector<uint64_t> seenPortUps_;
  std::atomic<bool> failover_{false};
  int livePaths_ = 0;  // guarded by the comm's lock
  int restingPaths_ = 0;  // guarded by the comm's lock: 1 while the standby path rests
  int standbyPath_ = -1;
  std::chrono::steady_clock::time_point strandedSince_;  // the last live path's failure, while none is live
  std::string strandedWhy_;
  bool ready_ = false;
  int peerNics_ = 1;
  bool sender_ = false;
  std::optional<protocol::ResumeOptions> resumePlan_;
  std::chrono::milliseconds controlSilenceLimit_{2000};
  protocol::AckSilence controlSilence_;                  // guarded by the comm's lock
  std::chrono::steady_clock::time_point nextControlLook_;  // guarded by the comm's lock
  uint64_t workAtLastLook_ = 0;                           // guarded by the comm's lock
};

}  // namespace railnet::verbs
