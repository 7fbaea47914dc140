// CLOCK_MONOTONIC in nanoseconds: the one clock railnet compares across threads and processes of a host (the
// helpers' retry times, the fabric-shaping buckets in shared memory).
#pragma once

#include <time.h>

#include <cstdint>

namespace railnet {

inline int64_t monotonicNs() noexcept {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<int64_t>(now.tv_sec) * 1000000000 + now.tv_nsec;
}

}  // namespace railnet
