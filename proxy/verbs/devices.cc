#include "proxy/verbs/devices.h"

#include <arpa/inet.h>
#include <endian.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <optional>

#include "proxy/verbs/gpu_direct.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {

// ---- Pure parts ----------------------------------------------------------------------------------------------

int portSpeedMbps(uint8_t activeWidth, uint32_t activeSpeed) {
  // Indexed by the bit number of the code. Width bits: 1x, 4x, 8x, 12x, 2x.
  static constexpr int kLanes[] = {1, 4, 8, 12, 2};
  // Speed bits: SDR, DDR, QDR, FDR10 (10.3125 Gb/s at 64b/66b), FDR, EDR, HDR, NDR, XDR.
  static constexpr int kLaneMbps[] = {2500, 5000, 10000, 10000, 14000, 25000, 50000, 100000, 200000};
  auto bit = [](uint32_t code, size_t count) -> int {  // -1 unless exactly one known bit is set
    if (code == 0 || (code & (code - 1)) != 0) return -1;
    int n = std::countr_zero(code);
    return static_cast<size_t>(n) < count ? n : -1;
  };
  int width = bit(activeWidth, std::size(kLanes));
  int speed = bit(activeSpeed, std::size(kLaneMbps));
  return width < 0 || speed < 0 ? 0 : kLanes[width] * kLaneMbps[speed];
}

// The RAILNET_IB_HCA filter reports "no rail / plane" as NCCL does.
static_assert(topo::NameFilter::kNoId == NCCL_NET_ID_UNDEF);

bool gidIsZero(const ibv_gid& gid) {
  for (uint8_t byte : gid.raw) {
    if (byte != 0) return false;
  }
  return true;
}

bool gidIsIpv4Mapped(const ibv_gid& gid) {
  for (int i = 0; i < 10; ++i) {
    if (gid.raw[i] != 0) return false;
  }
  return gid.raw[10] == 0xff && gid.raw[11] == 0xff;
}

bool gidIsLinkLocal(const ibv_gid& gid) { return gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80; }

std::string formatGid(const ibv_gid& gid) {
  char text[INET6_ADDRSTRLEN] = {};
  if (inet_ntop(AF_INET6, gid.raw, text, sizeof(text)) == nullptr) return "?";
  return text;
}

int selectGidIndex(const std::vector<GidEntry>& table, int family, int forcedIndex) {
  if (forcedIndex >= 0) {
    for (const GidEntry& entry : table) {
      if (entry.index == forcedIndex && !gidIsZero(entry.gid)) return forcedIndex;
    }
  }
  auto roceV2 = [](const GidEntry& entry) { return entry.type == "RoCE v2" && !gidIsZero(entry.gid); };
  auto ofFamily = [family](const ibv_gid& gid) {
    if (family == AF_INET6) return !gidIsIpv4Mapped(gid) && !gidIsLinkLocal(gid);
    return gidIsIpv4Mapped(gid);
  };
  for (const GidEntry& entry : table) {
    if (roceV2(entry) && ofFamily(entry.gid)) return entry.index;
  }
  for (const GidEntry& entry : table) {
    if (roceV2(entry)) return entry.index;
  }
  return -1;
}

// ---- sysfs ---------------------------------------------------------------------------------------------------

namespace {

std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!std::getline(in, line)) return {};
  while (!line.empty() && (line.back() == '\n' || line.back() == ' ' || line.back() == '\0')) line.pop_back();
  return line;
}

// PCI functions only: rxe, siw and other software devices have no device link or one outside the PCI tree.
std::string sysfsPciPath(const std::string& root, const std::string& device) {
  char resolved[PATH_MAX];
  if (realpath((root + "/" + device + "/device").c_str(), resolved) == nullptr) return {};
  return strstr(resolved, "/pci") != nullptr ? std::string(resolved) : std::string();
}

int sysfsNumaNode(const std::string& root, const std::string& device) {
  std::string text = readLine(root + "/" + device + "/device/numa_node");
  int node = -1;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), node);
  (void)end;
  return error == std::errc() ? node : -1;
}

}  // namespace

