// An opened RDMA port: the device context and protection domain that every railnet connection on that port
// shares, and the memory regions registered with it.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "proxy/transport.h"
#include "proxy/verbs/devices.h"
#include "proxy/verbs/registration_cache.h"

namespace railnet::verbs {

// Who hears about asynchronous errors of a QP: the QP's qp_context points at one (QueuePairs sets it).
// Called from the device's async-event thread; the QP (and so the sink) cannot be destroyed while it runs,
// because ibv_destroy_qp waits until every event reported for the QP has been acknowledged.
class QpEventSink {
 public:
  virtual ~QpEventSink() = default;
  virtual void onQpAsyncError(const std::string& what) noexcept = 0;
};

class VerbsDevice : public std::enable_shared_from_this<VerbsDevice> {
 public:
  // Opens the port's device, allocates a PD and starts the device's async-event thread; throws railnet::Error
  // when the device is gone. The destructor stops the thread at once (an eventfd wakes its poll).
  VerbsDevice(const IbvApi& api, const VerbsPort& port);
  ~VerbsDevice();
  // Stops and joins the async-event thread (the destructor does too; idempotent). The transport calls it when it is
  // destroyed (the plugin unloads) while something still holds the device: memory registered and never deregistered.
  // The thread runs the plugin's code, which the unload unmaps.
  void stopEvents();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  const IbvApi& api() const { return api_; }
  const VerbsPort& port() const { return port_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }

  // Registers memory for local and remote access (railnet writes into receive buffers with RDMA WRITE and
  // reads them for iflush), sharing a registration of the same kind that already covers the range
  // (regIsGlobal). NCCL_PTR_HOST: ibv_reg_mr. NCCL_PTR_CUDA: a DMA-BUF of the page range from
  // cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr when the port supports it, else (or when that fails)
  // ibv_reg_mr through peermem; neither: a clear error. Throws railnet::Error.
  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t size, int type);
  // NCCL's regMrDmaBuf: ibv_reg_dmabuf_mr with NCCL's fd, where byte `data` is at `offset`; fd < 0 is
  // registerMemory(type), as in NCCL.
  std::unique_ptr<MemoryRegion> registerDmabuf(void* data, size_t size, int type, uint64_t offset, int fd);
  void releaseMemory(ibv_mr* mr) { registrations_.release(mr); }

  // The port's state as its async events tell it (verbs path failover): how many times it went down (PORT_ERR)
  // and came back (PORT_ACTIVE), and whether it is up now. Any thread; the data path compares the counts with what
  // it saw last, one relaxed load per NIC.
  uint64_t portDowns() const { return portDowns_.load(std::memory_order_acquire); }
  uint64_t portUps() const { return portUps_.load(std::memory_order_acquire); }
  bool portActive() const { return portActive_.load(std::memory_order_acquire); }

 private:
  const IbvApi& api_;
  VerbsPort port_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  RegistrationCache<ibv_mr*> registrations_;
  int wakeFd_ = -1;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> portDowns_{0};
  std::atomic<uint64_t> portUps_{0};
  std::atomic<bool> portActive_{true};  // the port was active when it was discovered
  std::thread asyncThread_;  // logs port/device events; QP errors go to the QP's QpEventSink

  void asyncLoop();
  void handleAsyncEvent(const ibv_async_event& event);
};

// A registered buffer: what isend/irecv need to address it (lkey locally, rkey for the peer).
class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(std::shared_ptr<VerbsDevice> device, ibv_mr* mr, int kind = NCCL_PTR_HOST)
      : device_(std::move(device)), mr_(mr), kind_(kind) {}
  ~VerbsRegion() override { device_->releaseMemory(mr_); }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }
  int kind() const { return kind_; }  // NCCL_PTR_HOST, NCCL_PTR_CUDA or NCCL_PTR_DMABUF (GPU memory)
  bool gpuMemory() const { return kind_ != NCCL_PTR_HOST; }

 private:
  std::shared_ptr<VerbsDevice> device_;  // a region may outlive the comm it was registered through
  ibv_mr* mr_;
  int kind_ = NCCL_PTR_HOST;
};

}  // namespace railnet::verbs
