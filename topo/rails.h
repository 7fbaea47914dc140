// Which NIC each GPU uses and which rail each NIC is on (docs/topology.md, "Selection").
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "topo/topology.h"

namespace railnet::topo {

// RAILNET_RAILS: "name:rail,name:rail". Throws railnet::Error (ncclInvalidUsage) on a malformed entry, a rail
// outside 0..32767 or a name given twice.
std::vector<std::pair<std::string, int>> parseRailSpec(std::string_view spec);

// The rail a spec gives `name`, -1 when it does not name it.
int railFromSpec(const std::vector<std::pair<std::string, int>>& spec, std::string_view name);

struct RailPlan {
  std::vector<std::vector<PathType>> distance;  // [gpu][nic]
  std::vector<int> gpuNic;                      // [gpu]: index into Topology::nics, -1 when the node has no NIC
  std::vector<int> nicGpus;                     // [nic]: how many GPUs use it
  std::vector<int> nicRail;                     // [nic]: rail id, -1 for NICs no GPU uses (and none named)
  std::vector<std::vector<int>> fusionGroups;   // [gpu]: the NICs equally nearest to it (what fusion would merge)
  std::vector<std::string> warnings;            // suspicious mapping, one sentence each; empty when fine
};

// 1. Each GPU's candidates: the NICs at its smallest distance.
// 2. Balance: find the smallest NIC load L at which every GPU can have one of its candidates (bipartite matching
//    with NIC capacity 1, 2, ...). Then each GPU in bus order takes its least-used candidate below L (lowest bus
//    id on ties); when that greedy pass gets stuck, the matching's assignment is used. Deterministic.
// 3. Rails: the used NICs ranked by (lowest GPU index they serve, bus id) - identical on identical nodes.
//    A non-empty `railSpec` replaces step 3: NICs it names take its rails, the others get none.
RailPlan planRails(const Topology& topology, std::string_view railSpec);

}  // namespace railnet::topo