std::vector<GidEntry> readGidTable(const IbvApi& api, ibv_context* context, const std::string& sysfsRoot,
                                   const std::string& device, int port, int tableLength) {
  std::vector<GidEntry> table;
  std::string typesDir = sysfsRoot + "/" + device + "/ports/" + std::to_string(port) + "/gid_attrs/types/";
  for (int index = 0; index < tableLength; ++index) {
    GidEntry entry;
    entry.index = index;
    // Unpopulated slots fail (newer kernels) or read as zero (older ones): both are skipped.
    if (api.queryGid(context, static_cast<uint8_t>(port), index, &entry.gid) != 0 || gidIsZero(entry.gid)) continue;
    entry.type = readLine(typesDir + std::to_string(index));
    table.push_back(std::move(entry));
  }
  return table;
}

// ---- Discovery -----------------------------------------------------------------------------------------------

DiscoveryOptions DiscoveryOptions::fromSettings() {
  const Settings& config = settings();
  DiscoveryOptions options;
  options.hca = config.ibHca;
  options.gidIndex = static_cast<int>(config.ibGidIndex);   // -1..255 (settings table)
  options.family = static_cast<int>(config.ibAddrFamily);  // AF_INET or AF_INET6
  options.maxRecvs = static_cast<int>(config.maxRecvs);    // 1..8 (settings table)
  return options;
}

