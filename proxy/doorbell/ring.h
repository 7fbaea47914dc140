// railnet's GPU doorbell ring (issue 15), the host side: GPU threads post one-sided operations as 64-byte
// descriptors into pinned host memory mapped into the GPU (include/railnet/doorbell_device.cuh), and railnet's
// engine takes them in order and carries them out over the transports. The layout and the protocol both sides
// follow are public, in include/railnet/doorbell_layout.h. Here: RingConsumer (the engine's side) and postFromHost
// (a CPU producer, for host-only contexts and the unit tests, whose threads stand in for GPU threads).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <thread>

#include "railnet/doorbell_layout.h"

namespace railnet::doorbell {

// Host side. The ring's memory is owned by the caller (pinned and mapped in real use; plain memory in tests).
class RingConsumer {
 public:
  RingConsumer(Descriptor* slots, RingControl* control, uint64_t capacity)
      : slots_(slots), control_(control), capacity_(capacity) {}

  // Copies the next descriptor into *out and frees its slot; false when the next ticket is not published yet.
  bool take(Descriptor* out) {
    Descriptor& slot = slots_[slotOf(next_, capacity_)];
    const uint64_t published = std::atomic_ref<uint64_t>(slot.sequence).load(std::memory_order_acquire);
    if (published != next_ + 1) return false;
    std::memcpy(out, &slot, kFieldBytes);  // the fields only: `sequence` is touched atomically, always
    out->sequence = published;
    ++next_;
    std::atomic_ref<uint64_t>(control_->consumed).store(next_, std::memory_order_release);
    return true;
  }

  // Whether a producer has reserved the next ticket without publishing it yet (a stall, when it lasts).
  bool reservedButUnpublished() const {
    return std::atomic_ref<uint64_t>(control_->reserved).load(std::memory_order_acquire) > next_;
  }

  // Operations up to `ticket` (exclusive) finished: what quiet and the producers' completion waits read.
  void markCompleted(uint64_t ticket) {
    std::atomic_ref<uint64_t>(control_->completed).store(ticket, std::memory_order_release);
  }

  // The first error sticks: kernels read it instead of waiting for ever.
  void fail(RingError error) {
    uint32_t expected = 0;
    std::atomic_ref<uint32_t>(control_->error)
        .compare_exchange_strong(expected, static_cast<uint32_t>(error), std::memory_order_acq_rel);
  }

  uint64_t taken() const { return next_; }

 private:
  Descriptor* slots_;
  RingControl* control_;
  uint64_t capacity_;
  uint64_t next_ = 0;
};

// The producer's protocol for CPU threads (tests, and host-only contexts). Kernels follow it in
// railnet/doorbell_device.cuh; a ring is fed by one kind of producer, not both (a GPU's atomics on mapped host
// memory are atomic among that GPU's threads only, without PCIe atomics).
inline bool postFromHost(Descriptor* slots, RingControl* control, uint64_t capacity, const Descriptor& descriptor,
                         uint64_t maxSpins = UINT64_MAX) {
  const uint64_t ticket = std::atomic_ref<uint64_t>(control->reserved).fetch_add(1, std::memory_order_acq_rel);
  for (uint64_t spins = 0; ticket - std::atomic_ref<uint64_t>(control->consumed).load(std::memory_order_acquire) >=
                           capacity;
       ++spins) {
    if (spins >= maxSpins) return false;  // the ticket stays reserved: the consumer reports the stall
    std::this_thread::yield();            // a CPU thread waiting for room gives the engine its core
  }
  Descriptor& slot = slots[slotOf(ticket, capacity)];
  // Every field but `sequence`, then `sequence` with release order: a consumer that sees ticket + 1 sees them all.
  std::memcpy(&slot, &descriptor, kFieldBytes);
  std::atomic_ref<uint64_t>(slot.sequence).store(ticket + 1, std::memory_order_release);
  return true;
}
}  // namespace railnet::doorbell
