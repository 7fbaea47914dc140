#include "proxy/verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>

#include "proxy/nic_counters.h"
#include "proxy/protocol/handshake.h"
#include "proxy/staging/nvlink_staging.h"
#include "proxy/verbs/verbs_recv_comm.h"
#include "proxy/verbs/verbs_send_comm.h"
#include "railnet/error.h"
#include "topo/route.h"
#include "topo/topology.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {
namespace {

// The RDMA port's own IP: the IPv4 address inside its RoCE v2 GID, when it has one.
std::optional<protocol::SocketAddress> portAddress(const VerbsPort& port) {
  if (port.gidIndex < 0 || !gidIsIpv4Mapped(port.gid)) return std::nullopt;
  protocol::SocketAddress address;
  sockaddr_in in{};
  in.sin_family = AF_INET;
  memcpy(&in.sin_addr, port.gid.raw + 12, 4);
  memcpy(&address.storage, &in, sizeof(in));
  address.length = sizeof(in);
  return address;
}

// Where a port's connections meet out of band: the port's own IP when it has one, else the first interface
// RAILNET_IFNAME selects (InfiniBand without IPoIB).
protocol::SocketAddress rendezvousAddress(const VerbsPort& port) {
  if (std::optional<protocol::SocketAddress> own = portAddress(port)) return *own;
  protocol::SocketAddress address;
  const Settings& config = settings();
  std::vector<topo::NetInterface> interfaces = topo::discoverInterfaces(config.ifname, config.socketFamily);
  if (interfaces.empty()) {
    fail(ncclSystemError, "NET/railnet: RDMA port %s has no IPv4 GID and no interface is usable for its handshake",
         port.info.name.c_str());
  }
  memcpy(&address.storage, &interfaces[0].address, interfaces[0].addressLength);
  address.length = interfaces[0].addressLength;
  return address;
}

class VerbsTransport final : public Transport {
 public:
  VerbsTransport(const IbvApi& api, std::vector<VerbsPort> ports) : api_(api), ports_(std::move(ports)) {
    const Settings& config = settings();
    // The settings table holds every range (include/railnet/settings.h); values arrive validated.
    static_assert(kMaxQps == 8, "RAILNET_IB_QPS_PER_CONNECTION allows 1..8 in include/railnet/settings.h");
    qpOptions_.count = static_cast<int>(config.ibQpsPerConnection);
    qpOptions_.trafficClass = static_cast<int>(config.ibTrafficClass);
    qpOptions_.serviceLevel = static_cast<int>(config.ibServiceLevel);
    qpOptions_.timeout = static_cast<int>(config.ibTimeout);
    qpOptions_.retryCount = static_cast<int>(config.ibRetryCount);
    connectOptions_.streams = 0;  // control socket only: the bytes go by RDMA
    connectOptions_.stream.peerTimeoutMs = static_cast<int>(config.peerTimeoutMs);
    connectOptions_.strayTimeout = std::chrono::milliseconds(config.strayTimeoutMs);
    minStripeBytes_ = static_cast<uint64_t>(config.fusionMinStripeBytes);
    devices_.resize(ports_.size());
    railGpus_.resize(ports_.size());
  }

  // The plugin unloads. A device still open here is held by memory registered and never deregistered (or a comm never
  // closed): its async-event thread must not outlive the code it runs.
  ~VerbsTransport() override {
    for (size_t index = 0; index < devices_.size(); ++index) {
      if (std::shared_ptr<VerbsDevice> device = devices_[index].lock()) {
        RN_WARN("NET/railnet: unloading while %s is still held (memory registered and never deregistered, or a comm "
                "never closed); its async-event thread stops now", ports_[index].info.name.c_str());
        device->stopEvents();
      }
    }
  }

  const char* name() const noexcept override { return "verbs"; }
  int deviceCount() const noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(ports_.size() + fused_.size());
  }
  const DeviceInfo& device(int dev) const override {
    size_t index = checked(dev);
    std::lock_guard<std::mutex> lock(mutex_);
    return index < ports_.size() ? ports_[index].info : fused_[index - ports_.size()];
  }
  void place(int dev, const std::string& pciPath, int16_t railId, const std::string& railGpu) override {
    size_t index = checked(dev);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceInfo& info = ports_.at(index).info;
    info.pciPath = pciPath;
    info.railId = railId;
    railGpus_.at(index) = railGpu;
  }

