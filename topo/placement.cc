#include "topo/placement.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::topo {
namespace {

std::string lastComponent(const std::string& path) {
  size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

struct Registry {
  std::mutex mutex;
  std::string writtenFile;  // removed when the plugin is unloaded or the process exits
  ~Registry() {
    if (!writtenFile.empty()) unlink(writtenFile.c_str());
  }
};

Registry& registry() {
  static Registry instance;
  return instance;
}

// A file railnet wrote, possibly in a parent process whose NCCL_TOPO_FILE this process inherited (and which is
// gone with that process): ".../railnet-topo-<pid>.xml".
bool isRailnetFile(const std::string& path) {
  std::string name = lastComponent(path);
  const std::string prefix = "railnet-topo-", suffix = ".xml";
  if (name.size() <= prefix.size() + suffix.size() || name.rfind(prefix, 0) != 0) return false;
  if (name.compare(name.size() - suffix.size(), suffix.size(), suffix) != 0) return false;
  std::string pid = name.substr(prefix.size(), name.size() - prefix.size() - suffix.size());
  return pid.find_first_not_of("0123456789") == std::string::npos;
}

std::string writeTopologyFile(const std::string& xml) {
  const char* tmp = getenv("TMPDIR");
  std::string path =
      std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/railnet-topo-" + std::to_string(getpid()) + ".xml";
  std::string partial = path + ".part";
  {
    // The name is predictable and /tmp is shared: never follow a link another user planted there, never write
    // into a file that already exists (a leftover of a crashed process with our pid is removed first, only if
    // it is ours), and let only this user read it (docs/security.md).
    struct stat existing {};
    if (lstat(partial.c_str(), &existing) == 0 && S_ISREG(existing.st_mode) && existing.st_uid == geteuid()) {
      unlink(partial.c_str());
    }
    const int fd = open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (fd < 0) {
      RN_WARN("NET/railnet: cannot create the NCCL topology file %s: %s", partial.c_str(), errnoText(errno).c_str());
      return "";
    }
    size_t written = 0;
    while (written < xml.size()) {
      const ssize_t n = write(fd, xml.data() + written, xml.size() - written);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
    const int err = errno;
    if (close(fd) != 0 || written != xml.size()) {
      RN_WARN("NET/railnet: cannot write the NCCL topology file %s: %s", partial.c_str(), errnoText(err).c_str());
      unlink(partial.c_str());
      return "";
    }
  }
  if (rename(partial.c_str(), path.c_str()) != 0) {
    RN_WARN("NET/railnet: cannot rename %s to %s: %s", partial.c_str(), path.c_str(), errnoText(errno).c_str());
    unlink(partial.c_str());
    return "";
  }
  return path;
}

}  // namespace

std::vector<int> virtualNicAnchors(const Topology& topology) {
  std::vector<int> visible;
  for (const Gpu& gpu : topology.gpus) {
    if (gpu.cudaIndex >= 0) visible.push_back(gpu.index);
  }
  if (visible.size() >= 2) return visible;
  std::vector<int> all;
  for (const Gpu& gpu : topology.gpus) all.push_back(gpu.index);
  return all;
}

std::string baseDeviceName(std::string_view name) {
  size_t at = name.find('@');
  if (at != std::string_view::npos) name = name.substr(0, at);
  size_t colon = name.rfind(':');
  if (colon != std::string_view::npos && colon + 1 < name.size() &&
      name.find_first_not_of("0123456789", colon + 1) == std::string_view::npos) {
    name = name.substr(0, colon);
  }
  return std::string(name);
}

Placement planPlacement(const Topology& topology, const RailPlan& plan, const std::vector<NetDevice>& devices,
                        std::string_view railSpec) {
  auto spec = parseRailSpec(railSpec);
  Placement placement;
  placement.devices = devices;
  bool anyNic = false;
  int pciLess = 0;
  for (NetDevice& device : placement.devices) {
    std::string base = baseDeviceName(device.name);
    std::string busId = lastComponent(device.pciPath);
    for (size_t nic = 0; nic < topology.nics.size(); ++nic) {
      const Nic& candidate = topology.nics[nic];
      if (candidate.hasName(base) || (!busId.empty() && busId == candidate.where.busId)) {
        device.nic = static_cast<int>(nic);
        break;
      }
    }
    if (device.nic >= 0) {
      anyNic = true;
      for (size_t gpu = 0; gpu < plan.gpuNic.size() && gpu < topology.gpus.size(); ++gpu) {
        if (plan.gpuNic[gpu] == device.nic) {
          device.railGpu = topology.gpus[gpu].where.busId;
          break;
        }
      }
      if (device.pciPath.empty()) device.pciPath = topology.nics[static_cast<size_t>(device.nic)].where.sysfsPath();
    } else if (device.pciPath.empty()) {
      ++pciLess;
    }
  }

  const std::vector<int> anchors = virtualNicAnchors(topology);
  int order = 0;
  for (NetDevice& device : placement.devices) {
    const bool virtualDevice = device.nic < 0 && device.pciPath.empty();
    int rail = railFromSpec(spec, device.name);
    if (rail < 0 && device.name.find('@') == std::string::npos) rail = railFromSpec(spec, baseDeviceName(device.name));
    if (rail < 0 && spec.empty()) {
      if (device.railId >= 0) {
        rail = device.railId;
      } else if (device.nic >= 0) {
        rail = plan.nicRail[static_cast<size_t>(device.nic)];
      } else if (virtualDevice && pciLess >= 2 && !anyNic) {
        rail = order;
      }
    }
    if (virtualDevice) ++order;
    device.railId = static_cast<int16_t>(rail);
    if (virtualDevice && rail >= 0 && !topology.gpus.empty()) {
      placement.virtualNics.push_back({device.name, rail, anchors[static_cast<size_t>(rail) % anchors.size()]});
    }
  }
  if (!placement.virtualNics.empty()) placement.ncclXml = ncclTopologyXml(topology, placement.virtualNics);
  return placement;
}

Placement placeNetDevices(const std::vector<NetDevice>& devices) { return placeNetDevices(devices, settings()); }

Placement placeNetDevices(const std::vector<NetDevice>& devices, const Settings& config) {
  Topology topology;
  try {
    topology = loadTopology(config.topoXml);
  } catch (const Error& error) {
    if (!config.topoXml.empty()) throw;  // the user's file: a clear error, not a silent fallback
    RN_WARN("%s; devices keep the transport's PCI paths and rails", error.what());
    Placement unchanged;
    unchanged.devices = devices;
    return unchanged;
  }
  RailPlan plan = planRails(topology, config.rails);
  Placement placement = planPlacement(topology, plan, devices, config.rails);

  for (const std::string& warning : plan.warnings)
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: topology: %s", warning.c_str());
  for (const NetDevice& device : placement.devices) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: device %s: %s, rail %d%s%s", device.name.c_str(),
            device.nic >= 0          ? ("NIC " + topology.nics[static_cast<size_t>(device.nic)].where.busId).c_str()
            : device.pciPath.empty() ? "no PCI function"
                                     : device.pciPath.c_str(),
            device.railId, device.railGpu.empty() ? "" : ", GPU ", device.railGpu.c_str());
  }

  Registry& state = registry();
  std::lock_guard<std::mutex> lock(state.mutex);
  if (placement.ncclXml.empty()) return placement;
  const char* userFile = getenv("NCCL_TOPO_FILE");
  if (userFile != nullptr && userFile != state.writtenFile && !isRailnetFile(userFile)) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: NCCL_TOPO_FILE=%s is the user's; not placing %zu rail device(s) in it",
            userFile, placement.virtualNics.size());
  } else if (config.writeNcclTopo == 0) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: RAILNET_WRITE_NCCL_TOPO=0; NCCL places the rail devices itself");
  } else if (std::string path = writeTopologyFile(placement.ncclXml); !path.empty()) {
    // NCCL reads NCCL_TOPO_FILE in ncclTopoGetSystem, after the net plugin's init (docs/topology.md).
    setenv("NCCL_TOPO_FILE", path.c_str(), 1);
    state.writtenFile = path;
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: NCCL_TOPO_FILE=%s places %zu rail device(s) next to their GPUs",
            path.c_str(), placement.virtualNics.size());
  }
  return placement;
}

}  // namespace railnet::topo
