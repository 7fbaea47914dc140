// Kernels of railnet-doorbell-allreduce (doorbell_allreduce.cu): a ring all-reduce (reduce-scatter, then
// all-gather) of float sums whose inter-node hops are railnet doorbell put_signals (railnet/doorbell_device.cuh)
// and whose intra-node hops are either doorbells too or plain stores into the next GPU's memory over CUDA IPC
// (NVLink / P2P) with a flag word per signal; and the fill and compare kernels of the check.
//
// Layout, the same on every rank (so a sender computes the receiver's offsets): the window (registered with the
// doorbell context, and for nvlink hops mapped by the same-node neighbour through CUDA IPC) holds the data,
// `count` floats at offset 0, then, at `stageOffset`, the staging slots: (R - 1) per channel, one per
// reduce-scatter step, each `slotFloats` long. A channel is one CUDA block: channel ch walks the ring forward
// (ch even) or backward (ch odd) and owns floats [cut(count, C, ch), cut(count, C, ch + 1)) of the buffer, split
// into R chunks, each split into `pieces` pieces (the pipelining unit). Signal word / flag word of channel ch:
// 2 ch (reduce-scatter) and 2 ch + 1 (all-gather). Every (channel, phase) word receives exactly (R - 1) * pieces
// signals per all-reduce, from one sender only, in order; the host keeps the running total (`base`) and the kernel
// waits for base + the signals of this call so far (doorbell signals only grow, and nvlink senders store that same
// running total into the flag).
#pragma once

#include <cuda/atomic>
#include <stdint.h>

#include "railnet/doorbell_device.cuh"

namespace allreduce {

namespace db = railnet::doorbell::device;

constexpr int kThreads = 512;
constexpr uint64_t kAlign = 64;  // floats: every channel, chunk and piece starts on a 256-byte boundary

// Start of part i when n floats are split into `parts` (part `parts` starts at n): aligned down to kAlign, so parts
// may differ in length by up to kAlign floats and a part may be empty; the host and every rank compute the same.
__host__ __device__ inline uint64_t cut(uint64_t n, uint64_t parts, uint64_t i) {
  return i >= parts ? n : (n * i / parts) & ~(kAlign - 1);
}

// Which call of the kernel failed (Report::where).
enum Where : int { kRsSend = 1, kRsWait = 2, kAgSend = 3, kAgWait = 4, kQuietEnd = 5 };

// Mapped host memory: the first failure of any block (the host reads it even while a kernel hangs).
struct Report {
  int status;  // RAILNET_DOORBELL_* (0: all OK)
  int where;   // Where
  int channel;
  int step;    // reduce-scatter or all-gather step
  int piece;
  int pad;
};

// One ring direction's outgoing hop.
struct Hop {
  int peer;            // the next rank of the ring (doorbell rank)
  char* ipcWindow;     // nvlink hop: the next rank's window, mapped here by CUDA IPC; nullptr: a doorbell hop
  uint64_t* ipcFlags;  // nvlink hop: the next rank's flag words (GPU memory, mapped here)
};

// Everything a kernel needs, by value.
struct Plan {
  railnet_doorbell_device_t ctx;
  uint32_t window;       // the window's doorbell index (the same on every rank)
  char* myWindow;        // this rank's window
  uint64_t* myFlags;     // this rank's flag words, written by the previous rank of an nvlink hop
  Hop out[2];            // by direction: 0 forward, 1 backward
  int inIpc[2];          // by direction: the incoming hop is nvlink (poll myFlags), else doorbell signals
  int pos[2];            // this rank's position in each direction's ring
  int R;                 // ranks
  int pieces;            // pieces per chunk
  uint64_t count;        // floats
  uint64_t stageOffset;  // bytes, from the window's start
  uint64_t slotFloats;   // one staging slot
  uint64_t base;         // signals each (channel, phase) word received before this call
  uint64_t timeoutNs;    // every wait and post
  Report* report;
};

__device__ inline void note(const Plan& plan, int status, int where, int channel, int step, int piece) {
  if (threadIdx.x != 0) return;
  if (atomicCAS(&plan.report->status, 0, status) == 0) {
    plan.report->where = where;
    plan.report->channel = channel;
    plan.report->step = step;
    plan.report->piece = piece;
  }
}

// Loads bypass L1 (__ldcg): the data may have been written by a peer GPU or railnet's engine during this kernel.
__device__ inline void copyTo(float* __restrict__ to, const float* __restrict__ from, uint64_t n) {
  const uint64_t n4 = n / 4, stride = blockDim.x;
  const float4* f4 = reinterpret_cast<const float4*>(from);
  float4* t4 = reinterpret_cast<float4*>(to);
  uint64_t i = threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    const float4 a = __ldcg(f4 + i), b = __ldcg(f4 + i + stride), c = __ldcg(f4 + i + 2 * stride),
                 e = __ldcg(f4 + i + 3 * stride);
    t4[i] = a;
    t4[i + stride] = b;
    t4[i + 2 * stride] = c;
    t4[i + 3 * stride] = e;
  }
  for (; i < n4; i += stride) t4[i] = __ldcg(f4 + i);
  for (uint64_t t = n4 * 4 + threadIdx.x; t < n; t += stride) to[t] = __ldcg(from + t);
}

