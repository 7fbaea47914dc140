#include "proxy/verbs/queue_pairs.h"

#include <sys/random.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::verbs {
namespace {

void modify(const IbvApi& api, ibv_qp* qp, ibv_qp_attr* attr, int mask, const char* state) {
  if (int rc = api.modifyQp(qp, attr, mask); rc != 0) {
    fail(ncclSystemError, "NET/railnet: moving QP %u to %s failed: %s", qp->qp_num, state, errnoText(rc).c_str());
  }
}

}  // namespace

QueuePairs::QueuePairs(std::shared_ptr<VerbsDevice> device, const QpOptions& options, QpEventSink* sink)
    : device_(std::move(device)), options_(options) {
  const IbvApi& api = device_->api();
  int count = std::clamp(options_.count, 1, kMaxQps);
  int cqDepth = count * (options_.sendDepth + options_.recvDepth);
  cq_ = api.createCq(device_->context(), cqDepth, nullptr, nullptr, 0);
  if (cq_ == nullptr) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: ibv_create_cq(%d) on %s failed: %s", cqDepth, device_->port().device.c_str(),
         errnoText(err).c_str());
  }
  if (getrandom(&psn_, sizeof(psn_), 0) != sizeof(psn_)) psn_ = 0x5a5a5a;
  psn_ &= 0xffffff;
  for (int i = 0; i < count; ++i) {
    ibv_qp_init_attr init{};
    init.qp_context = sink;
    init.send_cq = cq_;
    init.recv_cq = cq_;
    init.qp_type = IBV_QPT_RC;
    init.cap.max_send_wr = static_cast<uint32_t>(options_.sendDepth);
    init.cap.max_recv_wr = static_cast<uint32_t>(options_.recvDepth);
    init.cap.max_send_sge = 2;  // small messages: header + payload in one SEND
    init.cap.max_recv_sge = 1;
    init.cap.max_inline_data = 64;
    ibv_qp* qp = api.createQp(device_->pd(), &init);
    if (qp == nullptr) {
      int err = errno;
      fail(ncclSystemError, "NET/railnet: ibv_create_qp on %s failed: %s", device_->port().device.c_str(),
           errnoText(err).c_str());
    }
    qps_.push_back(qp);
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = static_cast<uint8_t>(device_->port().port);
    attr.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                           (options_.remoteAtomics ? IBV_ACCESS_REMOTE_ATOMIC : 0);
    modify(api, qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, "INIT");
  }
  active_ = count;
}

QueuePairs::~QueuePairs() {
  const IbvApi& api = device_->api();
  for (ibv_qp* qp : qps_) api.destroyQp(qp);
  if (cq_ != nullptr) api.destroyCq(cq_);
}

QpInfo QueuePairs::localInfo() const {
  QpInfo info{};
  info.magic = kQpInfoMagic;
  info.version = kQpInfoVersion;
  info.qpCount = static_cast<uint16_t>(qps_.size());
  for (size_t i = 0; i < qps_.size(); ++i) info.qpn[i] = qps_[i]->qp_num;
  info.psn = psn_;
  const VerbsPort& port = device_->port();
  info.lid = port.lid;
  info.linkLayer = static_cast<uint8_t>(port.linkLayer);
  info.mtu = static_cast<uint8_t>(port.activeMtu);
  memcpy(info.gid, port.gid.raw, sizeof(info.gid));
  info.railId = port.info.railId;
  return info;
}

void QueuePairs::connect(const QpInfo& remote) {
  const VerbsPort& port = device_->port();
  if (const std::string problem = qpInfoProblem(remote, port.linkLayer); !problem.empty()) {
    fail(ncclSystemError, "NET/railnet: %s (%s)", problem.c_str(), port.device.c_str());
  }
  const IbvApi& api = device_->api();
  remoteRail_ = remote.railId;
  active_ = std::min<int>(static_cast<int>(qps_.size()), remote.qpCount);
  bool global = port.gidIndex >= 0;
  for (int i = 0; i < active_; ++i) {
    ibv_qp_attr attr{};
    attr.qp_state = IBV_QPS_RTR;
    attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(port.activeMtu, remote.mtu));
    attr.dest_qp_num = remote.qpn[i];
    attr.rq_psn = remote.psn;
    attr.max_dest_rd_atomic = 1;
    attr.min_rnr_timer = 12;
    attr.ah_attr.dlid = remote.lid;
    attr.ah_attr.sl = static_cast<uint8_t>(options_.serviceLevel);
    attr.ah_attr.port_num = static_cast<uint8_t>(port.port);
    if (global) {
      attr.ah_attr.is_global = 1;
      memcpy(attr.ah_attr.grh.dgid.raw, remote.gid, sizeof(remote.gid));
      attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(port.gidIndex);
      attr.ah_attr.grh.hop_limit = 255;
      attr.ah_attr.grh.traffic_class = static_cast<uint8_t>(options_.trafficClass);
    }
    modify(api, qps_[static_cast<size_t>(i)], &attr,
           IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
               IBV_QP_MIN_RNR_TIMER,
           "RTR");
    ibv_qp_attr rts{};
    rts.qp_state = IBV_QPS_RTS;
    rts.timeout = static_cast<uint8_t>(options_.timeout);
    rts.retry_cnt = static_cast<uint8_t>(options_.retryCount);
    rts.rnr_retry = 7;  // the receiver reposts its completion buffers from test(); wait for it, forever
    rts.sq_psn = psn_;
    rts.max_rd_atomic = 1;
    modify(api, qps_[static_cast<size_t>(i)], &rts,
           IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
           "RTS");
  }
}

}  // namespace railnet::verbs
