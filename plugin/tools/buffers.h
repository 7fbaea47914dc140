// Host memory for railnet-bench, shared by the railnet and raw TCP measurements so both move the same bytes
// between the same addresses, plus the pattern and checksum that verify a transfer.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

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

// The four buffers of a run. Messages in flight use distinct slots, like NCCL's NCCL_STEPS buffers: message i
// of size S lives at (i % slots(S)) * S. Slots are capped by `window` and by the arena size, so very large
// messages reuse fewer slots instead of needing window x size bytes.
class BenchBuffers {
 public:
  BenchBuffers(size_t maxMessage, int window, size_t arenaCap);

  HostBuffer send;      // source of the measured direction; holds the verification pattern
  HostBuffer recv;      // destination of the measured direction
  HostBuffer echoSend;  // source of the way back (ping-pong's pong; the back direction when both ways stream)
  HostBuffer echoRecv;  // destination of the way back

  size_t slots(size_t size) const noexcept {
    return std::max<size_t>(1, std::min<size_t>(static_cast<size_t>(window_), send.size() / size));
  }
  size_t slotOffset(size_t size, uint64_t message) const noexcept { return (message % slots(size)) * size; }

 private:
  int window_;
};

// Position-dependent bytes: a chunk delivered to the wrong offset, a stale or a zero buffer do not match.
void fillPattern(std::byte* data, size_t size, uint64_t seed);

// Order-sensitive 64-bit checksum.
uint64_t checksum(const std::byte* data, size_t size);

}  // namespace railnet::bench
