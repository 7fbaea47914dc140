// What the net plugin asks of the topology at init: for each transport device, its PCI path and rail, and for
// devices without a PCI function an NCCL topology XML that puts them next to their rail's GPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "railnet/settings.h"
#include "topo/nccl_xml.h"
#include "topo/rails.h"
#include "topo/topology.h"

namespace railnet::topo {

struct NetDevice {
  std::string name;     // the transport's device name: "mlx5_0", "mlx5_0:1", "ens1f0", "lo@127.0.1.1"
  std::string pciPath;  // sysfs path, empty when the device has no PCI function (or the transport did not know)
  int16_t railId = -1;  // -1 (NCCL_NET_ID_UNDEF) when unknown
  int nic = -1;         // out: index into Topology::nics, -1 when no NIC matched
  std::string railGpu;  // out: PCI bus id of the first GPU (by index) that uses this NIC, empty when none
};

struct Placement {
  std::vector<NetDevice> devices;       // the input with pciPath / railId / nic filled in
  std::vector<VirtualNic> virtualNics;  // devices without a PCI function that have a rail
  std::string ncclXml;                  // NCCL topology XML for them; empty when none is needed
};

// The name a device is matched to NICs by: "mlx5_0:1" -> "mlx5_0", "lo@127.0.1.1" -> "lo".
std::string baseDeviceName(std::string_view name);

// The GPUs that virtual NICs (devices without a PCI function) are placed beside, as Topology::gpus indices in
// bus order: rail r sits next to anchors[r % size]. When this process sees two or more GPUs but not all (a job
// or fake node given a block of the node's GPUs by CUDA_VISIBLE_DEVICES), only those; otherwise every GPU, so
// ranks that each see one GPU still agree on the node's layout.
std::vector<int> virtualNicAnchors(const Topology& topology);

// Pure planning, no files and no environment. Rails, first rule that applies:
//  1. railSpec (RAILNET_RAILS) names the device (full name, or base name for devices without '@');
//  2. a non-empty railSpec names nothing else: the device gets no rail;
//  3. the transport already gave the device a rail (e.g. RAILNET_TCP_ADDRESSES position, RAILNET_IB_HCA);
//  4. the device is a NIC of the topology: the NIC's rail from planRails;
//  5. devices without a PCI function, when there are at least two and no device is a topology NIC: their order.
Placement planPlacement(const Topology& topology, const RailPlan& plan, const std::vector<NetDevice>& devices,
                        std::string_view railSpec);

// At plugin init: loads the topology (RAILNET_TOPO_XML or the live machine), plans with RAILNET_RAILS, and when
// a virtual NIC has a rail and RAILNET_WRITE_NCCL_TOPO=1 writes $TMPDIR/railnet-topo-<pid>.xml and sets
// NCCL_TOPO_FILE to it unless the user set NCCL_TOPO_FILE. Logs what it did. A live machine hwloc cannot read
// leaves the devices as they are (logged); a RAILNET_TOPO_XML or RAILNET_RAILS that does not parse throws
// railnet::Error (ncclInvalidUsage).
Placement placeNetDevices(const std::vector<NetDevice>& devices);
// The same with explicit settings (tests).
Placement placeNetDevices(const std::vector<NetDevice>& devices, const Settings& config);

}  // namespace railnet::topo
