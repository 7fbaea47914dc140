// The memory railnet-bench moves, shared by railnet and its baseline so both move the same bytes between the same
// addresses: host memory, or GPU memory with --gpu; plus the pattern and checksum that verify a transfer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "base/cuda_driver.h"

namespace railnet::bench {

// Page-aligned host memory, written once at allocation so page faults stay out of the measurements.
class HostBuffer {
 public:
  explicit HostBuffer(size_t bytes);
  ~HostBuffer();
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  std::byte* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

class GpuDevice;
class DeviceMemory;

// One buffer of a run. Its host memory always exists: it holds the pattern that is sent and, after a verified run,
// the bytes that arrived. On the GPU (--gpu) the transports move a GPU copy of it instead, filled from the host
// memory at allocation and copied back to it by collect().
class BenchBuffer {
 public:
  // `gpu` null: host memory only.
  BenchBuffer(size_t bytes, const GpuDevice* gpu);
  ~BenchBuffer();
  BenchBuffer(const BenchBuffer&) = delete;
  BenchBuffer& operator=(const BenchBuffer&) = delete;

  size_t size() const noexcept { return host_.size(); }
  bool onGpu() const noexcept { return device_ != nullptr; }
  HostBuffer& host() noexcept { return host_; }
  const HostBuffer& host() const noexcept { return host_; }
  // What a transport is given: the host memory, or the GPU memory's device address.
  std::byte* transportData() const noexcept;
  // NCCL_PTR_HOST or NCCL_PTR_CUDA: the type regMr is told.
  int pointerType() const noexcept;
  // The GPU memory (onGpu() only).
  cuda::CUdeviceptr deviceAddress() const noexcept;

  // Writes the verification pattern into the host memory and, on the GPU, copies it up.
  void fill(uint64_t seed);
  // Zeroes the first `bytes` of what the transports write into.
  void clear(size_t bytes);
  // Makes the first `bytes` of host() what the transports wrote (a copy down from the GPU; nothing on the host).
  void collect(size_t bytes);

 private:
  HostBuffer host_;
  std::unique_ptr<DeviceMemory> device_;
};

// The four buffers of a run. Messages in flight use distinct slots, like NCCL's NCCL_STEPS buffers: message i
// of size S lives at (i % slots(S)) * S. Slots are capped by `window` and by the arena size, so very large
// messages reuse fewer slots instead of needing window x size bytes.
class BenchBuffers {
 public:
  // `gpu` null: host memory; else the transports move GPU memory of that device (which must outlive this).
  BenchBuffers(size_t maxMessage, int window, size_t arenaCap, const GpuDevice* gpu = nullptr);

  BenchBuffer send;      // source of the measured direction; holds the verification pattern
  BenchBuffer recv;      // destination of the measured direction
  BenchBuffer echoSend;  // source of the way back (ping-pong's pong; the back direction when both ways stream)
  BenchBuffer echoRecv;  // destination of the way back

  bool onGpu() const noexcept { return gpu_ != nullptr; }
  // What a thread does before it touches the buffers or hands them to a transport: on the GPU, make its context
  // current, as NCCL's proxy thread has it; nothing for host memory.
  void prepareThread() const;

  size_t slots(size_t size) const noexcept {
    return std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(window_), send.size() / size));
  }
  size_t slotOffset(size_t size, uint64_t message) const noexcept { return (message % slots(size)) * size; }

 private:
  int window_;
  const GpuDevice* gpu_;
};

// Position-dependent bytes: a chunk delivered to the wrong offset, a stale or a zero buffer do not match.
void fillPattern(std::byte* data, size_t size, uint64_t seed);

// Order-sensitive 64-bit checksum.
uint64_t checksum(const std::byte* data, size_t size);

}  // namespace railnet::bench
