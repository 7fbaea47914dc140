// PXN-style routing for connections (issue 13, docs/design.md "Routes"): a connection whose peer NIC sits on
// another rail leaves from this host's NIC on the peer's rail, when the host has one, so its traffic stays on
// one rail (a rail-optimized fabric's leaf) instead of crossing the spine. Pure: rails in, a choice out.
#pragma once

#include <cstdint>
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

}  // namespace railnet::topo
