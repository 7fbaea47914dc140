// Memory the plugin moves bytes in and out of, of either kind NCCL hands it: page-aligned host memory
// (NCCL_PTR_HOST) or GPU memory (NCCL_PTR_CUDA: a cuMem allocation on device 0, as NCCL allocates its buffers, or
// with CONFORMANCE_GPU_MEMORY=cumalloc cuMemAlloc on its primary context; both through the project's
// run-time loader of the CUDA driver, base/cuda_driver.h). GPU memory is not addressable from the CPU, so the
// harness reads and writes both kinds only through these calls; every call is complete when it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "comms.h"

namespace conformance {

enum class MemKind { Host, Gpu };

inline constexpr int kMemKinds = 2;
inline int kindIndex(MemKind kind) { return kind == MemKind::Gpu ? 1 : 0; }
// "host" / "GPU", for failure messages.
const char* kindName(MemKind kind);
// NCCL_PTR_HOST / NCCL_PTR_CUDA: the type regMr gets.
int ptrType(MemKind kind);

class Memory {
 public:
  virtual ~Memory() = default;
  Memory(const Memory&) = delete;
  Memory& operator=(const Memory&) = delete;

  MemKind kind() const { return kind_; }
  // The address the plugin gets (a device address for GPU memory).
  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  // The same bytes for the CPU: data() for host memory, nullptr for GPU memory.
  virtual uint8_t* hostData() const = 0;

  virtual void write(size_t offset, const void* source, size_t bytes) = 0;
  virtual void read(size_t offset, void* destination, size_t bytes) const = 0;
  virtual void fill(size_t offset, uint8_t value, size_t bytes) = 0;
  // Prepares the calling thread to hand this memory to the plugin as NCCL's threads would: for GPU memory,
  // device 0's primary context becomes current (NCCL's proxy threads run with their GPU set).
  virtual void attachThread() const {}

 protected:
  Memory(MemKind kind, uint8_t* data, size_t size) : kind_(kind), data_(data), size_(size) {}

 private:
  MemKind kind_;
  uint8_t* data_;
  size_t size_;
};

// `size` bytes of `kind`, zero-filled. GPU memory requires gpuUnavailableReason() to be empty.
std::unique_ptr<Memory> allocateMemory(MemKind kind, size_t size);

// Why this process cannot use GPU memory ("" when it can): libcuda missing, cuInit failed, no device, the
// primary context or a test allocation refused. Evaluated once; when usable, device 0's primary context is
// retained for the life of the process.
const std::string& gpuUnavailableReason();

// Makes device 0's primary context current on the calling thread. Requires a usable GPU.
void bindGpuContext();
// Whether the calling thread's current context is device 0's primary context (false when none is current).
bool gpuContextCurrent();
// Clears the calling thread's current context (to drive the plugin from a thread without one).
void unbindGpuContext();

}  // namespace conformance
