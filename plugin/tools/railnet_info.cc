// railnet-info: what railnet sees on this node (or in a hwloc XML file) - GPUs, NICs, the GPU x NIC distance
// matrix, rails, each GPU's NIC, the transports that can run, and the NCCL topology XML railnet would hand over.
// Exit status: 0 fine, 1 the mapping is suspicious or a RAILNET_* setting is invalid (reasons printed), 2 usage or
// load error.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "proxy/tcp/addresses.h"
#include "proxy/verbs/devices.h"
#include "proxy/verbs/ibverbs_api.h"
#include "railnet/error.h"
#include "railnet/settings.h"
#include "railnet/version.h"
#include "topo/netif.h"
#include "topo/placement.h"

namespace {

using namespace railnet::topo;

struct Options {
  bool json = false;
  bool sysfs = false;
  bool xmlOnly = false;
  std::string topoXml;
  std::string rails;
  bool railsGiven = false;
  std::vector<std::string> devices;  // --devices: transport device names to place instead of the discovered ones
  bool env = false;                   // --env: every setting, its value and the variable that decided it
};

void usage(FILE* out) {
  fprintf(out,
          "usage: railnet-info [--json | --xml] [--topo-xml FILE | --sysfs] [--rails SPEC] [--devices NAME[,...]]\n"
          "       railnet-info --env | --version\n"
          "  --env            every RAILNET_* setting: its value and which variable decided it (the RAILNET_* one,\n"
          "                   NCCL's equivalent such as NCCL_SOCKET_IFNAME, or the default)\n"
          "  --json           machine-readable output\n"
          "  --xml            print only the NCCL topology XML railnet would hand over (empty when none)\n"
          "  --topo-xml FILE  read a hwloc XML file (lstopo --of xml) instead of this machine; default: "
          "RAILNET_TOPO_XML\n"
          "  --sysfs          read this machine from sysfs, as railnet does when libhwloc.so.15 is missing\n"
          "  --rails SPEC     RAILNET_RAILS to apply, e.g. mlx5_0:0,mlx5_1:1\n"
          "  --devices LIST   transport devices to place, e.g. lo@127.0.1.1,lo@127.0.2.1 (default: the TCP\n"
          "                   interfaces and verbs ports found here)\n"
          "Exit status: 0 fine, 1 suspicious mapping or invalid RAILNET_* setting (reasons on stderr), 2 usage or "
          "load error.\n");
}

std::vector<std::string> splitList(const std::string& text) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t comma = text.find(',', start);
    std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!item.empty()) out.push_back(item);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

bool parseArgs(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        fprintf(stderr, "railnet-info: %s needs a value\n", flag);
        return nullptr;
      }
      return argv[++i];
    };
    if (arg == "--json") {
      options->json = true;
    } else if (arg == "--sysfs") {
      options->sysfs = true;
    } else if (arg == "--xml") {
      options->xmlOnly = true;
    } else if (arg == "--topo-xml") {
      const char* v = value("--topo-xml");
      if (v == nullptr) return false;
      options->topoXml = v;
    } else if (arg == "--rails") {
      const char* v = value("--rails");
      if (v == nullptr) return false;
      options->rails = v;
      options->railsGiven = true;
    } else if (arg == "--devices") {
      const char* v = value("--devices");
      if (v == nullptr) return false;
      options->devices = splitList(v);
    } else if (arg == "--version") {
      printf("railnet-info %s (revision %s)\n", railnet::kVersion, railnet::revision());
      exit(0);
    } else if (arg == "--env") {
      options->env = true;
    } else if (arg == "-h" || arg == "--help") {
      usage(stdout);
      exit(0);
    } else {
      fprintf(stderr, "railnet-info: unknown argument %s\n", arg.c_str());
      usage(stderr);
      return false;
    }
  }
  if (options->json && options->xmlOnly) {
    fprintf(stderr, "railnet-info: --json and --xml exclude each other\n");
    return false;
  }
  return true;
}

struct Transports {
  std::vector<std::string> tcp;    // "eth0 (10.0.0.1:0, 25 Gb/s)"
  std::vector<std::string> verbs;  // "mlx5_0:1 (400 Gb/s)"
  std::string verbsNote;           // why there are none
  std::vector<NetDevice> devices;  // what the plugin would place
};

