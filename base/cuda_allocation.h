// GPU memory allocated the way NCCL allocates its buffers by default (NCCL_CUMEM_ENABLE=1): the cuMem API
// (create, reserve an address range, map, grant the device access). Such memory belongs to no context, so any
// context on its GPU copies it at full speed (proxy/staging/copy_queue.h, isCuMemAllocation). Used where railnet
// or its tools must hold GPU memory as NCCL would hand it over: railnet-bench --gpu, the conformance gpu group.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/cuda_driver.h"

namespace railnet::cuda {

class CuMemAllocation {
 public:
  // `bytes` (rounded up to the allocation granularity) on `device`, readable and writable by it. nullptr with
  // *why when the driver lacks the cuMem API or a step fails ("cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)").
  static std::unique_ptr<CuMemAllocation> create(const DriverApi& api, CUdevice device, size_t bytes, std::string* why);
  struct Options {
    std::vector<CUdevice> peers;  // also readable and writable by these GPUs (peer access to `device`): their copy
                                  // engines write it over NVLink
    bool gpuDirectRdma = false;   // marked for GPUDirect RDMA (a NIC registers it through a DMA-BUF)
    bool shareable = false;       // exportable to another process as a file descriptor (exportFd)
  };
  static std::unique_ptr<CuMemAllocation> create(const DriverApi& api, CUdevice device, size_t bytes,
                                                 const Options& options, std::string* why);
  // A shareable allocation as a new file descriptor (the caller closes it), or -1 with *why.
  int exportFd(std::string* why) const;
  ~CuMemAllocation();  // unmaps, releases the physical memory and frees the address range
  CuMemAllocation(const CuMemAllocation&) = delete;
  CuMemAllocation& operator=(const CuMemAllocation&) = delete;

  CUdeviceptr address() const noexcept { return address_; }
  size_t mappedBytes() const noexcept { return mapped_; }

 private:
  explicit CuMemAllocation(const DriverApi& api) : api_(api) {}
  const DriverApi& api_;
  CUmemGenericAllocationHandle handle_ = 0;
  bool created_ = false;
  CUdeviceptr address_ = 0;  // reserved range (0: none)
  size_t mapped_ = 0;        // bytes reserved, and mapped once mappedOk_
  bool mappedOk_ = false;
};

// Exports [begin, begin + length) of CUDA memory (page-aligned) as a DMA-BUF fd with
// cuMemGetHandleForAddressRange, for a NIC to register (GPUDirect RDMA). Returns the fd, or -1 with *why set.
// Works in the process whose GPU holds the memory; on memory imported from another process's GPU the driver
// refuses it (measured on H200s: CUDA_ERROR_UNKNOWN), so that process exports it (proxy/staging/hop_exchange.h).
int exportDmabuf(const DriverApi& driver, uintptr_t begin, size_t length, std::string* why);

}  // namespace railnet::cuda
