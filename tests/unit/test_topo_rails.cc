// GPU-to-NIC selection and rail ids over the fixtures: the exact mapping for each node shape.
#include <catch2/catch.hpp>

#include "topo_fixtures.h"

#include <string>
#include <vector>

#include "railnet/error.h"
#include "topo/rails.h"

using railnet::topo::loadTopology;
using railnet::topo::PathType;
using railnet::topo::planRails;
using railnet::topo::RailPlan;
using railnet::topo::Topology;

namespace {


// Per GPU: the name of its NIC ("-" for none).
std::vector<std::string> gpuNicNames(const Topology& topology, const RailPlan& plan) {
  std::vector<std::string> names;
  for (int nic : plan.gpuNic) names.push_back(nic < 0 ? "-" : topology.nics[static_cast<size_t>(nic)].name());
  return names;
}

int railOf(const Topology& topology, const RailPlan& plan, const std::string& name) {
  for (size_t nic = 0; nic < topology.nics.size(); ++nic) {
    if (topology.nics[nic].hasName(name)) return plan.nicRail[nic];
  }
  FAIL("no NIC named " << name);
  return -2;
}

bool anyWarningContains(const RailPlan& plan, const std::string& text) {
  for (const std::string& warning : plan.warnings) {
    if (warning.find(text) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("DGX-H100-like: each GPU its own PIX NIC, rails in GPU order, storage and management NICs unused", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  RailPlan plan = planRails(topology, "");
  CHECK(gpuNicNames(topology, plan) ==
        std::vector<std::string>{"mlx5_0", "mlx5_3", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"});
  const std::vector<std::string> byRail = {"mlx5_0", "mlx5_3", "mlx5_4",  "mlx5_5",
                                           "mlx5_6", "mlx5_9", "mlx5_10", "mlx5_11"};
  for (size_t rail = 0; rail < byRail.size(); ++rail)
    CHECK(railOf(topology, plan, byRail[rail]) == static_cast<int>(rail));
  CHECK(railOf(topology, plan, "mlx5_1") == -1);  // storage
  CHECK(railOf(topology, plan, "mlx5_7") == -1);  // storage
  CHECK(railOf(topology, plan, "eno1") == -1);    // management
  for (size_t gpu = 0; gpu < 8; ++gpu) {
    CHECK(plan.fusionGroups[gpu].size() == 1);
    CHECK(plan.distance[gpu][static_cast<size_t>(plan.gpuNic[gpu])] == PathType::PIX);
  }
  CHECK(plan.warnings.empty());
}

TEST_CASE("DGX-A100-like: two GPUs per NIC, rails by the lowest GPU each NIC serves", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-a100.xml"));
  RailPlan plan = planRails(topology, "");
  CHECK(gpuNicNames(topology, plan) ==
        std::vector<std::string>{"mlx5_2", "mlx5_2", "mlx5_0", "mlx5_0", "mlx5_3", "mlx5_3", "mlx5_1", "mlx5_1"});
  CHECK(railOf(topology, plan, "mlx5_2") == 0);
  CHECK(railOf(topology, plan, "mlx5_0") == 1);
  CHECK(railOf(topology, plan, "mlx5_3") == 2);
  CHECK(railOf(topology, plan, "mlx5_1") == 3);
  CHECK(plan.nicGpus == std::vector<int>{2, 2, 2, 2});
  CHECK(plan.warnings.empty());  // sharing is forced: no NIC idles
}

TEST_CASE("two sockets, NICs on one: the far GPUs spread over both NICs and are reported SYS", "[topo]") {
  Topology topology = loadTopology(fixture("two-socket-one-side.xml"));
  RailPlan plan = planRails(topology, "");
  CHECK(gpuNicNames(topology, plan) == std::vector<std::string>{"mlx5_0", "mlx5_1", "mlx5_0", "mlx5_1"});
  CHECK(plan.distance[0] == std::vector<PathType>{PathType::PIX, PathType::NODE});
  CHECK(plan.distance[2] == std::vector<PathType>{PathType::SYS, PathType::SYS});
  CHECK(railOf(topology, plan, "mlx5_0") == 0);
  CHECK(railOf(topology, plan, "mlx5_1") == 1);
  REQUIRE(plan.warnings.size() == 2);
  CHECK(plan.warnings[0] == "GPU2's nearest NIC (mlx5_0) is SYS-distant: its traffic crosses the CPU interconnect");
  CHECK(plan.warnings[1] == "GPU3's nearest NIC (mlx5_1) is SYS-distant: its traffic crosses the CPU interconnect");
}

TEST_CASE("a node with no NIC: no mapping, no rails, one warning", "[topo]") {
  Topology topology = loadTopology(fixture("no-nic.xml"));
  RailPlan plan = planRails(topology, "");
  CHECK(plan.gpuNic == std::vector<int>{-1, -1});
  CHECK(plan.nicRail.empty());
  REQUIRE(plan.warnings.size() == 1);
  CHECK(plan.warnings[0] == "no NIC on this node: GPUs cannot reach other nodes");
}

TEST_CASE("mixed NIC speeds in one fusion group are reported", "[topo]") {
  Topology topology = loadTopology(fixture("mixed-speeds.xml"));
  RailPlan plan = planRails(topology, "");
  CHECK(gpuNicNames(topology, plan) == std::vector<std::string>{"mlx5_0", "mlx5_1"});
  CHECK(plan.fusionGroups[0] == std::vector<int>{0, 1});
  CHECK(railOf(topology, plan, "mlx5_0") == 0);
  CHECK(railOf(topology, plan, "mlx5_1") == 1);
  REQUIRE(plan.warnings.size() == 1);
  CHECK(plan.warnings[0] ==
        "NICs of mixed speed in one fusion group (equally near GPU0): mlx5_0 (400 Gb/s), mlx5_1 (200 Gb/s)");
}

TEST_CASE("sharing a NIC while an equally fast NIC idles is reported", "[topo]") {
  // Both GPUs of the mixed-speed node forced onto one NIC by making the other far away.
  Topology topology = loadTopology(fixture("mixed-speeds.xml"));
  topology.nics[1].where.hostBridge = "pci0000:90";
  topology.nics[1].where.switches.clear();
  topology.nics[1].speedMbps = 400000;
  RailPlan plan = planRails(topology, "");
  CHECK(gpuNicNames(topology, plan) == std::vector<std::string>{"mlx5_0", "mlx5_0"});
  CHECK(railOf(topology, plan, "mlx5_1") == -1);
  CHECK(anyWarningContains(plan, "2 GPUs share mlx5_0 while mlx5_1 idles"));
  // A slower idle NIC (storage, management) is not a suspicious gap.
  topology.nics[1].speedMbps = 100000;
  CHECK(planRails(topology, "").warnings.empty());
}

TEST_CASE("balancing finds the assignment a first-come pick would miss", "[topo]") {
  // Switch X holds switch Y (GPU0), switch W (GPU1 and NIC A) and NIC B: GPU0 sees A and B at PXB, GPU1 sees A at
  // PIX. Taking GPU0 first with the lowest bus id would put it on A and leave GPU1 sharing it.
  Topology topology = loadTopology(fixture("mixed-speeds.xml"));
  topology.nics[1].speedMbps = 400000;
  topology.gpus[0].where.switches = {"0000:30:00.0", "0000:11:00.0"};
  topology.gpus[1].where.switches = {"0000:40:00.0", "0000:11:00.0"};
  topology.nics[0].where.switches = {"0000:40:00.0", "0000:11:00.0"};
  topology.nics[1].where.switches = {"0000:11:00.0"};
  RailPlan plan = planRails(topology, "");
  CHECK(plan.fusionGroups[0] == std::vector<int>{0, 1});
  CHECK(plan.fusionGroups[1] == std::vector<int>{0});
  CHECK(plan.distance[1][0] == PathType::PIX);
  CHECK(gpuNicNames(topology, plan) == std::vector<std::string>{"mlx5_1", "mlx5_0"});
  CHECK(railOf(topology, plan, "mlx5_1") == 0);  // serves GPU0
  CHECK(railOf(topology, plan, "mlx5_0") == 1);
  CHECK(plan.warnings.empty());
}

TEST_CASE("RAILNET_RAILS names rails explicitly and rejects malformed entries", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  RailPlan plan = planRails(topology, "mlx5_3:0, ibp22s0:1");
  CHECK(railOf(topology, plan, "mlx5_3") == 0);
  CHECK(railOf(topology, plan, "mlx5_0") == 1);  // named by its netdev
  CHECK(railOf(topology, plan, "mlx5_4") == -1);
  CHECK(gpuNicNames(topology, plan)[0] == "mlx5_0");  // the mapping itself does not change

  auto spec = railnet::topo::parseRailSpec("lo@127.0.1.1:3,mlx5_0:0");
  CHECK(railnet::topo::railFromSpec(spec, "lo@127.0.1.1") == 3);
  CHECK(railnet::topo::railFromSpec(spec, "mlx5_1") == -1);
  for (const char* bad : {"mlx5_0", "mlx5_0:", ":1", "mlx5_0:x", "mlx5_0:-1", "mlx5_0:40000", "mlx5_0:1,mlx5_0:2"}) {
    INFO(bad);
    CHECK_THROWS_AS(railnet::topo::parseRailSpec(bad), railnet::Error);
  }
  CHECK(railnet::topo::parseRailSpec(" ").empty());
}
