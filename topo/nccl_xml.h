// The NCCL topology XML (NCCL_TOPO_FILE) that places network devices without a PCI function - loopback rails,
// virtual interfaces - next to the GPU of their rail, so NCCL's ring/tree search and PXN see the rails.
// What NCCL requires of the file, with references into NCCL's source: docs/topology.md.
#pragma once

#include <string>
#include <vector>

#include "topo/topology.h"

namespace railnet::topo {

struct VirtualNic {
  std::string name;  // the device name the plugin reports; NCCL matches <net name=...> by it
  int rail = -1;
  int gpu = -1;  // Topology::gpus index it sits next to
};

// <system version="1"> with one <cpu> per NUMA node that holds a GPU, each GPU under its PCIe switches, and
// each virtual NIC as a PCI function (busid ffff:RR:00.0) beside its GPU, under the GPU's nearest switch. A GPU
// with no switch and a virtual NIC gets a synthetic switch (busid fffe:GG:00.0) holding both, so NCCL sees the
// pair as PIX as it would on a rail-optimised node.
std::string ncclTopologyXml(const Topology& topology, const std::vector<VirtualNic>& nics);

}  // namespace railnet::topo
