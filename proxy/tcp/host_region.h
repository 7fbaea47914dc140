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

// Host memory only: anything else (CUDA, DMA-BUF) is ncclInvalidArgument, so NCCL stages through host memory.
class HostRegistrar final : public MemoryRegistrar {
 public:
  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) override;
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) override;
};

// The process's one HostRegistrar (it holds no state).
MemoryRegistrar& hostRegistrar() noexcept;

}  // namespace railnet::tcp
