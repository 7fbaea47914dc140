// NIC fusion building blocks: the threshold scheduler (planStripes), the fused handle's address list, the
// fused DeviceInfo, and RAILNET_TCP_ADDRESSES parsing against this host's real interfaces.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>

#include <cstring>
#include <set>
#include <vector>

#include "proxy/protocol/stripe_plan.h"
#include "proxy/tcp/addresses.h"
#include "proxy/protocol/wire.h"
#include "proxy/transport.h"
#include "railnet/error.h"

using railnet::protocol::kMaxStripeNics;
using railnet::protocol::kStripeAlignment;
using railnet::protocol::planStripes;
using railnet::protocol::Stripe;

namespace {

std::vector<Stripe> plan(size_t bytes, int nics, uint64_t sequence, size_t minStripe) {
  Stripe out[kMaxStripeNics];
  const int n = planStripes(bytes, nics, sequence, minStripe, out);
  REQUIRE(n >= 1);
  REQUIRE(n <= kMaxStripeNics);
  return std::vector<Stripe>(out, out + n);
}

// The invariants every plan keeps: in-order coverage of [0, bytes), aligned offsets, distinct nics in range,
// and (when split) every stripe at least the (aligned) minimum.
void checkPlan(const std::vector<Stripe>& stripes, size_t bytes, int nics, size_t minStripe) {
  size_t offset = 0;
  std::set<int> used;
  for (const Stripe& s : stripes) {
    REQUIRE(s.offset == offset);
    REQUIRE(s.offset % kStripeAlignment == 0);
    REQUIRE(s.nic >= 0);
    REQUIRE(s.nic < std::max(1, std::min(nics, kMaxStripeNics)));
    REQUIRE(used.insert(s.nic).second);
    if (stripes.size() > 1) REQUIRE(s.bytes >= minStripe);
    offset += s.bytes;
  }
  REQUIRE(offset == bytes);
}

}  // namespace

TEST_CASE("planStripes keeps small messages whole and rotates them over the nics", "[stripe]") {
  const size_t min = 256 * 1024;
  for (uint64_t seq = 0; seq < 12; ++seq) {
    auto stripes = plan(2 * min - 1, 3, seq, min);
    REQUIRE(stripes.size() == 1);
    CHECK(stripes[0].nic == static_cast<int>(seq % 3));
    CHECK(stripes[0].offset == 0);
    CHECK(stripes[0].bytes == 2 * min - 1);
  }
  // Empty and one-byte messages too.
  CHECK(plan(0, 2, 1, min)[0].nic == 1);
  CHECK(plan(0, 2, 1, min)[0].bytes == 0);
  CHECK(plan(1, 2, 0, min)[0].bytes == 1);
}

TEST_CASE("planStripes splits at exactly twice the minimum", "[stripe]") {
  const size_t min = 256 * 1024;
  auto below = plan(2 * min - 1, 2, 0, min);
  REQUIRE(below.size() == 1);
  auto at = plan(2 * min, 2, 0, min);
  REQUIRE(at.size() == 2);
  CHECK(at[0].bytes == min);
  CHECK(at[1].bytes == min);
  checkPlan(at, 2 * min, 2, min);
  // 2 nics, 2*min + 1 bytes: the last stripe takes the extra byte, neither falls under the minimum.
  auto odd = plan(2 * min + 1, 2, 0, min);
  REQUIRE(odd.size() == 2);
  CHECK(odd[0].bytes == min);
  CHECK(odd[1].bytes == min + 1);
}

TEST_CASE("planStripes uses no more stripes than the minimum allows", "[stripe]") {
  const size_t min = 128 * 1024;
  // 5 * min with 8 nics: 5 stripes, not 8.
  auto stripes = plan(5 * min, 8, 0, min);
  CHECK(stripes.size() == 5);
  checkPlan(stripes, 5 * min, 8, min);
  // Enough bytes: one stripe per nic.
  auto full = plan(64 * min + 12345, 8, 0, min);
  CHECK(full.size() == 8);
  checkPlan(full, 64 * min + 12345, 8, min);
  // Balanced: stripes differ by less than 128 bytes per stripe.
  for (const Stripe& s : full) CHECK(s.bytes + 8 * kStripeAlignment >= (64 * min + 12345) / 8);
}