Transports findTransports(bool live) {
  Transports found;
  const railnet::Settings& config = railnet::settings();
  for (const NetInterface& netif : discoverInterfaces(config.ifname, config.socketFamily)) {
    found.tcp.push_back(netif.name + " (" + formatAddress(reinterpret_cast<const sockaddr*>(&netif.address)) + ", " +
                        (netif.speedMbps > 0 ? std::to_string(netif.speedMbps / 1000) + " Gb/s" : "speed unknown") +
                        ")");
    if (live && config.tcpAddresses.empty()) found.devices.push_back({netif.name, netif.pciPath, -1, -1});
  }
  // RAILNET_TCP_ADDRESSES: the plugin's TCP devices are the listed addresses (rails in list order), not the
  // interfaces; place what the plugin would.
  if (live && !config.tcpAddresses.empty()) {
    std::vector<NetInterface> rails = railnet::tcp::interfacesForAddresses(config.tcpAddresses);
    for (size_t i = 0; i < rails.size(); ++i) {
      found.devices.push_back({rails[i].name, rails[i].pciPath, static_cast<int16_t>(i), -1});
    }
  }
  std::string why;
  const railnet::verbs::IbvApi* api = railnet::verbs::loadIbverbs(&why);
  if (api == nullptr) {
    found.verbsNote = why;
    return found;
  }
  std::vector<railnet::verbs::VerbsPort> ports = railnet::verbs::discoverPorts(*api);
  if (ports.empty()) found.verbsNote = "no active RDMA port";
  std::vector<NetDevice> verbsDevices;
  for (const auto& port : ports) {
    found.verbs.push_back(port.info.name + " (" + std::to_string(port.info.speedMbps / 1000) + " Gb/s)");
    verbsDevices.push_back({port.info.name, port.info.pciPath, port.info.railId, -1});
  }
  // The plugin uses verbs when a port is active (RAILNET_TRANSPORT=auto), TCP otherwise.
  if (live && !verbsDevices.empty() && config.transport != railnet::TransportChoice::kTcp) found.devices = verbsDevices;
  return found;
}

std::string speedText(int mbps) { return mbps > 0 ? std::to_string(mbps / 1000) + " Gb/s" : "unknown"; }

std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      snprintf(escaped, sizeof(escaped), "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string jsonList(const std::vector<std::string>& items) {
  std::string out = "[";
  for (size_t i = 0; i < items.size(); ++i) out += (i ? ", " : "") + jsonString(items[i]);
  return out + "]";
}

