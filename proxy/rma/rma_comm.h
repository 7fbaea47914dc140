// One-sided puts with signals (NCCL's GIN proxy backend and RMA plugin) over any railnet Transport, built from the
// transport's own two-sided connections: per peer, a control connection carrying 64-byte records
// (control_record.h) and a data connection carrying the payloads, both ways. The target is passive: its progress
// (NCCL's GIN progress thread calls it continuously) takes each announced put, receives the payload straight into
// the named window at the named offset (the transport moves GPU memory itself: copy-engine staging on TCP), and
// applies the signal once that payload and every earlier one from the same peer have landed. Small puts from host
// memory travel inside their control message (control_record.h kInlinePutBytes).
// docs/design.md "One-sided puts (GIN)"; docs/decisions.md D69.
//
// Thread safety: every public call takes the comm's lock; NCCL calls registration from the application's thread
// while its GIN progress thread puts, tests and progresses the same comm.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "proxy/rma/control_record.h"
#include "proxy/rma/mesh.h"
#include "proxy/rma/target_writer.h"
#include "proxy/transport.h"

namespace railnet::rma {

// A registered window (NCCL's mhandle, and its ginHandle: the same pointer).
struct Window;
// One put (NCCL's request), or an internal control record (a window announcement).
struct Operation;
struct Peer;

struct PutArguments {
  int context = 0;
  uint64_t srcOffset = 0;
  void* srcHandle = nullptr;
  size_t size = 0;
  uint64_t dstOffset = 0;
  void* dstHandle = nullptr;
  uint32_t rank = 0;
  SignalOp signalOp = SignalOp::kNone;
  uint64_t signalOffset = 0;
  void* signalHandle = nullptr;
  uint64_t signalValue = 0;
};

// An opaque key a rank announces with a window (an address and a key, as a NIC names the window).
struct WindowKey {
  uint64_t address = 0;
  uint64_t key = 0;
};

class RmaComm {
 public:
  // Collective: connects to every rank (itself included) through `listen`'s device and accepts every rank's
  // connections. Blocks until the mesh stands; throws railnet::Error naming the peer when a connection fails.
  RmaComm(RmaListen& listen, void* const* handles, int nranks, int rank);
  ~RmaComm();
  RmaComm(const RmaComm&) = delete;
  RmaComm& operator=(const RmaComm&) = delete;

  int rank() const { return rank_; }
  int ranks() const { return nranks_; }

  // Collective, same order on every rank: registers [data, data + size) (NCCL_PTR_HOST or NCCL_PTR_CUDA) on every
  // data connection and learns every rank's size of this window. Returns the handle NCCL keeps (mhandle and
  // ginHandle). Throws railnet::Error.
  // `announce` (optional): a key this rank's peers learn with the window (railnet's doorbells announce the
  // window's NIC address and rkey for their mlx5 direct path); peerKey() reads the peers' afterwards.
  void* registerWindow(void* data, size_t size, int type, bool dmabuf, uint64_t dmabufOffset, int fd,
                       const WindowKey* announce = nullptr);
  void deregisterWindow(void* handle);
  // What `rank` announced with window `handle` (registered on every rank); false when it announced nothing.
  bool peerKey(int rank, void* handle, WindowKey* key) const;

  // Queues a put (and its signal). Returns ncclInvalidArgument, writing nothing, for a handle that is not a window
  // of this comm, a range outside the local or the target's window, or a signal word outside its window; the
  // comm's first failure (a peer that died) for every call after it. *request: what test() takes.
  ncclResult_t put(const PutArguments& arguments, void** request) noexcept;
  // done = 1 once the source may be reused (local completion); the request is then released. A failed put is
  // done with its error (NCCL 2.28 ignores test's result; the comm's next put returns it).
  ncclResult_t test(void* request, int* done) noexcept;
  // A request that is already done: NCCL 2.30's iflush (every put's payload is in place when its request
  // completes at the target, and railnet issues no gets whose data could still be in flight).
  ncclResult_t completedRequest(void** request) noexcept;
  // Moves what can move: control records, payloads, signals. The comm's failure, if any.
  ncclResult_t progress() noexcept;
  // True once a peer or a signal write has failed (every later put then fails).
  bool failed() const;

 private:
  void progressLocked();
  void pumpOutgoing(Peer& peer);
  void pumpIncoming(Peer& peer);
  void takeRecord(Peer& peer, const ControlRecord& record, const char* inlinePayload);
  void failPeer(Peer& peer, const std::string& why);
  Window* windowOf(void* handle) const;
  Operation* newOperation();
  ncclResult_t checkPut(const PutArguments& arguments, Window** src, Window** dst, Window** signal) const;

  mutable std::mutex mutex_;
  const int nranks_;
  const int rank_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank
  std::unordered_map<const void*, std::unique_ptr<Window>> windows_;
  std::unordered_map<uint32_t, Window*> windowsById_;
  uint32_t nextWindowId_ = 0;
  std::vector<std::unique_ptr<Operation>> operations_;  // every operation ever made; reused through freeOperations_
  std::vector<Operation*> freeOperations_;
  std::unordered_set<const void*> liveRequests_;  // puts handed to NCCL and not yet reported done
  TargetWriter writer_;  // inline payloads and signals, in order
  std::string failure_;  // the first failure; every later call reports it
  ncclResult_t failureCode_ = ncclSuccess;
};

// NCCL 2.30's contexts (createContext): a comm and how many contexts it was asked for. Puts on every context of a
// comm share its per-peer order, which is stronger than GIN's per-context order.
struct RmaContext {
  RmaComm* comm;
  int contexts;
};

}  // namespace railnet::rma
