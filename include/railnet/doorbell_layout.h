// The layout railnet's GPU doorbell ring shares between producers (kernels: railnet/doorbell_device.cuh) and
// railnet's engine (proxy/doorbell/ring.h, engine.h): the 64-byte descriptor, the ring's counters and error word,
// and the protocol. Public because kernels compile against it; plain C++17 that also compiles as CUDA device code.
//
// Protocol, for a ring of `capacity` slots (a power of two), tickets counted from 0 without wrapping (64-bit):
//   producer (any number of threads of one GPU, concurrently):
//     1. ticket = fetch_add(&control->reserved, 1)          (a device-scope atomic on mapped host memory: atomic
//                                                            among the GPU's threads, which is all it must be)
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

#include <stddef.h>
#include <stdint.h>

#include "railnet/host_device.h"

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

}  // namespace railnet::doorbell
