// iflush for GPUDirect receives: a 1-byte RDMA READ from the last non-empty received buffer into a registered
// host dummy, over a QP connected to itself on the same port. The NIC completes the READ only after the
// writes before it have reached the GPU's memory (PCIe ordering), which is what NCCL needs before a kernel
// reads data that arrived by GPUDirect RDMA. One loopback QP per recv comm, created on first use.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "proxy/verbs/queue_pairs.h"
#include "railnet/settings.h"

namespace railnet::verbs {

// RAILNET_IB_FLUSH, parsed by the settings table (include/railnet/settings.h): auto (flush receives into GPU
// memory), 0 (never), 1 (always, host memory too: lets the conformance harness run the real READ on soft-RoCE).
using railnet::FlushMode;

// The index of the buffer a flush reads from: the last one with sizes[i] > 0; -1 when all are empty (NCCL
// skips the flush then).
int flushTarget(int n, const int* sizes);

class LoopbackFlush {
 public:
  // Creates the QP and connects it to itself. Throws railnet::Error.
  explicit LoopbackFlush(std::shared_ptr<VerbsDevice> device);
  LoopbackFlush(const LoopbackFlush&) = delete;
  LoopbackFlush& operator=(const LoopbackFlush&) = delete;

  uint32_t qpNumber() const { return qps_.qp(0)->qp_num; }
  int capacity() const { return kDepth; }
  int inFlight() const { return inFlight_; }
  bool broken() const { return broken_; }  // a READ failed: the QP is in the error state

  // Posts the 1-byte READ of (address, rkey); its completion carries wrId. False with *why on failure.
  bool post(uint64_t wrId, uint64_t address, uint32_t rkey, std::string* why);

  // Takes finished READs off the CQ: onDone(wrId, ok, why). False (with *why) when polling itself failed.
  template <class OnDone>
  bool poll(OnDone&& onDone, std::string* why) {
    ibv_wc completions[16];
    for (;;) {
      int count = ibv_poll_cq(qps_.cq(), 16, completions);
      if (count < 0) {
        *why = "ibv_poll_cq of the flush QP failed";
        return false;
      }
      for (int i = 0; i < count; ++i) {
        const ibv_wc& wc = completions[i];
        --inFlight_;
        if (wc.status == IBV_WC_SUCCESS) {
          onDone(wc.wr_id, true, std::string());
        } else {
          broken_ = true;
          onDone(wc.wr_id, false, describe(wc));
        }
      }
      if (count < 16) return true;
    }
  }

 private:
  static constexpr int kDepth = 64;  // READs in flight per recv comm (NCCL keeps at most 32 requests)
  std::string describe(const ibv_wc& completion) const;

  std::shared_ptr<VerbsDevice> device_;
  std::vector<char> dummy_;
  std::unique_ptr<MemoryRegion> dummyRegion_;
  QueuePairs qps_;
  int inFlight_ = 0;
  bool broken_ = false;
};

}  // namespace railnet::verbs
