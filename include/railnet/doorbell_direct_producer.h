// The producer of railnet's mlx5 direct path (railnet/doorbell_direct.h): posts RDMA WRITEs and fetch-and-adds to
// a peer's RC send queue and rings its doorbell, following that header's five-step protocol. Header-only, written
// once over a memory-access policy `Memory` so that the same code runs in kernels (DeviceMemory, in
// railnet/doorbell_direct_device.cuh, used by railnet/doorbell_device.cuh) and on CPU threads (HostMemory below,
// which tests/unit/test_doorbell_direct.cc drives against a fake NIC). A policy is a type with static functions:
//   uint64_t fetchAddDevice(uint64_t* word, uint64_t add)  atomic among the producers (one GPU: device scope)
//   T loadAcquireSystem(const T* word)                      (T: uint32_t, uint64_t) what the poller or NIC wrote
//   void storeReleaseSystem(T* word, T value)               seen by the NIC / other producers after earlier writes
//   void fenceSystem()                                      earlier writes before later ones, for every observer
//   void storeMmio64(uint64_t* reg, uint64_t value)         one 8-byte store to the UAR doorbell register
//   void pause()                                            backs off inside a wait
//   uint64_t nowNs()                                        a monotonic clock for the waits' limit
//
// Every call returns RAILNET_DOORBELL_OK or a code of railnet/doorbell.h: BAD_DESCRIPTOR for a peer, window or
// signal it cannot name (nothing posted), the queue's `error` or the context's error word, or TIMEOUT when one of
// its waits (room in the ring, its turn to ring) ran past `timeoutNs`. Once a post has reserved its WQEBBs, a
// failure leaves them reserved and never rung: the queue is lost, as on a CQE error, and a post that timed out
// marks it STALLED so that every later post to that peer fails at once.
//
// NOT RUN ON HARDWARE: checked on the host against a fake NIC and rdma-core's mlx5dv.h, never posted to a ConnectX.
#pragma once

#include <stdint.h>

#include "railnet/doorbell.h"
#include "railnet/doorbell_direct.h"
#include "railnet/host_device.h"
#include "railnet/mlx5_wqe.h"

#if !defined(__CUDA_ARCH__)
#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#endif

namespace railnet::doorbell::direct {

// The most bytes one RDMA WRITE WQE carries: ConnectX's max_msg_sz (1 GiB). A longer put takes several WQEs, all
// in one reservation and rung by one doorbell.
inline constexpr uint64_t kMaxWriteBytes = 1ull << 30;

// The bytes of one WQEBB built in local memory (registers on a GPU) before it goes to its slot.
struct alignas(64) Wqebb {
  unsigned char bytes[mlx5::kWqebbBytes];
};

// Copies a built WQEBB to its slot in the send queue: four 16-byte stores on a GPU (few PCIe writes).
RAILNET_HOST_DEVICE inline void storeWqebb(void* slot, const Wqebb& wqebb) {
#if defined(__CUDA_ARCH__)
  const uint4* from = reinterpret_cast<const uint4*>(wqebb.bytes);
  uint4* to = static_cast<uint4*>(slot);
  to[0] = from[0];
  to[1] = from[1];
  to[2] = from[2];
  to[3] = from[3];
#else
  std::memcpy(slot, wqebb.bytes, sizeof(wqebb.bytes));
#endif
}

template <class Memory>
class DirectProducer {
 public:
  // view: the context's direct view; nranks: the peers it has queues to; signalCount: each rank's signal words;
  // contextError: the context's sticky error word (a RAILNET_DOORBELL_* code, 0: none), read in every wait, or
  // nullptr; timeoutNs: the limit of each wait.
  RAILNET_HOST_DEVICE DirectProducer(const DirectView& view, int32_t nranks, uint32_t signalCount,
                                     const uint32_t* contextError, uint64_t timeoutNs)
      : view_(view), nranks_(nranks), signalCount_(signalCount), contextError_(contextError), timeoutNs_(timeoutNs) {}

