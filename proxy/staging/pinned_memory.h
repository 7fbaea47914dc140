// Pinned host memory for copy-engine staging: page-locked so the copy engines can DMA to and from it, and placed
// on the GPU's NUMA node so the bytes cross the CPU interconnect at most once (the NIC side is usually on the same
// node as its GPU's rail). Registered with cuMemHostRegister(PORTABLE), so any context in the process may copy
// from it.
#pragma once

#include <cstddef>
#include <string>

#include "base/cuda_driver.h"

namespace railnet::staging {

class PinnedMemory {
 public:
  // `numaNode` < 0: wherever the kernel puts it. Throws railnet::Error (ncclSystemError) when the memory cannot
  // be mapped or registered, naming the size and the reason.
  PinnedMemory(const cuda::DriverApi& cuda, size_t bytes, int numaNode);
  ~PinnedMemory();
  PinnedMemory(const PinnedMemory&) = delete;
  PinnedMemory& operator=(const PinnedMemory&) = delete;

  char* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  const cuda::DriverApi& cuda_;
  char* data_ = nullptr;
  size_t size_ = 0;
};

// The NUMA node of the GPU with PCI bus id `busId` ("0000:1b:00.0", any case), from sysfs; -1 when unknown.
int numaNodeOfPci(const std::string& busId);

}  // namespace railnet::staging
