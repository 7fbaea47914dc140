// The doorbell ring's protocol (proxy/doorbell/ring.h) with CPU threads standing in for GPU producers: every
// ticket taken once, in ticket order, never half-written; a full ring holds producers back; a reserved but
// unpublished ticket holds later ones back; the first error sticks.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "proxy/doorbell/ring.h"
#include "tests/unit/doorbell_test_ring.h"

namespace {

using railnet::doorbell::Descriptor;
using railnet::doorbell::Op;
using railnet::doorbell::postFromHost;
using railnet::doorbell::RingConsumer;
using railnet::doorbell::RingControl;
using railnet::doorbell::RingError;

using Ring = TestRing;

// A descriptor whose every field derives from (producer, index), so a torn or mixed-up slot shows.
Descriptor made(uint32_t producer, uint64_t index) {
  Descriptor d{};
  d.op = static_cast<uint32_t>(Op::kPutSignal);
  d.peer = producer;
  d.sourceWindow = static_cast<uint32_t>(index * 3 + 1);
  d.targetWindow = static_cast<uint32_t>(index * 5 + 2);
  d.sourceOffset = index * 7 + producer;
  d.targetOffset = index * 11 + producer;
  d.bytes = index;
  d.signal = producer * 1000 + 1;
  d.signalOp = 1;
  d.signalValue = index ^ 0x5a5a5a5a5a5aull;
  return d;
}

bool consistent(const Descriptor& d) {
  const uint64_t index = d.bytes;
  const Descriptor expected = made(d.peer, index);
  return d.op == expected.op && d.sourceWindow == expected.sourceWindow && d.targetWindow == expected.targetWindow &&
         d.sourceOffset == expected.sourceOffset && d.targetOffset == expected.targetOffset &&
         d.signal == expected.signal && d.signalOp == expected.signalOp && d.signalValue == expected.signalValue;
}

}  // namespace

TEST_CASE("doorbell descriptors are one 64-byte slot, published by their last word", "[doorbell]") {
  STATIC_REQUIRE(sizeof(Descriptor) == 64);
  STATIC_REQUIRE(alignof(Descriptor) == 64);
  STATIC_REQUIRE(offsetof(Descriptor, sequence) == 56);
  STATIC_REQUIRE(offsetof(RingControl, consumed) == 64);
  STATIC_REQUIRE(offsetof(RingControl, completed) == 128);
  STATIC_REQUIRE(offsetof(RingControl, error) == 192);
}

TEST_CASE("one producer: tickets come out in order with every field, and free their slots", "[doorbell]") {
  Ring ring(8);
  RingConsumer consumer = ring.consumer();
  Descriptor out{};
  REQUIRE_FALSE(consumer.take(&out));  // a fresh ring: sequence 0 is never a ticket's
  for (uint64_t i = 0; i < 100; ++i) {
    REQUIRE(postFromHost(ring.slots.get(), &ring.control, ring.capacity, made(7, i)));
    REQUIRE(consumer.take(&out));
    CHECK(out.sequence == i + 1);
    CHECK(out.bytes == i);
    CHECK(consistent(out));
    CHECK(ring.control.consumed == i + 1);
    // The slot still holds this lap's descriptor; it must not be taken again as the next ticket.
    REQUIRE_FALSE(consumer.take(&out));
  }
  CHECK(consumer.taken() == 100);
}

TEST_CASE("a full ring holds the producer back until the engine takes a slot", "[doorbell]") {
  Ring ring(4);
  for (uint64_t i = 0; i < 4; ++i) REQUIRE(postFromHost(ring.slots.get(), &ring.control, 4, made(1, i), 1000));
  // The fifth ticket is reserved but has no room: the producer gives up after its spins here (a kernel would
  // keep waiting, reading `consumed`), and the reserved ticket is what the consumer then sees as unpublished.
  CHECK_FALSE(postFromHost(ring.slots.get(), &ring.control, 4, made(1, 4), 1000));
  RingConsumer consumer = ring.consumer();
  Descriptor out{};
  for (uint64_t i = 0; i < 4; ++i) {
    REQUIRE(consumer.take(&out));
    CHECK(out.bytes == i);
  }
  CHECK_FALSE(consumer.take(&out));
  CHECK(consumer.reservedButUnpublished());
}

