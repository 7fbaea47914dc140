// Placement of transport devices and the NCCL topology XML, parsed back with a reader as strict as NCCL's
// (src/graph/xml.cc: elements, attributes in double quotes, spaces/newlines only, no prolog).
#include <catch2/catch.hpp>

#include "topo_fixtures.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "railnet/error.h"
#include "railnet/settings.h"
#include "topo/placement.h"

using railnet::topo::loadTopology;
using railnet::topo::NetDevice;
using railnet::topo::planPlacement;
using railnet::topo::planRails;
using railnet::topo::Topology;

namespace {


struct Node {
  std::string tag;
  std::map<std::string, std::string> attrs;
  std::vector<std::unique_ptr<Node>> subs;
  Node* parent = nullptr;
};

class Reader {
 public:
  explicit Reader(const std::string& text) : text_(text) {}

  std::unique_ptr<Node> document() {
    skipSpace();
    auto root = element(nullptr);
    skipSpace();
    if (pos_ != text_.size()) throw std::runtime_error("trailing text at " + std::to_string(pos_));
    return root;
  }

 private:
  void skipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    if (pos_ >= text_.size() || text_[pos_] != c) {
      throw std::runtime_error(std::string("expected '") + c + "' at " + std::to_string(pos_));
    }
    ++pos_;
  }
  std::string name() {
    size_t start = pos_;
    while (pos_ < text_.size() && (isalnum(static_cast<unsigned char>(text_[pos_])) || text_[pos_] == '_')) ++pos_;
    if (start == pos_) throw std::runtime_error("expected a name at " + std::to_string(pos_));
    return text_.substr(start, pos_ - start);
  }
  std::unique_ptr<Node> element(Node* parent) {
    auto node = std::make_unique<Node>();
    node->parent = parent;
    expect('<');
    node->tag = name();
    while (pos_ < text_.size() && text_[pos_] == ' ') {
      ++pos_;
      std::string key = name();
      expect('=');
      expect('"');
      size_t end = text_.find('"', pos_);
      if (end == std::string::npos) throw std::runtime_error("unterminated attribute");
      node->attrs[key] = text_.substr(pos_, end - pos_);
      pos_ = end + 1;
    }
    if (text_.compare(pos_, 2, "/>") == 0) {
      pos_ += 2;
      return node;
    }
    expect('>');
    for (;;) {
      skipSpace();
      if (text_.compare(pos_, 2, "</") == 0) {
        pos_ += 2;
        if (name() != node->tag) throw std::runtime_error("mismatched close of " + node->tag);
        expect('>');
        return node;
      }
      node->subs.push_back(element(node.get()));
    }
  }

  const std::string& text_;
  size_t pos_ = 0;
};

void collect(Node* node, const std::string& tag, std::vector<Node*>* out) {
  if (node->tag == tag) out->push_back(node);
  for (auto& sub : node->subs) collect(sub.get(), tag, out);
}

Node* netNamed(Node* root, const std::string& name) {
  std::vector<Node*> nets;
  collect(root, "net", &nets);
  for (Node* net : nets) {
    if (net->attrs["name"] == name) return net;
  }
  return nullptr;
}

Node* pciChild(Node* node, const std::string& busId) {
  for (auto& sub : node->subs) {
    if (sub->tag == "pci" && sub->attrs["busid"] == busId) return sub.get();
  }
  return nullptr;
}

// What NCCL's loaders demand: every pci has busid/class/link_speed/link_width (ncclTopoAddPci), every cpu has
// numaid/arch and, for Intel x86, vendor/familyid/modelid (ncclTopoAddCpu).
void checkNcclRequirements(Node* root) {
  REQUIRE(root->tag == "system");
  CHECK(root->attrs["version"] == "1");
  std::vector<Node*> pcis, cpus;
  collect(root, "pci", &pcis);
  collect(root, "cpu", &cpus);
  for (Node* pci : pcis) {
    for (const char* key : {"busid", "class", "link_speed", "link_width"}) {
      INFO(pci->attrs["busid"] << " " << key);
      CHECK(pci->attrs.count(key) == 1);
    }
    CHECK(pci->attrs["busid"].size() == 12);
  }
  for (Node* cpu : cpus) {
    CHECK(cpu->parent == root);
    for (const char* key : {"numaid", "affinity", "arch", "vendor", "familyid", "modelid"})
      CHECK(cpu->attrs.count(key) == 1);
  }
}

std::vector<NetDevice> devices(std::initializer_list<std::pair<const char*, int>> list) {
  std::vector<NetDevice> out;
  for (const auto& [name, rail] : list) {
    NetDevice device;
    device.name = name;
    device.railId = static_cast<int16_t>(rail);
    out.push_back(device);
  }
  return out;
}

}  // namespace

