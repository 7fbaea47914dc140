// Which bytes of one receive buffer have been placed, each counted exactly once. A chunk is self-describing
// (wire.h ChunkHeader: offset, length, the message's size), so the receiver does not trust that chunks are disjoint
// or agree: it keeps the placed ranges and counts only what is new. A chunk that repeats placed bytes exactly is
// harmless and counts nothing (rail failover sends a chunk again when the NIC that carried it failed; docs/
// failover.md); a chunk that overlaps placed bytes in part, or names another message size, is a protocol error,
// where a byte counter would have completed the buffer with bytes missing.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace railnet::protocol {

class ChunkLedger {
 public:
  enum class Verdict {
    kCounted,    // new bytes; the message is not complete yet
    kComplete,   // new bytes that complete the message (exactly one add per message returns this)
    kRepeated,   // every byte was placed before: nothing counted
    kConflict,   // a protocol error (partial overlap, another message size, out of bounds): nothing counted
  };

  // Rail failover sends a chunk again while its first copy may still be on its way: two streams must never write
  // the same bytes at once, and a copy must not land after its buffer completed. So on such connections a stream
  // claims a chunk's range before it writes it (claim), and add() or release() ends the claim.
  enum class Claim {
    kGo,      // claimed: write it, then add() (or release() when the stream fails before the chunk is whole)
    kPlaced,  // every byte was placed before: drop the payload
    kBusy,    // another stream is writing exactly this chunk now: wait for its add() or release()
  };
  Claim claim(uint64_t offset, uint64_t length);
  void release(uint64_t offset, uint64_t length);

  // For the next message into this buffer. Not concurrent with add() (the buffer is being posted).
  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    claims_.clear();
    ranges_.clear();
    sized_ = false;
    messageSize_ = 0;
    complete_ = false;
    placed_.store(0, std::memory_order_relaxed);
  }

  // Any thread: records bytes [offset, offset + length) of a message of messageSize bytes. `why` says what a
  // kConflict was.
  Verdict add(uint64_t offset, uint64_t length, uint64_t messageSize, std::string* why);

  // Any thread: every byte of [offset, offset + length) is placed (an empty chunk: the empty message is complete).
  bool holds(uint64_t offset, uint64_t length) const {
    std::lock_guard<std::mutex> lock(mutex_);
    return length == 0 ? complete_ : coveredLocked(offset, offset + length);
  }

  // Bytes placed so far (any thread; the watchdog's measure of progress).
  uint64_t placed() const { return placed_.load(std::memory_order_relaxed); }
  // Separate placed ranges: 1 once the message is in, whatever order its chunks came in.
  size_t rangeCount() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return ranges_.size();
  }

 private:
  struct Range {
    uint64_t begin;
    uint64_t end;
  };

  mutable std::mutex mutex_;
  std::vector<Range> ranges_;  // sorted, disjoint, touching ranges merged; guarded by mutex_
  std::vector<Range> claims_;  // chunks a stream is writing now (failover connections); guarded by mutex_
  bool coveredLocked(uint64_t offset, uint64_t end) const;  // holds mutex_: placed in full
  bool sized_ = false;        // the first chunk has named the message's size; guarded by mutex_
  uint64_t messageSize_ = 0;  // guarded by mutex_
  bool complete_ = false;                // guarded by mutex_
  std::atomic<uint64_t> placed_{0};
};

}  // namespace railnet::protocol
