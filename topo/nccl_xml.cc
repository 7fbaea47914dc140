#include "topo/nccl_xml.h"

#include <cstdio>
#include <memory>
#include <utility>

namespace railnet::topo {
namespace {

struct Element {
  std::string tag;
  std::vector<std::pair<std::string, std::string>> attrs;
  std::vector<std::unique_ptr<Element>> subs;

  const std::string* attr(const std::string& name) const {
    for (const auto& [key, value] : attrs) {
      if (key == name) return &value;
    }
    return nullptr;
  }
  Element* add(std::string childTag, std::vector<std::pair<std::string, std::string>> childAttrs) {
    subs.push_back(std::make_unique<Element>());
    subs.back()->tag = std::move(childTag);
    subs.back()->attrs = std::move(childAttrs);
    return subs.back().get();
  }
  Element* find(const std::string& childTag, const std::string& key, const std::string& value) {
    for (auto& sub : subs) {
      const std::string* found = sub->attr(key);
      if (sub->tag == childTag && found != nullptr && *found == value) return sub.get();
    }
    return nullptr;
  }
};

std::string escape(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

void write(const Element& element, int depth, std::string* out) {
  out->append(static_cast<size_t>(depth) * 2, ' ');
  *out += "<" + element.tag;
  for (const auto& [key, value] : element.attrs) *out += " " + key + "=\"" + escape(value) + "\"";
  if (element.subs.empty()) {
    *out += "/>\n";
    return;
  }
  *out += ">\n";
  for (const auto& sub : element.subs) write(*sub, depth + 1, out);
  out->append(static_cast<size_t>(depth) * 2, ' ');
  *out += "</" + element.tag + ">\n";
}

// NCCL's kvDictPciGen strings (src/graph/topo.cc). hwloc gives the link's total GB/s but not its width, so the
// link is described as x16 of the generation with the same total.
std::string linkSpeed(float gbps) {
  float lane = gbps / 16;
  if (lane <= 0) return "16.0 GT/s PCIe";
  if (lane > 5.5f) return "64.0 GT/s PCIe";
  if (lane > 2.8f) return "32.0 GT/s PCIe";
  if (lane > 1.4f) return "16.0 GT/s PCIe";
  if (lane > 0.7f) return "8.0 GT/s PCIe";
  if (lane > 0.35f) return "5.0 GT/s PCIe";
  return "2.5 GT/s PCIe";
}

std::vector<std::pair<std::string, std::string>> pciAttrs(const std::string& busId, const char* pciClass, float gbps) {
  return {{"busid", busId}, {"class", pciClass}, {"link_speed", linkSpeed(gbps)}, {"link_width", "16"}};
}

std::string ncclArch(const std::string& hwlocArch) {
  if (hwlocArch.rfind("x86_64", 0) == 0) return "x86_64";
  if (hwlocArch.rfind("aarch64", 0) == 0 || hwlocArch.rfind("arm64", 0) == 0) return "arm64";
  if (hwlocArch.rfind("ppc64", 0) == 0) return "ppc64";
#if defined(__aarch64__)
  return "arm64";
#elif defined(__PPC__)
  return "ppc64";
#else
  return "x86_64";
#endif
}

std::string hexBus(const char* domain, int bus) {
  char text[32];
  snprintf(text, sizeof(text), "%s:%02x:00.0", domain, bus & 0xff);
  return text;
}

Element* cpuFor(const Topology& topology, const Gpu& gpu, Element* system) {
  const std::string numa = std::to_string(gpu.where.numaNode);
  if (Element* found = system->find("cpu", "numaid", numa)) return found;
  std::string cpumap = topology.machineCpumap;
  int packageIndex = gpu.where.package;
  for (const NumaNode& node : topology.numaNodes) {
    if (node.osIndex == gpu.where.numaNode) {
      cpumap = node.cpumap;
      if (packageIndex < 0) packageIndex = node.package;
    }
  }
  std::vector<std::pair<std::string, std::string>> attrs = {
      {"numaid", numa}, {"affinity", cpumap}, {"arch", ncclArch(topology.arch)}};
  for (const Package& package : topology.packages) {
    if (package.osIndex != packageIndex && !(packageIndex < 0 && topology.packages.size() == 1)) continue;
    // Omitted when unknown: NCCL fills them for the CPU of its own GPU (ncclTopoGetXmlFromCpu).
    if (!package.vendor.empty()) attrs.emplace_back("vendor", package.vendor);
    if (package.family >= 0) attrs.emplace_back("familyid", std::to_string(package.family));
    if (package.model >= 0) attrs.emplace_back("modelid", std::to_string(package.model));
    break;
  }
  return system->add("cpu", std::move(attrs));
}

}  // namespace

std::string ncclTopologyXml(const Topology& topology, const std::vector<VirtualNic>& nics) {
  Element system;
  system.tag = "system";
  system.attrs = {{"version", "1"}, {"name", "railnet: " + topology.source}};
  for (const Gpu& gpu : topology.gpus) {
    Element* parent = cpuFor(topology, gpu, &system);
    std::vector<const VirtualNic*> mine;
    for (const VirtualNic& nic : nics) {
      if (nic.gpu == gpu.index) mine.push_back(&nic);
    }
    // Outermost switch first; NCCL represents a switch by its upstream port's bus id, as railnet does.
    for (auto it = gpu.where.switches.rbegin(); it != gpu.where.switches.rend(); ++it) {
      Element* found = parent->find("pci", "busid", *it);
      parent = found != nullptr ? found : parent->add("pci", pciAttrs(*it, "0x060400", gpu.where.linkGBps));
    }
    if (gpu.where.switches.empty() && !mine.empty()) {
      parent = parent->add("pci", pciAttrs(hexBus("fffe", gpu.index), "0x060400", gpu.where.linkGBps));
    }
    parent->add("pci", pciAttrs(gpu.where.busId, "0x030200", gpu.where.linkGBps));
    for (const VirtualNic* nic : mine) {
      Element* function = parent->add("pci", pciAttrs(hexBus("ffff", nic->rail), "0x020000", gpu.where.linkGBps));
      function->add("nic", {})->add("net", {{"name", nic->name}});
    }
  }
  // No "<?xml ...?>" prolog: NCCL's parser (xmlGetNode in src/graph/xml.cc) reads elements and comments only.
  std::string out;
  write(system, 0, &out);
  return out;
}

}  // namespace railnet::topo
