// The device half of railnet-gin-device-test (gin_device_test.cu): constants both halves share, the result
// structs the kernels fill, the pattern, and every kernel. Included once, by gin_device_test.cu (the device API is
// header-only: no -rdc).
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <stddef.h>
#include <stdint.h>

namespace gin_test {

// ----------------------------------------------------------------------------------------------------------------
// Constants shared by host and device.

constexpr ncclGinSignal_t kSigData = 0;  // SignalInc only: put+signal, many puts, flush, counter, bandwidth data
constexpr ncclGinSignal_t kSigAdd = 1;   // SignalAdd only
constexpr ncclGinSignal_t kSigAck = 2;   // SignalInc only: bandwidth acks
constexpr ncclGinSignal_t kSigPing = 3;  // SignalInc only: round trip
constexpr int kSignalCount = 4;
constexpr ncclGinCounter_t kCtrPut = 0;
constexpr int kCounterCount = 1;
constexpr int kCounterBits = 56;  // gin.h: "Counters are restricted to using a maximum of 56 bits"

constexpr unsigned char kPoison = 0xA5;     // receive regions are filled with this before every check
constexpr unsigned char kOverwrite = 0x5A;  // what the flush/counter checks write over their source
constexpr uint64_t kAddValue = 1000003;
constexpr uint64_t kAdd64Value = (1ull << 40) + 5;  // exercises the upper 48 bits of the GFD signal value
constexpr size_t kGuardBytes = 4096;                // bytes after a received region that must stay poison
constexpr size_t kMiB = 1ull << 20;

// Device-side result of one GIN kernel.
struct KState {
  unsigned int timedOut;  // 0, or which wait of the kernel timed out (1-based)
  unsigned int pad;
  unsigned long long got, want;  // value seen / wanted at the timeout
  unsigned long long v[4];       // kernel-specific values (see each kernel)
};

// Device-side result of one verification.
struct VState {
  unsigned long long mismatches;  // data bytes that differ from the pattern
  unsigned long long firstBad;    // lowest such index (ULLONG_MAX if none)
  unsigned long long guardBad;    // bytes after the region that are no longer poison
};

// ----------------------------------------------------------------------------------------------------------------
// Device helpers.

__device__ __forceinline__ uint64_t nowNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// v >= least in rolling arithmetic of `bits` bits (the comparison NCCL's waitSignal/waitCounter use).
__host__ __device__ __forceinline__ bool reached(uint64_t v, uint64_t least, int bits) {
  uint64_t m = ~0ull >> (64 - bits);
  return ((v - least) & m) <= (m >> 1);
}

// The data pattern: depends on the byte index and on a key made of the transfer size, the check and the sender.
__device__ __forceinline__ unsigned char patByte(uint64_t idx, uint64_t key) {
  uint64_t x = (idx ^ key) * 0x9E3779B97F4A7C15ull;
  x ^= x >> 29;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 32;
  return (unsigned char)x;
}

uint64_t patKey(uint64_t size, int salt, int srcRank) {
  return (size * 0x100000001B3ull) ^ ((uint64_t)salt << 40) ^ ((uint64_t)(srcRank + 1) << 56) ^ 0x6A09E667F3BCC909ull;
}

__global__ void kFill(unsigned char* p, size_t n, uint64_t key) {
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) p[i] = patByte(i, key);
}

// Checks p[0..n) against the pattern and p[n..n+guard) against kPoison. With chunk != 0 the region is nChunks
// chunks where received chunk j holds sent chunk (j * invMul) % nChunks.
__global__ void kVerify(const unsigned char* p, size_t n, uint64_t key, size_t chunk, unsigned invMul,
                        unsigned nChunks, size_t guard, VState* vs) {
  unsigned long long bad = 0, guardBad = 0, first = ~0ull;
  size_t stride = (size_t)gridDim.x * blockDim.x;
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n + guard; i += stride) {
    unsigned char got = p[i];
    if (i < n) {
      size_t src = i;
      if (chunk != 0) {
        size_t j = i / chunk;
        src = ((j * invMul) % nChunks) * chunk + i % chunk;
      }
      if (got != patByte(src, key)) {
        bad++;
        if (i < first) first = i;
      }
    } else if (got != kPoison) {
      guardBad++;
    }
  }
  if (bad) {
    atomicAdd(&vs->mismatches, bad);
    atomicMin(&vs->firstBad, first);
  }
  if (guardBad) atomicAdd(&vs->guardBad, guardBad);
}

// All threads of the block write v over p[0..n).
__device__ void blockOverwrite(unsigned char* p, size_t n, unsigned char v) {
  size_t head = (16 - ((uintptr_t)p & 15)) & 15;
  if (head > n) head = n;
  for (size_t i = threadIdx.x; i < head; i += blockDim.x) p[i] = v;
  size_t nVec = (n - head) / 16;
  uint4* q = (uint4*)(p + head);
  unsigned w = v * 0x01010101u;
  for (size_t i = threadIdx.x; i < nVec; i += blockDim.x) q[i] = make_uint4(w, w, w, w);
  for (size_t i = head + nVec * 16 + threadIdx.x; i < n; i += blockDim.x) p[i] = v;
}

