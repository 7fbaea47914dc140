// GPU memory allocated the way NCCL allocates its buffers by default (NCCL_CUMEM_ENABLE=1): the cuMem API
// (create, reserve an address range, map, grant the device access). Such memory belongs to no context, so any
// context on its GPU copies it at full speed (proxy/staging/copy_queue.h, isCuMemAllocation). Used where railnet
// or its tools must hold GPU memory as NCCL would hand it over: railnet-bench --gpu, the conformance gpu group.
#pragma once

#include <cstddef>
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
  // The same, also readable and writable by `peers` (GPUs with peer access to `device`: their copy engines write
  // it over NVLink), and marked for GPUDirect RDMA when `gpuDirectRdma` (a NIC registers it through a DMA-BUF).
  static std::unique_ptr<CuMemAllocation> create(const DriverApi& api, CUdevice device, size_t bytes,
                                                 const std::vector<CUdevice>& peers, bool gpuDirectRdma,
                                                 std::string* why);
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

}  // namespace railnet::cuda
