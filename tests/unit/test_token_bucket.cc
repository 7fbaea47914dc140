// The fabric emulation (proxy/shaping/): the byte bucket on a clock driven by hand, and which buckets a stream
// draws from.
#include <catch2/catch.hpp>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "proxy/shaping/fabric_shaper.h"
#include "proxy/shaping/token_bucket.h"

using railnet::shaping::EgressShaping;
using railnet::shaping::FabricShaper;
using railnet::shaping::TokenBucket;

namespace {
constexpr double kRate = 1e9;              // 1 byte per ns
constexpr uint64_t kBurst = 1000;          // bytes
constexpr int64_t kStart = 1000000000000;  // an arbitrary "now"
}  // namespace

TEST_CASE("an idle bucket grants one burst at once, then the rate", "[shaping]") {
  TokenBucket bucket(kRate, kBurst);
  std::atomic<int64_t> state{0};  // zero: long past, so full
  int64_t wait = -1;
  CHECK(bucket.take(state, 5000, 100, kStart, &wait) == kBurst);
  CHECK(bucket.take(state, 5000, 100, kStart, &wait) == 0);  // empty now
  CHECK(wait == 100);                                           // 100 bytes' worth at 1 B/ns
  CHECK(bucket.take(state, 5000, 100, kStart + 100, &wait) == 100);
  // After a long idle spell it still holds no more than one burst.
  CHECK(bucket.take(state, 5000, 100, kStart + 1000000, &wait) == kBurst);
}

TEST_CASE("over time the bucket grants the rate, whatever the request sizes", "[shaping]") {
  TokenBucket bucket(kRate, kBurst);
  std::atomic<int64_t> state{0};
  uint64_t total = 0;
  int64_t now = kStart;
  for (int i = 0; i < 10000; ++i) {
    int64_t wait = 0;
    const uint64_t got = bucket.take(state, 300 + static_cast<uint64_t>(i % 7) * 100, 200, now, &wait);
    total += got;
    now += got == 0 ? wait : 37;
  }
  // Granted bytes track elapsed time at 1 B/ns, plus at most the first burst.
  const double elapsed = static_cast<double>(now - kStart);
  CHECK(static_cast<double>(total) <= elapsed + kBurst + 1);
  CHECK(static_cast<double>(total) >= elapsed - 2000);
}

TEST_CASE("refunded bytes can be taken again", "[shaping]") {
  TokenBucket bucket(kRate, kBurst);
  std::atomic<int64_t> state{0};
  int64_t wait = 0;
  CHECK(bucket.take(state, kBurst, 1, kStart, &wait) == kBurst);
  bucket.refund(state, 400);  // the socket took only 600
  CHECK(bucket.take(state, kBurst, 1, kStart, &wait) == 400);
}

TEST_CASE("a request smaller than the minimum waits only for itself", "[shaping]") {
  TokenBucket bucket(kRate, kBurst);
  std::atomic<int64_t> state{0};
  int64_t wait = 0;
  CHECK(bucket.take(state, kBurst, 1, kStart, &wait) == kBurst);
  CHECK(bucket.take(state, 50, 500, kStart, &wait) == 0);
  CHECK(wait == 50);  // min(wanted, minimum) = 50 bytes
}

TEST_CASE("streams draw from their NIC's bucket, and across rails from the host's one spine", "[shaping]") {
  // NICs at 1 GB/s (burst 1 MB), spine at 250 MB/s (burst 256 KiB); a segment of this test's own.
  auto shaper = FabricShaper::createForTest(1e9, 250e6, "unit-test-" + std::to_string(getpid()));
  const EgressShaping sameRail = shaper->streamShaping(0, 0);
  const EgressShaping crossA = shaper->streamShaping(1, 0);
  const EgressShaping crossB = shaper->streamShaping(2, 3);
  const EgressShaping unshapedRail = shaper->streamShaping(-1, 5);  // no rail: its own NIC bucket, no spine
  REQUIRE(sameRail.active());
  const int64_t now = 1000000000000;
  int64_t wait = 0;
  CHECK(sameRail.take(10000000, now, &wait) == 1000000);  // the NIC's burst; the spine is not involved
  CHECK(crossA.take(10000000, now, &wait) == 256 * 1024);  // NIC 1 is full, the spine allows its burst
  CHECK(crossB.take(10000000, now, &wait) == 0);           // NIC 2 is full, but the spine is spent
  CHECK(wait > 0);
  CHECK(unshapedRail.take(10000000, now, &wait) == 1000000);
  // What the spine refused went back to NIC 2: its whole burst is still there for same-rail traffic.
  const EgressShaping sameRail2 = shaper->streamShaping(2, 2);
  CHECK(sameRail2.take(10000000, now, &wait) == 1000000);
}