  // `bytes` from this rank's window `sourceWindow` at `sourceOffset` to `peer`'s window `targetWindow` at
  // `targetOffset`: one RDMA WRITE WQE per kMaxWriteBytes, none for 0 bytes (nothing to order: an RC queue keeps
  // later WQEs behind earlier ones anyway).
  RAILNET_HOST_DEVICE int postWrite(int peer, uint32_t targetWindow, uint64_t targetOffset, uint32_t sourceWindow,
                                    uint64_t sourceOffset, uint64_t bytes) const {
    DirectQueue* queue = nullptr;
    Write write;
    if (const int bad = resolveWrite(peer, targetWindow, targetOffset, sourceWindow, sourceOffset, bytes, &queue,
                                     &write);
        bad != RAILNET_DOORBELL_OK) {
      return bad;
    }
    if (bytes == 0) return failure(queue);
    return post(queue, &write, nullptr);
  }

  // `add` added to `peer`'s signal word `signalIndex`: one ATOMIC fetch-and-add WQE; the old value lands in the
  // atomic sink (never read).
  RAILNET_HOST_DEVICE int postFetchAdd(int peer, uint32_t signalIndex, uint64_t add) const {
    DirectQueue* queue = nullptr;
    FetchAdd fetchAdd;
    if (const int bad = resolveFetchAdd(peer, signalIndex, add, &queue, &fetchAdd); bad != RAILNET_DOORBELL_OK) {
      return bad;
    }
    return post(queue, nullptr, &fetchAdd);
  }

  // put_signal: the write's WQE(s) and the fetch-and-add reserved together and rung by one doorbell. An RC
  // responder executes a QP's requests in order, but into GPU memory that is not enough: the data goes to the GPU
  // and the atomic to the signal word in host memory, along different PCIe paths, so the signal could be seen
  // first. For a target in GPU memory an RDMA READ of the write's last bytes goes between them, and the atomic
  // carries the fence bit (it waits for the READ's response, which the responder sends only after the data it
  // reads, and so the write before it, has reached the GPU).
  RAILNET_HOST_DEVICE int postWriteFetchAdd(int peer, uint32_t targetWindow, uint64_t targetOffset,
                                            uint32_t sourceWindow, uint64_t sourceOffset, uint64_t bytes,
                                            uint32_t signalIndex, uint64_t add) const {
    DirectQueue* queue = nullptr;
    Write write;
    FetchAdd fetchAdd;
    if (const int bad = resolveWrite(peer, targetWindow, targetOffset, sourceWindow, sourceOffset, bytes, &queue,
                                     &write);
        bad != RAILNET_DOORBELL_OK) {
      return bad;
    }
    if (const int bad = resolveFetchAdd(peer, signalIndex, add, &queue, &fetchAdd); bad != RAILNET_DOORBELL_OK) {
      return bad;
    }
    return post(queue, bytes == 0 ? nullptr : &write, &fetchAdd);
  }

  // Waits until every WQE reserved on any queue before the call has completed (its CQE polled into `completed`).
  RAILNET_HOST_DEVICE int quietQueues() const {
    for (int32_t peer = 0; peer < nranks_; ++peer) {
      const DirectQueue* queue = view_.queues + peer;
      if (queue->depth == 0) continue;  // this rank's own entry
      const uint64_t reserved = Memory::loadAcquireSystem(&queue->reserved);
      const int done = wait(queue, [&] { return Memory::loadAcquireSystem(&queue->completed) >= reserved; });
      if (done != RAILNET_DOORBELL_OK) return done;
    }
    return RAILNET_DOORBELL_OK;
  }

  // The context's error, else the first queue's error (0: none).
  RAILNET_HOST_DEVICE int error() const {
    if (const int context = contextFailure(); context != RAILNET_DOORBELL_OK) return context;
    for (int32_t peer = 0; peer < nranks_; ++peer) {
      const DirectQueue* queue = view_.queues + peer;
      if (queue->depth == 0) continue;
      if (const uint32_t failed = Memory::loadAcquireSystem(&queue->error); failed != 0) {
        return static_cast<int>(failed);
      }
    }
    return RAILNET_DOORBELL_OK;
  }

