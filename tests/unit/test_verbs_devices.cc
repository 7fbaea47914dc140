#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <endian.h>
#include <sys/stat.h>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "proxy/verbs/devices.h"
#include "proxy/verbs/ibverbs_api.h"
#include "railnet/log.h"
#include "topo/name_filter.h"

using railnet::topo::NameFilter;
using railnet::verbs::GidEntry;
using railnet::verbs::portSpeedMbps;
using railnet::verbs::selectGidIndex;

namespace {

ibv_gid gidOf(const char* text) {
  ibv_gid gid{};
  REQUIRE(inet_pton(AF_INET6, text, gid.raw) == 1);
  return gid;
}

GidEntry entry(int index, const char* address, const char* type) { return GidEntry{index, gidOf(address), type}; }

}  // namespace

TEST_CASE("port speed is lane rate times width for every IB encoding", "[verbs]") {
  // 1x of each speed code.
  CHECK(portSpeedMbps(1, 1) == 2500);      // SDR
  CHECK(portSpeedMbps(1, 2) == 5000);      // DDR
  CHECK(portSpeedMbps(1, 4) == 10000);     // QDR
  CHECK(portSpeedMbps(1, 8) == 10000);     // FDR10
  CHECK(portSpeedMbps(1, 16) == 14000);    // FDR
  CHECK(portSpeedMbps(1, 32) == 25000);    // EDR
  CHECK(portSpeedMbps(1, 64) == 50000);    // HDR
  CHECK(portSpeedMbps(1, 128) == 100000);  // NDR
  CHECK(portSpeedMbps(1, 256) == 200000);  // XDR (active_speed_ex)
  // Each width code.
  CHECK(portSpeedMbps(2, 32) == 100000);    // 4x EDR
  CHECK(portSpeedMbps(4, 64) == 400000);    // 8x HDR
  CHECK(portSpeedMbps(8, 4) == 120000);     // 12x QDR
  CHECK(portSpeedMbps(16, 128) == 200000);  // 2x NDR
  CHECK(portSpeedMbps(2, 128) == 400000);   // 4x NDR: a ConnectX-7 port
  CHECK(portSpeedMbps(2, 256) == 800000);   // 4x XDR
}

TEST_CASE("unknown port speed or width codes give 0", "[verbs]") {
  CHECK(portSpeedMbps(0, 32) == 0);
  CHECK(portSpeedMbps(3, 32) == 0);  // two width bits
  CHECK(portSpeedMbps(32, 32) == 0);
  CHECK(portSpeedMbps(2, 0) == 0);
  CHECK(portSpeedMbps(2, 3) == 0);  // two speed bits
  CHECK(portSpeedMbps(2, 512) == 0);
  CHECK(portSpeedMbps(255, 0xffffffffu) == 0);
}

TEST_CASE("an empty HCA list selects every device and port", "[verbs]") {
  NameFilter all("");
  CHECK(all.empty());
  CHECK(all.matches("mlx5_0", 1));
  CHECK(all.matches("rxe0", 2));
  CHECK(all.selectsDevice("anything"));
  CHECK(all.railId("mlx5_0", 1) == NCCL_NET_ID_UNDEF);
}

TEST_CASE("HCA names are prefixes by default", "[verbs]") {
  NameFilter filter("mlx5_1,rxe");
  CHECK(filter.matches("mlx5_1", 1));
  CHECK(filter.matches("mlx5_10", 1));  // a prefix, as in NCCL_IB_HCA
  CHECK(filter.matches("rxe0", 1));
  CHECK_FALSE(filter.matches("mlx5_0", 1));
  CHECK(filter.selectsDevice("mlx5_10"));
  CHECK_FALSE(filter.selectsDevice("mlx5_0"));
}

TEST_CASE("a leading = makes HCA names exact", "[verbs]") {
  NameFilter filter("=mlx5_1,mlx5_2");
  CHECK(filter.matches("mlx5_1", 1));
  CHECK(filter.matches("mlx5_2", 1));
  CHECK_FALSE(filter.matches("mlx5_10", 1));
  CHECK_FALSE(filter.matches("mlx5_", 1));
}

