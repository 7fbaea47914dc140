// Pinned host memory mapped into the GPU, zeroed (cuMemHostAlloc, PORTABLE | DEVICEMAP, in the device's primary
// context; under unified addressing kernels use the same pointer); plain aligned host memory without a GPU
// (cudaDevice < 0: the unit tests). What the doorbells' ring, signal words and direct-path counters live in.
#pragma once

#include <cstddef>
#include <memory>

#include "base/cuda_driver.h"

namespace railnet::doorbell {

// A GPU's primary context (the one the CUDA runtime and the application's kernels use), retained for as long as
// this lives: where the doorbells allocate and register host memory for the GPU.
class PrimaryContext {
 public:
  // Throws railnet::Error when CUDA is unusable or there is no such device.
  explicit PrimaryContext(int cudaDevice);
  ~PrimaryContext();
  PrimaryContext(const PrimaryContext&) = delete;
  PrimaryContext& operator=(const PrimaryContext&) = delete;
  const cuda::DriverApi& cuda() const { return *cuda_; }
  cuda::CUcontext context() const { return context_; }
  int device() const { return device_; }

 private:
  const cuda::DriverApi* cuda_ = nullptr;
  cuda::CUcontext context_ = nullptr;
  cuda::CUdevice handle_ = 0;
  int device_;
};

class MappedMemory {
 public:
  // Throws railnet::Error when the memory cannot be had.
  MappedMemory(int cudaDevice, size_t bytes);
  ~MappedMemory();
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;
  void* data() const { return data_; }

 private:
  static constexpr unsigned kPortable = 0x01;   // CU_MEMHOSTALLOC_PORTABLE
  static constexpr unsigned kDeviceMap = 0x02;  // CU_MEMHOSTALLOC_DEVICEMAP
  std::unique_ptr<PrimaryContext> gpu_;  // none: plain host memory
  void* data_ = nullptr;
};

}  // namespace railnet::doorbell
