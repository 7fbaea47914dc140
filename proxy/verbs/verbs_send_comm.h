// The sending end of a railnet verbs connection. Receiver-driven like the TCP transport: isend waits for the
// receiver's clear-to-send, which names the buffer's address and rkey; the payload then goes by RDMA WRITE
// straight into that buffer, striped over the connection's QPs, and each stripe ends with a small SEND that
// carries a chunk header, so the receiver counts bytes exactly as with TCP chunks.
#pragma once

#include <chrono>
#include <mutex>
#include <optional>
#include <vector>

#include "proxy/protocol/clear_to_send.h"
#include "proxy/protocol/held_group.h"
#include "proxy/protocol/request_pool.h"
#include "proxy/progress/watchdog.h"
#include "proxy/staging/piece_pipeline.h"
#include "proxy/verbs/notice.h"
#include "proxy/verbs/nvlink_hop.h"
#include "proxy/verbs/verbs_connection.h"
#include "railnet/settings.h"

namespace railnet::verbs {

class VerbsSendComm;

class VerbsSendRequest final : public protocol::CommRequest<VerbsSendComm, VerbsSendRequest> {
 private:
  friend class VerbsSendComm;
  int pendingStripes_ = 0;  // guarded by the comm's mutex
  uint64_t completedStripes_ = 0;  // guarded: the watchdog's measure of progress
  uint64_t serial_ = 0;            // guarded: which send this is (requests are reused)
  progress::ProgressMark watch_;   // guarded
  uint64_t size_ = 0;
  int eagerSlot_ = -1;  // the header slot a small message's SEND reads from, until it completes
  uint64_t hopPieces_ = 0;  // guarded: NVLink hop pieces not yet posted (their stripes are not yet counted)
  uint64_t pathBytes_[kMaxPaths] = {};  // payload per path, counted on its NIC when the request completes
  bool hopped_ = false;
  // Done once every stripe is posted and completed.
  bool workLeft() const { return pendingStripes_ != 0 || hopPieces_ != 0; }
};

// How a routed connection's send comm uses the NVLink hop (verbs_transport.cc decides; nvlink_hop.h).
struct HopPlan {
  NvlinkHop::Mode mode = NvlinkHop::Mode::kGpu;
  std::string railGpuBusId;  // kGpu: the routed port's GPU
};

class VerbsSendComm final : public SendComm, private progress::Watched {
 public:
  // nics: the device's NICs (one unless fused); peerNics: the receiver's (PeerInfo::nicCount);
  // minStripeBytes: the fusion scheduler's threshold (RAILNET_FUSION_MIN_STRIPE_BYTES).
  // hop: set for a routed connection that sends through the NVLink hop.
  // failover: the connection asked for path failover (wire.h kFeaturePathFailover; on with two or more paths).
  // standbyNic: the standby path's NIC, an index into nics (VerbsConnection), or -1.
  VerbsSendComm(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
                const protocol::SocketAddress& peer, const QpOptions& options, uint64_t minStripeBytes,
                const std::optional<HopPlan>& hop = std::nullopt, bool failover = false,
                const protocol::ResumeOptions* resume = nullptr, int standbyNic = -1);
  ~VerbsSendComm() override;

  ncclResult_t isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept override;

