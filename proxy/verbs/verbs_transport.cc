#include "proxy/verbs/verbs_transport.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "proxy/tcp/connect.h"
#include "proxy/verbs/verbs_recv_comm.h"
#include "proxy/verbs/verbs_send_comm.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {
namespace {

// Where a port's connections meet out of band: the IPv4 address inside its RoCE v2 GID when it has one
// (the RDMA port's own IP), else the first interface RAILNET_IFNAME selects (InfiniBand without IPoIB).
tcp::SocketAddress rendezvousAddress(const VerbsPort& port) {
  tcp::SocketAddress address;
  if (port.gidIndex >= 0 && gidIsIpv4Mapped(port.gid)) {
    sockaddr_in in{};
    in.sin_family = AF_INET;
    memcpy(&in.sin_addr, port.gid.raw + 12, 4);
    memcpy(&address.storage, &in, sizeof(in));
    address.length = sizeof(in);
    return address;
  }
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
    qpOptions_.count = static_cast<int>(std::clamp<int64_t>(config.ibQpsPerConnection, 1, kMaxQps));
    qpOptions_.trafficClass = static_cast<int>(config.ibTrafficClass);
    qpOptions_.serviceLevel = static_cast<int>(config.ibServiceLevel);
    qpOptions_.timeout = static_cast<int>(std::clamp<int64_t>(config.ibTimeout, 1, 31));
    qpOptions_.retryCount = static_cast<int>(std::clamp<int64_t>(config.ibRetryCount, 0, 7));
    connectOptions_.streams = 0;  // control socket only: the bytes go by RDMA
    connectOptions_.stream.peerTimeoutMs = static_cast<int>(std::max<int64_t>(config.peerTimeoutMs, 0));
    connectOptions_.strayTimeout = std::chrono::milliseconds(std::max<int64_t>(config.strayTimeoutMs, 1));
    devices_.resize(ports_.size());
  }

  const char* name() const noexcept override { return "verbs"; }
  int deviceCount() const noexcept override { return static_cast<int>(ports_.size()); }
  const DeviceInfo& device(int dev) const override { return ports_.at(checked(dev)).info; }
  void place(int dev, const std::string& pciPath, int16_t railId) override {
    DeviceInfo& info = ports_.at(checked(dev)).info;
    info.pciPath = pciPath;
    info.railId = railId;
  }

  std::unique_ptr<ListenComm> listen(int dev, void* handle) override {
    size_t index = checked(dev);
    return std::make_unique<tcp::TcpListenComm>(rendezvousAddress(ports_[index]), optionsFor(index),
                                                static_cast<tcp::Handle*>(handle));
  }

  void connect(int dev, void* handle, std::unique_ptr<SendComm>* comm) override {
    tcp::connectStep(static_cast<tcp::Handle*>(handle), optionsFor(checked(dev)), comm);
  }

 private:
  size_t checked(int dev) const {
    if (dev < 0 || dev >= deviceCount()) {
      fail(ncclInvalidUsage, "NET/railnet: device %d does not exist (railnet verbs has %d)", dev, deviceCount());
    }
    return static_cast<size_t>(dev);
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

  tcp::ConnectOptions optionsFor(size_t index) {
    tcp::ConnectOptions options = connectOptions_;
    options.railId = ports_[index].info.railId;
    QpOptions qp = qpOptions_;
    options.makeSendComm = [this, index, qp](tcp::Fd control, std::vector<tcp::Fd>, const tcp::SocketAddress& peer) {
      return std::unique_ptr<SendComm>(new VerbsSendComm(openPort(index), std::move(control), peer, qp));
    };
    options.makeRecvComm = [this, index, qp](tcp::Fd control, std::vector<tcp::Fd>, const tcp::SocketAddress& peer) {
      return std::unique_ptr<RecvComm>(new VerbsRecvComm(openPort(index), std::move(control), peer, qp));
    };
    return options;
  }

  const IbvApi& api_;
  std::vector<VerbsPort> ports_;
  QpOptions qpOptions_;
  tcp::ConnectOptions connectOptions_;
  std::mutex mutex_;
  std::vector<std::weak_ptr<VerbsDevice>> devices_;  // guarded by mutex_
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
