// railnet's GPU doorbells, device side (issue 15): header-only CUDA that lets kernels post one-sided operations to
// the ring of a doorbell context (railnet/doorbell.h makes the context and gives the railnet_doorbell_device_t a
// kernel takes by value). No CPU decision is in the path: a kernel writes a 64-byte descriptor into the ring in
// mapped host memory and railnet's engine thread carries it out over railnet's transports (the protocol:
// railnet/doorbell_layout.h). When the context has the mlx5 direct path (ctx.direct, railnet/doorbell_direct.h),
// put, put_signal, signal and quiet post the NIC's own WQEs to each peer's send queue and ring its doorbell
// instead (railnet/doorbell_direct_producer.h); the same calls, scopes and codes either way.
//
//   #include <railnet/doorbell_device.cuh>
//   namespace db = railnet::doorbell::device;
//   __global__ void step(railnet_doorbell_device_t ctx, uint32_t window, size_t bytes) {
//     ... fill this rank's half of the window ...
//     int peer = (ctx.rank + 1) % ctx.nranks;
//     db::put_signal<db::Scope::kBlock>(ctx, peer, window, bytes, window, 0, bytes, /*signal*/ 0, /*add*/ 1);
//     db::wait_signal<db::Scope::kBlock>(ctx, 0, /*at least*/ 1);   // the left neighbour's bytes have landed
//   }
//
// Every call returns RAILNET_DOORBELL_OK (0) or a code of railnet/doorbell.h: the ring's sticky error (a peer
// failed, a bad descriptor, a stalled producer) as soon as it is set, or RAILNET_DOORBELL_TIMEOUT when its own wait
// ran past `timeoutNs` (GPU %globaltimer). Nothing spins for ever.
//
// Granularity: Scope::kThread, the calling thread posts (any number of threads may post concurrently);
// Scope::kWarp, every thread of the warp calls with the same arguments and lane 0 posts; Scope::kBlock, every thread
// of the block calls, thread 0 posts. In the group scopes, the group's earlier writes to the source buffer are made
// visible to the engine (and its copy engines) before the descriptor is published, and every thread gets the result.
//
// Ordering and completion: operations to one peer land in ticket order, and a signal is applied at the target only
// after its put's bytes and every earlier put to that peer have landed. `quiet` returns once every operation posted
// before it (by any thread) has completed locally: its source bytes may be overwritten.
//
// Direct path differences: a bad peer, window or signal index is returned by the call itself (BAD_DESCRIPTOR,
// nothing posted) rather than set as the context's sticky error; a range outside a window is caught only by the NIC
// (the peer's queue fails: PEER_FAILED); a put to this rank itself is BAD_DESCRIPTOR (no loopback queue).
//
// Requires CUDA 11.7+ (libcu++ atomic_ref) and sm_70+.
#pragma once

#include <cuda/atomic>
#include <stdint.h>

#include "railnet/doorbell.h"
#include "railnet/doorbell_direct_device.cuh"
#include "railnet/doorbell_layout.h"