TEST_CASE("a reserved but unpublished ticket holds back the later ones, which then come in order", "[doorbell]") {
  Ring ring(16);
  RingConsumer consumer = ring.consumer();
  // Ticket 0 is reserved by a "slow producer" that has not written its slot yet; tickets 1 and 2 are published.
  const uint64_t slow = std::atomic_ref<uint64_t>(ring.control.reserved).fetch_add(1);
  REQUIRE(slow == 0);
  REQUIRE(postFromHost(ring.slots.get(), &ring.control, 16, made(2, 1)));
  REQUIRE(postFromHost(ring.slots.get(), &ring.control, 16, made(2, 2)));
  Descriptor out{};
  CHECK_FALSE(consumer.take(&out));
  CHECK(consumer.reservedButUnpublished());
  // The slow producer publishes: all three come out in ticket order.
  Descriptor late = made(2, 0);
  std::memcpy(&ring.slots[0], &late, railnet::doorbell::kFieldBytes);
  std::atomic_ref<uint64_t>(ring.slots[0].sequence).store(1, std::memory_order_release);
  for (uint64_t i = 0; i < 3; ++i) {
    REQUIRE(consumer.take(&out));
    CHECK(out.bytes == i);
  }
  CHECK_FALSE(consumer.reservedButUnpublished());
}

TEST_CASE("many producers on a small ring: every ticket taken exactly once, never torn", "[doorbell]") {
  constexpr uint32_t kProducers = 4;
  constexpr uint64_t kEach = 5000;
  Ring ring(32);
  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&ring, p] {
      for (uint64_t i = 0; i < kEach; ++i) postFromHost(ring.slots.get(), &ring.control, ring.capacity, made(p, i));
    });
  }
  RingConsumer consumer = ring.consumer();
  std::set<std::pair<uint32_t, uint64_t>> seen;
  std::vector<uint64_t> nextOf(kProducers, 0);
  uint64_t torn = 0, outOfOrder = 0, wrongSequence = 0;
  Descriptor out{};
  while (consumer.taken() < kProducers * kEach) {
    if (!consumer.take(&out)) {
      std::this_thread::yield();
      continue;
    }
    torn += consistent(out) ? 0 : 1;
    wrongSequence += out.sequence == consumer.taken() ? 0 : 1;
    // One producer's tickets are increasing, so its descriptors come out in its own order.
    if (out.peer < kProducers) {
      outOfOrder += out.bytes == nextOf[out.peer] ? 0 : 1;
      nextOf[out.peer] = out.bytes + 1;
    }
    seen.insert({out.peer, out.bytes});
  }
  for (std::thread& t : producers) t.join();
  CHECK(torn == 0);
  CHECK(outOfOrder == 0);
  CHECK(wrongSequence == 0);
  CHECK(seen.size() == kProducers * kEach);
  CHECK_FALSE(consumer.take(&out));
  CHECK(ring.control.reserved == kProducers * kEach);
  CHECK(ring.control.consumed == kProducers * kEach);
}

TEST_CASE("the ring's first error sticks, and completion is what the engine marks", "[doorbell]") {
  Ring ring(8);
  RingConsumer consumer = ring.consumer();
  consumer.markCompleted(5);
  CHECK(ring.control.completed == 5);
  CHECK(ring.control.error == 0);
  consumer.fail(RingError::kPeerFailed);
  consumer.fail(RingError::kBadDescriptor);
  CHECK(ring.control.error == static_cast<uint32_t>(RingError::kPeerFailed));
}