namespace {

constexpr int kUnknownSpeedMbps = 10000;  // what NCCL assumes for a speed it cannot read
constexpr int kMaxGidTableLength = 4096;  // bounds the scan should a driver report nonsense

uint64_t fallbackGuid(const std::string& device) {  // FNV-1a: stable across runs and processes
  uint64_t hash = 1469598103934665603ULL;
  for (unsigned char c : device) hash = (hash ^ c) * 1099511628211ULL;
  return hash;
}

// XDR and later only appear in active_speed_ex, which newer rdma-core headers have (a template, so that the
// member test compiles against headers without it).
template <typename PortAttr>
uint32_t speedCodeOf(const PortAttr& attr) {
  if constexpr (requires { attr.active_speed_ex; }) {
    if (attr.active_speed_ex != 0) return attr.active_speed_ex;
  }
  return attr.active_speed;
}

// The port's addressing for the log line.
std::string describeAddress(const VerbsPort& port) {
  char text[160];
  if (port.gidIndex < 0) {
    snprintf(text, sizeof(text), "LID 0x%x", port.lid);
  } else {
    snprintf(text, sizeof(text), "GID[%d] %s", port.gidIndex, formatGid(port.gid).c_str());
  }
  return text;
}

// Fills port->gidIndex / port->gid; false (after a WARN) when the port cannot be addressed.
bool chooseAddress(const IbvApi& api, ibv_context* context, const ibv_port_attr& attr, const DiscoveryOptions& options,
                   VerbsPort* port) {
  std::string where = port->device + ":" + std::to_string(port->port);
  if (port->linkLayer == IBV_LINK_LAYER_ETHERNET) {
    std::vector<GidEntry> table = readGidTable(api, context, options.sysfsRoot, port->device, port->port,
                                               std::min(attr.gid_tbl_len, kMaxGidTableLength));
    port->gidIndex = selectGidIndex(table, options.family, options.gidIndex);
    if (port->gidIndex < 0) {
      RN_WARN(
          "NET/railnet: verbs device %s skipped: no usable RoCE v2 GID among %zu populated GIDs "
          "(RAILNET_IB_ADDR_FAMILY=%s; RAILNET_IB_GID_INDEX forces one)",
          where.c_str(), table.size(), options.family == AF_INET6 ? "AF_INET6" : "AF_INET");
      return false;
    }
    if (options.gidIndex >= 0 && port->gidIndex != options.gidIndex) {
      RN_WARN("NET/railnet: RAILNET_IB_GID_INDEX=%d is not a populated GID of %s; using GID %d", options.gidIndex,
              where.c_str(), port->gidIndex);
    }
    for (const GidEntry& entry : table) {
      if (entry.index == port->gidIndex) port->gid = entry.gid;
    }
    return true;
  }
  // InfiniBand: LID routing inside the subnet; a forced GID index adds a GRH (e.g. routed IB).
  if (options.gidIndex >= 0) {
    if (api.queryGid(context, static_cast<uint8_t>(port->port), options.gidIndex, &port->gid) == 0 &&
        !gidIsZero(port->gid)) {
      port->gidIndex = options.gidIndex;
    } else {
      port->gid = ibv_gid{};
      RN_WARN("NET/railnet: RAILNET_IB_GID_INDEX=%d is not a populated GID of %s; using LID routing", options.gidIndex,
              where.c_str());
    }
  }
  if (port->gidIndex < 0 && port->lid == 0) {
    RN_WARN("NET/railnet: verbs device %s skipped: InfiniBand port without a LID (is a subnet manager running?)",
            where.c_str());
    return false;
  }
  return true;
}

void probeDevice(const IbvApi& api, ibv_device* device, const topo::NameFilter& filter, const DiscoveryOptions& options,
                 std::vector<VerbsPort>* found) {
  const char* rawName = api.getDeviceName(device);
  std::string name = rawName != nullptr ? rawName : device->name;
  if (!filter.selectsDevice(name)) return;
  if (device->transport_type != IBV_TRANSPORT_IB) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: verbs device %s skipped: not InfiniBand or RoCE (transport %d)",
            name.c_str(), static_cast<int>(device->transport_type));
    return;
  }
  ibv_context* context = api.openDevice(device);
  if (context == nullptr) {
    RN_WARN("NET/railnet: verbs device %s skipped: cannot open it: %s", name.c_str(), strerror(errno));
    return;
  }
  auto closer = [&api](ibv_context* opened) { api.closeDevice(opened); };
  std::unique_ptr<ibv_context, decltype(closer)> guard(context, closer);

  ibv_device_attr deviceAttr{};
  if (int rc = api.queryDevice(context, &deviceAttr); rc != 0) {
    RN_WARN("NET/railnet: verbs device %s skipped: ibv_query_device failed: %s", name.c_str(), strerror(rc));
    return;
  }
  std::string pciPath = sysfsPciPath(options.sysfsRoot, name);
  int numaNode = sysfsNumaNode(options.sysfsRoot, name);
  uint64_t guid = be64toh(deviceAttr.node_guid);
  if (guid == 0) guid = fallbackGuid(name);

  std::optional<GdrDecision> gdr;
  for (int portNumber = 1; portNumber <= deviceAttr.phys_port_cnt; ++portNumber) {
    if (!filter.matches(name, portNumber)) continue;
    ibv_port_attr attr{};
    if (int rc = api.queryPort(context, static_cast<uint8_t>(portNumber), &attr); rc != 0) {
      RN_WARN("NET/railnet: verbs device %s:%d skipped: ibv_query_port failed: %s", name.c_str(), portNumber,
              strerror(rc));
      continue;
    }
    if (attr.state != IBV_PORT_ACTIVE) {
      RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: verbs device %s:%d skipped: port not active (state %d)", name.c_str(),
              portNumber, static_cast<int>(attr.state));
      continue;
    }
    VerbsPort port;
    port.device = name;
    port.port = portNumber;
    // Old drivers leave the link layer unspecified on InfiniBand ports (ibv_devinfo reads it the same way).
    port.linkLayer = attr.link_layer == IBV_LINK_LAYER_UNSPECIFIED ? int{IBV_LINK_LAYER_INFINIBAND} : attr.link_layer;
    if (port.linkLayer != IBV_LINK_LAYER_INFINIBAND && port.linkLayer != IBV_LINK_LAYER_ETHERNET) {
      RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: verbs device %s:%d skipped: link layer %d", name.c_str(), portNumber,
              port.linkLayer);
      continue;
    }
    port.lid = attr.lid;
    port.activeMtu = attr.active_mtu;
    port.numaNode = numaNode;
    if (!chooseAddress(api, context, attr, options, &port)) continue;

    uint32_t speedCode = speedCodeOf(attr);
    int speed = portSpeedMbps(attr.active_width, speedCode);
    if (speed == 0) {
      RN_INFO(NCCL_INIT | NCCL_NET,
              "NET/railnet: verbs device %s:%d has unknown width/speed codes %u/%u; "
              "reporting %d Mbps",
              name.c_str(), portNumber, attr.active_width, speedCode, kUnknownSpeedMbps);
      speed = kUnknownSpeedMbps;
    }
    DeviceInfo& info = port.info;
    info.pciPath = pciPath;
    info.guid = guid;
    if (!gdr) gdr = decideGdr(gatherGdrInputs(api, context));  // once per device: the probe is per context
    info.ptrSupport = gdr->ptrSupport;
    port.gdrDmabuf = gdr->dmabuf;
    port.gdrPeermem = gdr->peermem;
    port.gdrSummary = gdr->summary;
    info.regIsGlobal = true;
    info.speedMbps = speed;
    info.port = portNumber;
    info.maxComms = deviceAttr.max_qp > 0 ? deviceAttr.max_qp : 65536;
    info.maxRecvs = options.maxRecvs;
    info.maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
    info.railId = filter.railId(name, portNumber);
    info.planeId = filter.planeId(name, portNumber);
    found->push_back(std::move(port));
  }
}