TEST_CASE("base device names drop the port and the address", "[topo]") {
  CHECK(railnet::topo::baseDeviceName("mlx5_0:1") == "mlx5_0");
  CHECK(railnet::topo::baseDeviceName("lo@127.0.1.1") == "lo");
  CHECK(railnet::topo::baseDeviceName("ens1f0") == "ens1f0");
}

TEST_CASE("loopback rails on a switchless 2-GPU box: each next to its GPU under a synthetic switch", "[topo]") {
  Topology topology = loadTopology(fixture("two-gpu-box.xml"));
  auto plan = planRails(topology, "");
  auto placement = planPlacement(topology, plan, devices({{"lo@127.0.1.1", 0}, {"lo@127.0.2.1", 1}}), "");
  REQUIRE(placement.virtualNics.size() == 2);
  CHECK(placement.virtualNics[0].gpu == 0);
  CHECK(placement.virtualNics[1].gpu == 1);
  CHECK(placement.devices[0].railId == 0);
  CHECK(placement.devices[1].railId == 1);
  CHECK(placement.devices[0].pciPath.empty());

  REQUIRE_FALSE(placement.ncclXml.empty());
  CHECK(placement.ncclXml.find("<?xml") == std::string::npos);
  auto root = Reader(placement.ncclXml).document();
  checkNcclRequirements(root.get());
  std::vector<Node*> cpus;
  collect(root.get(), "cpu", &cpus);
  REQUIRE(cpus.size() == 1);
  CHECK(cpus[0]->attrs["numaid"] == "0");
  CHECK(cpus[0]->attrs["affinity"] == "0000000f");
  CHECK(cpus[0]->attrs["arch"] == "x86_64");
  CHECK(cpus[0]->attrs["vendor"] == "GenuineIntel");
  CHECK(cpus[0]->attrs["modelid"] == "143");

  const std::vector<std::pair<std::string, std::string>> expected = {{"lo@127.0.1.1", "0000:11:00.0"},
                                                                     {"lo@127.0.2.1", "0000:51:00.0"}};
  for (size_t rail = 0; rail < expected.size(); ++rail) {
    Node* net = netNamed(root.get(), expected[rail].first);
    REQUIRE(net != nullptr);
    CHECK(net->attrs.size() == 1);  // only the name: NCCL fills dev/speed/guid from the plugin's properties
    Node* nicFunction = net->parent->parent;
    CHECK(net->parent->tag == "nic");
    CHECK(nicFunction->attrs["class"] == "0x020000");
    CHECK(nicFunction->attrs["busid"] == "ffff:0" + std::to_string(rail) + ":00.0");
    Node* sw = nicFunction->parent;
    CHECK(sw->attrs["class"] == "0x060400");
    CHECK(sw->attrs["busid"] == "fffe:0" + std::to_string(rail) + ":00.0");
    CHECK(sw->parent == cpus[0]);
    Node* gpu = pciChild(sw, expected[rail].second);
    REQUIRE(gpu != nullptr);
    CHECK(gpu->attrs["class"] == "0x030200");
  }
}

TEST_CASE("virtual NICs sit beside the GPUs this process sees when it sees a block of the node's GPUs", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  auto plan = planRails(topology, "");
  const auto loopbackRails = devices({{"lo@127.0.1.1", 0}, {"lo@127.0.2.1", 1}, {"lo@127.0.3.1", 2}});

  SECTION("no CUDA ordinals known (a file, or no driver): every GPU, in bus order") {
    auto placement = planPlacement(topology, plan, loopbackRails, "");
    REQUIRE(placement.virtualNics.size() == 3);
    CHECK(placement.virtualNics[0].gpu == 0);
    CHECK(placement.virtualNics[1].gpu == 1);
    CHECK(placement.virtualNics[2].gpu == 2);
  }
  SECTION("CUDA_VISIBLE_DEVICES gave this process GPUs 6 and 4 (a fake node's block): rails go round those two") {
    topology.gpus[6].cudaIndex = 0;
    topology.gpus[4].cudaIndex = 1;
    auto placement = planPlacement(topology, plan, loopbackRails, "");
    REQUIRE(placement.virtualNics.size() == 3);
    CHECK(placement.virtualNics[0].gpu == 4);  // bus order, as everywhere else, not CUDA's order
    CHECK(placement.virtualNics[1].gpu == 6);
    CHECK(placement.virtualNics[2].gpu == 4);
    CHECK(placement.devices[2].railId == 2);  // the rail itself does not change
    auto root = Reader(placement.ncclXml).document();
    checkNcclRequirements(root.get());
  }
  SECTION("one GPU visible (one rank per GPU): every GPU, so the node's ranks agree") {
    topology.gpus[3].cudaIndex = 0;
    auto placement = planPlacement(topology, plan, loopbackRails, "");
    REQUIRE(placement.virtualNics.size() == 3);
    CHECK(placement.virtualNics[1].gpu == 1);
    CHECK(placement.virtualNics[2].gpu == 2);
  }
}

