// Pinned host memory mapped into the GPU, zeroed (cuMemHostAlloc, PORTABLE | DEVICEMAP, in the device's primary
// context; under unified addressing kernels use the same pointer); plain aligned host memory without a GPU
// (cudaDevice < 0: the unit tests). What the doorbells' ring, signal words and direct-path counters live in.
#pragma once

#include <cstddef>

#include "base/cuda_driver.h"

namespace railnet::doorbell {

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
  const cuda::DriverApi* cuda_ = nullptr;
  cuda::CUcontext context_ = nullptr;
  cuda::CUdevice device_ = 0;
  void* data_ = nullptr;
};

}  // namespace railnet::doorbell
