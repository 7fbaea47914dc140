// A data stream of the TCP transport: one socket carrying self-describing chunks (protocol/wire.h ChunkHeader +
// payload), served by a helper thread of the progress engine. The sender queues chunks from any thread; the
// helper writes them, and on the receiving end reads each header, asks the owning comm where the payload goes,
// and reads the payload straight into the posted buffer.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "proxy/nic_counters.h"
#include "proxy/progress/engine.h"
#include "proxy/protocol/socket.h"
#include "proxy/protocol/wire.h"
#include "proxy/shaping/fabric_shaper.h"

namespace railnet::tcp {

using protocol::ChunkHeader;
using protocol::Fd;

struct SendOp;

// Implemented by the comm that owns the streams. Called on helper threads.
class StreamOwner {
 public:
  // Where the payload of `header` goes; nullptr rejects the chunk (the owner records why); retryLater() leaves
  // it at the head of its stream, unread, until the owner calls Stream::resumeReceive() (its staging slot is
  // still busy).
  virtual char* resolveChunk(const ChunkHeader& header) noexcept = 0;
  static char* retryLater() noexcept;
  // Another answer of resolveChunk: read the payload and drop it (a copy of a chunk of a receive already finished,
  // sent again after a NIC failed; wire.h kFeatureDataFailover). chunkReceived() is not called for it.
  static char* discard() noexcept;
  // And: not yet, ask again shortly by itself (about every 100 us; nothing wakes it): another stream is writing the
  // same chunk (rail failover's claims), which ends in microseconds, or when that stream fails.
  static char* retrySoon() noexcept;
  virtual void chunkReceived(const ChunkHeader& header) noexcept = 0;
  // A chunk whose payload was being written when its stream failed or was restarted: it will not be whole.
  virtual void chunkAbandoned(const ChunkHeader& /*header*/) noexcept {}
  // The stream hit end-of-stream (endOfStream) or an error (err: its errno, 0 for a protocol error); no more
  // callbacks follow for it.
  virtual void streamFailed(int streamIndex, const char* why, int err, bool endOfStream) noexcept = 0;
  // Sender: stream `thief` has nothing queued; hand it a chunk from a sibling of its NIC with a backlog, served
  // by another helper, or return false (a receiving comm never has one).
  virtual bool stealChunk(int /*thief*/, SendOp* /*out*/) noexcept { return false; }

 protected:
  ~StreamOwner() = default;
};

// One piece of a message to write: header, then `header.length` bytes at `data`.
struct SendOp {
  ChunkHeader header;
  const char* data;
  std::atomic<int>* pending;  // the request's chunks left; decremented once this chunk is in the kernel
  std::atomic<int>* slotPending = nullptr;  // chunks left in the staging slot `data` points into, if any
  std::atomic<uint64_t>* sentBytes = nullptr;  // the request's payload written so far, partial chunks included
};

// What a data stream's helper did: counted in plain fields by that helper alone (no shared cache line on the
// data path) and added to the process-wide totals when the stream is detached (foldTelemetry).
struct StreamTelemetry {
  uint64_t chunksSent = 0;
  uint64_t chunksReceived = 0;
  uint64_t chunksStolen = 0;    // chunks taken from a sibling stream's queue
  uint64_t sendCalls = 0;       // sendmsg() calls that wrote something
  uint64_t sendWouldBlock = 0;  // ... that found the socket full (EAGAIN)
  uint64_t recvCalls = 0;       // recv() calls that read something
  uint64_t recvWouldBlock = 0;  // ... that found nothing (EAGAIN)
};
// One line for the log: the process's totals so far and what they come to per chunk.
std::string streamTelemetryLine();

class Stream final : public progress::EventSource {
 public:
  // counters: the NIC this stream's socket uses (payload bytes are added as chunks complete), or nullptr.
  Stream(Fd fd, StreamOwner* owner, int index, NicCounters* counters = nullptr,
         shaping::EgressShaping shaping = {});

