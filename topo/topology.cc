#include "topo/topology.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <optional>

#include "base/cuda_driver.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "topo/hwloc_api.h"
#include "topo/route.h"

namespace railnet::topo {
namespace {

constexpr unsigned short kNvidiaVendor = 0x10de;

std::string formatBusId(unsigned domain, unsigned bus, unsigned dev, unsigned func) {
  char text[32];
  snprintf(text, sizeof(text), "%04x:%02x:%02x.%01x", domain, bus, dev, func);
  return text;
}

std::string busIdOf(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return formatBusId(pci.domain, pci.bus, pci.dev, pci.func);
}

// "0000:1B:00.0" / "00000000:1b:00.0" -> "0000:1b:00.0"; "" when it does not parse.
std::string normalizeBusId(const char* text) {
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
  if (sscanf(text, "%x:%x:%x.%x", &domain, &bus, &dev, &func) != 4) return "";
  return formatBusId(domain, bus, dev, func);
}

const char* infoOf(hwloc_obj_t obj, const char* name) {
  for (unsigned i = 0; i < obj->infos_count; ++i) {
    if (strcmp(obj->infos[i].name, name) == 0) return obj->infos[i].value;
  }
  return nullptr;
}

// Every object of one type (NUMA nodes and PCI devices included: their virtual depths work the same way).
template <class Visit>
void forEach(const HwlocApi& api, hwloc_topology_t topology, hwloc_obj_type_t type, Visit visit) {
  int depth = api.getTypeDepth(topology, type);
  if (depth == HWLOC_TYPE_DEPTH_UNKNOWN || depth == HWLOC_TYPE_DEPTH_MULTIPLE) return;
  for (unsigned i = 0;; ++i) {
    hwloc_obj_t obj = api.getObjByDepth(topology, depth, i);
    if (obj == nullptr) return;
    visit(obj);
  }
}

// sysfs cpumap format: 32-bit hex words, most significant first, comma-separated.
std::string cpumapOf(const HwlocApi& api, hwloc_const_bitmap_t set) {
  if (set == nullptr || api.bitmapIsZero(set)) return "00000000";
  int last = api.bitmapLast(set);
  if (last < 0) return "ffffffff";  // infinite set
  std::string out;
  for (int word = last / 32; word >= 0; --word) {
    unsigned long bits = api.bitmapToIthUlong(set, static_cast<unsigned>(word / (sizeof(unsigned long) * 8 / 32)));
    if (sizeof(unsigned long) == 8) bits = (word % 2 == 1) ? (bits >> 32) : (bits & 0xffffffffUL);
    char text[16];
    snprintf(text, sizeof(text), "%08lx", bits & 0xffffffffUL);
    if (!out.empty()) out += ',';
    out += text;
  }
  return out;
}

int packageOf(const HwlocApi& api, hwloc_topology_t topology, hwloc_obj_t ancestor) {
  int found = -1;
  forEach(api, topology, HWLOC_OBJ_PACKAGE, [&](hwloc_obj_t package) {
    if (found < 0 && ancestor->cpuset != nullptr && !api.bitmapIsZero(ancestor->cpuset) &&
        api.bitmapIsIncluded(ancestor->cpuset, package->cpuset)) {
      found = static_cast<int>(package->os_index);
    }
  });
  return found;
}

PciLocation locate(const HwlocApi& api, hwloc_topology_t topology, hwloc_obj_t pcidev) {
  PciLocation where;
  where.busId = busIdOf(pcidev->attr->pcidev);
  where.linkGBps = pcidev->attr->pcidev.linkspeed;
  std::vector<std::string> upward;
  for (hwloc_obj_t parent = pcidev->parent; parent != nullptr && parent->type == HWLOC_OBJ_BRIDGE;
       parent = parent->parent) {
    const hwloc_obj_attr_u::hwloc_bridge_attr_s& bridge = parent->attr->bridge;
    if (bridge.upstream_type == HWLOC_OBJ_BRIDGE_HOST) {
      char name[32];
      snprintf(name, sizeof(name), "pci%04x:%02x", static_cast<unsigned>(bridge.downstream.pci.domain),
               static_cast<unsigned>(bridge.downstream.pci.secondary_bus));
      where.hostBridge = name;
      break;
    }
    upward.push_back(busIdOf(bridge.upstream.pci));
  }
  where.bridges.assign(upward.rbegin(), upward.rend());
  // PCIe alternates below a root port: switch upstream port, its downstream ports, the next switch's upstream
  // port... Index 0 is the root port, so the upstream ports are at the odd indices (docs/topology.md).
  for (size_t i = 1; i < where.bridges.size(); i += 2) where.switches.push_back(where.bridges[i]);
  std::reverse(where.switches.begin(), where.switches.end());

  hwloc_obj_t ancestor = pcidev;  // the first non-I/O ancestor: I/O objects have no cpuset
  while (ancestor != nullptr && ancestor->cpuset == nullptr) ancestor = ancestor->parent;
  if (ancestor != nullptr) {
    if (ancestor->nodeset != nullptr && api.bitmapWeight(ancestor->nodeset) == 1) {
      where.numaNode = api.bitmapFirst(ancestor->nodeset);
    }
    where.package = packageOf(api, topology, ancestor);
  }
  return where;
}

int parseSpeedFile(const std::string& path, double scale) {
  std::ifstream in(path);
  double value = 0;
  if (!(in >> value) || value <= 0) return 0;
  return static_cast<int>(value * scale);
}

// Speed: the fixture's RailnetSpeedMbps info, else (live machine only) sysfs.
int nicSpeed(hwloc_obj_t osdev, bool live) {
  if (const char* text = infoOf(osdev, "RailnetSpeedMbps")) return atoi(text);
  if (!live) return 0;
  std::string name = osdev->name != nullptr ? osdev->name : "";
  if (osdev->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
    return parseSpeedFile("/sys/class/infiniband/" + name + "/ports/1/rate", 1000);  // "400 Gb/sec (4X NDR)"
  }
  return parseSpeedFile("/sys/class/net/" + name + "/speed", 1);  // Mb/s, -1 when down
}

int countPorts(hwloc_obj_t osdev) {
  int ports = 0;
  for (unsigned i = 0; i < osdev->infos_count; ++i) {
    unsigned port = 0;
    char tail[16] = {};
    if (sscanf(osdev->infos[i].name, "Port%uStat%15s", &port, tail) == 2 && strcmp(tail, "e") == 0) ++ports;
  }
  return ports;
}

bool isGpu(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return pci.vendor_id == kNvidiaVendor && (pci.class_id == 0x0302 || pci.class_id == 0x0300);
}

void assignCudaOrdinals(Topology* topology) {
  std::string why;
  const cuda::DriverApi* api = cuda::initDriver(&why);
  if (api == nullptr) {
    RN_INFO(NCCL_INIT, "NET/railnet: topology: no CUDA ordinals (%s)", why.c_str());
    return;
  }
  int count = 0;
  if (api->cuDeviceGetCount(&count) != cuda::CUDA_SUCCESS) return;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cuda::CUdevice device = 0;
    char busId[64] = {};
    if (api->cuDeviceGet(&device, ordinal) != cuda::CUDA_SUCCESS) continue;
    if (api->cuDeviceGetPCIBusId(busId, sizeof(busId), device) != cuda::CUDA_SUCCESS) continue;
    std::string normalized = normalizeBusId(busId);
    for (Gpu& gpu : topology->gpus) {
      if (gpu.where.busId == normalized) gpu.cudaIndex = ordinal;
    }
  }
}

}  // namespace

