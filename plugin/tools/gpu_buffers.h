// GPU memory for railnet-bench --gpu, through the project's own CUDA driver loader (base/cuda_driver.h; the bench
// links no CUDA library and builds without a CUDA toolkit): device 0 and its primary context, device memory, and
// pinned host memory for copy-engine staging.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "base/cuda_allocation.h"
#include "base/cuda_driver.h"

namespace railnet::bench {

// Device 0 with its primary context retained for the process's lifetime, as the CUDA runtime (and so NCCL and
// PyTorch) uses it. Every thread that calls CUDA, directly or through the plugin, makes it current first.
class GpuDevice {
 public:
  // Loads libcuda, initialises it and retains device 0's primary context, current on the calling thread. Returns
  // null and sets *why when there is no usable GPU ("libcuda.so.1 not found: ...", "cuInit: ...", "no GPU").
  static std::unique_ptr<GpuDevice> open(std::string* why);
  ~GpuDevice();  // releases the primary context: every allocation made in it must be gone
  GpuDevice(const GpuDevice&) = delete;
  GpuDevice& operator=(const GpuDevice&) = delete;

  const cuda::DriverApi& api() const noexcept { return api_; }
  cuda::CUdevice device() const noexcept { return device_; }
  // "0000:19:00.0", or "" when the driver does not say.
  const std::string& pciBusId() const noexcept { return pciBusId_; }

  // Makes the primary context current on the calling thread (cuCtxSetCurrent). Throws BenchError.
  void makeCurrent() const;
  // Throws BenchError "CUDA <what>: CUDA_ERROR_... (n)" unless `result` is CUDA_SUCCESS.
  void check(cuda::CUresult result, const char* what) const;

 private:
  GpuDevice(const cuda::DriverApi& api, cuda::CUdevice device, cuda::CUcontext context);

  const cuda::DriverApi& api_;
  const cuda::CUdevice device_;
  const cuda::CUcontext context_;
  std::string pciBusId_;
};

// Device memory allocated as NCCL allocates its buffers (cuMem, base/cuda_allocation.h), cleared once at
// allocation; cuMemAlloc only on a driver without the cuMem API (the header line says which). Its synchronous copies wait until the bytes have
// arrived, also where the driver would let a copy from pageable memory or a memset return early.
class DeviceMemory {
 public:
  DeviceMemory(const GpuDevice& gpu, size_t bytes);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;

  cuda::CUdeviceptr address() const noexcept { return address_; }
  size_t size() const noexcept { return size_; }

  void upload(const std::byte* from, size_t bytes);  // host -> the first `bytes`
  void download(std::byte* to, size_t bytes) const;  // the first `bytes` -> host
  void clear(size_t bytes);                          // zeroes the first `bytes`

 private:
  const GpuDevice& gpu_;
  std::unique_ptr<cuda::CuMemAllocation> cuMem_;  // null: cuMemAlloc'd
  cuda::CUdeviceptr address_ = 0;
  size_t size_ = 0;
};

// Page-locked host memory (cuMemHostAlloc, portable): what the copy engines read and write at full speed.
class PinnedMemory {
 public:
  PinnedMemory(const GpuDevice& gpu, size_t bytes);
  ~PinnedMemory();
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  std::byte* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }

 private:
  const GpuDevice& gpu_;
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace railnet::bench
