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
#include "proxy/staging/hop_exchange.h"

namespace railnet::staging {

// Whether the calling thread's current GPU (NCCL's proxy thread runs on its comm's GPU) can copy into the GPU
// with PCI bus id `railGpuBusId`: that GPU is visible to this process and is the same GPU or cuDeviceCanAccessPeer
// says yes; or it is not visible and a process of this host serves staging on it (hop_exchange.h), whose peer
// access is then found out when the staging is imported. False with *why otherwise.
bool peerCopyPossible(const std::string& railGpuBusId, std::string* why);

class NvlinkStaging {
 public:
  // `slots` pieces of `pieceBytes` on the GPU with bus id `railGpuBusId`, writable by the GPU of `source` (device
  // memory NCCL registered), marked for GPUDirect RDMA: allocated here when that GPU is visible, else imported from
  // the process that serves it (hop_exchange.h); and a copy queue on the source's GPU (railnet's own copy context
  // when it reads `source`, chooseCopyContext). Throws railnet::Error naming the step that failed.
  NvlinkStaging(const cuda::DriverApi& cuda, const void* source, const std::string& railGpuBusId, int slots,
                uint64_t pieceBytes);
  ~NvlinkStaging();
  NvlinkStaging(const NvlinkStaging&) = delete;
  NvlinkStaging& operator=(const NvlinkStaging&) = delete;

  cuda::CUdeviceptr slot(int index) const { return address_ + static_cast<uint64_t>(index) * pieceBytes_; }
  void* base() const { return reinterpret_cast<void*>(address_); }
  size_t bytes() const { return static_cast<size_t>(slots_) * pieceBytes_; }
  int sourceDevice() const { return source_->device(); }
  int railDevice() const { return railDevice_; }  // -1: another process's GPU (imported staging)
  // Imported staging: its DMA-BUF from the serving process, for the NIC registration; -1 otherwise (this process
  // exports its own staging when it registers).
  int dmabufFd() const { return imported_ != nullptr ? imported_->dmabufFd() : -1; }
  std::string importedDmabufWhy() const { return imported_ != nullptr ? imported_->dmabufWhy() : std::string(); }
  // Whether `pointer` is memory of the source GPU (what every later region of the comm must be).
  bool fromSourceGpu(const void* pointer) const { return source_->owns(pointer); }
  CopyQueue& copies() { return *copies_; }

 private:
  std::unique_ptr<DeviceContext> source_;
  int railDevice_ = -1;
  int slots_;
  uint64_t pieceBytes_;
  std::unique_ptr<cuda::CuMemAllocation> local_;   // the rail GPU is visible here
  std::unique_ptr<ImportedStaging> imported_;     // it is another process's
  cuda::CUdeviceptr address_ = 0;
  std::shared_ptr<CopyContext> copyContext_;  // null: copies run in the source's context
  std::unique_ptr<CopyQueue> copies_;         // last: destroyed first, after its copies finish
};

}  // namespace railnet::staging