TEST_CASE("a leading ^ excludes HCAs", "[verbs]") {
  NameFilter prefix("^mlx5_0,rxe");
  CHECK_FALSE(prefix.matches("mlx5_0", 1));
  CHECK_FALSE(prefix.matches("mlx5_01", 1));
  CHECK_FALSE(prefix.matches("rxe0", 1));
  CHECK(prefix.matches("mlx5_1", 1));
  CHECK_FALSE(prefix.selectsDevice("rxe0"));
  CHECK(prefix.railId("mlx5_1", 1) == NCCL_NET_ID_UNDEF);

  NameFilter exact("^=mlx5_0");
  CHECK_FALSE(exact.matches("mlx5_0", 1));
  CHECK(exact.matches("mlx5_01", 1));
}

TEST_CASE("HCA entries can name ports", "[verbs]") {
  NameFilter filter("mlx5_0:1,mlx5_1");
  CHECK(filter.matches("mlx5_0", 1));
  CHECK_FALSE(filter.matches("mlx5_0", 2));
  CHECK(filter.matches("mlx5_1", 1));
  CHECK(filter.matches("mlx5_1", 2));
  CHECK(filter.selectsDevice("mlx5_0"));

  NameFilter excludePort("^mlx5_0:2");
  CHECK(excludePort.matches("mlx5_0", 1));
  CHECK_FALSE(excludePort.matches("mlx5_0", 2));
  CHECK(excludePort.selectsDevice("mlx5_0"));  // port 1 is still wanted

  NameFilter exactPort("=mlx5_1:2");
  CHECK(exactPort.matches("mlx5_1", 2));
  CHECK_FALSE(exactPort.matches("mlx5_1", 1));
  CHECK_FALSE(exactPort.matches("mlx5_10", 2));
}

TEST_CASE("HCA entries carry rail and plane ids", "[verbs]") {
  NameFilter filter("mlx5_0:1:3:1,mlx5_1::4");
  CHECK(filter.railId("mlx5_0", 1) == 3);
  CHECK(filter.planeId("mlx5_0", 1) == 1);
  CHECK(filter.railId("mlx5_1", 2) == 4);  // empty port: any port
  CHECK(filter.planeId("mlx5_1", 2) == NCCL_NET_ID_UNDEF);
}

TEST_CASE("malformed HCA entries are reported and made harmless", "[verbs]") {
  NameFilter badPort("mlx5_0:x");  // port ignored: every port of mlx5_0
  CHECK(badPort.matches("mlx5_0", 1));
  CHECK(badPort.matches("mlx5_0", 2));
  NameFilter misplaced("mlx5_0,^mlx5_1");  // '^' inside the list is not a mode switch
  CHECK(misplaced.matches("mlx5_0", 1));
  CHECK_FALSE(misplaced.matches("mlx5_1", 1));
  CHECK_FALSE(misplaced.matches("rxe0", 1));
  NameFilter empties(",,mlx5_0,,");
  CHECK(empties.matches("mlx5_0", 1));
  CHECK_FALSE(empties.matches("rxe0", 1));
}

TEST_CASE("GID classification", "[verbs]") {
  CHECK(railnet::verbs::gidIsIpv4Mapped(gidOf("::ffff:10.0.0.1")));
  CHECK_FALSE(railnet::verbs::gidIsIpv4Mapped(gidOf("fd00::1")));
  CHECK(railnet::verbs::gidIsLinkLocal(gidOf("fe80::5054:ff:fe12:3456")));
  CHECK_FALSE(railnet::verbs::gidIsLinkLocal(gidOf("fd00::1")));
  CHECK(railnet::verbs::gidIsZero(ibv_gid{}));
  CHECK(railnet::verbs::formatGid(gidOf("::ffff:10.0.0.1")) == "::ffff:10.0.0.1");
}