 private:
  friend class protocol::CommRequest<VerbsSendComm, VerbsSendRequest>;
  MemoryRegistrar& registrar() noexcept override {
    return hop_ != nullptr ? static_cast<MemoryRegistrar&>(*hop_) : connection_;
  }
  ncclResult_t testRequest(VerbsSendRequest* request, int* done, int* sizes) noexcept;
  // The watchdog's look (proxy/progress/watchdog.h): a send with no completion for the limit gets one WARN.
  void watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept override;
  // Rail failover's look (every tick while RAILNET_FAILOVER=1): drives a failed path's query, answer and probes.
  void watchPaths(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept override;
  void describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept override;
  // Reads the control socket: end-of-stream, and with failover the receiver's path frames. Caller holds mutex_.
  void pumpControl();
  // Takes finished work off every path's CQ. Caller holds mutex_.
  void pollCompletions();
  // ---- signaled work (a stripe's WRITE and notice, an eager SEND): kept until it completes, so failover can ask
  // the receiver about it and send it again over another path ----
  struct SentWork {
    enum class Kind : uint8_t { kStripe, kEager };
    Kind kind = Kind::kStripe;
    int path = 0;
    VerbsSendRequest* request = nullptr;
    uint64_t owner = 0;  // nonzero: the wr_id this work stands for (a hop slot's notice)
    uint64_t localBase = 0;  // the message's first byte
    uint32_t lkey = 0;       // without a region (the hop's staging, or an empty message)
    const LinkRegion* region = nullptr;
    protocol::ChunkHeader header{};
    protocol::ClearToSendQueue::Destination destination{};
  };
  static constexpr uint64_t kWorkTag = uint64_t{1} << 61;  // in wr_id: a SentWork index
  uint32_t newWork();
  // Posts the work on `path` (its QP round robin). False when the post failed and the connection failed with it;
  // with failover a failed post takes the path out and the work waits for the query like a flushed one.
  bool postWork(uint32_t index, int path);
  // The work's notice completed (or the receiver has its bytes): its request counts it; the work is freed.
  void completeWork(uint32_t index);
  // Bytes [offset, offset + length) of a message of `size` on one path: RDMA WRITEs spread over the path's
  // QPs, each followed by its notice SEND.
  // Reads byte `at` of the message from localBase + at, through `region`'s key for the path's NIC (or `lkey` without
  // one: the hop's staging); the notices carry `wrId` (0: the request).
  // *posted (when given) counts the stripes posted, which complete even after a failed post.
  bool postStripes(VerbsSendRequest* request, int path, uint64_t localBase, const LinkRegion* region, uint32_t lkey,
                   uint64_t size,
                   uint64_t offset, uint64_t length, const protocol::ClearToSendQueue::Destination& destination,
                   uint64_t wrId = 0, int* posted = nullptr);
  // One message on its own: eager SEND when small and a header slot is free, else striped WRITEs with notices,
  // over the paths the fusion scheduler picks. False once a post failed (recorded on the connection).
  bool postMessage(VerbsSendRequest* request, const char* data, const LinkRegion* region, uint64_t size,
                   const protocol::ClearToSendQueue::Destination& destination);

  // ---- multireceive aggregation (protocol/held_group.h); caller holds mutex_ ----
  struct HeldMember {
    VerbsSendRequest* request;
    const char* data;
    const LinkRegion* region;
    uint64_t size;
    protocol::ClearToSendQueue::Destination destination;
  };
  // The held members' RDMA WRITEs (unsignaled) and one signaled SEND of their headers, all on one QP, so RC
  // ordering lands every payload before the notice. Without a free group notice slot, each member goes alone.
  void flushHeld();
  bool postGroup(std::vector<HeldMember>& members);
  static constexpr int kGroupNotices = 2 * NCCL_NET_MAX_REQUESTS;  // groups whose notice SEND may be in flight
  static constexpr uint64_t kGroupWrTag = uint64_t{1} << 63;      // in wr_id: a group notice (user pointers never)
  std::vector<protocol::ChunkHeader> groupHeaders_;                 // kGroupNotices x kMaxRecvs, registered
  std::unique_ptr<LinkRegion> groupRegion_;
  std::vector<int> freeGroupNotices_;                               // guarded by mutex_
  std::vector<std::vector<HeldMember>> groupMembers_;               // guarded: per notice slot, its members
  std::vector<int> groupPath_;                                      // guarded: per notice slot, its path
  protocol::HeldGroup<HeldMember> held_{std::chrono::microseconds(settings().groupWaitUs)};  // guarded

  // ---- the NVLink hop (verbs_send_hop.cc); caller holds mutex_ ----
  struct HopMessage {
    VerbsSendRequest* request = nullptr;
    uint64_t source = 0;  // the message's first byte (GPU memory; host memory in the test mode)
    uint64_t size = 0;
    protocol::ClearToSendQueue::Destination destination{};
  };
  using HopPiece = staging::PiecePipeline<HopMessage>::Piece;
  struct HopSlot {
    HopPiece piece;
    int pendingStripes = 0;  // the piece's notices not yet completed; the slot frees at 0
  };
  static constexpr uint64_t kHopWrTag = uint64_t{1} << 62;  // in wr_id: a hop slot's notice
  void addHopMessage(VerbsSendRequest* request, const char* data, uint64_t size,
                     const protocol::ClearToSendQueue::Destination& destination);
  // Copies finished pieces' slots out, then starts copies into free slots. False once a step failed (recorded).
  bool pumpHop();
  void sendHopPiece(int slot);
  void onHopNotice(int slot);

  // A message of at most kEagerBytes as one SEND: header from a registered slot, payload from the user buffer.
  bool postEager(VerbsSendRequest* request, int path, const char* data, const LinkRegion* region, uint64_t size,
                 const protocol::ClearToSendQueue::Destination& destination);

  // Clear-to-send frames arrive by RDMA SEND on QP 0 of a path (path 0 until it fails) into these buffers, posted
  // on every path (kept alive past the QPs); wr_id: path x kClearToSendBuffers + buffer.
  static constexpr int kClearToSendBuffers = 2 * NCCL_NET_MAX_REQUESTS;
  static constexpr size_t kClearToSendBytes = 512;  // 8 entries with 8 keys each: 16 + 8 x 24 + 8 x 7 x 4 bytes
  void postClearToSendBuffer(int path, size_t index);

  // ---- path failover (verbs_send_failover.cc; docs/failover.md "Verbs"); caller holds mutex_ ----
  // A work request of a failed path whose fate is unknown: a SentWork, or member `member` of group notice `group`.
  struct Unknown {
    int work = -1;
    int group = -1;
    int member = 0;
  };
  // Drained failed paths are queried, queries past their time fail the connection, due probes make paths again.
  void advanceFailover();
  void sendQuery(int path);
  // The receiver's answer to a path's query: what it lacks goes again over the live paths. False: protocol error.
  bool applyAnswer(int path, const char* answer, size_t count);
  void startRenew(int path);
  // The receiver's answer to a renewal: its QP record, or none (portDown: its NIC is down).
  void applyRenew(int path, const char* record, size_t bytes, bool portDown);
  // Posts the work the receiver lacked (applyAnswer) over the live paths; it stays parked while none is live.
  void sendParked();
  // One control frame from the receiver (kPathDown, kPathAnswer, kPathRenew) and its payload. False: recorded.
  bool applyPathFrame(const protocol::FrameHeader& frame, const char* payload);
  std::vector<std::vector<Unknown>> unknown_;  // per path: failed work awaiting its query (then its answer)
  std::vector<uint32_t> parked_;  // work the receiver lacked, to send again (while no path is live: the standby, D96)
  std::vector<std::chrono::steady_clock::time_point> pathDeadline_;  // per path: the query's or renewal's answer

  std::mutex mutex_;
  std::vector<protocol::ChunkHeader> eagerHeaders_;  // one per send request that may be in flight
  std::vector<int> freeEagerSlots_;             // guarded by mutex_
  std::vector<char> ctsBuffers_;  // paths x kClearToSendBuffers
  std::vector<SentWork> work_;        // guarded by mutex_
  std::vector<uint32_t> freeWork_;    // guarded by mutex_
  uint64_t workStarted_ = 0;          // guarded by mutex_: newWork() calls, ever (the control socket's watch)
  std::unique_ptr<LinkRegion> ctsRegion_;
  std::unique_ptr<LinkRegion> eagerRegion_;
  VerbsConnection connection_;
  // After connection_: the hop registers its staging with the connection's NIC, and lets go of it first.
  std::unique_ptr<NvlinkHop> hop_;                                   // null: this comm does not hop
  std::unique_ptr<staging::PiecePipeline<HopMessage>> hopPipeline_;  // guarded by mutex_
  std::vector<HopSlot> hopSlots_;                                    // guarded by mutex_
  protocol::ClearToSendQueue posted_;                      // guarded by mutex_
  protocol::RequestPool<VerbsSendRequest> requests_;       // guarded by mutex_
  uint64_t minStripeBytes_;
  uint64_t messages_ = 0;                             // guarded by mutex_; rotates the first path of each message
  uint32_t nextQp_[kMaxPaths] = {};                   // guarded by mutex_; per path
  uint64_t sends_ = 0;                                // guarded by mutex_
  progress::WatchRegistration watchdog_;              // last: reset first in the destructor
};

}  // namespace railnet::verbs
