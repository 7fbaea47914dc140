// A token bucket for bytes, kept as one number (GCRA's theoretical arrival time, in ns of CLOCK_MONOTONIC) so that
// several threads and processes can share it through an atomic in shared memory (fabric_shaper.h). Pure
// arithmetic on a caller-supplied clock: tests drive time by hand.
#pragma once

#include <atomic>
#include <cstdint>

namespace railnet::shaping {

class TokenBucket {
 public:
  // `bytesPerSecond` > 0; `burstBytes`: what may leave at once after an idle spell.
  TokenBucket(double bytesPerSecond, uint64_t burstBytes);

  // Up to `wanted` bytes may leave at `nowNs`: returns how many (then `state` has advanced), or 0 with *waitNs set
  // to how long until `minimum` bytes (min(wanted, minimum)) could. `state` is the bucket's shared number.
  uint64_t take(std::atomic<int64_t>& state, uint64_t wanted, uint64_t minimum, int64_t nowNs, int64_t* waitNs) const;
  // Returns bytes taken but not sent (a socket that took less than granted).
  void refund(std::atomic<int64_t>& state, uint64_t bytes) const;

  double nsPerByte() const { return nsPerByte_; }
  uint64_t burstBytes() const { return burstBytes_; }

 private:
  double nsPerByte_;
  uint64_t burstBytes_;
  int64_t toleranceNs_;  // the burst, in time
};

}  // namespace railnet::shaping