TEST_CASE("GID selection prefers an IPv4-mapped RoCE v2 GID", "[verbs]") {
  // The table of an rxe or mlx5 port with an IPv4 and an IPv6 address.
  std::vector<GidEntry> table = {
      entry(0, "fe80::5054:ff:fe12:3456", "IB/RoCE v1"),
      entry(1, "fe80::5054:ff:fe12:3456", "RoCE v2"),
      entry(2, "fd00::2", "IB/RoCE v1"),
      entry(3, "fd00::2", "RoCE v2"),
      entry(4, "::ffff:10.0.2.15", "IB/RoCE v1"),
      entry(5, "::ffff:10.0.2.15", "RoCE v2"),
  };
  CHECK(selectGidIndex(table, AF_INET, -1) == 5);
  CHECK(selectGidIndex(table, AF_INET6, -1) == 3);  // not link-local, not IPv4-mapped
  // Without an address of the family: the first RoCE v2 GID.
  std::vector<GidEntry> linkLocalOnly(table.begin(), table.begin() + 2);
  CHECK(selectGidIndex(linkLocalOnly, AF_INET, -1) == 1);
  CHECK(selectGidIndex(linkLocalOnly, AF_INET6, -1) == 1);
}

TEST_CASE("a forced GID index wins when populated", "[verbs]") {
  std::vector<GidEntry> table = {entry(0, "fe80::1", "IB/RoCE v1"), entry(1, "fe80::1", "RoCE v2"),
                                 entry(3, "::ffff:10.0.0.1", "RoCE v2")};
  CHECK(selectGidIndex(table, AF_INET, 0) == 0);  // even a RoCE v1 GID
  CHECK(selectGidIndex(table, AF_INET, 1) == 1);
  CHECK(selectGidIndex(table, AF_INET, 2) == 3);  // slot 2 is empty: automatic choice
  CHECK(selectGidIndex(table, AF_INET, 99) == 3);
  std::vector<GidEntry> zero = {GidEntry{0, ibv_gid{}, "RoCE v2"}};
  CHECK(selectGidIndex(zero, AF_INET, 0) == -1);  // an all-zero GID is an empty slot
}

TEST_CASE("GID selection never picks RoCE v1 or empty slots on its own", "[verbs]") {
  CHECK(selectGidIndex({}, AF_INET, -1) == -1);
  std::vector<GidEntry> v1Only = {entry(0, "fe80::1", "IB/RoCE v1"), entry(1, "::ffff:10.0.0.1", "IB/RoCE v1")};
  CHECK(selectGidIndex(v1Only, AF_INET, -1) == -1);
  std::vector<GidEntry> unknownType = {entry(0, "::ffff:10.0.0.1", "")};  // sysfs type unreadable
  CHECK(selectGidIndex(unknownType, AF_INET, -1) == -1);
  std::vector<GidEntry> zeroV2 = {GidEntry{0, ibv_gid{}, "RoCE v2"}, entry(1, "::ffff:10.0.0.1", "RoCE v2")};
  CHECK(selectGidIndex(zeroV2, AF_INET6, -1) == 1);
}

TEST_CASE("libibverbs loads, or fails with a reason", "[verbs]") {
  std::string why;
  const railnet::verbs::IbvApi* api = railnet::verbs::loadIbverbs(&why);
  if (api == nullptr) {
    CHECK_FALSE(why.empty());
    CHECK(railnet::verbs::loadIbverbs(nullptr) == nullptr);  // the answer is cached
    WARN("libibverbs unavailable: " << why);
    return;
  }
  CHECK(railnet::verbs::loadIbverbs(nullptr) == api);
  CHECK(api->getDeviceList != nullptr);
  CHECK(api->queryPortCompat != nullptr);
  CHECK(api->regMr != nullptr);
  CHECK(api->wcStatusStr != nullptr);
  CHECK(std::string(api->wcStatusStr(IBV_WC_SUCCESS)).find("success") != std::string::npos);

  // Discovery on the real host: empty without RDMA kernel support, otherwise sane entries (the rxe guest).
  std::vector<railnet::verbs::VerbsPort> ports = railnet::verbs::discoverPorts(*api);
  std::error_code error;
  if (!std::filesystem::exists("/sys/class/infiniband", error)) CHECK(ports.empty());
  for (const railnet::verbs::VerbsPort& port : ports) {
    CHECK_FALSE(port.info.name.empty());
    CHECK(port.port >= 1);
    CHECK(port.info.speedMbps > 0);
    if (port.linkLayer == IBV_LINK_LAYER_ETHERNET) CHECK(port.gidIndex >= 0);
  }
}

