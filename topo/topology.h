// The node as railnet sees it: GPUs, NICs, the PCIe switches and host bridges between them, NUMA nodes and
// packages, discovered with hwloc 2.x from the live machine or from a hwloc XML file (RAILNET_TOPO_XML).
// The model holds no hwloc handle: tests and tools build and compare it as plain data.
// docs/topology.md explains the rules.
#pragma once

#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace railnet::topo {

// GPU-NIC distance classes, nearest first (nvidia-smi topo -m names; NCCL folds NODE into PHB).
enum class PathType : int {
  PIX = 0,   // through one PCIe switch
  PXB = 1,   // through several PCIe switches, same host bridge
  PHB = 2,   // through a PCIe host bridge (the CPU), one host bridge
  NODE = 3,  // across host bridges of one NUMA node
  SYS = 4,   // across NUMA nodes / sockets (the SMP interconnect)
};
const char* pathName(PathType type);

// Where a PCI function sits.
struct PciLocation {
  std::string busId;                  // "0000:1b:00.0", lower-case
  std::vector<std::string> bridges;   // bus ids of every PCI-PCI bridge above it, root port first
  std::vector<std::string> switches;  // bus ids of the PCIe switches (their upstream ports) above it, nearest first
  std::string hostBridge;             // "pci0000:00" style name of its host bridge; "" when none
  int numaNode = -1;                  // OS index of its NUMA node; -1 when unknown or ambiguous
  int package = -1;                   // OS index of its package (socket); -1 when unknown
  float linkGBps = 0;                 // hwloc's link speed (GB/s), 0 when unknown
  std::string sysfsPath() const;      // "/sys/devices/pci0000:00/0000:00:01.0/.../0000:1b:00.0"
};

struct Gpu {
  int index = 0;       // rank in PCI bus order: the node-wide GPU number (CUDA_DEVICE_ORDER=PCI_BUS_ID)
  int cudaIndex = -1;  // this process's CUDA ordinal, -1 when not visible or unknown (see docs/topology.md)
  std::string model;   // hwloc's PCIDevice info, may be empty
  PciLocation where;
};

struct Nic {
  std::string verbsName;             // OpenFabrics OS device, e.g. "mlx5_0"; may be empty
  std::vector<std::string> netdevs;  // Network OS devices, e.g. "ens1f0np0"
  int ports = 0;                     // OpenFabrics ports (hwloc's PortNState infos), 0 when not an RDMA device
  int speedMbps = 0;                 // 0: unknown
  std::string model;
  PciLocation where;
  // The name railnet shows: the verbs device if any, else the first netdev.
  const std::string& name() const { return verbsName.empty() ? netdevs.front() : verbsName; }
  bool hasName(std::string_view name) const;
};

struct NumaNode {
  int osIndex = 0;
  int package = -1;
  std::string cpumap;  // sysfs cpumap format ("ffffffff,ffffffff"): 32-bit hex words, most significant first
};

struct Package {
  int osIndex = 0;
  std::string vendor;  // CPUVendor ("GenuineIntel", "AuthenticAMD"), may be empty
  int family = -1;     // CPUFamilyNumber
  int model = -1;      // CPUModelNumber
};

struct Topology {
  std::string source;     // "live" or the XML file
  std::string arch;       // hwloc's Architecture info ("x86_64", "aarch64"), may be empty
  std::vector<Gpu> gpus;  // bus order
  std::vector<Nic> nics;  // bus order, then name
  std::vector<NumaNode> numaNodes;
  std::vector<Package> packages;
  std::string machineCpumap;  // all CPUs, sysfs cpumap format
};

// Distance class of the path between two PCI functions.
PathType classify(const PciLocation& a, const PciLocation& b);

// Loads the live machine (xmlFile empty) or a hwloc XML file. Throws railnet::Error with the reason when
// hwloc cannot load it. Live loads ask the CUDA driver for CUDA ordinals when it is present; XML loads never do.
Topology loadTopology(const std::string& xmlFile);

// Without libhwloc (loadTopology falls back to it for the live machine): the same model read from sysfs under
// `root` ("/sys"; tests point it at a fake tree). GPU models and NIC names come out the same as hwloc's;
// packages get /proc/cpuinfo's first vendor/family/model.
Topology loadSysfsTopology(const std::string& root);

// A PCI function's place from its sysfs device path ("/sys/devices/pci0000:10/0000:10:01.0/.../0000:15:00.0").
PciLocation locationFromSysfsPath(const std::string& path);

// Rail failover (docs/failover.md "Single-NIC devices"): the devices a single-NIC connection of device `dev` may move
// to, nearest first by the class of the PCI path between them (pciPaths: each device's sysfs path, empty when unknown;
// unknown ranks last), then by index. `eligible` admits a candidate.
std::vector<int> sparesNearest(const std::vector<std::string>& pciPaths, int dev,
                               const std::function<bool(int)>& eligible);

}  // namespace railnet::topo
