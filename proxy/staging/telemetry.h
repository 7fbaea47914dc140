// Where a comm's staged pieces spend their time, summed over the comm's life and logged once (INFO, NCCL_NET) when
// the comm closes: the numbers that tell a slow copy engine from a slow wire or a thread that polls too rarely.
// A few clock reads per piece (a piece is 64 KiB or more): nothing on the per-byte path.
#pragma once

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace railnet::staging {

class StagingTelemetry {
 public:
  using Clock = std::chrono::steady_clock;
  enum Span : int { kWaitForSlot, kCopy, kPollGap, kSpans };

  void add(Span span, Clock::duration elapsed) {
    Sum& sum = sums_[static_cast<size_t>(span)];
    const uint64_t ns = static_cast<uint64_t>(std::max<int64_t>(0, std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed).count()));
    ++sum.count;
    sum.ns += ns;
    sum.maxNs = std::max(sum.maxNs, ns);
  }
  // The time since the previous call while work was pending (the gap between two polls of the copy queue).
  void polled(bool workPending) {
    if (!workPending) {  // idle comms (every host-memory poll of a GPU comm) read no clock
      lastPoll_ = Clock::time_point{};
      return;
    }
    const Clock::time_point now = Clock::now();
    if (lastPoll_ != Clock::time_point{}) add(kPollGap, now - lastPoll_);
    lastPoll_ = now;
  }
  void countPiece(uint64_t bytes) {
    ++pieces_;
    bytes_ += bytes;
  }
  uint64_t pieces() const { return pieces_; }

  // "412 pieces (412.0 MiB); slot wait mean 3.1 us max 80 us; copy (queued to seen done) mean 22 us max 140 us;
  // poll gap mean 1.2 us max 95 us"
  std::string describe(const char* copyName) const;

 private:
  struct Sum {
    uint64_t count = 0;
    uint64_t ns = 0;
    uint64_t maxNs = 0;
  };
  std::array<Sum, kSpans> sums_{};
  uint64_t pieces_ = 0;
  uint64_t bytes_ = 0;
  Clock::time_point lastPoll_{};
};

}  // namespace railnet::staging