  // A fused device's connections spread over QPs on each child port (verbs_connection.h); its control socket meets
  // at the first child's address.
  int makeVirtualDevice(const std::vector<int>& children) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (children.size() > static_cast<size_t>(kMaxNics)) {
      fail(ncclInvalidUsage, "NET/railnet: a fused verbs device holds at most %d ports; %zu asked", kMaxNics,
           children.size());
    }
    std::vector<const DeviceInfo*> infos;
    for (int child : children) {
      if (child < 0 || static_cast<size_t>(child) >= ports_.size()) {
        fail(ncclInvalidArgument, "NET/railnet: verbs device %d is not a physical device", child);
      }
      const VerbsPort& first = ports_[static_cast<size_t>(children[0])];
      const VerbsPort& port = ports_[static_cast<size_t>(child)];
      // One connection's paths all speak the peer's link layer (QpInfo carries one per path, but a fused
      // device that is half InfiniBand, half RoCE cannot match a peer's fused device path by path).
      if (port.linkLayer != first.linkLayer) {
        fail(ncclInvalidUsage, "NET/railnet: cannot fuse %s (%s) with %s (%s): link layers differ",
             first.info.name.c_str(), first.linkLayer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand",
             port.info.name.c_str(), port.linkLayer == IBV_LINK_LAYER_ETHERNET ? "RoCE" : "InfiniBand");
      }
      infos.push_back(&port.info);
    }
    DeviceInfo fused = fusedDeviceInfo(infos, children);
    fused.guid = ports_.size() + fused_.size();  // unique: physical GUIDs are EUI-64 node GUIDs
    fused_.push_back(fused);
    return static_cast<int>(ports_.size() + fused_.size()) - 1;
  }

  std::unique_ptr<ListenComm> listen(int dev, void* handle) override {
    serveHopStaging(dev);
    std::vector<size_t> nics = nicsOf(dev);
    return std::make_unique<protocol::HandshakeListener>(rendezvousAddress(ports_[nics[0]]), optionsFor(nics),
                                                static_cast<protocol::Handle*>(handle));
  }

  void connect(int dev, void* handle, std::unique_ptr<SendComm>* comm) override {
    auto* peer = static_cast<protocol::Handle*>(handle);
    if (peer->connectToken == 0) serveHopStaging(dev);
    std::optional<HopPlan> hop;
    const int routed = routeFor(dev, *peer, &hop);
    // Between two single-NIC devices the connection keeps a standby path (D96); a fused peer's paths fail over
    // among themselves.
    const bool standby = peer->nicCount <= 1 && peer->addressCount <= 1;
    protocol::connectStep(peer, optionsFor(nicsOf(routed), hop, standby), comm);
  }

 private:
  size_t checked(int dev) const {
    if (dev < 0 || dev >= deviceCount()) {
      fail(ncclInvalidUsage, "NET/railnet: device %d does not exist (railnet verbs has %d)", dev, deviceCount());
    }
    return static_cast<size_t>(dev);
  }

  // PXN-style routing (topo/route.h, RAILNET_FORWARD), as on TCP: a connection from a port to a peer NIC on
  // another rail leaves from this host's port on that rail, so its QPs stay on one rail's leaf. Physical ports of
  // the same link layer on both ends (a fused peer's paths are matched NIC by NIC). A port that takes GPU memory
  // routes only to another such port whose GPU this thread's GPU can copy into, and then sends its GPU bytes
  // through the NVLink hop (*hop set; nvlink_hop.h, RAILNET_IB_NVLINK_HOP): NCCL chose GPUDirect by the GPU's
  // distance to `dev`, and the routed port must not read that GPU across the PCIe fabric (decisions D83, D85).
  int routeFor(int dev, const protocol::Handle& peer, std::optional<HopPlan>* hop) const {
    const Settings& config = settings();
    if (config.forward == 0 || peer.addressCount > 1 || peer.nicCount > 1) return dev;
    const size_t index = checked(dev);
    std::lock_guard<std::mutex> lock(mutex_);
    if (index >= ports_.size()) return dev;
    auto takesGpu = [&](size_t port) { return (ports_[port].info.ptrSupport & ~NCCL_PTR_HOST) != 0; };
    const bool localGpu = takesGpu(index);
    if (localGpu && config.ibNvlinkHop == 0) return dev;
    std::vector<int16_t> rails;
    for (const VerbsPort& port : ports_) rails.push_back(port.info.railId);
    std::string hopWhy;
    RouteWay way = RouteWay::kNone;
    const int routed = topo::routeDevice(rails, dev, peer.railId, [&](int candidate) {
      const size_t other = static_cast<size_t>(candidate);
      if (ports_[other].linkLayer != ports_[index].linkLayer) return false;
      // Asked only of a GPUDirect candidate for a GPUDirect port: the CUDA probe runs once per such connection.
      const bool reachable = localGpu && takesGpu(other) && staging::peerCopyPossible(railGpus_[other], &hopWhy);
      way = routeWay(static_cast<int>(config.ibNvlinkHop), localGpu, takesGpu(other), reachable);
      return way != RouteWay::kNone;
    });
    const bool first = peer.connectToken == 0;  // the first call of this connection's connects
    if (routed == dev) {
      if (localGpu && first && !hopWhy.empty()) {
        RN_INFO(NCCL_NET, "NET/railnet: connection from %s (rail %d) to a NIC on rail %d stays on %s: no NVLink hop "
                "(%s)", ports_[index].info.name.c_str(), ports_[index].info.railId, peer.railId,
                ports_[index].info.name.c_str(), hopWhy.c_str());
      }
      return dev;
    }
    if (way == RouteWay::kHop) {
      *hop = HopPlan{localGpu ? NvlinkHop::Mode::kGpu : NvlinkHop::Mode::kHostTest,
                     railGpus_[static_cast<size_t>(routed)]};
    }
    if (first) {
      const DeviceInfo& to = ports_[static_cast<size_t>(routed)].info;
      noteRoutedConnection(ports_[index].info.name, ports_[index].info.railId, peer.railId, to.name, to.railId);
    }
    return routed;
  }

  // Ranks of other processes that route to a port on this process's GPU's rail stage on that GPU (D85): serve
  // it when this device takes GPU memory and the hop is on.
  void serveHopStaging(int dev) {
    if (settings().ibNvlinkHop != 1) return;
    const size_t index = checked(dev);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const DeviceInfo& info = index < ports_.size() ? ports_[index].info : fused_[index - ports_.size()];
      if ((info.ptrSupport & ~NCCL_PTR_HOST) == 0) return;
    }
    hopServers_.serveCurrentGpu();
  }

  // The ports a device's connections use: itself, or a fused device's children.
  std::vector<size_t> nicsOf(int dev) const {
    size_t index = checked(dev);
    std::lock_guard<std::mutex> lock(mutex_);
    if (index < ports_.size()) return {index};
    std::vector<size_t> nics;
    for (int child : fused_[index - ports_.size()].children) nics.push_back(static_cast<size_t>(child));
    return nics;
  }

  // A single-NIC device's standby NIC (D96): the nearest other port of the same link layer that takes the same
  // memory (GPU memory registered for a connection is registered with its standby NIC too) and has an IP when this
  // port has one (the control socket's re-made routes); -1 when none. Caller holds mutex_.
  int spareFor(size_t index) const {
    std::vector<std::string> pciPaths;
    for (const VerbsPort& port : ports_) pciPaths.push_back(port.info.pciPath);
    const VerbsPort& own = ports_[index];
    const bool ownAddress = portAddress(own).has_value();
    std::vector<int> order = topo::sparesNearest(pciPaths, static_cast<int>(index), [&](int candidate) {
      const VerbsPort& port = ports_[static_cast<size_t>(candidate)];
      return port.linkLayer == own.linkLayer && (port.info.ptrSupport & own.info.ptrSupport) == own.info.ptrSupport &&
             (!ownAddress || portAddress(port).has_value());
    });
    return order.empty() ? -1 : order[0];
  }

  // The port's device stays open while any comm uses it.
  std::shared_ptr<VerbsDevice> openPort(size_t index) {
    std::lock_guard<std::mutex> lock(mutex_);
    std::shared_ptr<VerbsDevice> device = devices_[index].lock();
    if (!device) {
      device = std::make_shared<VerbsDevice>(api_, ports_[index]);
      devices_[index] = device;
    }
    return device;
  }

  std::vector<std::shared_ptr<VerbsDevice>> openPorts(const std::vector<size_t>& nics) {
    std::vector<std::shared_ptr<VerbsDevice>> devices;
    for (size_t nic : nics) devices.push_back(openPort(nic));
    return devices;
  }

  // askStandby (a sender): the peer is a single-NIC device; a single-NIC sender that fails over then asks for a
  // standby path (wire.h kFeatureStandbyPath). A receiver adds one when asked.
  protocol::ConnectOptions optionsFor(const std::vector<size_t>& nics, const std::optional<HopPlan>& hop = std::nullopt,
                                      bool askStandby = false) {
    protocol::ConnectOptions options = connectOptions_;
    // The standby path's NIC (after the device's own): the spare when the host has one, else the device's own (a
    // receiver without a spare). And the ports' own IPs, the standby's included: the resumable control channel's
    // re-made sockets leave from and arrive at them (D94), NIC 0 first; a port without one (InfiniBand) leaves the
    // choice to the kernel and the control socket's address.
    std::vector<size_t> standbyNics = nics;
    std::vector<protocol::SocketAddress> standbyLocals;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      options.railId = ports_[nics[0]].info.railId;
      const int spare = nics.size() == 1 ? spareFor(nics[0]) : -1;
      if (spare >= 0) standbyNics.push_back(static_cast<size_t>(spare));
      for (size_t nic : standbyNics) {
        if (std::optional<protocol::SocketAddress> own = portAddress(ports_[nic])) standbyLocals.push_back(*own);
      }
    }
    if (standbyLocals.size() != standbyNics.size()) standbyLocals.clear();
    const int standbyNic = nics.size() == 1 ? static_cast<int>(standbyNics.size()) - 1 : -1;
    options.nicCount = static_cast<uint16_t>(nics.size());
    // Path failover (docs/failover.md "Verbs"): asked by the sender, on for connections of two or more paths. A
    // hopping sender keeps its staging pieces' failures fatal.
    const bool failover = settings().failover != 0 && !hop;
    if (failover) options.features |= protocol::kFeaturePathFailover | protocol::kFeatureResume;
    // A sender asks for a standby only when it has a spare; a receiver honours the ask whatever its own
    // RAILNET_FAILOVER.
    if (failover && askStandby && nics.size() == 1 && standbyNics.size() == 2) {
      options.features |= protocol::kFeatureStandbyPath;
    }
    protocol::ResumeOptions resume;
    if (!standbyLocals.empty()) resume.locals.assign(standbyLocals.begin(), standbyLocals.begin() + nics.size());
    resume.stream = options.stream;
    resume.limit = std::chrono::milliseconds(settings().failoverResumeMs);
    resume.cutEvery = static_cast<uint32_t>(settings().faultControlCut);
    QpOptions qp = qpOptions_;
    uint64_t minStripe = minStripeBytes_;
    const bool standby = (options.features & protocol::kFeatureStandbyPath) != 0;
    options.makeSendComm = [this, nics, standbyNics, standbyNic, standbyLocals, qp, minStripe, hop, failover, resume,
                            standby](protocol::Fd control, std::vector<protocol::Fd>, const protocol::PeerInfo& peer) {
      protocol::ResumeOptions session = resume;
      session.key = peer.session;
      if (standby) session.locals = standbyLocals;
      return std::unique_ptr<SendComm>(new VerbsSendComm(openPorts(standby ? standbyNics : nics), peer.nicCount,
                                                         std::move(control), peer.peer, qp, minStripe, hop, failover,
                                                         &session, standby ? standbyNic : -1));
    };
    options.makeRecvComm = [this, nics, standbyNics, standbyNic, standbyLocals, qp, resume](
                               protocol::Fd control, std::vector<protocol::Fd>, const protocol::PeerInfo& peer) {
      protocol::ResumeOptions session = resume;
      session.acceptor = true;
      session.key = peer.session;
      const bool resumable = (peer.features & protocol::kFeatureResume) != 0;
      // The sender asked for a standby path: this end's is on its standby NIC (optionsFor).
      const bool asked = (peer.features & protocol::kFeatureStandbyPath) != 0 && standbyNic >= 0;
      if (asked) session.locals = standbyLocals;
      return std::unique_ptr<RecvComm>(new VerbsRecvComm(openPorts(asked ? standbyNics : nics), peer.nicCount,
                                                         std::move(control), peer.peer, qp,
                                                         (peer.features & protocol::kFeaturePathFailover) != 0,
                                                         resumable ? &session : nullptr, asked ? standbyNic : -1));
    };
    return options;
  }

  const IbvApi& api_;
  std::vector<VerbsPort> ports_;  // physical devices; their info is guarded by mutex_ (place)
  std::deque<DeviceInfo> fused_;  // guarded by mutex_; a deque keeps references handed out valid
  QpOptions qpOptions_;
  protocol::ConnectOptions connectOptions_;
  uint64_t minStripeBytes_ = 0;
  mutable std::mutex mutex_;
  std::vector<std::weak_ptr<VerbsDevice>> devices_;  // guarded by mutex_
  std::vector<std::string> railGpus_;                // guarded by mutex_ (place): each port's rail GPU bus id
  HopServers hopServers_;
};

}  // namespace

std::unique_ptr<Transport> createVerbsTransport(std::string* why) {
  const IbvApi* api = loadIbverbs(why);
  if (api == nullptr) return nullptr;
  std::vector<VerbsPort> ports = discoverPorts(*api);
  if (ports.empty()) {
    *why = "no active RDMA port";
    return nullptr;
  }
  return std::make_unique<VerbsTransport>(*api, std::move(ports));
}

}  // namespace railnet::verbs
