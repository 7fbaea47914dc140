#include "proxy/staging/landing_ring.h"

#include <algorithm>

namespace railnet::staging {

LandingRing::LandingRing(int slots, uint64_t pieceBytes) : pieceBytes_(pieceBytes), slots_(static_cast<size_t>(slots)) {
  for (size_t i = 0; i < slots_.size(); ++i) slots_[i].expectedSeq = static_cast<uint16_t>(i);
}

LandingRing::Verdict LandingRing::place(const protocol::ChunkHeader& header, uint64_t* stagingOffset,
                                        std::string* why) {
  const uint16_t seq = header.pieceSeq;
  const size_t index = seq & (slots_.size() - 1);
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[index];
  if (slot.expectedSeq != seq) {
    // Piece numbers wrap at 2^16: "later" is the next half of the circle. A later piece waits for its slot; an
    // earlier one was already placed and copied, so its number coming again is a protocol error.
    if (static_cast<int16_t>(static_cast<uint16_t>(seq - slot.expectedSeq)) > 0) return Verdict::kWait;
    *why = "staged piece " + std::to_string(seq) + " arrived after its slot moved on to piece " +
           std::to_string(slot.expectedSeq);
    return Verdict::kReject;
  }
  const uint64_t pieceStart = header.offset & ~(pieceBytes_ - 1);
  if (header.offset >= header.messageSize && header.messageSize != 0) {
    *why = "staged chunk at offset " + std::to_string(header.offset) + " of a " + std::to_string(header.messageSize) +
           "-byte message";
    return Verdict::kReject;
  }
  const uint64_t pieceLength = std::min(pieceBytes_, header.messageSize - pieceStart);
  if (slot.state == State::kEmpty) {
    slot.piece = header;
    slot.piece.offset = pieceStart;
    slot.piece.length = pieceLength;
    slot.placedBytes = 0;
    slot.landedBytes = 0;
    slot.state = State::kFilling;
  } else if (slot.state != State::kFilling || slot.piece.recvId != header.recvId || slot.piece.slot != header.slot ||
             slot.piece.messageSize != header.messageSize || slot.piece.offset != pieceStart) {
    *why = "staged piece " + std::to_string(seq) + " mixes chunks of different messages or pieces";
    return Verdict::kReject;
  }
  if (header.offset + header.length > pieceStart + pieceLength || slot.placedBytes + header.length > pieceLength) {
    *why = "staged chunk [" + std::to_string(header.offset) + ", +" + std::to_string(header.length) +
           ") does not fit piece " + std::to_string(seq) + " [" + std::to_string(pieceStart) + ", +" +
           std::to_string(pieceLength) + ")";
    return Verdict::kReject;
  }
  slot.placedBytes += header.length;
  *stagingOffset = index * pieceBytes_ + (header.offset - pieceStart);
  return Verdict::kLand;
}

bool LandingRing::landed(const protocol::ChunkHeader& header) {
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[header.pieceSeq & (slots_.size() - 1)];
  slot.landedBytes += header.length;
  if (slot.landedBytes < slot.piece.length) return false;
  slot.state = State::kLanded;
  ++landedPieces_;
  return true;
}

void LandingRing::takeLanded(std::vector<LandedPiece>* out, int most) {
  std::lock_guard<std::mutex> lock(mutex_);
  // In piece order: copies then finish, and slots free, in the order later pieces need them.
  for (int taken = 0; taken < most; ++taken) {
    const size_t index = nextTaken_ & (slots_.size() - 1);
    Slot& slot = slots_[index];
    if (slot.expectedSeq != nextTaken_ || slot.state != State::kLanded) return;
    slot.state = State::kCopying;
    --landedPieces_;
    out->push_back(LandedPiece{static_cast<int>(index), slot.piece});
    ++nextTaken_;
    ++taken_;
  }
}

void LandingRing::release(int index) {
  std::lock_guard<std::mutex> lock(mutex_);
  Slot& slot = slots_[static_cast<size_t>(index)];
  slot.state = State::kEmpty;
  --taken_;
  slot.expectedSeq = static_cast<uint16_t>(slot.expectedSeq + slots_.size());
}

std::string LandingRing::describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  static const char* const kStateNames[] = {"empty", "filling", "landed", "copying"};
  std::string line = "next piece to copy " + std::to_string(nextTaken_) + "; slots:";
  for (size_t i = 0; i < slots_.size(); ++i) {
    const Slot& slot = slots_[i];
    line += " [" + std::to_string(i) + "] piece " + std::to_string(slot.expectedSeq) + " " +
            kStateNames[static_cast<int>(slot.state)];
    if (slot.state == State::kFilling) {
      line += " " + std::to_string(slot.landedBytes) + "/" + std::to_string(slot.piece.length) + " B of receive " +
              std::to_string(slot.piece.recvId);
    }
  }
  return line;
}

bool LandingRing::anyTaken() const {
  return taken_.load(std::memory_order_acquire) > 0;
}

bool LandingRing::anyLanded() const {
  return landedPieces_.load(std::memory_order_acquire) > 0;
}

}  // namespace railnet::staging
