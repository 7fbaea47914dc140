#include "proxy/protocol/chunk_ledger.h"

#include <algorithm>

namespace railnet::protocol {

ChunkLedger::Verdict ChunkLedger::add(uint64_t offset, uint64_t length, uint64_t messageSize, std::string* why) {
  if (offset > messageSize || length > messageSize - offset) {
    *why = "a chunk of " + std::to_string(length) + " bytes at offset " + std::to_string(offset) +
           " outside its message of " + std::to_string(messageSize) + " bytes";
    return Verdict::kConflict;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  // The chunk is whole: its claim, if it had one, ends.
  std::erase_if(claims_, [&](const Range& claimed) { return claimed.begin == offset && claimed.end == offset + length; });
  if (!sized_) {
    sized_ = true;
    messageSize_ = messageSize;
  } else if (messageSize != messageSize_) {
    *why = "chunks of one buffer name messages of " + std::to_string(messageSize_) + " and " +
           std::to_string(messageSize) + " bytes";
    return Verdict::kConflict;
  }
  if (length == 0) {
    // Only an empty message has an empty chunk worth counting: it completes the message once.
    if (messageSize != 0 || complete_) return Verdict::kRepeated;
    complete_ = true;
    return Verdict::kComplete;
  }
  const uint64_t end = offset + length;
  // The first placed range that ends after `offset`: the only one that can share bytes with [offset, end) first.
  auto over = std::upper_bound(ranges_.begin(), ranges_.end(), offset,
                               [](uint64_t at, const Range& range) { return at < range.end; });
  if (over != ranges_.end() && over->begin < end) {
    if (over->begin <= offset && end <= over->end) return Verdict::kRepeated;
    *why = "a chunk of bytes " + std::to_string(offset) + "-" + std::to_string(end) + " overlaps placed bytes " +
           std::to_string(over->begin) + "-" + std::to_string(over->end) + " in part";
    return Verdict::kConflict;
  }
  // Disjoint from every placed range: merge it with the ranges it touches (one ending at `offset`, one beginning at
  // `end`), so in-order and interleaved arrivals keep a few ranges.
  const bool touchesLeft = over != ranges_.begin() && (over - 1)->end == offset;
  const bool touchesRight = over != ranges_.end() && over->begin == end;
  if (touchesLeft && touchesRight) {
    (over - 1)->end = over->end;
    ranges_.erase(over);
  } else if (touchesLeft) {
    (over - 1)->end = end;
  } else if (touchesRight) {
    over->begin = offset;
  } else {
    ranges_.insert(over, Range{offset, end});
  }
  const uint64_t placed = placed_.load(std::memory_order_relaxed) + length;
  placed_.store(placed, std::memory_order_relaxed);
  if (placed == messageSize_) {
    complete_ = true;
    return Verdict::kComplete;
  }
  return Verdict::kCounted;
}

bool ChunkLedger::coveredLocked(uint64_t offset, uint64_t end) const {
  auto over = std::upper_bound(ranges_.begin(), ranges_.end(), offset,
                               [](uint64_t at, const Range& range) { return at < range.end; });
  return over != ranges_.end() && over->begin <= offset && end <= over->end;
}

ChunkLedger::Claim ChunkLedger::claim(uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint64_t end = offset + length;
  if (length == 0 ? complete_ : coveredLocked(offset, end)) return Claim::kPlaced;
  for (const Range& claimed : claims_) {
    if (claimed.begin == offset && claimed.end == end) return Claim::kBusy;
  }
  claims_.push_back(Range{offset, end});
  return Claim::kGo;
}

void ChunkLedger::release(uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::erase_if(claims_, [&](const Range& claimed) { return claimed.begin == offset && claimed.end == offset + length; });
}

}  // namespace railnet::protocol