TEST_CASE("on a switched node a rail device sits under its GPU's nearest switch", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  auto plan = planRails(topology, "");
  auto placement = planPlacement(topology, plan, devices({{"veth0", -1}, {"veth1", -1}}), "veth1:9");
  // veth1 named by RAILNET_RAILS; veth0 then gets none (a non-empty spec names every rail).
  CHECK(placement.devices[0].railId == -1);
  CHECK(placement.devices[1].railId == 9);
  REQUIRE(placement.virtualNics.size() == 1);
  CHECK(placement.virtualNics[0].gpu == 1);  // rail 9 of 8 GPUs
  auto root = Reader(placement.ncclXml).document();
  checkNcclRequirements(root.get());
  std::vector<Node*> cpus;
  collect(root.get(), "cpu", &cpus);
  CHECK(cpus.size() == 2);
  Node* net = netNamed(root.get(), "veth1");
  REQUIRE(net != nullptr);
  Node* leaf = net->parent->parent->parent;
  CHECK(leaf->attrs["busid"] == "0000:20:00.0");  // GPU1's leaf switch
  CHECK(pciChild(leaf, "0000:22:00.0") != nullptr);
  CHECK(leaf->parent->attrs["busid"] == "0000:11:00.0");
  CHECK(pciChild(leaf->parent, "0000:13:00.0") != nullptr);  // GPU0's leaf switch, same outer switch element
  std::vector<Node*> gpus;
  collect(root.get(), "pci", &gpus);
  int gpuCount = 0;
  for (Node* pci : gpus) gpuCount += pci->attrs["class"] == "0x030200" ? 1 : 0;
  CHECK(gpuCount == 8);
}

TEST_CASE("transport devices are matched to NICs by name or PCI path and take the NIC's rail", "[topo]") {
  Topology topology = loadTopology(fixture("dgx-h100.xml"));
  auto plan = planRails(topology, "");
  std::vector<NetDevice> input = devices({{"mlx5_3:1", -1}, {"ibp22s0", -1}, {"mlx5_1", -1}, {"other", -1}});
  input[3].pciPath =
      "/sys/devices/pci0000:d0/0000:d0:01.0/0000:d1:00.0/0000:d2:01.0/0000:e0:00.0/0000:e1:01.0/0000:e3:00.0";
  auto placement = planPlacement(topology, plan, input, "");
  CHECK(placement.devices[0].railId == 1);  // mlx5_3 serves GPU1
  CHECK(placement.devices[0].pciPath ==
        "/sys/devices/pci0000:10/0000:10:01.0/0000:11:00.0/0000:12:01.0/0000:20:00.0/0000:21:01.0/0000:23:00.0");
  CHECK(placement.devices[1].railId == 0);   // mlx5_0's netdev
  CHECK(placement.devices[2].railId == -1);  // storage
  CHECK(placement.devices[3].railId == 7);   // by PCI path: mlx5_11, next to GPU7
  CHECK(placement.devices[3].nic >= 0);
  // Each rail device names its rail's GPU (the NVLink hop stages there); storage has none.
  auto busOfGpu = [&](int index) {
    for (const auto& gpu : topology.gpus) {
      if (gpu.index == index) return gpu.where.busId;
    }
    return std::string("none");
  };
  CHECK(placement.devices[0].railGpu == busOfGpu(1));
  CHECK(placement.devices[1].railGpu == busOfGpu(0));
  CHECK(placement.devices[2].railGpu.empty());
  CHECK(placement.devices[3].railGpu == busOfGpu(7));
  CHECK(!placement.devices[3].railGpu.empty());
  CHECK(placement.virtualNics.empty());
  CHECK(placement.ncclXml.empty());
}

