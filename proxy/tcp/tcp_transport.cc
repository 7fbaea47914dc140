#include "proxy/tcp/tcp_transport.h"

#include <algorithm>
#include <cstring>

#include "proxy/tcp/connect.h"
#include "proxy/tcp/recv_comm.h"
#include "proxy/tcp/send_comm.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"
#include "topo/netif.h"

namespace railnet::tcp {
namespace {

// Loopback has no link speed. 100 Gb/s makes NCCL plan 2 channels; 400 Gb/s (closer to what lo carries)
// makes it plan 4, which adds 43% all_reduce bandwidth at >= 64 MiB but doubles 32 KiB-512 KiB latency under
// NCCL's own algorithm choice (docs/performance.md), so the default stays at 100 Gb/s.
constexpr int kLoopbackSpeedMbps = 100000;
constexpr int kUnknownSpeedMbps = 10000;  // what NCCL assumes for a speed it cannot read

class TcpTransport final : public Transport {
 public:
  TcpTransport() {
    const Settings& config = settings();
    interfaces_ = topo::discoverInterfaces(config.ifname, config.socketFamily);
    if (interfaces_.empty()) {
      fail(ncclSystemError, "NET/railnet: no usable network interface (RAILNET_IFNAME=\"%s\")", config.ifname.c_str());
    }
    for (size_t i = 0; i < interfaces_.size(); ++i) {
      const topo::NetInterface& netif = interfaces_[i];
      DeviceInfo info;
      info.name = netif.name;
      info.pciPath = netif.pciPath;
      info.guid = i;
      info.ptrSupport = NCCL_PTR_HOST;
      info.speedMbps = config.tcpSpeedMbps > 0 ? static_cast<int>(config.tcpSpeedMbps)
                       : netif.speedMbps > 0   ? netif.speedMbps
                       : netif.loopback        ? kLoopbackSpeedMbps
                                               : kUnknownSpeedMbps;
      info.maxRecvs = kMaxRecvs;
      info.maxComms = 65536;
      info.maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
      devices_.push_back(info);
    }
    options_.streams = static_cast<int>(std::clamp<int64_t>(config.tcpStreams, 1, kMaxStreams));
    options_.stream.bufferBytes = static_cast<int>(std::max<int64_t>(config.tcpSocketBufferBytes, 0));
    options_.stream.notSentLowat = static_cast<int>(std::max<int64_t>(config.tcpNotSentLowat, 0));
    options_.stream.peerTimeoutMs = static_cast<int>(std::max<int64_t>(config.peerTimeoutMs, 0));
    options_.strayTimeout = std::chrono::milliseconds(std::max<int64_t>(config.strayTimeoutMs, 1));
    options_.makeSendComm = [](Fd control, std::vector<Fd> data, const SocketAddress& peer) {
      return std::unique_ptr<SendComm>(new TcpSendComm(std::move(control), std::move(data), peer));
    };
    options_.makeRecvComm = [](Fd control, std::vector<Fd> data, const SocketAddress& peer) {
      return std::unique_ptr<RecvComm>(new TcpRecvComm(std::move(control), std::move(data), peer));
    };
  }

  const char* name() const noexcept override { return "TCP"; }
  int deviceCount() const noexcept override { return static_cast<int>(devices_.size()); }

  const DeviceInfo& device(int dev) const override { return devices_.at(checked(dev)); }

  std::unique_ptr<ListenComm> listen(int dev, void* handle) override {
    const topo::NetInterface& netif = interfaces_[checked(dev)];
    SocketAddress address;
    memcpy(&address.storage, &netif.address, netif.addressLength);
    address.length = netif.addressLength;
    return std::make_unique<TcpListenComm>(address, options_, static_cast<Handle*>(handle));
  }

  void connect(int dev, void* handle, std::unique_ptr<SendComm>* comm) override {
    checked(dev);
    connectStep(static_cast<Handle*>(handle), options_, comm);
  }

 private:
  size_t checked(int dev) const {
    if (dev < 0 || dev >= deviceCount()) {
      fail(ncclInvalidUsage, "NET/railnet: device %d does not exist (railnet TCP has %d)", dev, deviceCount());
    }
    return static_cast<size_t>(dev);
  }

  std::vector<topo::NetInterface> interfaces_;
  std::vector<DeviceInfo> devices_;
  ConnectOptions options_;
};

}  // namespace

std::unique_ptr<Transport> createTcpTransport() { return std::make_unique<TcpTransport>(); }

}  // namespace railnet::tcp
