// Where chunks of a receive into GPU memory land before the copy engines move them up: `slots` pinned slots of one
// piece each, used in the order the sender numbered the pieces. Piece s may only use slot s % slots once piece
// s - slots has been copied out of it. Because a sender queues the chunks of each data stream in piece order,
// the oldest unfinished piece always finds its slot free and its chunks at the heads of their streams: a stream
// that waits for a slot never waits on something queued behind it, so the ring cannot deadlock however the
// chunks interleave (docs/design.md, "GPU memory on TCP").
//
// Pure bookkeeping with one lock: helper threads place chunks and count their bytes, the comm's driving thread
// takes landed pieces, copies them and releases their slots.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/protocol/wire.h"

namespace railnet::staging {

// A message of `size` bytes moves in pieces of `pieceBytes` (a power of two): piece i covers
// [i * pieceBytes, min(size, (i + 1) * pieceBytes)).
inline uint64_t pieceCount(uint64_t size, uint64_t pieceBytes) { return (size + pieceBytes - 1) / pieceBytes; }

// The largest power of two <= value (value >= 1).
inline uint64_t powerOfTwoFloor(uint64_t value) {
  uint64_t power = 1;
  while (power <= value / 2) power *= 2;
  return power;
}

class LandingRing {
 public:
  // slots: a power of two in [1, 32768]; pieceBytes: a power of two.
  LandingRing(int slots, uint64_t pieceBytes);

  enum class Verdict { kLand, kWait, kReject };
  // A chunk of staged piece header.pieceSeq: kLand with *stagingOffset (from the start of the staging memory)
  // when its slot is its piece's; kWait while the slot still holds an older piece; kReject with *why when the
  // chunk contradicts its piece (another message, outside the piece, more bytes than the piece has, a piece
  // number already used).
  Verdict place(const protocol::ChunkHeader& header, uint64_t* stagingOffset, std::string* why);
  // The placed chunk's bytes are in. True when that completed its piece.
  bool landed(const protocol::ChunkHeader& header);

  struct LandedPiece {
    int slot;
    protocol::ChunkHeader piece;  // recvId, slot, messageSize; offset and length are the piece's
  };
  // Up to `most` pieces whose bytes are all in, in piece order (stopping at the first still filling); marked as
  // being copied.
  void takeLanded(std::vector<LandedPiece>* out, int most);
  // Copies taken and not yet released.
  bool anyTaken() const;
  // The copy out of `slot` has finished: the slot now waits for the piece `slots` later.
  void release(int slot);
  bool anyLanded() const;
  // One line for a stall report: each slot's state and the piece it holds or waits for.
  std::string describe() const;

  int slots() const { return static_cast<int>(slots_.size()); }
  uint64_t pieceBytes() const { return pieceBytes_; }

 private:
  enum class State : uint8_t { kEmpty, kFilling, kLanded, kCopying };
  struct Slot {
    uint16_t expectedSeq;
    State state = State::kEmpty;
    protocol::ChunkHeader piece{};
    uint64_t placedBytes = 0;
    uint64_t landedBytes = 0;
  };

  uint64_t pieceBytes_;
  mutable std::mutex mutex_;
  std::vector<Slot> slots_;  // guarded by mutex_
  uint16_t nextTaken_ = 0;   // guarded: the piece takeLanded hands out next (pieces are copied in order)
  // Written under mutex_, read without it: NCCL's proxy thread asks anyLanded() on every poll of a receive.
  std::atomic<int> taken_{0};         // taken, not yet released
  std::atomic<int> landedPieces_{0};
};

}  // namespace railnet::staging