// ---- Discovery against a fake libibverbs and a fake sysfs tree -------------------------------------------------

namespace {

struct FakePort {
  ibv_port_attr attr{};
  std::vector<std::pair<ibv_gid, std::string>> gids;  // index = position; type written to the fake sysfs
};

struct FakeDevice {
  ibv_device device{};
  ibv_context context{};
  uint64_t nodeGuid = 0;
  std::vector<FakePort> ports;
};

std::vector<FakeDevice>* gFakes = nullptr;
int gOpen = 0;
std::vector<std::string> gWarnings;

void recordWarnings(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  if (level != NCCL_LOG_WARN) return;
  va_list args;
  va_start(args, fmt);
  char text[1024];
  vsnprintf(text, sizeof(text), fmt, args);
  va_end(args);
  gWarnings.emplace_back(text);
}

// Captures WARN lines for one test (and keeps them off stderr).
struct WarningCapture {
  WarningCapture() {
    gWarnings.clear();
    railnet::log::setLogger(recordWarnings);
  }
  ~WarningCapture() { railnet::log::setLogger(nullptr); }
  bool saw(const std::string& text) const {
    for (const std::string& warning : gWarnings) {
      if (warning.find(text) != std::string::npos) return true;
    }
    return false;
  }
};

FakeDevice* fakeOf(ibv_context* context) {
  for (FakeDevice& fake : *gFakes) {
    if (&fake.context == context) return &fake;
  }
  return nullptr;
}

railnet::verbs::IbvApi fakeApi() {
  railnet::verbs::IbvApi api;
  api.forkInit = [] { return 0; };
  api.getDeviceList = [](int* count) {
    auto** list = static_cast<ibv_device**>(calloc(gFakes->size() + 1, sizeof(ibv_device*)));
    for (size_t i = 0; i < gFakes->size(); ++i) list[i] = &(*gFakes)[i].device;
    *count = static_cast<int>(gFakes->size());
    return list;
  };
  api.freeDeviceList = [](ibv_device** list) { free(list); };
  api.getDeviceName = [](ibv_device* device) -> const char* { return device->name; };
  api.openDevice = [](ibv_device* device) -> ibv_context* {
    for (FakeDevice& fake : *gFakes) {
      if (&fake.device == device) {
        fake.context.device = device;
        ++gOpen;
        return &fake.context;
      }
    }
    return nullptr;
  };
  api.closeDevice = [](ibv_context*) {
    --gOpen;
    return 0;
  };
  api.queryDevice = [](ibv_context* context, ibv_device_attr* attr) {
    FakeDevice* fake = fakeOf(context);
    attr->phys_port_cnt = static_cast<uint8_t>(fake->ports.size());
    attr->max_qp = 131072;
    attr->node_guid = htobe64(fake->nodeGuid);
    return 0;
  };
  // The fake context has no extended ops, so IbvApi::queryPort takes this compat path.
  api.queryPortCompat = [](ibv_context* context, uint8_t port, _compat_ibv_port_attr* attr) {
    *reinterpret_cast<ibv_port_attr*>(attr) = fakeOf(context)->ports.at(port - 1).attr;
    return 0;
  };
  api.queryGid = [](ibv_context* context, uint8_t port, int index, ibv_gid* gid) {
    const FakePort& fake = fakeOf(context)->ports.at(port - 1);
    if (index < 0 || index >= static_cast<int>(fake.gids.size())) return -1;
    *gid = fake.gids[index].first;
    return 0;
  };
  return api;
}

FakeDevice device(const char* name, uint64_t guid, ibv_transport_type transport = IBV_TRANSPORT_IB) {
  FakeDevice fake;
  snprintf(fake.device.name, sizeof(fake.device.name), "%s", name);
  fake.device.transport_type = transport;
  fake.nodeGuid = guid;
  return fake;
}

FakePort rocePort(std::vector<std::pair<ibv_gid, std::string>> gids, ibv_port_state state = IBV_PORT_ACTIVE) {
  FakePort port;
  port.attr.state = state;
  port.attr.link_layer = IBV_LINK_LAYER_ETHERNET;
  port.attr.active_width = 2;   // 4x
  port.attr.active_speed = 32;  // EDR
  port.attr.active_mtu = IBV_MTU_4096;
  port.attr.gid_tbl_len = static_cast<int>(gids.size()) + 2;  // trailing empty slots
  port.gids = std::move(gids);
  return port;
}

FakePort ibPort(uint16_t lid) {
  FakePort port;
  port.attr.state = IBV_PORT_ACTIVE;
  port.attr.link_layer = IBV_LINK_LAYER_INFINIBAND;
  port.attr.lid = lid;
  port.attr.active_width = 2;
  port.attr.active_speed = 128;  // NDR
  port.attr.gid_tbl_len = 1;
  port.gids = {{gidOf("fe80::1"), "IB/RoCE v1"}};
  return port;
}

// Writes <root>/<device>/ports/<n>/gid_attrs/types/<index> as the kernel does.
void writeSysfs(const std::filesystem::path& root, const std::vector<FakeDevice>& fakes) {
  for (const FakeDevice& fake : fakes) {
    for (size_t p = 0; p < fake.ports.size(); ++p) {
      auto dir = root / fake.device.name / "ports" / std::to_string(p + 1) / "gid_attrs" / "types";
      std::filesystem::create_directories(dir);
      for (size_t i = 0; i < fake.ports[p].gids.size(); ++i) {
        std::ofstream(dir / std::to_string(i)) << fake.ports[p].gids[i].second << "\n";
      }
    }
  }
}

struct FakeHost {
  std::vector<FakeDevice> fakes;
  std::filesystem::path root;