TEST_CASE("planStripes rotates the first nic of split messages", "[stripe]") {
  const size_t min = 128 * 1024;
  // 3 nics, messages worth only 2 stripes: over 3 messages every nic carries a stripe twice.
  std::vector<int> perLane(3, 0);
  for (uint64_t seq = 0; seq < 3; ++seq) {
    auto stripes = plan(2 * min, 3, seq, min);
    REQUIRE(stripes.size() == 2);
    CHECK(stripes[0].nic == static_cast<int>(seq % 3));
    for (const Stripe& s : stripes) ++perLane[static_cast<size_t>(s.nic)];
  }
  CHECK(perLane == std::vector<int>{2, 2, 2});
}

TEST_CASE("planStripes aligns an unaligned minimum and clamps the nic count", "[stripe]") {
  // A minimum of 1000 bytes acts as 1024 (the next multiple of 128).
  auto stripes = plan(2047, 2, 0, 1000);
  CHECK(stripes.size() == 1);
  stripes = plan(2048, 2, 0, 1000);
  CHECK(stripes.size() == 2);
  checkPlan(stripes, 2048, 2, 1024);
  // A minimum under the alignment acts as 128.
  stripes = plan(1000, 4, 0, 1);
  checkPlan(stripes, 1000, 4, 128);
  CHECK(stripes.size() == 4);
  // Lanes outside 1..8 are clamped: 0 nics is one nic, 20 nics is 8.
  CHECK(plan(1 << 20, 0, 5, 1024).size() == 1);
  CHECK(plan(1 << 20, 0, 5, 1024)[0].nic == 0);
  CHECK(plan(size_t{1} << 30, 20, 0, 1024).size() == 8);
}

TEST_CASE("planStripes covers every size exactly (sweep)", "[stripe]") {
  const size_t mins[] = {128, 4096, 65536, 262144};
  for (size_t min : mins) {
    for (int nics = 1; nics <= kMaxStripeNics; ++nics) {
      for (size_t bytes : {size_t{0}, size_t{1}, min, 2 * min - 1, 2 * min, 2 * min + 127, 3 * min + 1,
                           8 * min - 1, 8 * min, 100 * min + 77, size_t{1} << 30}) {
        for (uint64_t seq = 0; seq < 3; ++seq) checkPlan(plan(bytes, nics, seq, min), bytes, nics, min);
      }
    }
  }
}

TEST_CASE("a fused handle carries every listening address and rail", "[fusion]") {
  using namespace railnet::protocol;
  std::vector<ListenAddress> nics;
  for (int i = 0; i < kMaxHandleAddresses4; ++i) {
    ListenAddress nic;
    auto* in4 = reinterpret_cast<sockaddr_in*>(&nic.address.storage);
    in4->sin_family = AF_INET;
    in4->sin_port = htons(static_cast<uint16_t>(40000 + i));
    in4->sin_addr.s_addr = htonl(0x7f000001u + (static_cast<uint32_t>(i) << 8));
    nic.address.length = sizeof(sockaddr_in);
    nic.railId = static_cast<int16_t>(i * 2);
    nics.push_back(nic);
  }
  Handle handle{};
  handle.magic = kHandleMagic;
  handle.version = kWireVersion;
  writeHandleAddresses(&handle, nics);
  std::vector<ListenAddress> back = handleAddresses(handle);
  REQUIRE(back.size() == nics.size());
  for (size_t i = 0; i < nics.size(); ++i) {
    CHECK(back[i].address.toString() == nics[i].address.toString());
    CHECK(back[i].railId == nics[i].railId);
  }
  // One more than fits is refused with a clear error, not truncated.
  nics.push_back(nics.back());
  CHECK_THROWS_AS(writeHandleAddresses(&handle, nics), railnet::Error);
  // A handle from a physical device (laneCount 0) decodes as one address.
  Handle single{};
  single.magic = kHandleMagic;
  single.version = kWireVersion;
  memcpy(single.address, &nics[0].address.storage, sizeof(sockaddr_in));
  single.railId = -1;
  REQUIRE(handleAddresses(single).size() == 1);
  CHECK(handleAddresses(single)[0].address.toString() == nics[0].address.toString());
  // A nic count beyond the room is a corrupt handle.
  single.addressCount = 200;
  CHECK_THROWS_AS(handleAddresses(single), railnet::Error);
}