// Waits until signal `id` reaches `least`, at most timeoutNs; then lets NCCL's waitSignal confirm it (it returns
// at once, with acquire ordering). Records the timeout in st.
__device__ bool waitSignalFor(ncclGin const& gin, ncclGinSignal_t id, uint64_t least, uint64_t timeoutNs,
                              KState* st, unsigned where) {
  uint64_t t0 = nowNs(), v;
  while (!reached(v = gin.readSignal(id), least, 64)) {
    if (nowNs() - t0 > timeoutNs) {
      st->timedOut = where;
      st->got = v;
      st->want = least;
      return false;
    }
  }
  gin.waitSignal(ncclCoopThread(), id, least);
  return true;
}

__device__ bool waitCounterFor(ncclGin const& gin, ncclGinCounter_t id, uint64_t least, uint64_t timeoutNs,
                               KState* st, unsigned where) {
  uint64_t t0 = nowNs(), v;
  least &= ~0ull >> (64 - kCounterBits);
  while (!reached(v = gin.readCounter(id, kCounterBits), least, kCounterBits)) {
    if (nowNs() - t0 > timeoutNs) {
      st->timedOut = where;
      st->got = v;
      st->want = least;
      return false;
    }
  }
  gin.waitCounter(ncclCoopThread(), id, least, kCounterBits);
  return true;
}

// ----------------------------------------------------------------------------------------------------------------
// GIN kernels. All take the ncclDevComm by value and issue operations from one thread (ncclCoopThread), on GIN
// context 0. Every kernel first posts what it sends and then waits for what it receives, so the two ranks' kernels
// can run in any order (or time-sliced on one GPU) without deadlock.

// out[0..3] = the 4 signals, out[4] = counter 0.
__global__ void kReadState(ncclDevComm dc, unsigned long long* out) {
  ncclGin gin(dc, 0);
  for (int i = 0; i < kSignalCount; i++) out[i] = gin.readSignal(i);
  out[kSignalCount] = gin.readCounter(kCtrPut, kCounterBits);
}

// Check 1: one put of n bytes with SignalInc (n == 0: gin.signal only); wait for the peer's.
__global__ void kPutSignal(ncclDevComm dc, ncclWindow_t win, int peer, size_t srcOff, size_t dstOff, size_t n,
                           uint64_t expect, uint64_t timeoutNs, KState* st) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  if (n == 0)
    gin.signal(world, peer, ncclGin_SignalInc{kSigData});
  else
    gin.put(world, peer, win, dstOff, win, srcOff, n, ncclGin_SignalInc{kSigData});
  if (waitSignalFor(gin, kSigData, expect, timeoutNs, st, 1)) gin.flush(ncclCoopThread());
}

// Check 2: nChunks puts without signal, chunk i to destination chunk (i * mul) % nChunks, then one gin.signal.
__global__ void kManyPuts(ncclDevComm dc, ncclWindow_t win, int peer, size_t srcOff, size_t dstOff, size_t chunk,
                          unsigned nChunks, unsigned mul, uint64_t expect, uint64_t timeoutNs, KState* st) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  for (unsigned i = 0; i < nChunks; i++)
    gin.put(world, peer, win, dstOff + (size_t)((i * mul) % nChunks) * chunk, win, srcOff + (size_t)i * chunk, chunk);
  gin.signal(world, peer, ncclGin_SignalInc{kSigData});
  if (waitSignalFor(gin, kSigData, expect, timeoutNs, st, 1)) gin.flush(ncclCoopThread());
}

// Check 3: put with SignalAdd{kAddValue}; wait for base + kAddValue; then a pure signal with SignalAdd{kAdd64Value};
// wait for the sum. v[0] = value after the first wait, v[1] = value after the second.
__global__ void kSignalAdd(ncclDevComm dc, ncclWindow_t win, int peer, size_t srcOff, size_t dstOff, size_t n,
                           uint64_t base, uint64_t timeoutNs, KState* st) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  gin.put(world, peer, win, dstOff, win, srcOff, n, ncclGin_SignalAdd{kSigAdd, kAddValue});
  if (!waitSignalFor(gin, kSigAdd, base + kAddValue, timeoutNs, st, 1)) return;
  st->v[0] = gin.readSignal(kSigAdd);
  gin.signal(world, peer, ncclGin_SignalAdd{kSigAdd, kAdd64Value});
  if (!waitSignalFor(gin, kSigAdd, base + kAddValue + kAdd64Value, timeoutNs, st, 2)) return;
  st->v[1] = gin.readSignal(kSigAdd);
  gin.flush(ncclCoopThread());
}