__device__ inline float4 add4(float4 a, float4 b) { return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w); }

// data += staged; the sums also go to `remote` (the next rank's memory, nvlink hop) when it is not null.
__device__ inline void reduceInto(float* __restrict__ data, const float* __restrict__ staged,
                                  float* __restrict__ remote, uint64_t n) {
  const uint64_t n4 = n / 4, stride = blockDim.x;
  float4* d4 = reinterpret_cast<float4*>(data);
  const float4* s4 = reinterpret_cast<const float4*>(staged);
  float4* r4 = reinterpret_cast<float4*>(remote);
  uint64_t i = threadIdx.x;
  for (; i + 3 * stride < n4; i += 4 * stride) {
    float4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = __ldcg(d4 + i + u * stride);
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = add4(v[u], __ldcg(s4 + i + u * stride));
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      d4[i + u * stride] = v[u];
      if (remote != nullptr) r4[i + u * stride] = v[u];
    }
  }
  for (; i < n4; i += stride) {
    const float4 v = add4(__ldcg(d4 + i), __ldcg(s4 + i));
    d4[i] = v;
    if (remote != nullptr) r4[i] = v;
  }
  for (uint64_t t = n4 * 4 + threadIdx.x; t < n; t += stride) {
    const float v = __ldcg(data + t) + __ldcg(staged + t);
    data[t] = v;
    if (remote != nullptr) remote[t] = v;
  }
}

// nvlink hop, after the block's stores to the next rank: every thread fences at system scope, then one thread
// publishes the running total (the flag has one writer, so a release store of the value, no P2P atomic).
__device__ inline void raiseFlag(uint64_t* flag, uint64_t value) {
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0)
    cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*flag).store(value, cuda::memory_order_release);
}

// Block scope: thread 0 polls the flag (acquire, %globaltimer-bounded; it also stops on the doorbell ring's sticky
// error), every thread gets the result.
__device__ inline int waitFlag(const Plan& plan, uint64_t* flag, uint64_t atLeast) {
  __shared__ int result;
  if (threadIdx.x == 0)
    result = db::detail::waitUntil(plan.ctx, plan.timeoutNs, [&] {
      return cuda::atomic_ref<uint64_t, cuda::thread_scope_system>(*flag).load(cuda::memory_order_acquire) >= atLeast;
    });
  __syncthreads();
  const int mine = result;
  __syncthreads();
  return mine;
}

// Sends `n` floats at `srcFloat` of this rank's data to byte offset `dstByte` of the next rank's window and adds
// one to its word `word` (the nvlink path stores the running total `total` instead). `copy`: false when the block
// already stored the bytes to the next rank (the fused reduce of an nvlink hop).
__device__ inline int deliver(const Plan& plan, int d, uint32_t word, uint64_t srcFloat, uint64_t dstByte, uint64_t n,
                              uint64_t total, bool copy) {
  const Hop& out = plan.out[d];
  if (out.ipcWindow != nullptr) {
    if (copy)
      copyTo(reinterpret_cast<float*>(out.ipcWindow + dstByte),
             reinterpret_cast<const float*>(plan.myWindow) + srcFloat, n);
    raiseFlag(out.ipcFlags + word, total);
    return RAILNET_DOORBELL_OK;
  }
  // Block scope: fences the block's earlier writes of the source (a fused reduce just wrote it) before posting.
  return db::put_signal<db::Scope::kBlock>(plan.ctx, out.peer, plan.window, dstByte, plan.window,
                                           srcFloat * sizeof(float), n * sizeof(float), word, 1, plan.timeoutNs);
}