namespace railnet::doorbell::device {

enum class Scope { kThread, kWarp, kBlock };

// A wait's default limit: long enough for any step a peer could legitimately take between two signals, short
// enough that a lost peer surfaces as an error the kernel can report (NCCL #2383 is a wait that never ends).
inline constexpr uint64_t kDefaultTimeoutNs = 30'000'000'000ull;

namespace detail {

__device__ inline uint64_t nowNs() {
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  return ns;
}

template <typename T>
__device__ inline T loadSystem(T* word) {
  return cuda::atomic_ref<T, cuda::thread_scope_system>(*word).load(cuda::memory_order_acquire);
}

__device__ inline RingControl* control(const railnet_doorbell_device_t& ctx) {
  return static_cast<RingControl*>(ctx.control);
}

__device__ inline int ringError(const railnet_doorbell_device_t& ctx) {
  return static_cast<int>(loadSystem(&control(ctx)->error));
}

// Polls `ready` until it holds, the ring fails, or `timeoutNs` passes.
template <typename Ready>
__device__ inline int waitUntil(const railnet_doorbell_device_t& ctx, uint64_t timeoutNs, Ready ready) {
  const uint64_t start = nowNs();
  for (uint32_t round = 0;; ++round) {
    if (ready()) return RAILNET_DOORBELL_OK;
    if (const int error = ringError(ctx); error != 0) return error;
    if (nowNs() - start >= timeoutNs) return RAILNET_DOORBELL_TIMEOUT;
    if (round >= 64) __nanosleep(200);  // after a short spin, leave the SM's issue slots to other warps
  }
}

// The producer's protocol (railnet/doorbell_layout.h): reserve a ticket, wait for its slot, write the fields,
// publish. *ticketOut: the ticket, for quiet.
__device__ inline int post(const railnet_doorbell_device_t& ctx, const Descriptor& descriptor, uint64_t timeoutNs,
                           uint64_t* ticketOut = nullptr) {
  if (const int error = ringError(ctx); error != 0) return error;
  RingControl* ring = control(ctx);
  // Device scope is enough: only this GPU's threads count tickets (no PCIe atomics needed on mapped memory).
  const uint64_t ticket =
      cuda::atomic_ref<uint64_t, cuda::thread_scope_device>(ring->reserved).fetch_add(1, cuda::memory_order_relaxed);
  const int room = waitUntil(ctx, timeoutNs, [&] { return ticket - loadSystem(&ring->consumed) < ctx.capacity; });
  if (room != RAILNET_DOORBELL_OK) return room;  // the ticket stays reserved: the engine reports the stall
  Descriptor* slot = static_cast<Descriptor*>(ctx.slots) + slotOf(ticket, ctx.capacity);
  // The 56 bytes of fields as three 16-byte stores and one 8-byte store (few PCIe writes), then the sequence word.
  const uint4* from = reinterpret_cast<const uint4*>(&descriptor);
  uint4* to = reinterpret_cast<uint4*>(slot);
  to[0] = from[0];
  to[1] = from[1];
  to[2] = from[2];
  slot->signalValue = descriptor.signalValue;
  cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(slot->sequence).store(ticket + 1, cuda::memory_order_release);
  if (ticketOut != nullptr) *ticketOut = ticket;
  return RAILNET_DOORBELL_OK;
}

// The direct path's producer for one call (ctx.direct != nullptr); the ring's error word is the context's.
__device__ inline direct::DirectProducer<direct::DeviceMemory> directProducer(const railnet_doorbell_device_t& ctx,
                                                                              uint64_t timeoutNs) {
  return {*static_cast<const DirectView*>(ctx.direct), ctx.nranks, ctx.signal_count, &control(ctx)->error,
          timeoutNs};
}

__device__ inline Descriptor describe(Op op, int peer, uint32_t targetWindow, uint64_t targetOffset,
                                      uint32_t sourceWindow, uint64_t sourceOffset, uint64_t bytes, uint32_t signal,
                                      uint64_t add) {
  Descriptor descriptor;
  descriptor.op = static_cast<uint32_t>(op);
  descriptor.peer = static_cast<uint32_t>(peer);
  descriptor.sourceWindow = sourceWindow;
  descriptor.targetWindow = targetWindow;
  descriptor.sourceOffset = sourceOffset;
  descriptor.targetOffset = targetOffset;
  descriptor.bytes = bytes;
  descriptor.signal = signal;
  descriptor.signalOp = static_cast<uint32_t>(op == Op::kPutSignal || op == Op::kSignal ? SignalOp::kAdd
                                                                                          : SignalOp::kNone);
  descriptor.signalValue = add;
  descriptor.sequence = 0;
  return descriptor;
}

// Runs `call` once for the scope's group and gives every thread of the group its result. Before it, each thread
// fences at system scope, so the group's writes (the source bytes) are visible to the engine and its copy engines
// once the descriptor is.
template <Scope S, typename Call>
__device__ inline int once(Call call) {
  if constexpr (S == Scope::kThread) {
    __threadfence_system();
    return call();
  } else if constexpr (S == Scope::kWarp) {
    __threadfence_system();
    __syncwarp();
    int result = 0;
    if ((threadIdx.x & 31) == 0) result = call();
    return __shfl_sync(0xffffffffu, result, 0);
  } else {
    __shared__ int result;
    __threadfence_system();
    __syncthreads();
    if (threadIdx.x == 0 && threadIdx.y == 0 && threadIdx.z == 0) result = call();
    __syncthreads();
    const int mine = result;
    __syncthreads();  // `result` may be reused by the block's next call
    return mine;
  }
}

}  // namespace detail

// Copies `bytes` from this rank's window `sourceWindow` at `sourceOffset` to `peer`'s window `targetWindow` at
// `targetOffset`. Returns once posted; the source may change only after quiet.
template <Scope S = Scope::kThread>
__device__ inline int put(const railnet_doorbell_device_t& ctx, int peer, uint32_t targetWindow, uint64_t targetOffset,
                          uint32_t sourceWindow, uint64_t sourceOffset, uint64_t bytes,
                          uint64_t timeoutNs = kDefaultTimeoutNs) {
  return detail::once<S>([&] {
    if (ctx.direct != nullptr) {
      return detail::directProducer(ctx, timeoutNs)
          .postWrite(peer, targetWindow, targetOffset, sourceWindow, sourceOffset, bytes);
    }
    return detail::post(ctx, detail::describe(Op::kPut, peer, targetWindow, targetOffset, sourceWindow, sourceOffset,
                                              bytes, 0, 0),
                        timeoutNs);
  });
}

// A put, then `add` added to `peer`'s signal word `signalIndex` once the bytes (and every earlier put to `peer`) landed.
template <Scope S = Scope::kThread>
__device__ inline int put_signal(const railnet_doorbell_device_t& ctx, int peer, uint32_t targetWindow,
                                 uint64_t targetOffset, uint32_t sourceWindow, uint64_t sourceOffset, uint64_t bytes,
                                 uint32_t signalIndex, uint64_t add, uint64_t timeoutNs = kDefaultTimeoutNs) {
  return detail::once<S>([&] {
    if (ctx.direct != nullptr) {
      return detail::directProducer(ctx, timeoutNs)
          .postWriteFetchAdd(peer, targetWindow, targetOffset, sourceWindow, sourceOffset, bytes, signalIndex, add);
    }
    return detail::post(ctx, detail::describe(Op::kPutSignal, peer, targetWindow, targetOffset, sourceWindow,
                                              sourceOffset, bytes, signalIndex, add),
                        timeoutNs);
  });
}

// Only the signal, ordered after every earlier put to `peer`.
template <Scope S = Scope::kThread>
__device__ inline int signal(const railnet_doorbell_device_t& ctx, int peer, uint32_t signalIndex, uint64_t add,
                             uint64_t timeoutNs = kDefaultTimeoutNs) {
  return detail::once<S>([&] {
    if (ctx.direct != nullptr) return detail::directProducer(ctx, timeoutNs).postFetchAdd(peer, signalIndex, add);
    return detail::post(ctx, detail::describe(Op::kSignal, peer, 0, 0, 0, 0, 0, signalIndex, add), timeoutNs);
  });
}

// This rank's signal word `signalIndex` (what peers added to it).
__device__ inline uint64_t read_signal(const railnet_doorbell_device_t& ctx, uint32_t signalIndex) {
  return detail::loadSystem(ctx.signals + signalIndex);
}

// Waits until this rank's signal word `signalIndex` is at least `atLeast`.
template <Scope S = Scope::kThread>
__device__ inline int wait_signal(const railnet_doorbell_device_t& ctx, uint32_t signalIndex, uint64_t atLeast,
                                  uint64_t timeoutNs = kDefaultTimeoutNs) {
  return detail::once<S>([&] {
    if (signalIndex >= ctx.signal_count) return static_cast<int>(RAILNET_DOORBELL_BAD_DESCRIPTOR);
    return detail::waitUntil(ctx, timeoutNs, [&] { return read_signal(ctx, signalIndex) >= atLeast; });
  });
}

// Waits until every operation posted before it, by any thread, has completed locally.
template <Scope S = Scope::kThread>
__device__ inline int quiet(const railnet_doorbell_device_t& ctx, uint64_t timeoutNs = kDefaultTimeoutNs) {
  return detail::once<S>([&] {
    if (ctx.direct != nullptr) return detail::directProducer(ctx, timeoutNs).quietQueues();
    uint64_t ticket = 0;
    const int posted =
        detail::post(ctx, detail::describe(Op::kQuiet, 0, 0, 0, 0, 0, 0, 0, 0), timeoutNs, &ticket);
    if (posted != RAILNET_DOORBELL_OK) return posted;
    RingControl* ring = detail::control(ctx);
    return detail::waitUntil(ctx, timeoutNs, [&] { return detail::loadSystem(&ring->completed) > ticket; });
  });
}

// The context's sticky error, else (direct path) the first failed peer queue's (0: none).
__device__ inline int error(const railnet_doorbell_device_t& ctx) {
  if (ctx.direct != nullptr) return detail::directProducer(ctx, 0).error();
  return detail::ringError(ctx);
}

}  // namespace railnet::doorbell::device