void printText(const Topology& topology, const RailPlan& plan, const Transports& transports,
               const Placement& placement) {
  printf("Topology: %s\n\n", topology.source == "live" ? "this machine (hwloc)" : topology.source.c_str());
  printf("GPUs (%zu, PCI bus order):\n", topology.gpus.size());
  for (const Gpu& gpu : topology.gpus) {
    printf("  GPU%-2d %s  cuda %-2s  NUMA %-2d  %s\n", gpu.index, gpu.where.busId.c_str(),
           gpu.cudaIndex >= 0 ? std::to_string(gpu.cudaIndex).c_str() : "-", gpu.where.numaNode, gpu.model.c_str());
  }
  printf("\nNICs (%zu):\n", topology.nics.size());
  for (const Nic& nic : topology.nics) {
    std::string netdevs;
    for (const std::string& netdev : nic.netdevs) netdevs += (netdevs.empty() ? "" : ",") + netdev;
    printf("  %-8s %-12s %s  NUMA %-2d  %-9s %d port(s)\n", nic.name().c_str(),
           nic.verbsName.empty() ? "" : netdevs.c_str(), nic.where.busId.c_str(), nic.where.numaNode,
           speedText(nic.speedMbps).c_str(), nic.ports);
  }
  if (!topology.nics.empty() && !topology.gpus.empty()) {
    printf("\nDistance (PIX < PXB < PHB < NODE < SYS):\n       ");
    for (const Nic& nic : topology.nics) printf(" %8s", nic.name().c_str());
    printf("\n");
    for (size_t gpu = 0; gpu < topology.gpus.size(); ++gpu) {
      printf("  GPU%-3zu", gpu);
      for (size_t nic = 0; nic < topology.nics.size(); ++nic) printf(" %8s", pathName(plan.distance[gpu][nic]));
      printf("\n");
    }
  }
  printf("\nRails:\n");
  bool anyRail = false;
  for (size_t nic = 0; nic < topology.nics.size(); ++nic) {
    if (plan.nicRail[nic] < 0) continue;
    anyRail = true;
    std::string gpus;
    for (size_t gpu = 0; gpu < plan.gpuNic.size(); ++gpu) {
      if (plan.gpuNic[gpu] == static_cast<int>(nic)) gpus += (gpus.empty() ? "GPU" : ", GPU") + std::to_string(gpu);
    }
    printf("  rail %-2d %-8s %s\n", plan.nicRail[nic], topology.nics[nic].name().c_str(), gpus.c_str());
  }
  if (!anyRail) printf("  (none)\n");
  printf("\nGPU -> NIC:\n");
  for (size_t gpu = 0; gpu < plan.gpuNic.size(); ++gpu) {
    int nic = plan.gpuNic[gpu];
    if (nic < 0) {
      printf("  GPU%-2zu -> none\n", gpu);
      continue;
    }
    printf("  GPU%-2zu -> %-8s %s, rail %d\n", gpu, topology.nics[static_cast<size_t>(nic)].name().c_str(),
           pathName(plan.distance[gpu][static_cast<size_t>(nic)]), plan.nicRail[static_cast<size_t>(nic)]);
  }
  printf("\nTransports on this machine:\n  TCP interfaces: ");
  for (size_t i = 0; i < transports.tcp.size(); ++i) printf("%s%s", i ? ", " : "", transports.tcp[i].c_str());
  printf("%s\n  verbs ports: ", transports.tcp.empty() ? "none" : "");
  for (size_t i = 0; i < transports.verbs.size(); ++i) printf("%s%s", i ? ", " : "", transports.verbs[i].c_str());
  printf("%s\n", transports.verbs.empty() ? ("none (" + transports.verbsNote + ")").c_str() : "");
  printf("\nDevices placed:\n");
  for (const NetDevice& device : placement.devices) {
    // The rail's GPU: where a routed GPUDirect connection stages its bytes (the verbs NVLink hop).
    printf("  %-16s rail %-3d %s%s%s\n", device.name.c_str(), device.railId,
           device.nic >= 0          ? ("NIC " + topology.nics[static_cast<size_t>(device.nic)].where.busId).c_str()
           : device.pciPath.empty() ? "no PCI function"
                                    : device.pciPath.c_str(),
           device.railGpu.empty() ? "" : ", rail GPU ", device.railGpu.c_str());
  }
  if (placement.devices.empty()) printf("  (none)\n");
  printf("\nNCCL topology XML (NCCL_TOPO_FILE):\n");
  if (placement.ncclXml.empty()) {
    bool railDeviceWithoutPci = false;
    for (const NetDevice& device : placement.devices) railDeviceWithoutPci |= device.pciPath.empty() && device.railId >= 0;
    printf(railDeviceWithoutPci ? "  none: no GPU to place the rail devices beside\n"
                                : "  none needed: no device without a PCI function has a rail\n");
  } else {
    printf("%s", placement.ncclXml.c_str());
  }
}

void printJson(const Topology& topology, const RailPlan& plan, const Transports& transports,
               const Placement& placement) {
  printf("{\n  \"source\": %s,\n  \"gpus\": [", jsonString(topology.source).c_str());
  for (size_t i = 0; i < topology.gpus.size(); ++i) {
    const Gpu& gpu = topology.gpus[i];
    printf("%s\n    {\"index\": %d, \"cuda\": %d, \"busId\": %s, \"numa\": %d, \"model\": %s, \"nic\": %s}",
           i ? "," : "", gpu.index, gpu.cudaIndex, jsonString(gpu.where.busId).c_str(), gpu.where.numaNode,
           jsonString(gpu.model).c_str(),
           plan.gpuNic[i] < 0 ? "null" : jsonString(topology.nics[static_cast<size_t>(plan.gpuNic[i])].name()).c_str());
  }
  printf("\n  ],\n  \"nics\": [");
  for (size_t i = 0; i < topology.nics.size(); ++i) {
    const Nic& nic = topology.nics[i];
    std::vector<std::string> distances;
    for (size_t gpu = 0; gpu < topology.gpus.size(); ++gpu) distances.push_back(pathName(plan.distance[gpu][i]));
    printf(
        "%s\n    {\"name\": %s, \"verbs\": %s, \"netdevs\": %s, \"busId\": %s, \"numa\": %d, \"speedMbps\": %d, "
        "\"ports\": %d, \"rail\": %d, \"gpus\": %d, \"distanceFromGpus\": %s}",
        i ? "," : "", jsonString(nic.name()).c_str(), jsonString(nic.verbsName).c_str(), jsonList(nic.netdevs).c_str(),
        jsonString(nic.where.busId).c_str(), nic.where.numaNode, nic.speedMbps, nic.ports, plan.nicRail[i],
        plan.nicGpus[i], jsonList(distances).c_str());
  }
  printf("\n  ],\n  \"transports\": {\"tcp\": %s, \"verbs\": %s},\n  \"devices\": [", jsonList(transports.tcp).c_str(),
         jsonList(transports.verbs).c_str());
  for (size_t i = 0; i < placement.devices.size(); ++i) {
    const NetDevice& device = placement.devices[i];
    printf("%s\n    {\"name\": %s, \"rail\": %d, \"pciPath\": %s, \"railGpu\": %s}", i ? "," : "",
           jsonString(device.name).c_str(), device.railId, jsonString(device.pciPath).c_str(),
           jsonString(device.railGpu).c_str());
  }
  printf("\n  ],\n  \"ncclTopoXml\": %s,\n  \"warnings\": %s\n}\n", jsonString(placement.ncclXml).c_str(),
         jsonList(plan.warnings).c_str());
}

}  // namespace

