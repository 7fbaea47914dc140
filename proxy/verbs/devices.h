// RDMA device discovery for the verbs transport: which (device, port) pairs railnet exposes to NCCL, and how
// each is addressed (LID for InfiniBand, a RoCE v2 GID for Ethernet).
//
// Discovery opens each device only to query it and closes it again; the transport reopens the devices it
// uses with openDevice(). It never throws: problems are logged and the device or port is skipped.
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "proxy/transport.h"
#include "proxy/verbs/ibverbs_api.h"
#include "topo/name_filter.h"
#include "topo/netif.h"

namespace railnet::verbs {

// Link bandwidth in Mb/s from ibv_port_attr: width code (1=1x, 2=4x, 4=8x, 8=12x, 16=2x) times the per-lane
// rate of the speed code (1 SDR 2.5, 2 DDR 5, 4 QDR 10, 8 FDR10 10, 16 FDR 14, 32 EDR 25, 64 HDR 50,
// 128 NDR 100, 256 XDR 200 Gb/s). XDR only exists in active_speed_ex, hence 32 bits. Rates are nominal,
// as NCCL reports them. 0 when either code is unknown (or has more than one bit set).
int portSpeedMbps(uint8_t activeWidth, uint32_t activeSpeed);

// One populated slot of a port's GID table.
struct GidEntry {
  int index = 0;
  ibv_gid gid{};
  std::string type;  // from sysfs gid_attrs/types: "RoCE v2", "IB/RoCE v1", or "" when unreadable
};

bool gidIsZero(const ibv_gid& gid);
bool gidIsIpv4Mapped(const ibv_gid& gid);   // ::ffff:a.b.c.d
bool gidIsLinkLocal(const ibv_gid& gid);    // fe80::/10
std::string formatGid(const ibv_gid& gid);  // inet_ntop form, e.g. "::ffff:10.0.0.1"

// The GID a RoCE port uses. forcedIndex >= 0 (RAILNET_IB_GID_INDEX) wins when that slot is populated,
// whatever its type. Otherwise: the first RoCE v2 GID of the wanted family (AF_INET: IPv4-mapped; AF_INET6:
// not IPv4-mapped and not link-local), else the first RoCE v2 GID at all, else -1. RoCE v1 GIDs are never
// picked automatically (railnet addresses peers over UDP/IP); force one by index to use it. All-zero GIDs
// are empty slots and never chosen.
int selectGidIndex(const std::vector<GidEntry>& table, int family, int forcedIndex);

// The populated slots of a port's GID table: ibv_query_gid for each index below tableLength, and the type
// from <sysfsRoot>/<device>/ports/<port>/gid_attrs/types/<index>.
std::vector<GidEntry> readGidTable(const IbvApi& api, ibv_context* context, const std::string& sysfsRoot,
                                   const std::string& device, int port, int tableLength);

struct VerbsPort {
  std::string device;  // kernel device name, e.g. "mlx5_0", "rxe0"
  int port = 1;
  int linkLayer = IBV_LINK_LAYER_UNSPECIFIED;  // IBV_LINK_LAYER_INFINIBAND or IBV_LINK_LAYER_ETHERNET
  uint16_t lid = 0;
  int gidIndex = -1;  // -1: InfiniBand with LID routing (no GRH); >= 0: the GID to put in the GRH / RoCE packet
  ibv_gid gid{};      // the GID at gidIndex, zero when gidIndex is -1
  ibv_mtu activeMtu = IBV_MTU_1024;
  int numaNode = -1;
  bool gdrDmabuf = false;   // CUDA memory registers through cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr
  bool gdrPeermem = false;  // CUDA memory registers with plain ibv_reg_mr (a peer-memory module is loaded)
  std::string gdrSummary;   // proxy/verbs/gpu_direct.h decideGdr()
  DeviceInfo info;  // what NCCL sees; info.name is "<device>" or "<device>:<port>" (several ports in use)
};

struct DiscoveryOptions {
  std::string hca;                                  // RAILNET_IB_HCA (topo::NameFilter's NCCL_IB_HCA grammar)
  int gidIndex = -1;                                // RAILNET_IB_GID_INDEX
  int family = AF_INET;                             // RAILNET_IB_ADDR_FAMILY
  int maxRecvs = 8;                                 // RAILNET_MAX_RECVS
  std::string sysfsRoot = "/sys/class/infiniband";  // tests point this at a fake tree

  static DiscoveryOptions fromSettings();  // the process-wide RAILNET_IB_* settings
};

// Every ACTIVE port, InfiniBand or RoCE, of each device that RAILNET_IB_HCA selects, in device-list order.
// Calls ibv_fork_init first (NCCL does too; it must precede other verbs). Empty, never an error, when the
// host has no RDMA device or no kernel support.
std::vector<VerbsPort> discoverPorts(const IbvApi& api);
std::vector<VerbsPort> discoverPorts(const IbvApi& api, const DiscoveryOptions& options);

// Opens the device named `device` (VerbsPort::device); nullptr, with a WARN, when it has gone away.
ibv_context* openDeviceByName(const IbvApi& api, const std::string& device);

}  // namespace railnet::verbs
