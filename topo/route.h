// PXN-style routing for connections (issue 13, docs/design.md "Routes"): a connection whose peer NIC sits on
// another rail leaves from this host's NIC on the peer's rail, when the host has one, so its traffic stays on
// one rail (a rail-optimized fabric's leaf) instead of crossing the spine. Pure: rails in, a choice out.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace railnet::topo {

// The device a connection from `localDev` to a peer NIC on `remoteRail` should leave from: `localDev` itself when
// the rails match or either is unknown (-1), else the first device in `deviceRails` (by index) whose rail is
// `remoteRail` and that `eligible` admits (physical devices of the same address family), else `localDev`.
template <class Eligible>
int routeDevice(const std::vector<int16_t>& deviceRails, int localDev, int16_t remoteRail, Eligible eligible) {
  if (localDev < 0 || static_cast<size_t>(localDev) >= deviceRails.size()) return localDev;
  const int16_t localRail = deviceRails[static_cast<size_t>(localDev)];
  if (localRail < 0 || remoteRail < 0 || localRail == remoteRail) return localDev;
  for (size_t dev = 0; dev < deviceRails.size(); ++dev) {
    if (deviceRails[dev] == remoteRail && eligible(static_cast<int>(dev))) return static_cast<int>(dev);
  }
  return localDev;
}

// Rail failover (docs/failover.md "Single-NIC devices"): the devices a single-NIC connection from `fromDev` may move
// to when its NIC fails, nearest first: ascending distance(fromDev, candidate) (a PCI path class; larger when
// unknown), then by index. `eligible` admits a candidate (a physical device of the same address family).
template <class Distance, class Eligible>
std::vector<int> spareOrder(int devices, int fromDev, Distance distance, Eligible eligible) {
  std::vector<std::pair<int, int>> ranked;  // (distance, device)
  for (int dev = 0; dev < devices; ++dev) {
    if (dev != fromDev && eligible(dev)) ranked.emplace_back(distance(fromDev, dev), dev);
  }
  std::sort(ranked.begin(), ranked.end());
  std::vector<int> order;
  for (const auto& entry : ranked) order.push_back(entry.second);
  return order;
}

}  // namespace railnet::topo
