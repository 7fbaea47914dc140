// The GPU half of the verbs transport's NVLink hop (docs/design.md, "Routes"): when a connection of a GPUDirect
// port is routed to this host's port on another rail, the bytes first cross NVLink (or PCIe peer-to-peer) from
// the comm's GPU into staging on the routed port's own GPU, which that NIC reads as it would its GPU's buffers.
// This is the copy and the memory; proxy/verbs/nvlink_hop.h registers the memory with the NIC and drives it.
// Not run on hardware with an RDMA NIC (no machine here has GPUs and RDMA NICs together); the copies and the
// staging memory are checked on one GPU by the unit test [nvlink-staging].
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "base/cuda_allocation.h"
#include "base/cuda_driver.h"
#include "proxy/staging/copy_queue.h"

namespace railnet::staging {

// Whether the calling thread's current GPU (NCCL's proxy thread runs on its comm's GPU) can copy into the GPU
// with PCI bus id `railGpuBusId` by peer access: that GPU is visible to this process and is the same GPU or
// cuDeviceCanAccessPeer says yes. False with *why otherwise (no driver, no current context, GPU not visible,
// no peer access, driver without the calls).
bool peerCopyPossible(const std::string& railGpuBusId, std::string* why);

class NvlinkStaging {
 public:
  // `slots` pieces of `pieceBytes` on the GPU with bus id `railGpuBusId`, writable by the GPU of `source` (device
  // memory NCCL registered), marked for GPUDirect RDMA; and a copy queue on the source's GPU (railnet's own copy
  // context when it reads `source`, chooseCopyContext). Throws railnet::Error naming the step that failed.
  NvlinkStaging(const cuda::DriverApi& cuda, const void* source, const std::string& railGpuBusId, int slots,
                uint64_t pieceBytes);
  ~NvlinkStaging();
  NvlinkStaging(const NvlinkStaging&) = delete;
  NvlinkStaging& operator=(const NvlinkStaging&) = delete;

  cuda::CUdeviceptr slot(int index) const { return memory_->address() + static_cast<uint64_t>(index) * pieceBytes_; }
  void* base() const { return reinterpret_cast<void*>(memory_->address()); }
  size_t bytes() const { return static_cast<size_t>(slots_) * pieceBytes_; }
  int sourceDevice() const { return source_->device(); }
  int railDevice() const { return railDevice_; }
  // Whether `pointer` is memory of the source GPU (what every later region of the comm must be).
  bool fromSourceGpu(const void* pointer) const { return source_->owns(pointer); }
  CopyQueue& copies() { return *copies_; }

 private:
  std::unique_ptr<DeviceContext> source_;
  int railDevice_ = -1;
  int slots_;
  uint64_t pieceBytes_;
  std::unique_ptr<cuda::CuMemAllocation> memory_;
  std::shared_ptr<CopyContext> copyContext_;  // null: copies run in the source's context
  std::unique_ptr<CopyQueue> copies_;         // last: destroyed first, after its copies finish
};

}  // namespace railnet::staging