TEST_CASE("an IPv6 fused handle holds four addresses", "[fusion]") {
  using namespace railnet::protocol;
  std::vector<ListenAddress> nics;
  for (int i = 0; i < kMaxHandleAddresses6; ++i) {
    ListenAddress nic;
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&nic.address.storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(50000 + i));
    inet_pton(AF_INET6, "fd00::1", &in6->sin6_addr);
    in6->sin6_addr.s6_addr[15] = static_cast<uint8_t>(i + 1);
    nic.address.length = sizeof(sockaddr_in6);
    nic.railId = static_cast<int16_t>(i);
    nics.push_back(nic);
  }
  Handle handle{};
  handle.magic = kHandleMagic;
  handle.version = kWireVersion;
  writeHandleAddresses(&handle, nics);
  auto back = handleAddresses(handle);
  REQUIRE(back.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(back[i].address.toString() == nics[i].address.toString());
  nics.push_back(nics.back());
  CHECK_THROWS_AS(writeHandleAddresses(&handle, nics), railnet::Error);
}

TEST_CASE("fusedDeviceInfo names, sums and intersects its children", "[fusion]") {
  railnet::DeviceInfo a;
  a.name = "lo@127.0.1.1";
  a.speedMbps = 100000;
  a.railId = 0;
  a.maxRecvs = 8;
  railnet::DeviceInfo b = a;
  b.name = "lo@127.0.2.1";
  b.railId = 1;
  b.maxRecvs = 4;
  railnet::DeviceInfo fused = railnet::fusedDeviceInfo({&a, &b}, {0, 1});
  CHECK(fused.name == "lo@127.0.1.1+lo@127.0.2.1");
  CHECK(fused.speedMbps == 200000);
  CHECK(fused.railId == NCCL_NET_ID_UNDEF);  // children on different rails
  CHECK(fused.maxRecvs == 4);
  CHECK(fused.children == std::vector<int>{0, 1});
  b.railId = 0;
  CHECK(railnet::fusedDeviceInfo({&a, &b}, {0, 1}).railId == 0);
}

TEST_CASE("RAILNET_TCP_ADDRESSES names devices after lo and keeps order", "[fusion]") {
  auto devices = railnet::tcp::interfacesForAddresses(" 127.0.1.1, 127.0.2.1 ,127.0.3.1");
  REQUIRE(devices.size() == 3);
  CHECK(devices[0].name == "lo@127.0.1.1");
  CHECK(devices[1].name == "lo@127.0.2.1");
  CHECK(devices[2].name == "lo@127.0.3.1");
  CHECK(devices[0].loopback);
  CHECK(railnet::topo::formatAddress(reinterpret_cast<const sockaddr*>(&devices[1].address)) == "127.0.2.1:0");
  CHECK_THROWS_AS(railnet::tcp::interfacesForAddresses("127.0.1.1,not-an-address"), railnet::Error);
  CHECK_THROWS_AS(railnet::tcp::interfacesForAddresses("127.0.1.1,127.0.1.1"), railnet::Error);
  // TEST-NET-3: no local address (a neighbour in a local subnet is not ours either).
  CHECK_THROWS_AS(railnet::tcp::interfacesForAddresses("203.0.113.77"), railnet::Error);
  CHECK_THROWS_AS(railnet::tcp::interfacesForAddresses(" , "), railnet::Error);
}
