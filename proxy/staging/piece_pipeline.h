// Moves messages through a few staging slots one piece at a time: a piece takes a free slot, is copied into it,
// leaves from it, and gives the slot back when its sends have completed. Pieces start in the order their messages
// were added, so a message's bytes leave in order and an earlier message is never overtaken by a later one. Used by
// the verbs transport's NVLink hop (docs/design.md, "Routes"). Pure bookkeeping, no CUDA and no verbs; the comm's
// driving thread calls it under the comm's lock.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace railnet::staging {

template <class Message>
class PiecePipeline {
 public:
  struct Piece {
    Message message;
    uint64_t offset = 0;  // in the message
    uint64_t bytes = 0;
    int slot = -1;        // the slot the piece holds until release(slot)
    bool last = false;    // the message's last piece
  };

  // slots >= 1 and pieceBytes >= 1 (the settings table keeps them so).
  PiecePipeline(int slots, uint64_t pieceBytes) : pieceBytes_(pieceBytes), held_(static_cast<size_t>(slots), false) {
    for (int slot = slots - 1; slot >= 0; --slot) free_.push_back(slot);
  }

  // Queues a message of `size` bytes behind the earlier ones; returns how many pieces it makes (0 for 0 bytes,
  // which the caller sends without staging).
  uint64_t add(const Message& message, uint64_t size) {
    if (size == 0) return 0;
    queue_.push_back({message, size, 0});
    return (size + pieceBytes_ - 1) / pieceBytes_;
  }

  // The next piece and the slot it now holds; nullopt when nothing waits or every slot is held.
  std::optional<Piece> start() {
    if (queue_.empty() || free_.empty()) return std::nullopt;
    Queued& front = queue_.front();
    Piece piece;
    piece.message = front.message;
    piece.offset = front.next;
    piece.bytes = front.size - front.next < pieceBytes_ ? front.size - front.next : pieceBytes_;
    piece.slot = free_.back();
    free_.pop_back();
    held_[static_cast<size_t>(piece.slot)] = true;
    front.next += piece.bytes;
    piece.last = front.next == front.size;
    if (piece.last) queue_.pop_front();
    return piece;
  }

  // The slot's piece has left: the slot takes the next piece. False (and nothing changes) for a slot that is not
  // held, which is the caller's bug.
  bool release(int slot) {
    if (slot < 0 || static_cast<size_t>(slot) >= held_.size() || !held_[static_cast<size_t>(slot)]) return false;
    held_[static_cast<size_t>(slot)] = false;
    free_.push_back(slot);
    return true;
  }

  uint64_t pieceBytes() const { return pieceBytes_; }
  int slots() const { return static_cast<int>(held_.size()); }
  int slotsHeld() const { return slots() - static_cast<int>(free_.size()); }
  size_t messagesWaiting() const { return queue_.size(); }
  bool idle() const { return queue_.empty() && free_.size() == held_.size(); }

 private:
  struct Queued {
    Message message;
    uint64_t size;
    uint64_t next;  // the first byte not yet given to a piece
  };
  uint64_t pieceBytes_;
  std::deque<Queued> queue_;
  std::vector<int> free_;   // most recently freed last: a warm slot is reused first
  std::vector<bool> held_;  // [slot]
};

}  // namespace railnet::staging
