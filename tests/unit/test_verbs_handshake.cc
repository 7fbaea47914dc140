// The verbs QP handshake record (proxy/verbs/queue_pairs.h): layout, version, and the rail it carries.
#include <catch2/catch.hpp>

#include <cstddef>

#include "proxy/nic_counters.h"
#include "proxy/verbs/queue_pairs.h"

using namespace railnet::verbs;

TEST_CASE("handshake: the QP record keeps its size and carries the local rail", "[verbs][handshake]") {
  STATIC_REQUIRE(sizeof(QpInfo) == 68);
  STATIC_REQUIRE(offsetof(QpInfo, gid) == 48);
  STATIC_REQUIRE(offsetof(QpInfo, railId) == 64);
  STATIC_REQUIRE(offsetof(QpInfo, path) == 66 && offsetof(QpInfo, paths) == 67);
  // Version 2 added railId where version 1 had reserved zeros, version 3 the path fields (fused devices) where
  // version 2 had zeros: an older peer is refused, not misread as rail 0 or as a connection of 0 paths.
  CHECK(kQpInfoVersion == 3);
}

TEST_CASE("handshake: rails of both ends decide cross-rail connections in the NIC counters", "[verbs][handshake]") {
  railnet::NicCounters& counters = railnet::nicCounters("test-verbs-handshake-nic", 3);
  uint64_t connections = counters.connections.load();
  uint64_t cross = counters.crossRailConnections.load();
  counters.addConnection(3, 3);
  counters.addConnection(3, 5);
  counters.addConnection(3, NCCL_NET_ID_UNDEF);  // an old or unconfigured peer: unknown is never cross-rail
  CHECK(counters.connections.load() == connections + 3);
  CHECK(counters.crossRailConnections.load() == cross + 1);
}
