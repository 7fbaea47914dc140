#include "proxy/shaping/token_bucket.h"

#include <algorithm>
#include <cmath>

namespace railnet::shaping {


TokenBucket::TokenBucket(double bytesPerSecond, uint64_t burstBytes)
    : nsPerByte_(1e9 / bytesPerSecond),
      burstBytes_(burstBytes),
      toleranceNs_(static_cast<int64_t>(std::llround(static_cast<double>(burstBytes) * (1e9 / bytesPerSecond)))) {}

uint64_t TokenBucket::take(std::atomic<int64_t>& state, uint64_t wanted, uint64_t minimum, int64_t nowNs,
                           int64_t* waitNs) const {
  const uint64_t least = std::max<uint64_t>(1, std::min(wanted, minimum));
  int64_t current = state.load(std::memory_order_relaxed);
  for (;;) {
    // `state` is when the bytes granted so far will have drained at the rate; an idle bucket (state in the past)
    // starts from now, so at most a burst is ever banked.
    const int64_t base = std::max(current, nowNs);
    const double roomNs = static_cast<double>(nowNs + toleranceNs_ - base);
    const uint64_t room = roomNs <= 0 ? 0 : static_cast<uint64_t>(roomNs / nsPerByte_);
    if (room < least) {
      *waitNs = static_cast<int64_t>(std::ceil(static_cast<double>(least - room) * nsPerByte_));
      return 0;
    }
    const uint64_t granted = std::min(wanted, room);
    const int64_t next = base + static_cast<int64_t>(std::llround(static_cast<double>(granted) * nsPerByte_));
    if (state.compare_exchange_weak(current, next, std::memory_order_relaxed)) return granted;
  }
}

void TokenBucket::refund(std::atomic<int64_t>& state, uint64_t bytes) const {
  if (bytes == 0) return;
  state.fetch_sub(static_cast<int64_t>(std::llround(static_cast<double>(bytes) * nsPerByte_)), std::memory_order_relaxed);
}

}  // namespace railnet::shaping