std::vector<VerbsPort> discover(const IbvApi& api, const DiscoveryOptions& options) {
  if (int rc = api.forkInit(); rc != 0) {
    RN_WARN("NET/railnet: ibv_fork_init failed: %s; forking after registering memory is unsafe", strerror(rc));
  }
  int count = 0;
  errno = 0;
  ibv_device** list = api.getDeviceList(&count);
  if (list == nullptr) {
    // ENOSYS: no kernel support (no ib_uverbs), the usual state of a host without RDMA hardware.
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: no RDMA devices (ibv_get_device_list: %s)", strerror(errno));
    return {};
  }
  auto freer = [&api](ibv_device** devices) { api.freeDeviceList(devices); };
  std::unique_ptr<ibv_device*, decltype(freer)> guard(list, freer);

  topo::NameFilter filter(options.hca);
  std::vector<VerbsPort> ports;
  for (int d = 0; d < count && list[d] != nullptr; ++d) {
    try {
      probeDevice(api, list[d], filter, options, &ports);
    } catch (const std::exception& e) {
      RN_WARN("NET/railnet: verbs device %s skipped: %s", list[d]->name, e.what());
    }
  }

  // Names must be unique: the bare device name when only one of its ports is used.
  std::map<std::string, int> portsPerDevice;
  for (const VerbsPort& port : ports) ++portsPerDevice[port.device];
  for (VerbsPort& port : ports) {
    port.info.name = portsPerDevice[port.device] == 1 ? port.device : port.device + ":" + std::to_string(port.port);
    RN_INFO(NCCL_INIT | NCCL_NET,
            "NET/railnet: verbs device %s:%d as %s: %s, %s, %d Mbps, MTU %d, NUMA %d, PCI %s, GPUDirect: %s",
            port.device.c_str(), port.port, port.info.name.c_str(),
            port.linkLayer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand", describeAddress(port).c_str(),
            port.info.speedMbps, 128 << static_cast<int>(port.activeMtu), port.numaNode,
            port.info.pciPath.empty() ? "none" : port.info.pciPath.c_str(), port.gdrSummary.c_str());
  }
  if (ports.empty()) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: no usable verbs port among %d RDMA device(s) (RAILNET_IB_HCA=\"%s\")",
            count, options.hca.c_str());
  }
  return ports;
}

}  // namespace

std::vector<VerbsPort> discoverPorts(const IbvApi& api) { return discoverPorts(api, DiscoveryOptions::fromSettings()); }

std::vector<VerbsPort> discoverPorts(const IbvApi& api, const DiscoveryOptions& options) {
  try {
    return discover(api, options);
  } catch (const std::exception& e) {  // e.g. bad_alloc: discovery reports, it never throws
    RN_WARN("NET/railnet: RDMA device discovery failed: %s", e.what());
    return {};
  }
}

ibv_context* openDeviceByName(const IbvApi& api, const std::string& device) {
  int count = 0;
  ibv_device** list = api.getDeviceList(&count);
  if (list == nullptr) {
    RN_WARN("NET/railnet: cannot open verbs device %s: ibv_get_device_list: %s", device.c_str(), strerror(errno));
    return nullptr;
  }
  ibv_context* context = nullptr;
  bool seen = false;
  for (int d = 0; d < count && list[d] != nullptr && !seen; ++d) {
    const char* name = api.getDeviceName(list[d]);
    if (name == nullptr || device != name) continue;
    seen = true;
    context = api.openDevice(list[d]);
    if (context == nullptr) RN_WARN("NET/railnet: cannot open verbs device %s: %s", device.c_str(), strerror(errno));
  }
  // The context keeps its device alive: freeing the list does not free an opened device.
  api.freeDeviceList(list);
  if (!seen) RN_WARN("NET/railnet: verbs device %s is gone", device.c_str());
  return context;
}

}  // namespace railnet::verbs