const char* pathName(PathType type) {
  switch (type) {
    case PathType::PIX:
      return "PIX";
    case PathType::PXB:
      return "PXB";
    case PathType::PHB:
      return "PHB";
    case PathType::NODE:
      return "NODE";
    case PathType::SYS:
      return "SYS";
  }
  return "?";
}

std::string PciLocation::sysfsPath() const {
  std::string path = "/sys/devices/" + (hostBridge.empty() ? std::string("pci") + busId.substr(0, 7) : hostBridge);
  for (const std::string& bridge : bridges) path += "/" + bridge;
  return path + "/" + busId;
}

bool Nic::hasName(std::string_view name) const {
  if (name.empty()) return false;
  if (verbsName == name) return true;
  return std::find(netdevs.begin(), netdevs.end(), name) != netdevs.end();
}

PathType classify(const PciLocation& a, const PciLocation& b) {
  if (!a.hostBridge.empty() && a.hostBridge == b.hostBridge) {
    // The nearest switch both sit below; the path crosses every switch between each device and it, plus it.
    for (size_t i = 0; i < a.switches.size(); ++i) {
      auto found = std::find(b.switches.begin(), b.switches.end(), a.switches[i]);
      if (found != b.switches.end()) {
        size_t crossed = i + static_cast<size_t>(found - b.switches.begin()) + 1;
        return crossed <= 1 ? PathType::PIX : PathType::PXB;
      }
    }
    return PathType::PHB;
  }
  if (a.numaNode >= 0 && a.numaNode == b.numaNode) return PathType::NODE;
  if (a.numaNode < 0 && b.numaNode < 0 && a.package >= 0 && a.package == b.package) return PathType::NODE;
  return PathType::SYS;
}

