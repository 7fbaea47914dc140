// The TCP transport's memory registration: host memory only, and the region just remembers what was registered.
#pragma once

#include <cstddef>
#include <memory>

#include "proxy/transport.h"

namespace railnet::tcp {

class HostRegion final : public MemoryRegion {
 public:
  HostRegion(void* data, size_t size) : data_(data), size_(size) {}
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_;
  size_t size_;
};

// Throws ncclInvalidArgument for anything but NCCL_PTR_HOST.
std::unique_ptr<MemoryRegion> registerHostMemory(void* data, size_t size, int type);

}  // namespace railnet::tcp
