// hwloc discovery over the fixtures in tests/fixtures/topo (written by generate.py there), and the path rules.
#include <catch2/catch.hpp>

#include "topo_fixtures.h"

#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "railnet/error.h"
#include "topo/topology.h"

using railnet::topo::classify;
using railnet::topo::loadTopology;
using railnet::topo::PathType;
using railnet::topo::PciLocation;
using railnet::topo::Topology;

namespace {


const railnet::topo::Nic& nicNamed(const Topology& topology, const std::string& name) {
  for (const auto& nic : topology.nics) {
    if (nic.hasName(name)) return nic;
  }
  FAIL("no NIC named " << name);
  throw 0;
}

PciLocation at(const char* busId, const char* hostBridge, std::vector<std::string> switches, int numa, int package) {
  PciLocation where;
  where.busId = busId;
  where.hostBridge = hostBridge;
  where.switches = std::move(switches);
  where.numaNode = numa;
  where.package = package;
  return where;
}

}  // namespace

TEST_CASE("path classes follow switches, host bridges, NUMA nodes and sockets", "[topo]") {
  PciLocation gpu = at("0000:15:00.0", "pci0000:10", {"0000:13:00.0", "0000:11:00.0"}, 0, 0);
  CHECK(classify(gpu, at("0000:17:00.0", "pci0000:10", {"0000:13:00.0", "0000:11:00.0"}, 0, 0)) == PathType::PIX);
  CHECK(classify(gpu, at("0000:22:00.0", "pci0000:10", {"0000:20:00.0", "0000:11:00.0"}, 0, 0)) == PathType::PXB);
  CHECK(classify(gpu, at("0000:2c:00.0", "pci0000:10", {"0000:11:00.0"}, 0, 0)) == PathType::PXB);
  CHECK(classify(gpu, at("0000:30:00.0", "pci0000:10", {}, 0, 0)) == PathType::PHB);
  CHECK(classify(gpu, at("0000:55:00.0", "pci0000:50", {"0000:53:00.0"}, 0, 0)) == PathType::NODE);
  CHECK(classify(gpu, at("0000:95:00.0", "pci0000:90", {"0000:93:00.0"}, 1, 1)) == PathType::SYS);
  // Two NUMA nodes of one socket (sub-NUMA clustering) are SYS, as in nvidia-smi and NCCL.
  CHECK(classify(gpu, at("0000:95:00.0", "pci0000:90", {}, 1, 0)) == PathType::SYS);
  // Unknown NUMA nodes: the package decides.
  CHECK(classify(at("0000:01:00.0", "pci0000:00", {}, -1, 0), at("0000:81:00.0", "pci0000:80", {}, -1, 0)) ==
        PathType::NODE);
  CHECK(classify(at("0000:01:00.0", "pci0000:00", {}, -1, -1), at("0000:81:00.0", "pci0000:80", {}, -1, -1)) ==
        PathType::SYS);
  CHECK(std::string(railnet::topo::pathName(PathType::NODE)) == "NODE");
}