 private:
  struct Write {
    mlx5::LocalBuffer source;
    mlx5::RemoteBuffer target;
    uint64_t bytes;
    bool targetInGpuMemory;
  };
  struct FetchAdd {
    mlx5::LocalBuffer sink;
    mlx5::RemoteBuffer target;
    uint64_t add;
  };

  RAILNET_HOST_DEVICE int resolvePeer(int peer, DirectQueue** queue) const {
    if (peer < 0 || peer >= nranks_) return RAILNET_DOORBELL_BAD_DESCRIPTOR;
    *queue = view_.queues + peer;
    // depth 0: no queue (this rank's own entry): the direct path has no loopback.
    if ((*queue)->depth == 0) return RAILNET_DOORBELL_BAD_DESCRIPTOR;
    return RAILNET_DOORBELL_OK;
  }

  // Keys and addresses of a write. Only the window indices and `valid` can be checked here: a DirectKey has no
  // size, so a range outside a window is posted as given and the NIC's memory-region bounds check turns it into an
  // error completion (the queue's error: RAILNET_DOORBELL_PEER_FAILED, not BAD_DESCRIPTOR).
  RAILNET_HOST_DEVICE int resolveWrite(int peer, uint32_t targetWindow, uint64_t targetOffset, uint32_t sourceWindow,
                                       uint64_t sourceOffset, uint64_t bytes, DirectQueue** queue,
                                       Write* write) const {
    if (const int bad = resolvePeer(peer, queue); bad != RAILNET_DOORBELL_OK) return bad;
    if (targetWindow >= view_.maxWindows || sourceWindow >= view_.maxWindows) return RAILNET_DOORBELL_BAD_DESCRIPTOR;
    const DirectKey source = view_.localWindows[sourceWindow];
    const DirectKey target = view_.remoteWindows[static_cast<uint64_t>(peer) * view_.maxWindows + targetWindow];
    if (source.valid == 0 || target.valid == 0) return RAILNET_DOORBELL_BAD_DESCRIPTOR;
    write->source = {source.address + sourceOffset, source.key};
    write->target = {target.address + targetOffset, target.key};
    write->bytes = bytes;
    write->targetInGpuMemory = target.valid == kKeyGpuMemory;
    return RAILNET_DOORBELL_OK;
  }

  RAILNET_HOST_DEVICE int resolveFetchAdd(int peer, uint32_t signalIndex, uint64_t add, DirectQueue** queue,
                                          FetchAdd* fetchAdd) const {
    if (const int bad = resolvePeer(peer, queue); bad != RAILNET_DOORBELL_OK) return bad;
    if (signalIndex >= signalCount_) return RAILNET_DOORBELL_BAD_DESCRIPTOR;
    const DirectKey signals = view_.remoteSignals[peer];
    const DirectKey sink = view_.atomicSink;
    if (signals.valid == 0 || sink.valid == 0) return RAILNET_DOORBELL_BAD_DESCRIPTOR;
    fetchAdd->sink = {sink.address, sink.key};
    fetchAdd->target = {signals.address + static_cast<uint64_t>(signalIndex) * sizeof(uint64_t), signals.key};
    fetchAdd->add = add;
    return RAILNET_DOORBELL_OK;
  }

  RAILNET_HOST_DEVICE int contextFailure() const {
    return contextError_ == nullptr ? RAILNET_DOORBELL_OK : static_cast<int>(Memory::loadAcquireSystem(contextError_));
  }

  // The queue's error, else the context's (0: none).
  RAILNET_HOST_DEVICE int failure(const DirectQueue* queue) const {
    if (const uint32_t failed = Memory::loadAcquireSystem(&queue->error); failed != 0) return static_cast<int>(failed);
    return contextFailure();
  }

