#include "proxy/tcp/tcp_transport.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "proxy/tcp/addresses.h"
#include "proxy/tcp/gpu_staging.h"
#include "proxy/protocol/handshake.h"
#include "proxy/tcp/recv_comm.h"
#include "proxy/tcp/send_comm.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"
#include "topo/route.h"
#include "topo/netif.h"
#include "topo/topology.h"

namespace railnet::tcp {
namespace {

using protocol::ConnectOptions;
using protocol::Handle;
using protocol::ListenAddress;
using protocol::LocalNic;
using protocol::PeerInfo;
using protocol::SocketAddress;

// Loopback has no link speed. 100 Gb/s makes NCCL plan 2 channels; 400 Gb/s (closer to what lo carries)
// makes it plan 4, which adds 43% all_reduce bandwidth at >= 64 MiB but doubles 32 KiB-512 KiB latency under
// NCCL's own algorithm choice (docs/performance.md), so the default stays at 100 Gb/s.
constexpr int kLoopbackSpeedMbps = 100000;
constexpr int kUnknownSpeedMbps = 10000;  // what NCCL assumes for a speed it cannot read

class TcpTransport final : public Transport {
 public:
  TcpTransport() {
    const Settings& config = settings();
    const bool byAddress = !config.tcpAddresses.empty();
    std::vector<topo::NetInterface> interfaces =
        byAddress ? interfacesForAddresses(config.tcpAddresses)
                  : topo::discoverInterfaces(config.ifname, config.socketFamily);
    if (interfaces.empty()) {
      fail(ncclSystemError, "NET/railnet: no usable network interface (RAILNET_IFNAME=\"%s\")", config.ifname.c_str());
    }
    // GPU memory goes through copy-engine staging (proxy/tcp/gpu_staging.h), on every interface alike.
    // GPU memory is offered to NCCL only on request: through NCCL its staging copies cost more than NCCL's own
    // host path (docs/decisions.md D70). The capability stays for GIN windows, which NCCL never stages.
    std::string gpuWhy;
    const bool offerGpu = config.tcpGpu != 0 && tcpGpuUsable(&gpuWhy);
    if (config.tcpGpu == 0) gpuWhy = "RAILNET_TCP_GPU=0";
    const int ptrSupport = NCCL_PTR_HOST | (offerGpu ? NCCL_PTR_CUDA : 0);
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: TCP transport takes %s%s%s", ptrSupport & NCCL_PTR_CUDA
            ? "host and GPU memory (GPU through copy-engine staging)" : "host memory only", gpuWhy.empty() ? "" : ": ",
            gpuWhy.c_str());
    for (size_t i = 0; i < interfaces.size(); ++i) {
      const topo::NetInterface& netif = interfaces[i];
      DeviceInfo info;
      info.name = netif.name;
      info.pciPath = netif.pciPath;
      info.guid = i;
      info.ptrSupport = ptrSupport;
      info.speedMbps = config.tcpSpeedMbps > 0 ? static_cast<int>(config.tcpSpeedMbps)
                       : netif.speedMbps > 0   ? netif.speedMbps
                       : netif.loopback        ? kLoopbackSpeedMbps
                                               : kUnknownSpeedMbps;
      info.maxRecvs = static_cast<int>(config.maxRecvs);  // 1..protocol::kMaxRecvs (settings table)
      info.maxComms = 65536;
      info.maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
      // Listed addresses are emulated rails: rail = position in the list (topo/ may assign others later).
      if (byAddress) info.railId = static_cast<int16_t>(i);
      devices_.push_back(info);
      Nic nic;
      memcpy(&nic.address.storage, &netif.address, netif.addressLength);
      nic.address.length = netif.addressLength;
      nic.bindLocal = byAddress;
      nic.loopback = netif.loopback;
      nics_.push_back(nic);
    }
    // The settings table holds every range (include/railnet/settings.h); values arrive validated.
    static_assert(protocol::kMaxStreams == 64, "RAILNET_TCP_STREAMS allows 1..64 in include/railnet/settings.h");
    static_assert(protocol::kMaxRecvs == 8, "RAILNET_MAX_RECVS allows 1..8 in include/railnet/settings.h");
    options_.streams = static_cast<int>(config.tcpStreams);
    options_.stream.bufferBytes = static_cast<int>(config.tcpSocketBufferBytes);
    options_.stream.notSentLowat = static_cast<int>(config.tcpNotSentLowat);
    options_.stream.peerTimeoutMs = static_cast<int>(config.peerTimeoutMs);
    options_.strayTimeout = std::chrono::milliseconds(config.strayTimeoutMs);
    minStripeBytes_ = static_cast<uint64_t>(config.fusionMinStripeBytes);
  }