TEST_CASE("the DGX-H100-like fixture loads with its GPUs, NICs, switches and NUMA nodes", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  REQUIRE(topology.gpus.size() == 8);
  REQUIRE(topology.nics.size() == 11);  // 8 compute, 2 storage, 1 management
  CHECK(topology.arch == "x86_64");
  REQUIRE(topology.numaNodes.size() == 2);
  CHECK(topology.numaNodes[1].cpumap == "000000f0");
  CHECK(topology.numaNodes[1].package == 1);
  REQUIRE(topology.packages.size() == 2);
  CHECK(topology.packages[0].vendor == "GenuineIntel");
  CHECK(topology.packages[0].model == 143);

  const auto& gpu0 = topology.gpus[0];
  CHECK(gpu0.index == 0);
  CHECK(gpu0.cudaIndex == -1);  // never from CUDA for an XML file
  CHECK(gpu0.model == "GH100 [H100 SXM5 80GB]");
  CHECK(gpu0.where.busId == "0000:15:00.0");
  CHECK(gpu0.where.hostBridge == "pci0000:10");
  CHECK(gpu0.where.bridges ==
        std::vector<std::string>{"0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"});
  CHECK(gpu0.where.switches == std::vector<std::string>{"0000:13:00.0", "0000:11:00.0"});
  CHECK(gpu0.where.numaNode == 0);
  CHECK(gpu0.where.package == 0);
  CHECK(gpu0.where.sysfsPath() ==
        "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.0/0000:14:00.0/0000:15:00.0");
  CHECK(topology.gpus[7].where.busId == "0000:e2:00.0");
  CHECK(topology.gpus[7].where.numaNode == 1);

  const auto& nic = nicNamed(topology, "mlx5_0");
  CHECK(nic.verbsName == "mlx5_0");
  CHECK(nic.netdevs == std::vector<std::string>{"ibp22s0"});
  CHECK(nic.hasName("ibp22s0"));
  CHECK(nic.ports == 1);
  CHECK(nic.speedMbps == 400000);
  CHECK(nic.where.busId == "0000:16:00.0");
  CHECK(nicNamed(topology, "mlx5_1").speedMbps == 200000);
  const auto& management = nicNamed(topology, "eno1");
  CHECK(management.verbsName.empty());
  CHECK(management.name() == "eno1");
  CHECK(management.ports == 0);
  CHECK(management.speedMbps == 1000);

  CHECK(classify(gpu0.where, nic.where) == PathType::PIX);
  CHECK(classify(gpu0.where, nicNamed(topology, "mlx5_3").where) == PathType::PXB);
  CHECK(classify(gpu0.where, nicNamed(topology, "mlx5_1").where) == PathType::PXB);
  CHECK(classify(gpu0.where, nicNamed(topology, "mlx5_4").where) == PathType::NODE);
  CHECK(classify(gpu0.where, management.where) == PathType::NODE);
  CHECK(classify(gpu0.where, nicNamed(topology, "mlx5_6").where) == PathType::SYS);
}

TEST_CASE("GPUs without a switch sit under their root port: PHB to a NIC of the same host bridge", "[topo]") {
  Topology topology = loadTopology(fixture("two-gpu-box.xml"));
  REQUIRE(topology.gpus.size() == 2);
  REQUIRE(topology.nics.size() == 1);
  CHECK(topology.gpus[0].where.switches.empty());
  CHECK(topology.gpus[0].where.bridges == std::vector<std::string>{"0000:10:01.0"});
  CHECK(topology.nics[0].where.sysfsPath() == "/sys/devices/pci0000:08/0000:08:01.0/0000:09:00.0");
  CHECK(classify(topology.gpus[0].where, topology.nics[0].where) == PathType::NODE);
  CHECK(classify(topology.gpus[0].where, topology.gpus[1].where) == PathType::NODE);
  // Two functions under one root port with no switch: the path goes through the root complex.
  PciLocation a = topology.gpus[0].where, b = a;
  b.busId = "0000:11:00.1";
  CHECK(classify(a, b) == PathType::PHB);
}

TEST_CASE("a node without NICs loads with GPUs only", "[topo]") {
  Topology topology = loadTopology(fixture("no-nic.xml"));
  CHECK(topology.gpus.size() == 2);
  CHECK(topology.nics.empty());
}

TEST_CASE("an unreadable topology file is a clear error", "[topo]") {
  try {
    loadTopology(fixture("does-not-exist.xml"));
    FAIL("loaded a missing file");
  } catch (const railnet::Error& error) {
    CHECK(error.code() == ncclInvalidUsage);
    CHECK(std::string(error.what()).find("does-not-exist.xml") != std::string::npos);
  }
}

TEST_CASE("sysfs paths give the same PCI location as hwloc", "[topo]") {
  PciLocation where = railnet::topo::locationFromSysfsPath(
      "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.0/0000:14:00.0/0000:15:00.0");
  CHECK(where.busId == "0000:15:00.0");
  CHECK(where.hostBridge == "pci0000:10");
  CHECK(where.bridges ==
        std::vector<std::string>{"0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:13:00.0", "0000:14:00.0"});
  CHECK(where.switches == std::vector<std::string>{"0000:13:00.0", "0000:11:00.0"});
  // Must agree with the hwloc fixture's view of GPU0 of the DGX-H100-like node.
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  CHECK(railnet::topo::locationFromSysfsPath(topology.gpus[0].where.sysfsPath()).switches ==
        topology.gpus[0].where.switches);
}