  // Polls `ready` until it holds, the queue or the context fails, or timeoutNs passes (the clock is read only
  // once the first poll failed).
  template <class Ready>
  RAILNET_HOST_DEVICE int wait(const DirectQueue* queue, Ready ready) const {
    uint64_t startNs = 0;
    for (uint32_t round = 0;; ++round) {
      if (ready()) return RAILNET_DOORBELL_OK;
      if (const int failed = failure(queue); failed != RAILNET_DOORBELL_OK) return failed;
      const uint64_t now = Memory::nowNs();
      if (round == 0) {
        startNs = now;
      } else if (now - startNs >= timeoutNs_) {
        return RAILNET_DOORBELL_TIMEOUT;
      }
      if (round >= 64) Memory::pause();  // after a short spin, leave the issue slots (or the CPU) to others
    }
  }

  // A post that gives up after reserving leaves its WQEBBs never rung, so no later post to the peer can ring
  // either: after its own limit, it marks the queue STALLED so that they fail at once, as the ring reports a
  // stalled producer. (A load then a store: an error the poller sets in between is overwritten, and the context's
  // error word, which the poller sets too, still names it.)
  RAILNET_HOST_DEVICE int abandon(DirectQueue* queue, int status) const {
    if (status == RAILNET_DOORBELL_TIMEOUT && Memory::loadAcquireSystem(&queue->error) == 0) {
      Memory::storeReleaseSystem(&queue->error, static_cast<uint32_t>(RAILNET_DOORBELL_STALLED));
    }
    return status;
  }

  // The protocol of railnet/doorbell_direct.h for `write` (nullptr: none; else bytes > 0) then `fetchAdd`
  // (nullptr: none), in one reservation.
  RAILNET_HOST_DEVICE int post(DirectQueue* queue, const Write* write, const FetchAdd* fetchAdd) const {
    const uint64_t writeWqes =
        write == nullptr ? 0 : write->bytes / kMaxWriteBytes + (write->bytes % kMaxWriteBytes != 0 ? 1 : 0);
    // put_signal into GPU memory: a READ of the write's last (up to 8) bytes into the sink, then a fenced atomic.
    const bool readBack = write != nullptr && fetchAdd != nullptr && write->targetInGpuMemory;
    const uint64_t n = writeWqes + (readBack ? 1 : 0) + (fetchAdd != nullptr ? 1 : 0);  // one WQEBB per WQE
    const uint32_t depth = queue->depth;
    if (n > depth) return RAILNET_DOORBELL_BAD_DESCRIPTOR;  // never fits: they share one reservation
    if (const int failed = failure(queue); failed != RAILNET_DOORBELL_OK) return failed;  // reserve nothing then
    const uint32_t qpn = queue->qpn;
    // 1. Reserve.
    const uint64_t start = Memory::fetchAddDevice(&queue->reserved, n);
    // 2. Room: the slots' previous WQEs have completed.
    int status = wait(queue, [&] { return start + n - Memory::loadAcquireSystem(&queue->completed) <= depth; });
    if (status != RAILNET_DOORBELL_OK) return abandon(queue, status);
    // 3. The WQEs, each built in local memory and stored whole; every one asks for a CQE.
    uint64_t registerValue = 0;
    for (uint64_t i = 0; i < n; ++i) {
      const uint64_t index = start + i;
      const mlx5::Post wqe{static_cast<uint16_t>(index & 0xffff), qpn, mlx5::kCtrlCqUpdate};
      Wqebb built{};
      if (i < writeWqes) {
        const uint64_t offset = i * kMaxWriteBytes;
        const uint64_t left = write->bytes - offset;
        mlx5::buildWrite(built.bytes, wqe, {write->source.address + offset, write->source.lkey},
                         {write->target.address + offset, write->target.rkey},
                         static_cast<uint32_t>(left < kMaxWriteBytes ? left : kMaxWriteBytes));
      } else if (readBack && i == writeWqes) {
        const uint64_t tail = write->bytes < 8 ? write->bytes : 8;
        mlx5::buildRead(built.bytes, wqe, {fetchAdd->sink.address + 8, fetchAdd->sink.lkey},
                        {write->target.address + write->bytes - tail, write->target.rkey}, static_cast<uint32_t>(tail));
      } else {
        const mlx5::Post fenced{wqe.wqeIndex, wqe.qpn,
                                static_cast<uint8_t>(wqe.fmCeSe | (readBack ? mlx5::kCtrlFence : 0))};
        mlx5::buildFetchAdd(built.bytes, fenced, fetchAdd->sink, fetchAdd->target, fetchAdd->add);
      }
      storeWqebb(mlx5::wqebbAt(queue->wqes, depth, static_cast<uint32_t>(index)), built);
      registerValue = mlx5::doorbellRegisterValue(reinterpret_cast<const mlx5::Ctrl*>(built.bytes));
    }
    Memory::fenceSystem();  // the WQEs before any index that names them
    // 4. Doorbells in slot order: wait for the posts before this one to have rung theirs.
    status = wait(queue, [&] { return Memory::loadAcquireSystem(&queue->rung) == start; });
    if (status != RAILNET_DOORBELL_OK) return abandon(queue, status);
    // 5. The record (the next free WQEBB), the register (this batch's last WQE), then the next producer's turn.
    Memory::storeReleaseSystem(queue->doorbellRecord + 1, mlx5::doorbellRecordValue(static_cast<uint16_t>(start + n)));
    Memory::fenceSystem();
    Memory::storeMmio64(queue->doorbellRegister, registerValue);
    Memory::storeReleaseSystem(&queue->rung, start + n);
    return RAILNET_DOORBELL_OK;
  }

