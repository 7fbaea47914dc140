#include <catch2/catch.hpp>

#include <netinet/in.h>

#include <iterator>
#include <string>
#include <vector>

#include "topo/name_filter.h"
#include "topo/netif.h"

using railnet::topo::NameFilter;

TEST_CASE("interface prefixes select by prefix", "[netif]") {
  NameFilter filter("eth,ib");
  CHECK(filter.matches("eth0"));
  CHECK(filter.matches("ib1"));
  CHECK_FALSE(filter.matches("lo"));
  CHECK_FALSE(filter.matches("en0"));
}

TEST_CASE("a caret excludes prefixes", "[netif]") {
  NameFilter filter("^docker,lo");
  CHECK(filter.matches("eth0"));
  CHECK_FALSE(filter.matches("docker0"));
  CHECK_FALSE(filter.matches("lo"));
}

TEST_CASE("an equals sign makes names exact", "[netif]") {
  NameFilter exact("=eth0,eth2");
  CHECK(exact.matches("eth0"));
  CHECK_FALSE(exact.matches("eth01"));
  CHECK_FALSE(exact.matches("eth1"));
  NameFilter excludeExact("^=eth0");
  CHECK_FALSE(excludeExact.matches("eth0"));
  CHECK(excludeExact.matches("eth01"));
}

TEST_CASE("an empty spec is empty", "[netif]") {
  CHECK(NameFilter("").empty());
  CHECK_FALSE(NameFilter("lo").empty());
}

TEST_CASE("loopback is found when asked for by name", "[netif]") {
  auto found = railnet::topo::discoverInterfaces("lo", "AF_INET");
  REQUIRE(found.size() == 1);
  CHECK(found[0].name == "lo");
  CHECK(found[0].loopback);
  CHECK(found[0].family == AF_INET);
  CHECK(found[0].pciPath.empty());
  CHECK(railnet::topo::formatAddress(reinterpret_cast<const sockaddr*>(&found[0].address)) == "127.0.0.1:0");
}

TEST_CASE("an interface that does not exist selects nothing", "[netif]") {
  CHECK(railnet::topo::discoverInterfaces("=no-such-if0", "").empty());
}

TEST_CASE("with nothing named, interfaces are picked in NCCL's order", "[netif]") {
  // src/misc/socket.cc ncclFindInterfaces: IPoIB, then anything but docker/lo/virbr, then docker, lo, virbr.
  const std::vector<std::string> order(std::begin(railnet::topo::kAutomaticInterfaces),
                                       std::end(railnet::topo::kAutomaticInterfaces));
  CHECK(order == std::vector<std::string>{"ib", "^docker,lo,virbr", "docker", "lo", "virbr"});
  // On this machine: the first step that finds an interface decides, so loopback only when nothing else is up.
  const auto automatic = railnet::topo::discoverInterfaces("", railnet::AddressFamily::kAny);
  REQUIRE_FALSE(automatic.empty());  // lo at least
  const auto ib = railnet::topo::discoverInterfaces("ib", railnet::AddressFamily::kAny);
  const auto others = railnet::topo::discoverInterfaces("^docker,lo,virbr", railnet::AddressFamily::kAny);
  if (!ib.empty()) {
    CHECK(automatic.size() == ib.size());
  } else if (!others.empty()) {
    CHECK(automatic.size() == others.size());
    for (const auto& nic : automatic) CHECK_FALSE(nic.loopback);
  }
}