Topology loadTopology(const std::string& xmlFile) {
  const bool live = xmlFile.empty();
  std::string why;
  const HwlocApi* api = loadHwloc(&why);
  if (api == nullptr && live) {
    RN_INFO(NCCL_INIT, "NET/railnet: topology from sysfs (%s)", why.c_str());
    Topology result = loadSysfsTopology("/sys");
    if (!result.gpus.empty()) assignCudaOrdinals(&result);
    return result;
  }
  if (api == nullptr) fail(ncclSystemError, "NET/railnet: cannot read %s: %s", xmlFile.c_str(), why.c_str());
  hwloc_topology_t raw = nullptr;
  if (api->topologyInit(&raw) != 0) fail(ncclSystemError, "NET/railnet: hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> owner(raw, api->topologyDestroy);
  if (!live && api->topologySetXml(raw, xmlFile.c_str()) != 0) {
    fail(ncclInvalidUsage, "NET/railnet: cannot use hwloc XML %s: %s", xmlFile.c_str(), errnoText(errno).c_str());
  }
  api->topologySetIoTypesFilter(raw, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  if (api->topologyLoad(raw) != 0) {
    fail(ncclInvalidUsage, "NET/railnet: hwloc cannot load %s: %s", live ? "this machine" : xmlFile.c_str(),
         errnoText(errno).c_str());
  }

  Topology result;
  result.source = live ? "live" : xmlFile;
  hwloc_obj_t root = api->getObjByDepth(raw, 0, 0);
  if (const char* arch = infoOf(root, "Architecture")) result.arch = arch;
  result.machineCpumap = cpumapOf(*api, root->cpuset);

  forEach(*api, raw, HWLOC_OBJ_PACKAGE, [&](hwloc_obj_t obj) {
    Package package;
    package.osIndex = static_cast<int>(obj->os_index);
    if (const char* vendor = infoOf(obj, "CPUVendor")) package.vendor = vendor;
    if (const char* family = infoOf(obj, "CPUFamilyNumber")) package.family = atoi(family);
    if (const char* model = infoOf(obj, "CPUModelNumber")) package.model = atoi(model);
    result.packages.push_back(package);
  });
  forEach(*api, raw, HWLOC_OBJ_NUMANODE, [&](hwloc_obj_t obj) {
    NumaNode node;
    node.osIndex = static_cast<int>(obj->os_index);
    node.package = packageOf(*api, raw, obj);
    node.cpumap = cpumapOf(*api, obj->cpuset);
    result.numaNodes.push_back(node);
  });

  forEach(*api, raw, HWLOC_OBJ_PCI_DEVICE, [&](hwloc_obj_t pci) {
    const hwloc_obj_attr_u::hwloc_pcidev_attr_s& attr = pci->attr->pcidev;
    const char* model = infoOf(pci, "PCIDevice");
    if (isGpu(attr)) {
      Gpu gpu;
      gpu.model = model != nullptr ? model : "";
      gpu.where = locate(*api, raw, pci);
      result.gpus.push_back(gpu);
      return;
    }
    Nic nic;
    for (hwloc_obj_t child = pci->io_first_child; child != nullptr; child = child->next_sibling) {
      if (child->type != HWLOC_OBJ_OS_DEVICE || child->name == nullptr) continue;
      if (child->attr->osdev.type == HWLOC_OBJ_OSDEV_OPENFABRICS) {
        nic.verbsName = child->name;
        nic.ports = countPorts(child);
        nic.speedMbps = std::max(nic.speedMbps, nicSpeed(child, live));
      } else if (child->attr->osdev.type == HWLOC_OBJ_OSDEV_NETWORK) {
        nic.netdevs.push_back(child->name);
        if (nic.speedMbps == 0) nic.speedMbps = nicSpeed(child, live);
      }
    }
    if (nic.verbsName.empty() && nic.netdevs.empty()) return;
    nic.model = model != nullptr ? model : "";
    nic.where = locate(*api, raw, pci);
    result.nics.push_back(nic);
  });

  std::sort(result.gpus.begin(), result.gpus.end(),
            [](const Gpu& a, const Gpu& b) { return a.where.busId < b.where.busId; });
  for (size_t i = 0; i < result.gpus.size(); ++i) result.gpus[i].index = static_cast<int>(i);
  std::sort(result.nics.begin(), result.nics.end(), [](const Nic& a, const Nic& b) {
    return a.where.busId != b.where.busId ? a.where.busId < b.where.busId : a.name() < b.name();
  });
  if (live && !result.gpus.empty()) assignCudaOrdinals(&result);
  return result;
}

std::vector<int> sparesNearest(const std::vector<std::string>& pciPaths, int dev,
                               const std::function<bool(int)>& eligible) {
  constexpr int kUnknownDistance = static_cast<int>(PathType::SYS) + 1;
  auto location = [&](int index) -> std::optional<PciLocation> {
    const std::string& path = pciPaths[static_cast<size_t>(index)];
    if (path.empty()) return std::nullopt;
    try {
      return locationFromSysfsPath(path);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const std::optional<PciLocation> from = location(dev);
  const auto distance = [&](int, int to) {
    const std::optional<PciLocation> there = location(to);
    return from && there ? static_cast<int>(classify(*from, *there)) : kUnknownDistance;
  };
  return spareOrder(static_cast<int>(pciPaths.size()), dev, distance, eligible);
}

}  // namespace railnet::topo