// --env: one line per setting, "RAILNET_X value (from VARIABLE | default)", then NCCL-named values railnet clamped
// or ignored.
void printEnvironment() {
  std::map<std::string, const railnet::SettingSource*> decided;
  for (const railnet::SettingSource& source : railnet::settingsSources()) decided[source.setting] = &source;
  for (const railnet::SettingInfo& info : railnet::settingsTable()) {
    auto found = decided.find(info.env);
    const char* fallback = railnet::ncclFallbackFor(info.env);
    std::string from = found == decided.end() ? "default" : "from " + found->second->variable;
    if (found == decided.end() && fallback != nullptr) from += std::string("; ") + fallback + " unset";
    const std::string value = found == decided.end() ? info.defaultValue : found->second->value;
    printf("%-34s %-24s (%s)\n", info.env, value.empty() ? "\"\"" : value.c_str(), from.c_str());
  }
  for (const std::string& warning : railnet::settingsWarnings()) fprintf(stderr, "railnet-info: %s\n", warning.c_str());
}

int main(int argc, char** argv) {
  Options options;
  if (!parseArgs(argc, argv, &options)) return 2;
  if (options.env) {
    printEnvironment();
    for (const std::string& error : railnet::settingsErrors()) fprintf(stderr, "railnet-info: %s\n", error.c_str());
    return railnet::settingsErrors().empty() ? 0 : 1;
  }
  // The plugin's init would fail on these (docs/decisions.md D59): say so, and show no map.
  if (!railnet::settingsErrors().empty()) {
    for (const std::string& error : railnet::settingsErrors()) fprintf(stderr, "railnet-info: %s\n", error.c_str());
    return 1;
  }
  const railnet::Settings& config = railnet::settings();
  if (options.topoXml.empty()) options.topoXml = config.topoXml;
  if (!options.railsGiven) options.rails = config.rails;
  try {
    if (options.sysfs && !options.topoXml.empty()) {
      fprintf(stderr, "railnet-info: --sysfs and a topology file exclude each other\n");
      return 2;
    }
    Topology topology = options.sysfs ? loadSysfsTopology("/sys") : loadTopology(options.topoXml);
    RailPlan plan = planRails(topology, options.rails);
    const bool live = options.topoXml.empty();
    Transports transports = findTransports(live);
    if (!options.devices.empty()) {
      transports.devices.clear();
      for (const std::string& name : options.devices) transports.devices.push_back({name, "", -1, -1});
    }
    Placement placement = planPlacement(topology, plan, transports.devices, options.rails);
    if (options.xmlOnly) {
      printf("%s", placement.ncclXml.c_str());
    } else if (options.json) {
      printJson(topology, plan, transports, placement);
    } else {
      printText(topology, plan, transports, placement);
    }
    for (const std::string& warning : plan.warnings) fprintf(stderr, "railnet-info: suspicious: %s\n", warning.c_str());
    return plan.warnings.empty() ? 0 : 1;
  } catch (const railnet::Error& error) {
    fprintf(stderr, "railnet-info: %s\n", error.what());
    return 2;
  }
}
