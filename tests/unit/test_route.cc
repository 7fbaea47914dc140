// PXN-style routing (topo/route.h): which local NIC a connection to a peer NIC on a given rail leaves from.
#include <catch2/catch.hpp>

#include <vector>

#include "proxy/verbs/nvlink_hop.h"
#include "topo/route.h"

using railnet::topo::routeDevice;
using railnet::topo::spareOrder;

namespace {
const auto any = [](int) { return true; };
}

TEST_CASE("a connection to another rail leaves from this host's NIC on that rail", "[route]") {
  const std::vector<int16_t> rails = {0, 1, 2, 3};
  CHECK(routeDevice(rails, 0, 2, any) == 2);
  CHECK(routeDevice(rails, 3, 1, any) == 1);
  CHECK(routeDevice(rails, 1, 1, any) == 1);  // already on the peer's rail
}

TEST_CASE("without a usable NIC on the peer's rail, or without rails, the connection keeps its NIC", "[route]") {
  const std::vector<int16_t> rails = {0, 1, -1};
  CHECK(routeDevice(rails, 0, 5, any) == 0);   // no NIC on rail 5 here
  CHECK(routeDevice(rails, 2, 1, any) == 2);   // this NIC's rail is unknown
  CHECK(routeDevice(rails, 0, -1, any) == 0);  // the peer's rail is unknown
  CHECK(routeDevice(rails, 0, 1, [](int dev) { return dev != 1; }) == 0);  // rail 1's NIC not eligible
  CHECK(routeDevice(rails, 7, 1, any) == 7);   // not a device of this list (a fused one): untouched
}

TEST_CASE("of several NICs on the peer's rail, the first eligible one is taken", "[route]") {
  const std::vector<int16_t> rails = {0, 1, 1};
  CHECK(routeDevice(rails, 0, 1, any) == 1);
  CHECK(routeDevice(rails, 0, 1, [](int dev) { return dev == 2; }) == 2);
}

TEST_CASE("verbs: how a port may route to a candidate on the peer's rail (the NVLink hop)", "[route]") {
  using railnet::verbs::RouteWay;
  using railnet::verbs::routeWay;
  // Host-memory ports route directly among themselves; the test setting 2 sends through host staging.
  CHECK(routeWay(1, false, false, false) == RouteWay::kDirect);
  CHECK(routeWay(0, false, false, false) == RouteWay::kDirect);
  CHECK(routeWay(2, false, false, false) == RouteWay::kHop);
  CHECK(routeWay(1, false, true, true) == RouteWay::kNone);  // never from host memory to a GPUDirect port
  // A GPUDirect port: only to a GPUDirect port whose GPU it can copy into, and only with the hop on.
  CHECK(routeWay(1, true, true, true) == RouteWay::kHop);
  CHECK(routeWay(2, true, true, true) == RouteWay::kHop);
  CHECK(routeWay(0, true, true, true) == RouteWay::kNone);
  CHECK(routeWay(1, true, true, false) == RouteWay::kNone);
  CHECK(routeWay(1, true, false, true) == RouteWay::kNone);
}

TEST_CASE("a single-NIC connection's spare NICs come nearest first, then by index, never itself", "[route]") {
  // Distances from NIC 1: NIC 3 shares its switch (0), NIC 0 its host bridge (2), NICs 2 and 4 are across sockets (4).
  const int distances[5] = {2, 0, 4, 0, 4};
  const auto distance = [&](int, int to) { return distances[to]; };
  CHECK(spareOrder(5, 1, distance, any) == std::vector<int>{3, 0, 2, 4});
  CHECK(spareOrder(5, 1, distance, [](int dev) { return dev != 3; }) == std::vector<int>{0, 2, 4});
  CHECK(spareOrder(1, 0, distance, any).empty());  // no other NIC: nowhere to move
}
