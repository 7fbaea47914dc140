// Multireceive aggregation's bookkeeping (proxy/protocol/held_group.h): what is held, when held members must go
// first, when the wait is up, and what a flush hands over.
#include <catch2/catch.hpp>

#include <chrono>
#include <thread>
#include <vector>

#include "proxy/protocol/held_group.h"

using railnet::protocol::ClearToSendQueue;
using railnet::protocol::HeldGroup;
using namespace std::chrono_literals;

namespace {
ClearToSendQueue::Destination member(uint32_t recvId, int slot, int groupSize, int unclaimed) {
  return ClearToSendQueue::Destination{.recvId = recvId, .slot = slot, .groupSize = groupSize, .groupUnclaimed = unclaimed};
}
}  // namespace

TEST_CASE("only small sends into groups of two or more are held, and only with a wait", "[aggregation]") {
  HeldGroup<int> on(20us);
  CHECK(on.holds(member(1, 0, 8, 7), true));
  CHECK_FALSE(on.holds(member(1, 0, 8, 7), false));  // too large to travel with others
  CHECK_FALSE(on.holds(member(1, 0, 1, 0), true));   // a single receive is never held
  HeldGroup<int> off(0us);
  CHECK_FALSE(off.holds(member(1, 0, 8, 7), true));
}

TEST_CASE("held members go first before any send that is not one of them", "[aggregation]") {
  HeldGroup<int> group(1s);
  CHECK_FALSE(group.mustFlushBefore(false, 1));  // nothing held
  group.add(10, 1);
  CHECK(group.anyHeld());
  CHECK_FALSE(group.mustFlushBefore(true, 1));  // another member of the same receive joins
  CHECK(group.mustFlushBefore(false, 1));       // a send of the same receive that is not held (a large one)
  CHECK(group.mustFlushBefore(true, 2));        // a member of another receive
  std::vector<int> sent;
  group.flush([&](std::vector<int>& members) { sent = members; });
  CHECK(sent == std::vector<int>{10});
  CHECK(group.empty());
  CHECK_FALSE(group.anyHeld());
  CHECK(group.groupsCarried() == 0);  // one member alone is not a carried group
}

TEST_CASE("a flush hands over the members in the order they were held and counts carried groups", "[aggregation]") {
  HeldGroup<int> group(1s);
  for (int m : {3, 1, 2}) group.add(m, 7);
  std::vector<int> sent;
  group.flush([&](std::vector<int>& members) { sent = members; });
  CHECK(sent == std::vector<int>{3, 1, 2});
  CHECK(group.groupsCarried() == 1);
  CHECK(group.membersCarried() == 3);
  int calls = 0;
  group.flush([&](std::vector<int>&) { ++calls; });  // nothing held: no call
  CHECK(calls == 0);
}

TEST_CASE("the wait counts from the oldest held member", "[aggregation]") {
  // Half a second: "not due yet" must hold even on a loaded machine that deschedules this thread for a while.
  HeldGroup<int> group(500ms);
  CHECK_FALSE(group.due());  // nothing held is never due
  group.add(1, 4);
  CHECK_FALSE(group.due());
  std::this_thread::sleep_for(600ms);
  group.add(2, 4);  // a later member does not restart the wait
  CHECK(group.due());
}
