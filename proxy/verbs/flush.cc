#include "proxy/verbs/flush.h"

#include "railnet/error.h"

namespace railnet::verbs {

int flushTarget(int n, const int* sizes) {
  for (int i = n - 1; i >= 0; --i) {
    if (sizes[i] > 0) return i;
  }
  return -1;
}

namespace {
QpOptions flushOptions() {
  QpOptions options;
  options.count = 1;
  options.sendDepth = 64;
  options.recvDepth = 1;
  return options;
}
}  // namespace

LoopbackFlush::LoopbackFlush(std::shared_ptr<VerbsDevice> device)
    : device_(device), dummy_(64), qps_(std::move(device), flushOptions()) {
  dummyRegion_ = device_->registerMemory(dummy_.data(), dummy_.size(), NCCL_PTR_HOST);
  qps_.connect(qps_.localInfo());  // the QP's peer is itself
}

bool LoopbackFlush::post(uint64_t wrId, uint64_t address, uint32_t rkey, std::string* why) {
  ibv_sge sge{reinterpret_cast<uint64_t>(dummy_.data()), 1, static_cast<VerbsRegion*>(dummyRegion_.get())->lkey()};
  ibv_send_wr wr{};
  wr.wr_id = wrId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_RDMA_READ;
  wr.send_flags = IBV_SEND_SIGNALED;
  wr.wr.rdma.remote_addr = address;
  wr.wr.rdma.rkey = rkey;
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qps_.qp(0), &wr, &bad); rc != 0) {
    *why = "ibv_post_send of the flush READ on QP " + std::to_string(qpNumber()) + " failed: " + errnoText(rc);
    return false;
  }
  ++inFlight_;
  return true;
}

std::string LoopbackFlush::describe(const ibv_wc& completion) const {
  char vendor[16];
  snprintf(vendor, sizeof(vendor), "%x", completion.vendor_err);
  return "flush READ on loopback QP " + std::to_string(completion.qp_num) + " of " + device_->port().device +
         ": work completion " + device_->api().wcStatusStr(completion.status) + " (status " +
         std::to_string(completion.status) + ", vendor error 0x" + vendor + ")";
}

}  // namespace railnet::verbs
