// An opened RDMA port: the device context and protection domain that every railnet connection on that port
// shares, and the memory regions registered with it.
#pragma once

#include <memory>
#include <string>

#include "proxy/transport.h"
#include "proxy/verbs/devices.h"
#include "proxy/verbs/registration_cache.h"

namespace railnet::verbs {

class VerbsDevice : public std::enable_shared_from_this<VerbsDevice> {
 public:
  // Opens the port's device and allocates a PD; throws railnet::Error when the device is gone.
  VerbsDevice(const IbvApi& api, const VerbsPort& port);
  ~VerbsDevice();
  VerbsDevice(const VerbsDevice&) = delete;
  VerbsDevice& operator=(const VerbsDevice&) = delete;

  const IbvApi& api() const { return api_; }
  const VerbsPort& port() const { return port_; }
  ibv_context* context() const { return context_; }
  ibv_pd* pd() const { return pd_; }

  // Registers host memory for local and remote access (railnet writes into receive buffers with RDMA WRITE),
  // sharing a registration that already covers the range (regIsGlobal).
  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t size, int type);
  void releaseMemory(ibv_mr* mr) { registrations_.release(mr); }

 private:
  const IbvApi& api_;
  VerbsPort port_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  RegistrationCache<ibv_mr*> registrations_;
};

// A registered buffer: what isend/irecv need to address it (lkey locally, rkey for the peer).
class VerbsRegion final : public MemoryRegion {
 public:
  VerbsRegion(std::shared_ptr<VerbsDevice> device, ibv_mr* mr) : device_(std::move(device)), mr_(mr) {}
  ~VerbsRegion() override { device_->releaseMemory(mr_); }
  uint32_t lkey() const { return mr_->lkey; }
  uint32_t rkey() const { return mr_->rkey; }

 private:
  std::shared_ptr<VerbsDevice> device_;  // a region may outlive the comm it was registered through
  ibv_mr* mr_;
};

}  // namespace railnet::verbs