__device__ inline int await(const Plan& plan, int d, uint32_t word, uint64_t atLeast) {
  if (plan.inIpc[d]) return waitFlag(plan, plan.myFlags + word, atLeast);
  return db::wait_signal<db::Scope::kBlock>(plan.ctx, word, atLeast, plan.timeoutNs);
}

// One all-reduce, in place on the window's data; one block per channel (gridDim.x channels, an even number).
//
// Ring position p (of R) in this channel's direction, chunks k = 0..R-1 of the channel, P pieces per chunk:
//   reduce-scatter step s = 0..R-2: send chunk (p - s) to the next rank's staging slot s; receive chunk (p - s - 1)
//     into this rank's slot s and add it into the data. Step 0 sends the input as is; step s + 1 sends what step s
//     just reduced, piece by piece, so the steps pipeline. After step R-2, chunk (p + 1) is complete.
//   all-gather step s = 0..R-2: send chunk (p + 1 - s) straight into the next rank's data at the same place
//     (step 0: the complete chunk, right after its last reduction); receive chunk (p - s) into the data.
// Waits (piece j of step s of a phase) are for base + s * P + j + 1: the sender posts that phase's pieces in
// exactly this order, and a doorbell signal is applied only after its bytes and every earlier put to that peer
// have landed, so "the word reached v" means "the first v - base pieces are here".
//
// No deadlock: every rank posts all of reduce-scatter step 0 before its first wait, and a rank's post of piece j of
// any later step follows only its own wait for piece j of the step before, which the previous rank posts on the
// same terms: induction over (step, piece).
//
// No region is overwritten while something may still read it (a doorbell put reads its source asynchronously until
// it lands):
//   - staging slot s of an all-reduce is written once (step s) and read once by its owner; the next all-reduce
//     writes it again only after a host barrier that follows every rank's previous kernel.
//   - a chunk this rank put (reduce-scatter step s sends chunk p - s) is overwritten only by the all-gather put of
//     step s from the previous rank. That put follows, by the chain of waits around the ring, the next rank's
//     wait for this rank's reduce-scatter put of step s: the source had been read (it landed). The chunk a
//     reduce-scatter step reduces into, p - s - 1, is one this rank has not sent yet in that call.
//   - the all-gather sends chunks received earlier in the same call, never written again in it.
//   - at the end, a block whose hop is a doorbell waits for `quiet`: its puts have all read their sources, so the
//     host may reset the data for the next all-reduce right after the kernel. (Puts into this rank's memory have
//     all landed: the kernel waited for each.)
__global__ void __launch_bounds__(kThreads) kRingAllReduce(Plan plan) {
  const int ch = blockIdx.x, d = ch & 1, R = plan.R, P = plan.pieces, p = plan.pos[d];
  const uint64_t chBegin = cut(plan.count, gridDim.x, ch);
  const uint64_t chLen = cut(plan.count, gridDim.x, ch + 1) - chBegin;
  const uint32_t rsWord = 2 * ch, agWord = 2 * ch + 1;
  const uint64_t firstSlot = uint64_t(ch) * (R - 1);  // this channel's staging slot of step 0
  const uint64_t base = plan.base;
  const bool nvlinkOut = plan.out[d].ipcWindow != nullptr;
  float* data = reinterpret_cast<float*>(plan.myWindow);
  const float* stage = reinterpret_cast<const float*>(plan.myWindow + plan.stageOffset);
  float* nextData = reinterpret_cast<float*>(plan.out[d].ipcWindow);
  float* nextStage = nvlinkOut ? reinterpret_cast<float*>(plan.out[d].ipcWindow + plan.stageOffset) : nullptr;

  // Piece j of chunk k: returns its first float in the data; *inChunk, its offset in the chunk (and in a slot).
  auto piece = [&](int k, int j, uint64_t* inChunk, uint64_t* n) {
    const uint64_t chunkBegin = cut(chLen, R, k), chunkLen = cut(chLen, R, k + 1) - chunkBegin;
    *inChunk = cut(chunkLen, P, j);
    *n = cut(chunkLen, P, j + 1) - *inChunk;
    return chBegin + chunkBegin + *inChunk;
  };
  auto slotFloat = [&](int step, uint64_t inChunk) { return (firstSlot + step) * plan.slotFloats + inChunk; };
  auto mod = [&](int x) { return ((x % R) + R) % R; };

  uint64_t inChunk = 0, n = 0;
  // Reduce-scatter step 0: this rank's own chunk p, as it is, into the next rank's slot 0.
  for (int j = 0; j < P; ++j) {
    const uint64_t at = piece(p, j, &inChunk, &n);
    const int st = deliver(plan, d, rsWord, at, plan.stageOffset + slotFloat(0, inChunk) * sizeof(float), n,
                           base + j + 1, true);
    if (st != RAILNET_DOORBELL_OK) return note(plan, st, kRsSend, ch, 0, j);
  }
  // Reduce-scatter steps: wait, add, send the sum on (the last step's sum is complete: all-gather step 0).
  for (int s = 0; s <= R - 2; ++s) {
    const int k = mod(p - s - 1);
    const bool last = s == R - 2;
    for (int j = 0; j < P; ++j) {
      const uint64_t at = piece(k, j, &inChunk, &n);
      int st = await(plan, d, rsWord, base + uint64_t(s) * P + j + 1);
      if (st != RAILNET_DOORBELL_OK) return note(plan, st, kRsWait, ch, s, j);
      float* remote = !nvlinkOut ? nullptr : last ? nextData + at : nextStage + slotFloat(s + 1, inChunk);
      reduceInto(data + at, stage + slotFloat(s, inChunk), remote, n);
      if (last)
        st = deliver(plan, d, agWord, at, at * sizeof(float), n, base + j + 1, false);
      else
        st = deliver(plan, d, rsWord, at, plan.stageOffset + slotFloat(s + 1, inChunk) * sizeof(float), n,
                     base + uint64_t(s + 1) * P + j + 1, false);
      if (st != RAILNET_DOORBELL_OK) return note(plan, st, last ? kAgSend : kRsSend, ch, last ? 0 : s + 1, j);
    }
  }
  // All-gather steps: wait for chunk p - s, forward it (except at the last step: it came from where it started).
  for (int s = 0; s <= R - 2; ++s) {
    const int k = mod(p - s);
    for (int j = 0; j < P; ++j) {
      const uint64_t at = piece(k, j, &inChunk, &n);
      int st = await(plan, d, agWord, base + uint64_t(s) * P + j + 1);
      if (st != RAILNET_DOORBELL_OK) return note(plan, st, kAgWait, ch, s, j);
      if (s == R - 2) continue;
      st = deliver(plan, d, agWord, at, at * sizeof(float), n, base + uint64_t(s + 1) * P + j + 1, true);
      if (st != RAILNET_DOORBELL_OK) return note(plan, st, kAgSend, ch, s + 1, j);
    }
  }
  if (!nvlinkOut) {
    const int st = db::quiet<db::Scope::kBlock>(plan.ctx, plan.timeoutNs);
    if (st != RAILNET_DOORBELL_OK) note(plan, st, kQuietEnd, ch, R - 1, 0);
  }
}

// Rank r's input: (r + 1) * ((i % 13) + 1), small integers, so every summation order gives the exact sum.
__global__ void kFillInput(float* in, uint64_t n, int rank) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x)
    in[i] = float(rank + 1) * float(i % 13 + 1);
}

// counts[0]: words where the ring's and NCCL's outputs differ bitwise; counts[1], counts[2]: words of each that
// differ from the closed form ((i % 13) + 1) * R (R + 1) / 2.
__global__ void kCompare(const float* ring, const float* nccl, uint64_t n, float rankSum,
                         unsigned long long* counts) {
  unsigned long long bits = 0, ringBad = 0, ncclBad = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < n; i += uint64_t(gridDim.x) * blockDim.x) {
    const float a = ring[i], b = nccl[i], expected = float(i % 13 + 1) * rankSum;
    bits += __float_as_uint(a) != __float_as_uint(b);
    ringBad += a != expected;
    ncclBad += b != expected;
  }
  if (bits != 0) atomicAdd(counts, bits);
  if (ringBad != 0) atomicAdd(counts + 1, ringBad);
  if (ncclBad != 0) atomicAdd(counts + 2, ncclBad);
}

}  // namespace allreduce
