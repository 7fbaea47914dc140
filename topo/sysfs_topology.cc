// The topology from sysfs, for hosts without libhwloc (docs/topology.md, "Discovery").
#include <sys/utsname.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "topo/topology.h"

namespace railnet::topo {
namespace {

namespace fs = std::filesystem;

std::string readLine(const fs::path& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

long readNumber(const fs::path& file, long fallback, int base = 10) {
  std::string text = readLine(file);
  if (text.empty()) return fallback;
  char* end = nullptr;
  long value = strtol(text.c_str(), &end, base);
  return end == text.c_str() ? fallback : value;
}

bool isBusId(const std::string& name) {
  unsigned domain = 0, bus = 0, dev = 0, func = 0;
  char tail = 0;
  return name.size() >= 12 && sscanf(name.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &dev, &func, &tail) == 4;
}

// realpath of a sysfs link such as class/net/<if>/device; "" when absent.
std::string resolved(const fs::path& link) {
  std::error_code error;
  fs::path target = fs::canonical(link, error);
  return error ? "" : target.string();
}

int packageOfCpu(const std::string& root, long cpu) {
  return static_cast<int>(readNumber(
      fs::path(root) / "devices/system/cpu" / ("cpu" + std::to_string(cpu)) / "topology/physical_package_id", -1));
}

int speedOf(const std::string& root, const std::string& verbs, const std::string& netdev) {
  if (!verbs.empty()) {
    std::string rate = readLine(fs::path(root) / "class/infiniband" / verbs / "ports/1/rate");  // "400 Gb/sec (4X NDR)"
    double gbps = atof(rate.c_str());
    if (gbps > 0) return static_cast<int>(gbps * 1000);
  }
  if (!netdev.empty()) {
    long mbps = readNumber(fs::path(root) / "class/net" / netdev / "speed", 0);
    if (mbps > 0) return static_cast<int>(mbps);
  }
  return 0;
}

// Union of two sysfs cpumaps ("ffffffff,0000000f"): 32-bit words, most significant first.
std::string cpumapUnion(const std::string& a, const std::string& b) {
  auto words = [](const std::string& map) {
    std::vector<unsigned long> out;  // least significant first
    size_t end = map.size();
    while (end > 0) {
      size_t comma = map.rfind(',', end - 1);
      size_t begin = comma == std::string::npos ? 0 : comma + 1;
      out.push_back(strtoul(map.substr(begin, end - begin).c_str(), nullptr, 16));
      end = comma == std::string::npos ? 0 : comma;
    }
    return out;
  };
  std::vector<unsigned long> x = words(a), y = words(b);
  if (x.size() < y.size()) x.resize(y.size(), 0);
  for (size_t i = 0; i < y.size(); ++i) x[i] |= y[i];
  std::string out;
  for (size_t i = x.size(); i-- > 0;) {
    char text[16];
    snprintf(text, sizeof(text), "%08lx", x[i] & 0xffffffffUL);
    out += (out.empty() ? "" : ",") + std::string(text);
  }
  return out;
}

}  // namespace

PciLocation locationFromSysfsPath(const std::string& path) {
  PciLocation where;
  std::vector<std::string> parts;
  size_t start = path.find("/devices/");
  std::string rest = start == std::string::npos ? path : path.substr(start + 9);
  for (size_t pos = 0; pos <= rest.size();) {
    size_t slash = rest.find('/', pos);
    std::string part = rest.substr(pos, slash == std::string::npos ? std::string::npos : slash - pos);
    if (!part.empty()) parts.push_back(part);
    if (slash == std::string::npos) break;
    pos = slash + 1;
  }
  if (parts.empty()) return where;
  where.busId = parts.back();
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    if (parts[i].rfind("pci", 0) == 0 && where.bridges.empty()) {
      where.hostBridge = parts[i];
    } else if (isBusId(parts[i])) {
      where.bridges.push_back(parts[i]);
    }
  }
  for (size_t i = 1; i < where.bridges.size(); i += 2) where.switches.push_back(where.bridges[i]);
  std::reverse(where.switches.begin(), where.switches.end());
  return where;
}

Topology loadSysfsTopology(const std::string& root) {
  Topology result;
  result.source = "live (sysfs)";
  utsname machine{};
  if (uname(&machine) == 0) result.arch = machine.machine;

  // NUMA nodes, their cpumaps and packages.
  std::map<int, int> numaPackage;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(fs::path(root) / "devices/system/node", error)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4 || !isdigit(static_cast<unsigned char>(name[4]))) continue;
    NumaNode node;
    node.osIndex = atoi(name.c_str() + 4);
    node.cpumap = readLine(entry.path() / "cpumap");
    node.package = packageOfCpu(root, atol(readLine(entry.path() / "cpulist").c_str()));
    numaPackage[node.osIndex] = node.package;
    result.numaNodes.push_back(node);
  }
  std::sort(result.numaNodes.begin(), result.numaNodes.end(),
            [](const NumaNode& a, const NumaNode& b) { return a.osIndex < b.osIndex; });
  std::set<int> packageIds;
  for (const NumaNode& node : result.numaNodes) {
    if (node.package >= 0) packageIds.insert(node.package);
  }
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line, vendor;
  int family = -1, model = -1;
  while (std::getline(cpuinfo, line) && (vendor.empty() || family < 0 || model < 0)) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id" && vendor.empty()) vendor = value;
    if (key == "cpu family" && family < 0) family = atoi(value.c_str());
    if (key == "model" && model < 0) model = atoi(value.c_str());
  }
  for (int id : packageIds) result.packages.push_back({id, vendor, family, model});

  auto place = [&](PciLocation* where, const fs::path& device) {
    where->numaNode = static_cast<int>(readNumber(device / "numa_node", -1));
    // As hwloc: with a single NUMA node, everything is local to it (sysfs often says -1 then).
    if (where->numaNode < 0 && result.numaNodes.size() == 1) where->numaNode = result.numaNodes[0].osIndex;
    auto found = numaPackage.find(where->numaNode);
    where->package = found != numaPackage.end() ? found->second : -1;
  };

  // GPUs.
  for (const auto& entry : fs::directory_iterator(fs::path(root) / "bus/pci/devices", error)) {
    long vendorId = readNumber(entry.path() / "vendor", 0, 16);
    long classId = readNumber(entry.path() / "class", 0, 16) >> 8;
    if (vendorId != 0x10de || (classId != 0x0302 && classId != 0x0300)) continue;
    Gpu gpu;
    gpu.where = locationFromSysfsPath(resolved(entry.path()));
    place(&gpu.where, entry.path());
    result.gpus.push_back(gpu);
  }

  // NICs: RDMA devices and network interfaces with a PCI function, grouped by bus id.
  std::map<std::string, Nic> byBusId;
  for (const char* kind : {"infiniband", "net"}) {
    for (const auto& entry : fs::directory_iterator(fs::path(root) / "class" / kind, error)) {
      std::string device = resolved(entry.path() / "device");
      // A virtio NIC's device is a child of its PCI function (".../0000:00:03.0/virtio0"): go up to the function.
      while (!device.empty() && device.find("/devices/pci") != std::string::npos &&
             !isBusId(fs::path(device).filename().string())) {
        device = fs::path(device).parent_path().string();
      }
      if (device.empty() || !isBusId(fs::path(device).filename().string())) continue;
      Nic& nic = byBusId[fs::path(device).filename().string()];
      std::string name = entry.path().filename().string();
      if (std::string(kind) == "infiniband") {
        nic.verbsName = name;
        std::error_code portError;
        for (const auto& port : fs::directory_iterator(entry.path() / "ports", portError)) {
          (void)port;
          ++nic.ports;
        }
      } else {
        nic.netdevs.push_back(name);
      }
      if (nic.where.busId.empty()) {
        nic.where = locationFromSysfsPath(device);
        place(&nic.where, fs::path(device));
      }
    }
  }
  for (auto& [busId, nic] : byBusId) {
    std::sort(nic.netdevs.begin(), nic.netdevs.end());
    nic.speedMbps = speedOf(root, nic.verbsName, nic.netdevs.empty() ? "" : nic.netdevs.front());
    result.nics.push_back(nic);
  }

  std::sort(result.gpus.begin(), result.gpus.end(),
            [](const Gpu& a, const Gpu& b) { return a.where.busId < b.where.busId; });
  for (size_t i = 0; i < result.gpus.size(); ++i) result.gpus[i].index = static_cast<int>(i);
  result.machineCpumap = "00000000";
  for (const NumaNode& node : result.numaNodes) result.machineCpumap = cpumapUnion(result.machineCpumap, node.cpumap);
  if (result.numaNodes.empty()) result.machineCpumap = "ffffffff";
  return result;
}

}  // namespace railnet::topo