  const char* name() const noexcept override { return "TCP"; }
  int deviceCount() const noexcept override {
    std::lock_guard<std::mutex> lock(mutex_);
    return static_cast<int>(devices_.size());
  }

  const DeviceInfo& device(int dev) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return devices_[checked(dev)];  // a deque: references stay valid as virtual devices are added
  }

  bool stagesGpuMemoryInHost() const noexcept override { return (devices_.front().ptrSupport & NCCL_PTR_CUDA) != 0; }

  void place(int dev, const std::string& pciPath, int16_t railId, const std::string&) override {
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceInfo& info = devices_[checked(dev)];
    info.pciPath = pciPath;
    info.railId = railId;
  }

  std::unique_ptr<ListenComm> listen(int dev, void* handle) override {
    std::vector<ListenAddress> addresses;
    ConnectOptions options = optionsFor(dev);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      for (int child : childrenOf(dev)) {
        const size_t index = static_cast<size_t>(child);
        addresses.push_back(ListenAddress{nics_[index].address, devices_[index].railId});
      }
    }
    return std::make_unique<protocol::HandshakeListener>(addresses, options, static_cast<Handle*>(handle));
  }

  void connect(int dev, void* handle, std::unique_ptr<SendComm>* comm) override {
    auto* peer = static_cast<Handle*>(handle);
    protocol::connectStep(peer, optionsFor(routeFor(dev, *peer)), comm);
  }

  int makeVirtualDevice(const std::vector<int>& children) override {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<const DeviceInfo*> infos;
    const sa_family_t family = nics_.at(static_cast<size_t>(children.at(0))).address.storage.ss_family;
    for (int child : children) {
      if (child < 0 || static_cast<size_t>(child) >= nics_.size()) {
        fail(ncclInvalidArgument, "NET/railnet: TCP device %d is not a physical device", child);
      }
      if (nics_[static_cast<size_t>(child)].address.storage.ss_family != family) {
        fail(ncclInvalidUsage, "NET/railnet: cannot fuse TCP devices of different address families (%s, %s)",
             devices_[static_cast<size_t>(children[0])].name.c_str(),
             devices_[static_cast<size_t>(child)].name.c_str());
      }
      infos.push_back(&devices_[static_cast<size_t>(child)]);
    }
    const int most = family == AF_INET6 ? protocol::kMaxHandleAddresses6 : protocol::kMaxHandleAddresses4;
    if (static_cast<int>(children.size()) > most) {
      fail(ncclInvalidUsage, "NET/railnet: a fused TCP device holds at most %d %s NICs (the handle's room); %zu asked",
           most, family == AF_INET6 ? "IPv6" : "IPv4", children.size());
    }
    DeviceInfo fused = fusedDeviceInfo(infos, children);
    fused.guid = devices_.size();
    devices_.push_back(fused);
    return static_cast<int>(devices_.size()) - 1;
  }

 private:
  struct Nic {  // a physical device's address
    SocketAddress address;  // port 0
    bool bindLocal = false;  // RAILNET_TCP_ADDRESSES: connections leave from this address
    bool loopback = false;
  };

  size_t checked(int dev) const {  // caller holds mutex_
    if (dev < 0 || static_cast<size_t>(dev) >= devices_.size()) {
      fail(ncclInvalidUsage, "NET/railnet: device %d does not exist (railnet TCP has %zu)", dev, devices_.size());
    }
    return static_cast<size_t>(dev);
  }

  std::vector<int> childrenOf(int dev) const {  // caller holds mutex_
    const DeviceInfo& info = devices_[checked(dev)];
    return info.children.empty() ? std::vector<int>{dev} : info.children;
  }

  // PXN-style routing (topo/route.h, RAILNET_FORWARD): the device a connection from `dev` to the NIC named by
  // `peer` leaves from. Physical devices only, on both ends (a fused peer's NICs are matched per stream).
  int routeFor(int dev, const Handle& peer) const {
    if (settings().forward == 0 || peer.addressCount > 1) return dev;
    std::lock_guard<std::mutex> lock(mutex_);
    if (checked(dev) >= nics_.size()) return dev;
    std::vector<int16_t> rails;
    for (size_t i = 0; i < nics_.size(); ++i) rails.push_back(devices_[i].railId);
    sockaddr_storage peerAddress{};
    std::memcpy(&peerAddress, peer.address, sizeof(peer.address));
    const int routed = topo::routeDevice(rails, dev, peer.railId, [&](int candidate) {
      return nics_[static_cast<size_t>(candidate)].address.storage.ss_family == peerAddress.ss_family;
    });
    if (routed != dev && peer.connectToken == 0) {  // the first call of this connection's connects
      const DeviceInfo& from = devices_[static_cast<size_t>(dev)];
      const DeviceInfo& to = devices_[static_cast<size_t>(routed)];
      noteRoutedConnection(from.name, from.railId, peer.railId, to.name, to.railId);
    }
    return routed;
  }

  // Rail failover for a single-NIC device (docs/failover.md "Single-NIC devices"): the host's other physical NICs
  // of the same address family (and loopback-ness), nearest first by their PCI paths. Caller holds mutex_.
  std::vector<int> sparesFor(int dev) const {
    std::vector<std::string> pciPaths;
    for (size_t index = 0; index < nics_.size(); ++index) pciPaths.push_back(devices_[index].pciPath);
    const Nic& own = nics_[static_cast<size_t>(dev)];
    std::vector<int> order = topo::sparesNearest(pciPaths, dev, [&](int candidate) {
      const Nic& nic = nics_[static_cast<size_t>(candidate)];
      return nic.address.storage.ss_family == own.address.storage.ss_family && nic.loopback == own.loopback;
    });
    if (order.size() > protocol::kMaxSessionEntries - 1) order.resize(protocol::kMaxSessionEntries - 1);
    return order;
  }

  // The connection options of a device: its NICs with rails, and comm factories that count traffic per NIC.
  ConnectOptions optionsFor(int dev) const {
    std::lock_guard<std::mutex> lock(mutex_);
    ConnectOptions options = options_;
    const std::vector<int> children = childrenOf(dev);
    const bool fused = children.size() > 1 || !devices_[checked(dev)].children.empty();
    const bool failover = settings().failover != 0;
    // A single-NIC device moves to another NIC of its host when its own fails (when the host has another).
    const std::vector<int> spares = failover && !fused ? sparesFor(children[0]) : std::vector<int>{};
    const bool movable = !spares.empty();
    std::vector<std::pair<std::string, int16_t>> nics;
    for (int child : children) {
      const DeviceInfo& info = devices_[static_cast<size_t>(child)];
      const Nic& nic = nics_[static_cast<size_t>(child)];
      nics.emplace_back(info.name, info.railId);
      if (fused || nic.bindLocal) {
        options.nics.push_back(LocalNic{nic.bindLocal ? nic.address : SocketAddress{}, info.railId});
      }
    }
    options.railId = nics[0].second;
    // The sending side decides how its sends complete; the receiver learns it from the hello (wire.h).
    // Delivered completion where the setting asks for it, or (auto) where failover needs it: a fused or movable
    // device's sends must outlive a NIC's failure, so they complete only once the receiver has their bytes
    // (docs/failover.md).
    const SendCompletion completion = settings().sendCompletion;
    const bool delivered = completion == SendCompletion::kDelivered ||
                           (completion == SendCompletion::kAuto && failover && (fused || movable));
    const bool dataFailover = failover && delivered && (fused || movable);
    options.features = delivered ? protocol::kFeatureDeliveredCompletion : 0;
    if (failover) options.features |= protocol::kFeatureResume;
    if (dataFailover) options.features |= protocol::kFeatureDataFailover;
    if (dataFailover && movable) options.features |= protocol::kFeatureMove;
    // A resumable control channel's re-made socket leaves from NIC 0, as the first one did.
    protocol::ResumeOptions resume;
    for (const LocalNic& nic : options.nics) {
      if (nic.bind.length != 0) resume.locals.push_back(nic.bind);
    }
    if (resume.locals.size() != options.nics.size()) resume.locals.clear();  // all bound, or the kernel chooses
    // A movable device: its own NIC's address, then the spares' (sender: where a moved socket leaves from;
    // receiver: session listeners named after the connection's own, where a moved socket arrives).
    std::vector<SocketAddress> spareAddresses;
    std::vector<NicLayout::Spare> spareNics;
    for (int spare : spares) {
      spareAddresses.push_back(nics_[static_cast<size_t>(spare)].address);
      const DeviceInfo& info = devices_[static_cast<size_t>(spare)];
      spareNics.push_back(NicLayout::Spare{info.name, &nicCounters(info.name, info.railId), info.railId});
    }
    if (movable && dataFailover) {
      resume.locals = {nics_[static_cast<size_t>(children[0])].address};
      resume.locals.insert(resume.locals.end(), spareAddresses.begin(), spareAddresses.end());
      resume.connectionNics = 1;
    }
    // A receiving connection's session listeners: one on each NIC of the device, NIC 0 first, where it listens (not
    // where its sockets arrived: a fused connection made while a NIC was down has sockets standing in elsewhere).
    std::vector<SocketAddress> listening;
    for (int child : children) listening.push_back(nics_[static_cast<size_t>(child)].address);
    resume.stream = options.stream;
    resume.limit = std::chrono::milliseconds(settings().failoverResumeMs);
    resume.cutEvery = static_cast<uint32_t>(settings().faultControlCut);
    const bool sendResumable = settings().failover != 0;
    const uint64_t minStripe = minStripeBytes_;
    // One counted connection per NIC the comm uses; cross-rail when the rail at the other end differs.
    auto layoutFor = [nics, minStripe, spareNics](const PeerInfo& peer, size_t dataStreams) {
      NicLayout layout;
      layout.minStripeBytes = minStripe;
      layout.spares = spareNics;
      layout.peerRail = peer.controlRail;
      layout.nicsDownAtConnect = peer.nicsDownAtConnect;
      layout.whyDown = peer.whyDown;
      for (NicLayout::Spare& spare : layout.spares) {
        spare.shaping = shaping::FabricShaper::forStream(spare.railId, peer.controlRail);
      }
      for (size_t nic = 0; nic < nics.size(); ++nic) {
        layout.names.push_back(nics[nic].first);
        NicCounters& counters = nicCounters(nics[nic].first, nics[nic].second);
        const int16_t remote = nic < peer.dataRails.size() ? peer.dataRails[nic] : peer.controlRail;
        if (nic == 0 || nic < dataStreams) counters.addConnection(nics[nic].second, remote);
        layout.nics.push_back(&counters);
        // Fabric emulation (a test feature, off by default): this NIC's bucket, and the spine's across rails.
        layout.shaping.push_back(shaping::FabricShaper::forStream(nics[nic].second, remote));
      }
      return layout;
    };
    options.makeSendComm = [layoutFor, resume, sendResumable, delivered, dataFailover](
                               Fd control, std::vector<Fd> data, const PeerInfo& peer) {
      NicLayout layout = layoutFor(peer, data.size());
      protocol::ResumeOptions session = resume;
      session.key = peer.session;
      return std::unique_ptr<SendComm>(new TcpSendComm(std::move(control), std::move(data), peer.peer,
                                                       std::move(layout), sendResumable ? &session : nullptr,
                                                       delivered, dataFailover));
    };
    options.makeRecvComm = [layoutFor, resume, spareAddresses, listening](Fd control, std::vector<Fd> data,
                                                                          const PeerInfo& peer) {
      NicLayout layout = layoutFor(peer, data.size());
      const bool sendDone = (peer.features & protocol::kFeatureDeliveredCompletion) != 0;
      protocol::ResumeOptions session = resume;
      session.acceptor = true;
      session.key = peer.session;
      session.locals = listening;
      const bool resumable = (peer.features & protocol::kFeatureResume) != 0;
      const bool sendsAgain = (peer.features & protocol::kFeatureDataFailover) != 0;
      const bool peerMoves = sendsAgain && (peer.features & protocol::kFeatureMove) != 0;
      if (peerMoves && !session.locals.empty()) {
        // The sender may move to this host's other NICs: listeners there too, named after the connection's own.
        session.connectionNics = session.locals.size();
        for (const SocketAddress& spare : spareAddresses) {
          if (session.locals.size() < protocol::kMaxSessionEntries) session.locals.push_back(spare);
        }
      }
      return std::unique_ptr<RecvComm>(new TcpRecvComm(std::move(control), std::move(data), peer.peer, layout,
                                                       sendDone, resumable ? &session : nullptr, sendsAgain));
    };
    return options;
  }

  mutable std::mutex mutex_;  // devices_ grows with makeVirtualDevice
  std::vector<Nic> nics_;     // physical devices
  std::deque<DeviceInfo> devices_;  // physical, then virtual
  ConnectOptions options_;
  uint64_t minStripeBytes_ = 0;
};

}  // namespace

std::unique_ptr<Transport> createTcpTransport() { return std::make_unique<TcpTransport>(); }

}  // namespace railnet::tcp