// Check 4: put (no signal), gin.flush, overwrite the source with kOverwrite (whole block), then gin.signal; the peer
// must still see the original data.
__global__ void kFlushOverwrite(ncclDevComm dc, ncclWindow_t win, int peer, size_t srcOff, size_t dstOff, size_t n,
                                unsigned char* src, uint64_t expect, uint64_t timeoutNs, KState* st) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  if (threadIdx.x == 0) {
    gin.put(world, peer, win, dstOff, win, srcOff, n);
    gin.flush(ncclCoopThread());
  }
  __syncthreads();
  blockOverwrite(src, n, kOverwrite);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    gin.signal(world, peer, ncclGin_SignalInc{kSigData});
    if (waitSignalFor(gin, kSigData, expect, timeoutNs, st, 1)) gin.flush(ncclCoopThread());
  }
}

// Check 5: nChunks puts with CounterInc (no signal); waitCounter(base + nChunks); overwrite the source; gin.signal.
// v[0] = counter after the wait, v[1] = counter at the end (both must be exactly base + nChunks).
__global__ void kCounter(ncclDevComm dc, ncclWindow_t win, int peer, size_t srcOff, size_t dstOff, size_t chunk,
                         unsigned nChunks, unsigned char* src, uint64_t ctrBase, uint64_t expect, uint64_t timeoutNs,
                         KState* st) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  __shared__ bool counted;
  if (threadIdx.x == 0) {
    for (unsigned i = 0; i < nChunks; i++)
      gin.put(world, peer, win, dstOff + (size_t)i * chunk, win, srcOff + (size_t)i * chunk, chunk, ncclGin_None{},
              ncclGin_CounterInc{kCtrPut});
    counted = waitCounterFor(gin, kCtrPut, ctrBase + nChunks, timeoutNs, st, 1);
    if (counted) st->v[0] = gin.readCounter(kCtrPut, kCounterBits);
  }
  __syncthreads();
  if (!counted) return;
  blockOverwrite(src, (size_t)nChunks * chunk, kOverwrite);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    gin.signal(world, peer, ncclGin_SignalInc{kSigData});
    if (!waitSignalFor(gin, kSigData, expect, timeoutNs, st, 2)) return;
    gin.flush(ncclCoopThread());
    st->v[1] = gin.readCounter(kCtrPut, kCounterBits);
  }
}

// Bench (a): signal ping-pong on kSigPing. Rank 0 signals and waits for the answer; rank 1 waits and answers.
// v[0] (rank 0) = ns for the `iters` timed round trips after `warm` warm-up ones.
__global__ void kPingPong(ncclDevComm dc, int rank, int peer, int warm, int iters, uint64_t base, uint64_t timeoutNs,
                          KState* st) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  uint64_t t0 = nowNs();
  for (int i = 0; i < warm + iters; i++) {
    if (rank == 0) {
      if (i == warm) t0 = nowNs();
      gin.signal(world, peer, ncclGin_SignalInc{kSigPing});
      if (!waitSignalFor(gin, kSigPing, base + i + 1, timeoutNs, st, 1)) return;
    } else {
      if (!waitSignalFor(gin, kSigPing, base + i + 1, timeoutNs, st, 1)) return;
      gin.signal(world, peer, ncclGin_SignalInc{kSigPing});
    }
  }
  st->v[0] = nowNs() - t0;
  gin.flush(ncclCoopThread());
}

// Bench (b): per round, rank 0 puts `reps` puts of n bytes back to back (source and destination cycle through
// `slots` slots), the last one with SignalInc{kSigData}, and waits for rank 1's SignalInc{kSigAck}. roundNs[r] is
// the time of round r on rank 0 from its start to the ack's arrival (nothing subtracted).
__global__ void kPutBurst(ncclDevComm dc, ncclWindow_t win, int rank, int peer, size_t srcOff, size_t dstOff, size_t n,
                          unsigned reps, unsigned slots, int rounds, uint64_t dataBase, uint64_t ackBase,
                          uint64_t timeoutNs, KState* st, unsigned long long* roundNs) {
  ncclGin gin(dc, 0);
  ncclTeam world = ncclTeamWorld(dc);
  for (int r = 0; r < rounds; r++) {
    if (rank == 0) {
      uint64_t t0 = nowNs();
      for (unsigned k = 0; k + 1 < reps; k++) {
        size_t off = (size_t)(k % slots) * n;
        gin.put(world, peer, win, dstOff + off, win, srcOff + off, n);
      }
      size_t off = (size_t)((reps - 1) % slots) * n;
      gin.put(world, peer, win, dstOff + off, win, srcOff + off, n, ncclGin_SignalInc{kSigData});
      if (!waitSignalFor(gin, kSigAck, ackBase + r + 1, timeoutNs, st, 1)) return;
      roundNs[r] = nowNs() - t0;
    } else {
      if (!waitSignalFor(gin, kSigData, dataBase + r + 1, timeoutNs, st, 1)) return;
      gin.signal(world, peer, ncclGin_SignalInc{kSigAck});
    }
  }
  gin.flush(ncclCoopThread());
}

}  // namespace gin_test