TEST_CASE("without hwloc the topology is read from sysfs", "[topo]") {
  namespace fs = std::filesystem;
  char dirTemplate[] = "/tmp/railnet-sysfs-XXXXXX";
  REQUIRE(mkdtemp(dirTemplate) != nullptr);
  const fs::path root = dirTemplate;
  auto write = [](const fs::path& file, const std::string& text) {
    fs::create_directories(file.parent_path());
    std::ofstream(file) << text << "\n";
  };
  const fs::path sw = root / "devices/pci0000:10/0000:10:01.0/0000:11:00.0";
  const fs::path gpu = sw / "0000:12:00.0/0000:13:00.0";
  const fs::path nic = sw / "0000:12:01.0/0000:14:00.0";
  write(gpu / "vendor", "0x10de");
  write(gpu / "class", "0x030200");
  write(gpu / "numa_node", "0");
  write(nic / "vendor", "0x15b3");
  write(nic / "class", "0x020700");
  write(nic / "numa_node", "0");
  fs::create_directories(root / "bus/pci/devices");
  fs::create_directory_symlink(gpu, root / "bus/pci/devices/0000:13:00.0");
  fs::create_directory_symlink(nic, root / "bus/pci/devices/0000:14:00.0");
  write(root / "class/infiniband/mlx5_0/ports/1/rate", "400 Gb/sec (4X NDR)");
  fs::create_directory_symlink(nic, root / "class/infiniband/mlx5_0/device");
  write(root / "class/net/ibp20s0/speed", "400000");
  fs::create_directory_symlink(nic, root / "class/net/ibp20s0/device");
  fs::create_directories(root / "class/net/lo");  // no device link: virtual, not a NIC
  write(root / "devices/system/node/node0/cpumap", "0000000f");
  write(root / "devices/system/node/node0/cpulist", "0-3");
  write(root / "devices/system/node/node1/cpumap", "000000f0");
  write(root / "devices/system/node/node1/cpulist", "4-7");
  write(root / "devices/system/cpu/cpu0/topology/physical_package_id", "0");
  write(root / "devices/system/cpu/cpu4/topology/physical_package_id", "1");

  Topology topology = railnet::topo::loadSysfsTopology(root.string());
  REQUIRE(topology.gpus.size() == 1);
  CHECK(topology.gpus[0].where.busId == "0000:13:00.0");
  CHECK(topology.gpus[0].where.hostBridge == "pci0000:10");
  CHECK(topology.gpus[0].where.switches == std::vector<std::string>{"0000:11:00.0"});
  CHECK(topology.gpus[0].where.numaNode == 0);
  CHECK(topology.gpus[0].where.package == 0);
  REQUIRE(topology.nics.size() == 1);
  CHECK(topology.nics[0].verbsName == "mlx5_0");
  CHECK(topology.nics[0].netdevs == std::vector<std::string>{"ibp20s0"});
  CHECK(topology.nics[0].ports == 1);
  CHECK(topology.nics[0].speedMbps == 400000);
  CHECK(classify(topology.gpus[0].where, topology.nics[0].where) == PathType::PIX);
  REQUIRE(topology.numaNodes.size() == 2);
  CHECK(topology.numaNodes[1].cpumap == "000000f0");
  CHECK(topology.numaNodes[1].package == 1);
  CHECK(topology.packages.size() == 2);
  CHECK(topology.machineCpumap == "000000ff");
  fs::remove_all(root);
}

TEST_CASE("a single-NIC device's spares rank by the PCI path between them, unknown paths last", "[topo]") {
  // NIC 0 and NIC 2 share a PCIe switch; NIC 1 is under another host bridge; NIC 3's path is unknown; NIC 4 shares
  // NIC 0's host bridge only. From NIC 0: 2 (same switch), 4 (same host bridge), 1 (across), 3 (unknown).
  const std::vector<std::string> paths = {
      "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:00.0/0000:13:00.0",
      "/sys/devices/pci0000:90/0000:90:01.0/0000:91:00.0/0000:92:00.0/0000:93:00.0",
      "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:14:00.0",
      "",
      "/sys/devices/pci0000:10/0000:10:02.0/0000:21:00.0",
  };
  const auto any = [](int) { return true; };
  CHECK(railnet::topo::sparesNearest(paths, 0, any) == std::vector<int>{2, 4, 1, 3});
  CHECK(railnet::topo::sparesNearest(paths, 0, [](int dev) { return dev != 2; }) == std::vector<int>{4, 1, 3});
  CHECK(railnet::topo::sparesNearest({paths[0]}, 0, any).empty());
}