  int fd() const noexcept override { return fd_.get(); }
  int index() const { return index_; }
  uint64_t queuedBytes() const { return queuedBytes_.load(std::memory_order_relaxed); }
  // For stall reports only (racy by nature): the stream holds a chunk back until its staging slot frees.
  bool waitingForSlot() const { return waitingForSlot_.load(std::memory_order_relaxed); }
  // Sender side, any thread: queue a chunk and wake the helper. False (nothing queued) once a stream that releases
  // on failure has failed.
  bool enqueue(const SendOp& op);
  // Before start: when this stream fails, every chunk it holds unwritten or part-written counts as done for its
  // request (pending and slotPending decremented), so the owner may send it again elsewhere (rail failover).
  void releaseOnFailure() { releaseOnFailure_ = true; }
  bool dead() const { return dead_.load(std::memory_order_acquire); }
  // Any thread, a test feature (RAILNET_FAULT_NIC_CUT): shut the socket down both ways, as a failing path would.
  void cut();
  // Failback, while detached from the engine: the stream starts again on `fd` (a socket made through its NIC
  // again), with nothing queued and nothing half read or written; revive() once attached again.
  void restart(Fd fd);
  // While detached: the NIC whose counters this stream adds to from now on (a connection moved to another NIC).
  void setCounters(NicCounters* counters) { counters_ = counters; }
  void setShaping(const shaping::EgressShaping& shaping) { shaping_ = shaping; }
  void revive() { dead_.store(false, std::memory_order_release); }
  // Receiver side, any thread: a chunk this stream was told to retry later may have a destination now.
  void resumeReceive() { wake(); }
  // Any helper: moves the oldest queued chunk to *out (for an idle sibling) if one more stays queued behind it
  // and it is not a staged chunk (those keep their stream's piece order).
  bool giveQueuedChunk(SendOp* out);

  // Adds this stream's counts to the process-wide totals; call once no helper touches the stream (detached).
  void foldTelemetry() const;

  // progress::EventSource, helper thread only.
  uint64_t progress() noexcept override;
  void markReady(bool readable, bool writable, bool peerClosed) noexcept override;
  int64_t retryAtNs() const noexcept override;
  void failWith(const char* why, int err) noexcept override;
  uint64_t affinityKey() const noexcept override { return connectionKey_; }

 private:
  static constexpr size_t kMaxGather = 8;  // chunks gathered into one sendmsg
  static constexpr uint64_t kDiscardBytes = 64 * 1024;  // scratch for dropped payloads
  // Moves up to `budget` bytes of chunks from the shared queue to sending_, or steals one; false: nothing to send.
  bool refill(uint64_t budget);
  uint64_t progressSend();
  uint64_t progressReceive();
  // A whole header sits in nextHeader_: take it and resolve its destination; false once the stream has failed.
  bool startChunk();
  // Asks the owner where incoming_'s payload goes; false once the stream has failed (awaitingDestination_ set
  // while the owner says "later").
  bool resolveIncoming();
  void finishChunk();
  void fail(const char* why, int err, bool endOfStream);
  void abandonIncoming();  // helper (or detached): tells the owner a chunk half written will not be whole

  Fd fd_;
  StreamOwner* owner_;
  int index_;
  NicCounters* counters_;
  shaping::EgressShaping shaping_;  // fabric emulation: what this stream may write when (inactive: anything)
  int64_t shapedUntilNs_ = 0;       // helper only: nothing is written before this CLOCK_MONOTONIC time
  bool shapedWait_ = false;         // helper only: the last send pass stopped for the bucket
  uint64_t connectionKey_;  // the same for both ends of one TCP connection (its two addresses, in order)
  const uint64_t passBytes_;      // most bytes moved per direction in one progress() (RAILNET_TCP_PASS_BYTES)

  std::mutex queueMutex_;
  std::deque<SendOp> queue_;  // guarded by queueMutex_
  std::atomic<uint64_t> queuedBytes_{0};

  // Helper-only state.
  std::deque<SendOp> sending_;
  uint64_t sentOfFront_ = 0;
  ChunkHeader incoming_{};                  // the chunk whose payload is being read
  char nextHeader_[sizeof(ChunkHeader)]{};  // the next header, filled by the same reads as the payload
  uint64_t headerBytes_ = 0;                // of nextHeader_
  char* destination_ = nullptr;
  uint64_t payloadLeft_ = 0;
  bool inPayload_ = false;
  bool awaitingDestination_ = false;  // incoming_ was told to retry later: nothing more is read until it lands
  bool discarding_ = false;           // incoming_'s payload is read into discardBuffer_ and dropped
  bool retryingSoon_ = false;         // awaitingDestination_ by retrySoon(): retryAtNs() brings it back
  std::unique_ptr<char[]> discardBuffer_;  // made on first use
  bool releaseOnFailure_ = false;
  std::atomic<bool> waitingForSlot_{false};  // awaitingDestination_, published for stall reports
  bool readable_ = true;
  bool peerClosed_ = false;  // epoll saw the peer's FIN (or an error): short reads no longer mean drained
  bool writable_ = true;
  StreamTelemetry telemetry_;
  std::atomic<bool> dead_{false};
};

}  // namespace railnet::tcp
