#include "topo/rails.h"

#include <algorithm>
#include <cstdlib>
#include <set>

#include "railnet/error.h"

namespace railnet::topo {
namespace {

std::string_view trim(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Kuhn's augmenting paths over NIC "slots" (capacity copies of each NIC).
class Matcher {
 public:
  Matcher(const std::vector<std::vector<int>>& candidates, int nicCount, int capacity)
      : candidates_(candidates), capacity_(capacity), slotOwner_(static_cast<size_t>(nicCount * capacity), -1) {}

  bool assignAll() {
    for (size_t gpu = 0; gpu < candidates_.size(); ++gpu) {
      if (candidates_[gpu].empty()) continue;
      std::vector<bool> seen(slotOwner_.size(), false);
      if (!augment(static_cast<int>(gpu), &seen)) return false;
    }
    return true;
  }

  std::vector<int> gpuNic() const {
    std::vector<int> result(candidates_.size(), -1);
    for (size_t slot = 0; slot < slotOwner_.size(); ++slot) {
      if (slotOwner_[slot] >= 0) result[static_cast<size_t>(slotOwner_[slot])] = static_cast<int>(slot) / capacity_;
    }
    return result;
  }

 private:
  // Slots are tried level by level (every candidate's first slot, then every second slot...), so load spreads
  // over the candidates before any NIC takes a second GPU.
  bool augment(int gpu, std::vector<bool>* seen) {
    for (int level = 0; level < capacity_; ++level) {
      for (int nic : candidates_[static_cast<size_t>(gpu)]) {
        size_t slot = static_cast<size_t>(nic * capacity_ + level);
        if ((*seen)[slot]) continue;
        (*seen)[slot] = true;
        if (slotOwner_[slot] < 0 || augment(slotOwner_[slot], seen)) {
          slotOwner_[slot] = gpu;
          return true;
        }
      }
    }
    return false;
  }

  const std::vector<std::vector<int>>& candidates_;
  int capacity_;
  std::vector<int> slotOwner_;
};

// Empty when some GPU finds every candidate at `capacity`.
std::vector<int> greedy(const std::vector<std::vector<int>>& candidates, size_t nics, int capacity) {
  std::vector<int> load(nics, 0);
  std::vector<int> result(candidates.size(), -1);
  for (size_t gpu = 0; gpu < candidates.size(); ++gpu) {
    int best = -1;
    for (int nic : candidates[gpu]) {
      int used = load[static_cast<size_t>(nic)];
      if (used < capacity && (best < 0 || used < load[static_cast<size_t>(best)])) best = nic;
    }
    if (best < 0 && !candidates[gpu].empty()) return {};
    if (best >= 0) ++load[static_cast<size_t>(best)];
    result[gpu] = best;
  }
  return result;
}

std::string speedText(int mbps) { return mbps > 0 ? std::to_string(mbps / 1000) + " Gb/s" : "unknown speed"; }

void addWarnings(const Topology& topology, RailPlan* plan) {
  const size_t nics = topology.nics.size();
  if (!topology.gpus.empty() && nics == 0) {
    plan->warnings.push_back("no NIC on this node: GPUs cannot reach other nodes");
  }
  for (size_t gpu = 0; gpu < topology.gpus.size(); ++gpu) {
    int nic = plan->gpuNic[gpu];
    if (nic >= 0 && plan->distance[gpu][static_cast<size_t>(nic)] == PathType::SYS) {
      plan->warnings.push_back("GPU" + std::to_string(gpu) + "'s nearest NIC (" +
                               topology.nics[static_cast<size_t>(nic)].name() +
                               ") is SYS-distant: its traffic crosses "
                               "the CPU interconnect");
    }
  }
  for (size_t shared = 0; shared < nics; ++shared) {
    if (plan->nicGpus[shared] < 2) continue;
    for (size_t idle = 0; idle < nics; ++idle) {
      if (plan->nicGpus[idle] != 0) continue;
      // A slower idle NIC is a storage or management port, not a compute NIC left unused.
      int idleSpeed = topology.nics[idle].speedMbps, sharedSpeed = topology.nics[shared].speedMbps;
      if (idleSpeed > 0 && sharedSpeed > 0 && idleSpeed < sharedSpeed) continue;
      plan->warnings.push_back(std::to_string(plan->nicGpus[shared]) + " GPUs share " + topology.nics[shared].name() +
                               " while " + topology.nics[idle].name() + " idles");
    }
  }
  std::set<std::vector<int>> reported;
  for (size_t gpu = 0; gpu < topology.gpus.size(); ++gpu) {
    const std::vector<int>& group = plan->fusionGroups[gpu];
    if (group.size() < 2 || !reported.insert(group).second) continue;
    std::set<int> speeds;
    std::string names;
    for (int nic : group) {
      const Nic& n = topology.nics[static_cast<size_t>(nic)];
      speeds.insert(n.speedMbps);
      names += (names.empty() ? "" : ", ") + n.name() + " (" + speedText(n.speedMbps) + ")";
    }
    if (speeds.size() > 1) {
      plan->warnings.push_back("NICs of mixed speed in one fusion group (equally near GPU" + std::to_string(gpu) +
                               "): " + names);
    }
  }
}

}  // namespace

std::vector<std::pair<std::string, int>> parseRailSpec(std::string_view spec) {
  std::vector<std::pair<std::string, int>> entries;
  while (!trim(spec).empty()) {
    size_t comma = spec.find(',');
    std::string_view entry = trim(spec.substr(0, comma));
    spec = comma == std::string_view::npos ? std::string_view() : spec.substr(comma + 1);
    size_t colon = entry.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == entry.size()) {
      fail(ncclInvalidUsage, "NET/railnet: RAILNET_RAILS entry \"%.*s\" is not name:rail",
           static_cast<int>(entry.size()), entry.data());
    }
    std::string name(trim(entry.substr(0, colon)));
    std::string number(trim(entry.substr(colon + 1)));
    char* end = nullptr;
    long rail = strtol(number.c_str(), &end, 10);
    if (end == number.c_str() || *end != '\0' || rail < 0 || rail > 32767) {
      fail(ncclInvalidUsage, "NET/railnet: RAILNET_RAILS entry \"%s:%s\": the rail must be 0..32767", name.c_str(),
           number.c_str());
    }
    if (railFromSpec(entries, name) >= 0) {
      fail(ncclInvalidUsage, "NET/railnet: RAILNET_RAILS names %s twice", name.c_str());
    }
    entries.emplace_back(name, static_cast<int>(rail));
  }
  return entries;
}

int railFromSpec(const std::vector<std::pair<std::string, int>>& spec, std::string_view name) {
  for (const auto& [entryName, rail] : spec) {
    if (entryName == name) return rail;
  }
  return -1;
}

RailPlan planRails(const Topology& topology, std::string_view railSpec) {
  const size_t gpus = topology.gpus.size();
  const size_t nics = topology.nics.size();
  RailPlan plan;
  plan.distance.assign(gpus, std::vector<PathType>(nics, PathType::SYS));
  plan.fusionGroups.assign(gpus, {});
  for (size_t gpu = 0; gpu < gpus; ++gpu) {
    PathType best = PathType::SYS;
    for (size_t nic = 0; nic < nics; ++nic) {
      plan.distance[gpu][nic] = classify(topology.gpus[gpu].where, topology.nics[nic].where);
      best = std::min(best, plan.distance[gpu][nic]);
    }
    for (size_t nic = 0; nic < nics; ++nic) {
      if (plan.distance[gpu][nic] == best) plan.fusionGroups[gpu].push_back(static_cast<int>(nic));
    }
  }

  plan.gpuNic.assign(gpus, -1);
  if (nics > 0) {
    for (int capacity = 1; capacity <= static_cast<int>(std::max<size_t>(gpus, 1)); ++capacity) {
      Matcher matcher(plan.fusionGroups, static_cast<int>(nics), capacity);
      if (!matcher.assignAll()) continue;
      // The smallest feasible capacity is known; the greedy pass (each GPU in bus order takes its least-used
      // candidate, the lowest bus id on ties) gives the intuitive pairing and is kept when it fits that capacity.
      plan.gpuNic = greedy(plan.fusionGroups, nics, capacity);
      if (plan.gpuNic.empty()) plan.gpuNic = matcher.gpuNic();
      break;
    }
  }
  plan.nicGpus.assign(nics, 0);
  for (int nic : plan.gpuNic) {
    if (nic >= 0) ++plan.nicGpus[static_cast<size_t>(nic)];
  }

  plan.nicRail.assign(nics, -1);
  if (!trim(railSpec).empty()) {
    auto spec = parseRailSpec(railSpec);
    for (size_t nic = 0; nic < nics; ++nic) {
      const Nic& n = topology.nics[nic];
      plan.nicRail[nic] = railFromSpec(spec, n.verbsName);
      for (const std::string& netdev : n.netdevs) {
        if (plan.nicRail[nic] < 0) plan.nicRail[nic] = railFromSpec(spec, netdev);
      }
    }
  } else {
    // Used NICs by (first GPU served, bus id); NICs sort by bus id already, so a stable sort keeps that order.
    std::vector<int> firstGpu(nics, static_cast<int>(gpus));
    for (size_t gpu = 0; gpu < gpus; ++gpu) {
      int nic = plan.gpuNic[gpu];
      if (nic >= 0)
        firstGpu[static_cast<size_t>(nic)] = std::min(firstGpu[static_cast<size_t>(nic)], static_cast<int>(gpu));
    }
    std::vector<int> used;
    for (size_t nic = 0; nic < nics; ++nic) {
      if (plan.nicGpus[nic] > 0) used.push_back(static_cast<int>(nic));
    }
    std::stable_sort(used.begin(), used.end(),
                     [&](int a, int b) { return firstGpu[static_cast<size_t>(a)] < firstGpu[static_cast<size_t>(b)]; });
    for (size_t rank = 0; rank < used.size(); ++rank)
      plan.nicRail[static_cast<size_t>(used[rank])] = static_cast<int>(rank);
  }
  addWarnings(topology, &plan);
  return plan;
}

}  // namespace railnet::topo
