// What a TCP comm registers, and the staging that lets it take GPU memory: regMr of CUDA memory gives the comm,
// once, a copy queue on that GPU's context and `RAILNET_TCP_STAGING_SLOTS` pinned slots of one piece each
// (proxy/staging/). The send comm copies GPU pieces down into its slots before their chunks leave; the receive
// comm lands chunks in its slots and copies each piece up (docs/design.md, "GPU memory on TCP").
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "proxy/staging/copy_queue.h"
#include "proxy/staging/pinned_memory.h"
#include "proxy/transport.h"

namespace railnet::tcp {

class TcpRegion final : public MemoryRegion {
 public:
  TcpRegion(void* data, size_t size, bool onGpu) : data_(data), size_(size), onGpu_(onGpu) {}
  void* data() const { return data_; }
  size_t size() const { return size_; }
  bool onGpu() const { return onGpu_; }

 private:
  void* data_;
  size_t size_;
  bool onGpu_;
};

// True when `mr` (as NCCL passed it to isend/irecv; may be null for host memory) is GPU memory.
inline bool onGpu(const MemoryRegion* mr) { return mr != nullptr && static_cast<const TcpRegion*>(mr)->onGpu(); }

// Whether the TCP transport offers NCCL_PTR_CUDA: RAILNET_TCP_GPU=1, libcuda loads and a GPU is there; *why
// says why not. Evaluated once per process.
bool tcpGpuUsable(std::string* why);

// Piece size and slot count from the settings, as powers of two.
uint64_t stagingPieceBytes();
int stagingSlots();

class CommStaging final : public MemoryRegistrar {
 public:
  explicit CommStaging(std::string role) : role_(std::move(role)) {}
  ~CommStaging() override;

  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) override;
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) override;

  // Set once the comm registered GPU memory; NCCL's regMr returns before the isend/irecv that names the region,
  // so the data path may rely on it for any GPU region it is given.
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  char* slot(int index) const { return memory_->data() + static_cast<size_t>(index) * pieceBytes_; }
  int slots() const { return slots_; }
  uint64_t pieceBytes() const { return pieceBytes_; }
  // The driving thread's (isend/irecv/test under the comm's lock).
  staging::CopyQueue& copies() { return *copies_; }

 private:
  void prepare(void* gpuMemory);

  std::string role_;
  std::mutex mutex_;  // regMr calls (NCCL's service thread) against each other
  std::atomic<bool> ready_{false};
  uint64_t pieceBytes_ = 0;
  int slots_ = 0;
  std::unique_ptr<staging::DeviceContext> context_;
  std::shared_ptr<staging::CopyContext> copyContext_;  // null: copies run in the buffers' own context
  std::unique_ptr<staging::PinnedMemory> memory_;
  std::unique_ptr<staging::CopyQueue> copies_;
};

}  // namespace railnet::tcp