  const DirectView& view_;
  int32_t nranks_;
  uint32_t signalCount_;
  const uint32_t* contextError_;
  uint64_t timeoutNs_;
};

#if !defined(__CUDA_ARCH__) && defined(__cpp_lib_atomic_ref)
// The host policy: CPU threads as producers (tests; a host-side poster). Needs C++20's std::atomic_ref, so nvcc's
// host pass at -std=c++17 does without it (kernels use DeviceMemory).
struct HostMemory {
  static uint64_t fetchAddDevice(uint64_t* word, uint64_t add) {
    return std::atomic_ref<uint64_t>(*word).fetch_add(add, std::memory_order_relaxed);
  }
  template <typename T>
  static T loadAcquireSystem(const T* word) {
    return std::atomic_ref<T>(*const_cast<T*>(word)).load(std::memory_order_acquire);
  }
  template <typename T>
  static void storeReleaseSystem(T* word, T value) {
    std::atomic_ref<T>(*word).store(value, std::memory_order_release);
  }
  static void fenceSystem() {
#if defined(__SANITIZE_THREAD__)
    // TSan does not model fences (GCC's -Wtsan, an error with werror): a seq_cst read-modify-write instead, a full
    // barrier on x86. The protocol's happens-before edges are its release stores and acquire loads either way.
    static std::atomic<uint32_t> barrier{0};
    barrier.fetch_add(0, std::memory_order_seq_cst);
#else
    std::atomic_thread_fence(std::memory_order_seq_cst);
#endif
  }
  // Real UAR pages are write-combining I/O memory: a CPU producer would need an sfence after this store (rdma-core's
  // mmio_flush_writes). The tests' register is plain memory.
  static void storeMmio64(uint64_t* reg, uint64_t value) {
    std::atomic_ref<uint64_t>(*reg).store(value, std::memory_order_relaxed);
  }
  static void pause() { std::this_thread::yield(); }
  static uint64_t nowNs() {
    return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                     std::chrono::steady_clock::now().time_since_epoch())
                                     .count());
  }
};
#endif

}  // namespace railnet::doorbell::direct