  FakeHost() {
    char pattern[] = "/tmp/railnet-verbs-test-XXXXXX";
    REQUIRE(mkdtemp(pattern) != nullptr);
    root = pattern;
    FakeDevice rxe = device("rxe0", 0x5054ff00fe123456ULL);
    rxe.ports.push_back(rocePort({{gidOf("fe80::5054:ff:fe12:3456"), "IB/RoCE v1"},
                                  {gidOf("fe80::5054:ff:fe12:3456"), "RoCE v2"},
                                  {gidOf("::ffff:10.0.2.15"), "IB/RoCE v1"},
                                  {gidOf("::ffff:10.0.2.15"), "RoCE v2"}}));
    FakeDevice dual = device("mlx5_0", 0);  // no node GUID: a fallback is made up
    dual.ports.push_back(rocePort({{gidOf("::ffff:10.1.0.1"), "RoCE v2"}}));
    dual.ports.push_back(rocePort({{gidOf("::ffff:10.1.1.1"), "RoCE v2"}}));
    dual.ports.push_back(rocePort({{gidOf("::ffff:10.1.2.1"), "RoCE v2"}}, IBV_PORT_DOWN));
    FakeDevice v1 = device("mlx5_1", 0x11);
    v1.ports.push_back(rocePort({{gidOf("::ffff:10.2.0.1"), "IB/RoCE v1"}}));  // skipped: no RoCE v2 GID
    FakeDevice ib = device("ib0dev", 0x22);
    ib.ports.push_back(ibPort(0x17));
    FakeDevice iwarp = device("siw0", 0x33, IBV_TRANSPORT_IWARP);
    iwarp.ports.push_back(rocePort({{gidOf("::ffff:10.3.0.1"), "RoCE v2"}}));
    fakes = {rxe, dual, v1, ib, iwarp};
    writeSysfs(root, fakes);
    gFakes = &fakes;
    gOpen = 0;
  }
  ~FakeHost() {
    gFakes = nullptr;
    std::error_code error;
    std::filesystem::remove_all(root, error);
  }

  std::vector<railnet::verbs::VerbsPort> discover(const char* hca, int gidIndex = -1, int family = AF_INET) {
    railnet::verbs::DiscoveryOptions options;
    options.hca = hca;
    options.gidIndex = gidIndex;
    options.family = family;
    options.sysfsRoot = root.string();
    return railnet::verbs::discoverPorts(fakeApi(), options);
  }
};

}  // namespace

