// railnet's GPU doorbell ring (issue 15): GPU threads post one-sided operations as 64-byte descriptors into pinned
// host memory mapped into the GPU, and railnet's engine on the host takes them in order and carries them out over
// the transports (ring + engine path; the mlx5 path posts WQEs instead, mlx5_wqe.h). This header holds the
// shared layout and the protocol both sides follow; it compiles as CUDA device code (RAILNET_HOST_DEVICE), and the
// host side (RingConsumer) is plain C++ the unit tests drive with CPU threads standing in for GPU threads.
//
// Protocol, for a ring of `capacity` slots (a power of two), tickets counted from 0 without wrapping (64-bit):
//   producer (any number of threads, concurrently):
//     1. ticket = fetch_add(&control->reserved, 1)          (device atomic; the counter lives in GPU memory or,
//                                                            for CPU producers, anywhere both can reach)
//     2. wait until ticket - control->consumed < capacity   (the engine's progress, read from mapped memory)
//     3. write the slot's fields (slot = ticket & (capacity - 1)), everything but `sequence`
//     4. fence at system scope (__threadfence_system / release), then store sequence = ticket + 1
//   consumer (one thread, the engine):
//     1. next = its count of taken tickets; slot = next & (capacity - 1)
//     2. when acquire-load(slot.sequence) == next + 1: the descriptor is complete; copy it out
//     3. after copying, release-store control->consumed = next + 1 (the slot may be reused)
// The sequence value (ticket + 1, never 0) tells a complete descriptor of this lap from one left by the previous
// lap (ticket + 1 - capacity) or a fresh ring (0), so the consumer never takes a half-written slot and takes each
// ticket exactly once, in ticket order, whatever order producers finish in. A producer stalled between steps 1
// and 4 holds back later tickets (ordering is by ticket): the engine reports it after a timeout rather than skip.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#if !defined(__CUDA_ARCH__)
#include <thread>
#endif

#include "proxy/doorbell/host_device.h"

namespace railnet::doorbell {

enum class Op : uint32_t {
  kPut = 1,        // bytes from the local window to the peer's window
  kPutSignal = 2,  // a put, then the peer's signal word updated after its bytes have landed
  kSignal = 3,     // only the signal (ordered after every earlier put to that peer)
  kQuiet = 4,      // no transfer: completes when every earlier operation of this ring has completed
};

// What a signal does to the peer's 64-bit word (GIN's INC is an add of 1).
enum class SignalOp : uint32_t { kNone = 0, kAdd = 1 };

// One operation. 64 bytes: one slot, one PCIe write burst from the GPU, one cache line on the host.
struct alignas(64) Descriptor {
  uint32_t op;             // Op
  uint32_t peer;           // target rank in the doorbell context
  uint32_t sourceWindow;   // local window index
  uint32_t targetWindow;   // the peer's window index (same index: windows are registered collectively)
  uint64_t sourceOffset;
  uint64_t targetOffset;
  uint64_t bytes;
  uint32_t signal;         // index of the peer's signal word
  uint32_t signalOp;       // SignalOp
  uint64_t signalValue;
  uint64_t sequence;       // ticket + 1 once the fields above are complete; written last
};
static_assert(sizeof(Descriptor) == 64, "one descriptor per 64-byte slot");
static_assert(offsetof(Descriptor, sequence) == 56, "the publishing word is the slot's last 8 bytes");
inline constexpr size_t kFieldBytes = offsetof(Descriptor, sequence);  // what a producer writes before publishing

// The ring's shared counters, each on its own cache line: producers bump `reserved`, the engine writes `consumed`
// and `completed` (tickets whose operation finished locally: quiet waits on it), and `error` (nonzero: the first
// failure, RingError, which kernels read instead of waiting forever).
struct alignas(64) RingControl {
  alignas(64) uint64_t reserved;
  alignas(64) uint64_t consumed;
  alignas(64) uint64_t completed;
  alignas(64) uint32_t error;
};

enum class RingError : uint32_t {
  kNone = 0,
  kPeerFailed = 1,    // a transport to a peer failed (the engine's log names the peer)
  kBadDescriptor = 2, // an unknown op, peer, window, or a range outside a window
  kStalled = 3,       // a producer reserved a ticket and never published it
};

RAILNET_HOST_DEVICE constexpr bool isPowerOfTwo(uint64_t value) { return value != 0 && (value & (value - 1)) == 0; }

// The slot of a ticket.
RAILNET_HOST_DEVICE constexpr uint64_t slotOf(uint64_t ticket, uint64_t capacity) { return ticket & (capacity - 1); }

#if !defined(__CUDA_ARCH__)
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

// The producer's protocol for CPU threads (tests, and host code that shares a ring with kernels). A kernel does
// the same with atomicAdd, volatile loads and __threadfence_system().
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
#endif

}  // namespace railnet::doorbell
