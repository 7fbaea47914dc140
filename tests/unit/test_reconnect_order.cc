// The order in which a re-made control connection tries pairs of NICs (proxy/protocol/session_service.h
// reconnectOrder): each rail to itself first, failed NICs last, every pair tried once.
#include <catch2/catch.hpp>

#include <set>
#include <utility>
#include <vector>

#include "proxy/protocol/session_service.h"

using railnet::protocol::ReconnectPlan;
using railnet::protocol::SocketAddress;
using railnet::protocol::reconnectOrder;
using Pairs = std::vector<std::pair<int, int>>;

namespace {
ReconnectPlan planOf(size_t locals, size_t targets, uint64_t avoid) {
  ReconnectPlan plan;
  plan.locals.resize(locals);
  plan.targets.resize(targets);
  plan.avoid = avoid;
  return plan;
}
}  // namespace

TEST_CASE("a re-made control connection tries each rail to itself, then across, failed NICs last", "[reconnect]") {
  CHECK(reconnectOrder(planOf(2, 2, 0)) == Pairs{{0, 0}, {1, 1}, {0, 1}, {1, 0}});
  // NIC 0 failed here: the other rail first, then the pairs that cross to or from NIC 0's rail.
  CHECK(reconnectOrder(planOf(2, 2, 1)) == Pairs{{1, 1}, {0, 0}, {0, 1}, {1, 0}});
  const Pairs three = reconnectOrder(planOf(3, 3, 2));
  CHECK(three.front() == std::pair<int, int>{0, 0});
  CHECK(three[1] == std::pair<int, int>{2, 2});
  CHECK(three[2] == std::pair<int, int>{0, 2});  // a cross pair away from NIC 1 before any pair through it
  // Every pair exactly once.
  for (size_t locals : {1u, 2u, 3u}) {
    for (size_t targets : {1u, 2u, 4u}) {
      for (uint64_t avoid : {0ull, 1ull, 5ull}) {
        const Pairs order = reconnectOrder(planOf(locals, targets, avoid));
        CHECK(order.size() == locals * targets);
        CHECK(std::set<std::pair<int, int>>(order.begin(), order.end()).size() == order.size());
      }
    }
  }
}

TEST_CASE("without bound sources the kernel chooses, and each target is tried, avoided ones last", "[reconnect]") {
  CHECK(reconnectOrder(planOf(0, 3, 0)) == Pairs{{-1, 0}, {-1, 1}, {-1, 2}});
  CHECK(reconnectOrder(planOf(0, 3, 1)) == Pairs{{-1, 1}, {-1, 2}, {-1, 0}});
  CHECK(reconnectOrder(planOf(0, 0, 0)).empty());
}