TEST_CASE("discovery lists active, addressable ports with unique names", "[verbs]") {
  FakeHost host;
  WarningCapture warnings;
  auto ports = host.discover("");
  CHECK(gOpen == 0);  // every context it opened is closed again
  CHECK(warnings.saw("mlx5_1:1 skipped: no usable RoCE v2 GID"));
  CHECK_FALSE(warnings.saw("siw0"));  // not an InfiniBand/RoCE device: INFO only
  REQUIRE(ports.size() == 4);

  CHECK(ports[0].device == "rxe0");
  CHECK(ports[0].info.name == "rxe0");  // its only port: the bare device name
  CHECK(ports[0].gidIndex == 3);        // the IPv4-mapped RoCE v2 GID
  CHECK(railnet::verbs::formatGid(ports[0].gid) == "::ffff:10.0.2.15");
  CHECK(ports[0].linkLayer == IBV_LINK_LAYER_ETHERNET);
  CHECK(ports[0].activeMtu == IBV_MTU_4096);
  CHECK(ports[0].info.guid == 0x5054ff00fe123456ULL);
  CHECK(ports[0].info.speedMbps == 100000);
  CHECK(ports[0].info.pciPath.empty());
  CHECK(ports[0].numaNode == -1);
  CHECK(ports[0].info.ptrSupport == NCCL_PTR_HOST);
  CHECK(ports[0].info.maxRecvs == 8);
  CHECK(ports[0].info.regIsGlobal);
  CHECK(ports[0].info.maxComms == 131072);
  CHECK(ports[0].info.maxP2pBytes == NCCL_MAX_NET_SIZE_BYTES);

  CHECK(ports[1].info.name == "mlx5_0:1");  // two usable ports: names carry the port
  CHECK(ports[2].info.name == "mlx5_0:2");
  CHECK(ports[1].info.port == 1);
  CHECK(ports[2].info.port == 2);
  CHECK(ports[1].info.guid != 0);
  CHECK(ports[1].info.guid == ports[2].info.guid);  // one ASIC: NCCL tells the ports apart by port number

  CHECK(ports[3].info.name == "ib0dev");
  CHECK(ports[3].linkLayer == IBV_LINK_LAYER_INFINIBAND);
  CHECK(ports[3].gidIndex == -1);
  CHECK(ports[3].lid == 0x17);
  CHECK(ports[3].info.speedMbps == 400000);
}

TEST_CASE("discovery honours RAILNET_IB_HCA", "[verbs]") {
  FakeHost host;
  WarningCapture warnings;
  auto onePort = host.discover("mlx5_0:2");
  REQUIRE(onePort.size() == 1);
  CHECK(onePort[0].info.name == "mlx5_0");  // the only port in use now
  CHECK(onePort[0].port == 2);

  auto excluded = host.discover("^mlx5,rxe");
  REQUIRE(excluded.size() == 1);
  CHECK(excluded[0].device == "ib0dev");

  auto railed = host.discover("=rxe0:1:5:2");
  REQUIRE(railed.size() == 1);
  CHECK(railed[0].info.railId == 5);
  CHECK(railed[0].info.planeId == 2);
  CHECK(host.discover("nothing").empty());
  CHECK(gOpen == 0);
}

TEST_CASE("discovery applies RAILNET_IB_GID_INDEX and RAILNET_IB_ADDR_FAMILY", "[verbs]") {
  FakeHost host;
  WarningCapture warnings;
  auto forced = host.discover("rxe", 1);
  REQUIRE(forced.size() == 1);
  CHECK(forced[0].gidIndex == 1);
  auto forcedIb = host.discover("ib0dev", 0);
  REQUIRE(forcedIb.size() == 1);
  CHECK(forcedIb[0].gidIndex == 0);  // a GRH for routed InfiniBand
  auto v6 = host.discover("rxe", -1, AF_INET6);
  REQUIRE(v6.size() == 1);
  CHECK(v6[0].gidIndex == 1);              // no global IPv6 GID: the first RoCE v2 one
  auto missing = host.discover("rxe", 7);  // slot 7 is empty: automatic choice, with a warning
  REQUIRE(missing.size() == 1);
  CHECK(missing[0].gidIndex == 3);
  CHECK(warnings.saw("RAILNET_IB_GID_INDEX=7 is not a populated GID of rxe0:1; using GID 3"));
}
