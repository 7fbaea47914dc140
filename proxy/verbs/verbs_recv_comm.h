// The receiving end of a railnet verbs connection. irecv publishes each buffer's address and rkey in a
// clear-to-send; the sender RDMA-writes into it and follows each stripe with a SEND carrying a chunk header,
// which lands in one of the small receive buffers posted here. test() polls the CQ: no helper threads.
#pragma once

#include <atomic>
#include <deque>
#include <mutex>
#include <vector>

#include "proxy/progress/watchdog.h"
#include "proxy/protocol/receive_ring.h"
#include "proxy/protocol/request_pool.h"
#include "proxy/protocol/wire.h"
#include "proxy/verbs/flush.h"
#include "proxy/verbs/notice.h"
#include "proxy/verbs/verbs_connection.h"

namespace railnet::verbs {

class VerbsRecvComm;

class VerbsRecvRequest final : public protocol::CommRequest<VerbsRecvComm, VerbsRecvRequest>, public protocol::PostedReceive {
  // Its transfer state is the posted receive's (protocol/receive_ring.h); these are the watchdog's.
 private:
  friend class VerbsRecvComm;
  uint64_t serial_ = 0;            // which receive this is (entries are reused); under the comm's lock
  progress::ProgressMark watch_;   // under the comm's lock
};

// An iflush in flight: done when its READ completes on the comm's loopback QP.
class VerbsFlushRequest final : public protocol::CommRequest<VerbsRecvComm, VerbsFlushRequest> {
 private:
  friend class VerbsRecvComm;
  // Guarded by the comm's mutex.
  bool inUse_ = false;
  int pendingReads_ = 0;  // one READ per nic of the comm
  std::string error_;     // non-empty: a READ failed
};

class VerbsRecvComm final : public RecvComm, private progress::Watched {
 public:
  // nics: the device's NICs (one unless fused); peerNics: the sender's (PeerInfo::nicCount); failover: the sender
  // asked for path failover (wire.h kFeaturePathFailover; on with two or more paths); standbyNic: the standby path's
  // NIC, an index into nics (VerbsConnection), or -1.
  VerbsRecvComm(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
                const protocol::SocketAddress& peer, const QpOptions& options, bool failover = false,
                const protocol::ResumeOptions* resume = nullptr, int standbyNic = -1);
  ~VerbsRecvComm() override;

  ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                     Request** request) noexcept override;
  ncclResult_t iflush(int n, void** data, const int* sizes, MemoryRegion** mrs, Request** request) noexcept override;
  void expectIdleReceives() noexcept override { idleReceivesExpected_.store(true, std::memory_order_relaxed); }

 private:
  // The watchdog's look (proxy/progress/watchdog.h): a receive with no new byte for the limit gets one WARN.
  void watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept override;
  // Rail failover's look (every tick while RAILNET_FAILOVER=1): drives a failed path's query, answer and probes.
  void watchPaths(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept override;
  void describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept override;
  std::string describeReceive(const VerbsRecvRequest& request) const;
  friend class protocol::CommRequest<VerbsRecvComm, VerbsFlushRequest>;
  friend class protocol::CommRequest<VerbsRecvComm, VerbsRecvRequest>;
  MemoryRegistrar& registrar() noexcept override { return connection_; }
  ncclResult_t testRequest(VerbsFlushRequest* request, int* done, int* sizes) noexcept;
  void pollFlush();  // caller holds mutex_
  using Ring = protocol::ReceiveRing<VerbsRecvRequest>;
  static constexpr uint32_t kRing = Ring::kEntries;
  // Chunk-header buffers posted per QP: at most 32 receives x 8 buffers of notices can be outstanding.
  static constexpr int kNoticesPerQp = NCCL_NET_MAX_REQUESTS * protocol::kMaxRecvs;

  ncclResult_t testRequest(VerbsRecvRequest* request, int* done, int* sizes) noexcept;
  void postNotice(int path, int qpIndex, int bufferIndex);
  void postNotices(int path);
  void pollCompletions();
  void applyNotice(int path, const Notice& notice, uint32_t bytes);
  // A group notice: 1..8 members' headers, their payloads already written. Caller holds mutex_.
  void applyGroupNotice(int path, const Notice& notice, uint32_t bytes);
  void pumpControl();
  // Stages a receive's clear-to-send frame and sends it on the clear-to-send path (held while that path moves).
  bool sendClearToSend(uint32_t recvId, const void* frame, size_t size);
  bool postClearToSend(uint32_t recvId);

  // ---- path failover (verbs_recv_failover.cc; docs/failover.md "Verbs"); caller holds mutex_ ----
  // Drained failed paths are marked down and their queries answered; clear-to-sends move off a failed path.
  void advanceFailover();
  // Once the failed clear-to-send path's SENDs have all completed, the next live path that has carried a notice
  // takes them: every clear-to-send not known to have arrived goes again there, in order (the sender drops repeats).
  void moveClearToSends();
  void answerQuery(int path);
  void applyRenew(int path, const char* record, size_t bytes);
  // One control frame from the sender besides kOversize (kPathDown, kPathQuery, kPathRenew). False: recorded.
  bool applyPathFrame(const protocol::FrameHeader& frame, const char* payload);
  static constexpr uint64_t kClearToSendTag = uint64_t{1} << 63;  // in wr_id: a clear-to-send SEND (| recvId)
  std::deque<uint32_t> unackedClearToSends_;  // in posting order, until their SEND completes
  int clearToSendPath_ = 0;
  std::vector<bool> carriedNotice_;  // per path: a notice arrived on its current QPs (the sender's side is at RTS)
  std::vector<std::vector<protocol::ChunkHeader>> queries_;  // per path: the sender's query, answered once drained
  std::vector<bool> queried_;

  std::mutex mutex_;
  // Declared before link_ so they outlive the QPs whose work requests point into them.
  std::vector<Notice> notices_;  // kNoticesPerQp per QP of each path: path-major, then QP
  std::unique_ptr<LinkRegion> noticeRegion_;
  static constexpr size_t kClearToSendBytes = 512;  // as the sender's buffers (verbs_send_comm.h)
  std::vector<char> ctsFrames_;  // one outgoing clear-to-send frame per receive-ring entry
  std::vector<uint32_t> ctsFrameBytes_;  // its length, for sending it again when its path fails
  std::unique_ptr<LinkRegion> ctsRegion_;
  VerbsConnection connection_;
  Ring ring_;  // posted receives (protocol/receive_ring.h); touched under mutex_ only
  bool controlClosed_ = false;
  // iflush (guarded by mutex_): one loopback QP per nic, created on the first flush; a flush READs through
  // every nic, as each NIC only orders its own writes. After a failed READ a QP is retired (polled until its
  // other READs have completed with errors, then destroyed) and the next flush gets a fresh one: an iflush that
  // needs a READ never answers NULL, which NCCL would take as "done".
  FlushMode flushMode_;
  std::vector<std::unique_ptr<LoopbackFlush>> flush_;  // [NIC]
  std::vector<std::unique_ptr<LoopbackFlush>> retiredFlushes_;
  std::vector<VerbsFlushRequest> flushRequests_;
  uint64_t receives_ = 0;                          // guarded by mutex_
  std::atomic<bool> idleReceivesExpected_{false};  // expectIdleReceives()
  progress::WatchRegistration watchdog_;           // last: reset first in the destructor
};

}  // namespace railnet::verbs