TEST_CASE("devices without a PCI function get rails by order only when they are all there is", "[topo]") {
  Topology topology = loadTopology(fixture("two-gpu-box.xml"));
  auto plan = planRails(topology, "");
  auto byOrder = planPlacement(topology, plan, devices({{"lo@127.0.1.1", -1}, {"lo@127.0.2.1", -1}}), "");
  CHECK(byOrder.devices[0].railId == 0);
  CHECK(byOrder.devices[1].railId == 1);
  CHECK(byOrder.virtualNics.size() == 2);

  auto single = planPlacement(topology, plan, devices({{"lo", -1}}), "");
  CHECK(single.devices[0].railId == -1);
  CHECK(single.ncclXml.empty());

  auto withNic = planPlacement(topology, plan, devices({{"eth0", -1}, {"veth0", -1}, {"veth1", -1}}), "");
  CHECK(withNic.devices[0].railId == 0);
  CHECK(withNic.devices[0].pciPath == "/sys/devices/pci0000:08/0000:08:01.0/0000:09:00.0");
  CHECK(withNic.devices[1].railId == -1);
  CHECK(withNic.devices[2].railId == -1);

  auto swapped = planPlacement(topology, plan, devices({{"lo@127.0.1.1", 0}, {"lo@127.0.2.1", 1}}),
                               "lo@127.0.2.1:0,lo@127.0.1.1:1");
  CHECK(swapped.devices[0].railId == 1);
  CHECK(swapped.devices[1].railId == 0);
  REQUIRE(swapped.virtualNics.size() == 2);
  CHECK(swapped.virtualNics[0].gpu == 1);

  Topology noGpu = loadTopology(fixture("two-gpu-box.xml"));
  noGpu.gpus.clear();
  auto cpuOnly = planPlacement(noGpu, planRails(noGpu, ""), devices({{"lo@127.0.1.1", 0}, {"lo@127.0.2.1", 1}}), "");
  CHECK(cpuOnly.devices[1].railId == 1);
  CHECK(cpuOnly.ncclXml.empty());
}

TEST_CASE("at init the topology file is written and NCCL_TOPO_FILE set, but never over the user's", "[topo]") {
  char dirTemplate[] = "/tmp/railnet-topo-test-XXXXXX";
  REQUIRE(mkdtemp(dirTemplate) != nullptr);
  const std::string dir = dirTemplate;
  const char* oldTmp = getenv("TMPDIR");
  const std::string savedTmp = oldTmp != nullptr ? oldTmp : "";
  const char* oldTopo = getenv("NCCL_TOPO_FILE");
  const std::string savedTopo = oldTopo != nullptr ? oldTopo : "";
  setenv("TMPDIR", dir.c_str(), 1);
  unsetenv("NCCL_TOPO_FILE");

  railnet::Settings config;
  config.topoXml = fixture("two-gpu-box.xml");
  auto rails = devices({{"lo@127.0.1.1", 0}, {"lo@127.0.2.1", 1}});
  const std::string expectedPath = dir + "/railnet-topo-" + std::to_string(getpid()) + ".xml";

  config.writeNcclTopo = 0;
  auto off = railnet::topo::placeNetDevices(rails, config);
  CHECK_FALSE(off.ncclXml.empty());
  CHECK(getenv("NCCL_TOPO_FILE") == nullptr);
  CHECK(access(expectedPath.c_str(), F_OK) != 0);

  config.writeNcclTopo = 1;
  auto placed = railnet::topo::placeNetDevices(rails, config);
  REQUIRE(getenv("NCCL_TOPO_FILE") != nullptr);
  CHECK(std::string(getenv("NCCL_TOPO_FILE")) == expectedPath);
  std::ifstream written(expectedPath);
  std::string text((std::istreambuf_iterator<char>(written)), std::istreambuf_iterator<char>());
  CHECK(text == placed.ncclXml);

  setenv("NCCL_TOPO_FILE", "/user/own.xml", 1);
  railnet::topo::placeNetDevices(rails, config);
  CHECK(std::string(getenv("NCCL_TOPO_FILE")) == "/user/own.xml");

  // Inherited from a parent process that ran railnet: that file is the parent's, not the user's.
  setenv("NCCL_TOPO_FILE", "/tmp/gone/railnet-topo-1.xml", 1);
  railnet::topo::placeNetDevices(rails, config);
  CHECK(std::string(getenv("NCCL_TOPO_FILE")) == expectedPath);

  config.rails = "lo@127.0.1.1:oops";
  CHECK_THROWS_AS(railnet::topo::placeNetDevices(rails, config), railnet::Error);
  config.rails = "";
  config.topoXml = fixture("missing.xml");
  CHECK_THROWS_AS(railnet::topo::placeNetDevices(rails, config), railnet::Error);

  unlink(expectedPath.c_str());
  rmdir(dir.c_str());
  if (savedTmp.empty()) {
    unsetenv("TMPDIR");
  } else {
    setenv("TMPDIR", savedTmp.c_str(), 1);
  }
  if (savedTopo.empty()) {
    unsetenv("NCCL_TOPO_FILE");
  } else {
    setenv("NCCL_TOPO_FILE", savedTopo.c_str(), 1);
  }
}
