// The reliable-connected QPs of one railnet connection and the completion queue they share, with the
// handshake record both ends exchange on the control socket to bring them up (RESET → INIT → RTR → RTS).
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "proxy/verbs/verbs_device.h"

namespace railnet::verbs {

constexpr int kMaxQps = 8;
constexpr uint32_t kQpInfoMagic = 0x50514e52;  // "RNQP"
constexpr uint16_t kQpInfoVersion = 3;  // 2: railId; 3: path, paths

// Sent by each end as the first bytes on the control socket.
struct QpInfo {
  uint32_t magic;
  uint16_t version;
  uint16_t qpCount;
  uint32_t qpn[kMaxQps];
  uint32_t psn;
  uint16_t lid;
  uint8_t linkLayer;
  uint8_t mtu;  // ibv_mtu
  uint8_t gid[16];
  int16_t railId;  // the sender's DeviceInfo::railId (NCCL_NET_ID_UNDEF when unknown)
  uint8_t path;    // this record's path of the connection (verbs_connection.h), 0..paths-1
  uint8_t paths;   // the connection's path count as the sender planned it
};
static_assert(sizeof(QpInfo) == 68);

// Why the peer's record (bytes off the network) cannot be used against a local port of `localLinkLayer`; empty when
// it can. Inline so the record's fuzz target (tests/fuzz/) needs no verbs library.
inline std::string qpInfoProblem(const QpInfo& remote, int localLinkLayer) {
  auto layer = [](int linkLayer) { return linkLayer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand"; };
  if (remote.magic != kQpInfoMagic || remote.version != kQpInfoVersion) {
    char magic[16];
    std::snprintf(magic, sizeof(magic), "0x%08x", remote.magic);
    return std::string("the peer's QP record is not railnet's (magic ") + magic + ", version " +
           std::to_string(remote.version) + ")";
  }
  if (remote.linkLayer != localLinkLayer) {
    return std::string("link layers differ: this port is ") + layer(localLinkLayer) + ", the peer's is " +
           layer(remote.linkLayer);
  }
  if (remote.qpCount < 1 || remote.qpCount > kMaxQps) {
    return "the peer offers " + std::to_string(remote.qpCount) + " QPs (1 to " + std::to_string(kMaxQps) + " allowed)";
  }
  return "";
}

struct QpOptions {
  int count = 2;
  int trafficClass = 0;
  int serviceLevel = 0;
  int timeout = 20;
  int retryCount = 7;
  int sendDepth = 512;  // work requests per QP
  int recvDepth = 512;
  bool remoteAtomics = false;  // peers may run atomics on memory this QP's peer side exposes (IBV_ACCESS_REMOTE_ATOMIC)
};

class QueuePairs {
 public:
  // Creates the CQ and `options.count` RC QPs and moves them to INIT. Throws railnet::Error.
  // `sink` (may be null) hears about asynchronous errors of these QPs (it becomes their qp_context).
  QueuePairs(std::shared_ptr<VerbsDevice> device, const QpOptions& options, QpEventSink* sink = nullptr);
  ~QueuePairs();
  QueuePairs(const QueuePairs&) = delete;
  QueuePairs& operator=(const QueuePairs&) = delete;

  QpInfo localInfo() const;
  // Checks the peer's record and moves the QPs to RTS against it; the QPs used are min(ours, theirs).
  // Throws railnet::Error naming what did not fit.
  void connect(const QpInfo& remote);

  int count() const { return active_; }  // QPs in use: created() until connect(), then min(ours, the peer's)
  int created() const { return static_cast<int>(qps_.size()); }
  int16_t remoteRail() const { return remoteRail_; }  // from the peer's record, once connected
  ibv_qp* qp(int index) const { return qps_[static_cast<size_t>(index)]; }
  ibv_cq* cq() const { return cq_; }
  const VerbsDevice& device() const { return *device_; }

 private:
  std::shared_ptr<VerbsDevice> device_;
  QpOptions options_;
  ibv_cq* cq_ = nullptr;
  std::vector<ibv_qp*> qps_;
  uint32_t psn_ = 0;
  int active_ = 0;
  int16_t remoteRail_ = NCCL_NET_ID_UNDEF;
};

}  // namespace railnet::verbs
