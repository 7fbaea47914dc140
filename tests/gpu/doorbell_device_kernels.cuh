// Kernels of railnet-doorbell-device-test (doorbell_device_test.cu): each uses railnet's device API
// (railnet/doorbell_device.cuh) the way an application would and reports what it saw in a Report the host reads.
#pragma once

#include <stdint.h>

#include "railnet/doorbell_device.cuh"

namespace doorbell_test {

namespace db = railnet::doorbell::device;
using Ctx = railnet_doorbell_device_t;

// Signal words, one per use (signals only grow; each phase waits for base + what the peer adds).
enum Signal : uint32_t {
  kSigSizes = 0,     // put_signal at each size
  kSigWarps = 1,     // block signals after warp puts
  kSigMany = 2,      // one signal per thread of a large grid
  kSigQuiet = 3,     // signal after quiet + overwrite
  kSigNever = 4,     // never signalled: the timeout check
  kSigDeath = 5,     // never signalled: waits while the peer dies
  kSigPing = 6,      // round trips
  kSigPutPing = 7,   // put+signal round trips
  kSigBurst = 8,     // bandwidth rounds
  kSigAck = 9,       // bandwidth acks
};

// What a kernel tells the host: the first non-OK status and where, and counts.
struct Report {
  int status;                 // first non-OK status of any call (0: all OK)
  int where;                  // which call gave it (kernel-defined)
  unsigned long long value;   // a kernel-defined number (elapsed ns, mismatches, a signal value)
  unsigned long long mismatches;
};

__device__ inline void note(Report* report, int status, int where) {
  if (status != RAILNET_DOORBELL_OK && atomicCAS(&report->status, 0, status) == 0) report->where = where;
}

__device__ inline uint8_t patternByte(uint64_t index, uint32_t seed) {
  uint64_t x = (index + 1) * 0x9E3779B97F4A7C15ull ^ (uint64_t(seed) << 32 | seed);
  x ^= x >> 29;
  return static_cast<uint8_t>(x * 0xBF58476D1CE4E5B9ull >> 56);
}

__global__ void kFill(uint8_t* data, uint64_t bytes, uint32_t seed) {
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < bytes; i += uint64_t(gridDim.x) * blockDim.x)
    data[i] = patternByte(i, seed);
}

// Counts bytes of [data, data + bytes) that differ from the pattern, and of the `guard` bytes after it that are not
// `sentinel`.
__global__ void kVerify(const uint8_t* data, uint64_t bytes, uint32_t seed, uint64_t guard, uint8_t sentinel,
                        unsigned long long* mismatches) {
  unsigned long long bad = 0;
  for (uint64_t i = blockIdx.x * uint64_t(blockDim.x) + threadIdx.x; i < bytes + guard;
       i += uint64_t(gridDim.x) * blockDim.x) {
    const uint8_t expected = i < bytes ? patternByte(i, seed) : sentinel;
    bad += data[i] != expected;
  }
  if (bad != 0) atomicAdd(mismatches, bad);
}

// Thread scope: one put_signal of `bytes`, then wait for the peer's to this rank.
__global__ void kPutSignalOne(Ctx ctx, uint32_t window, uint64_t targetOffset, uint64_t sourceOffset, uint64_t bytes,
                              uint64_t expectAtLeast, uint64_t timeoutNs, Report* report) {
  const int peer = 1 - ctx.rank;
  note(report, db::put_signal(ctx, peer, window, targetOffset, window, sourceOffset, bytes, kSigSizes, 1, timeoutNs),
       1);
  note(report, db::wait_signal(ctx, kSigSizes, expectAtLeast, timeoutNs), 2);
}

// Warp scope puts, block scope signals: each warp fills its own slice and puts it; each block then signals once
// (after its warps' puts, so the peer sees every slice of the block once it sees the signal).
__global__ void kWarpsAndBlocks(Ctx ctx, uint32_t window, uint8_t* source, uint64_t sourceOffset,
                                uint64_t targetOffset, uint64_t sliceBytes, uint32_t seed, uint64_t timeoutNs,
                                Report* report) {
  const int peer = 1 - ctx.rank;
  const uint32_t warpsPerBlock = blockDim.x / 32;
  const uint64_t warp = blockIdx.x * uint64_t(warpsPerBlock) + threadIdx.x / 32;
  const uint64_t first = warp * sliceBytes;
  for (uint64_t i = threadIdx.x % 32; i < sliceBytes; i += 32)
    source[sourceOffset + first + i] = patternByte(first + i, seed);
  note(report, db::put<db::Scope::kWarp>(ctx, peer, window, targetOffset + first, window, sourceOffset + first,
                                         sliceBytes, timeoutNs),
       1);
  note(report, db::signal<db::Scope::kBlock>(ctx, peer, kSigWarps, 1, timeoutNs), 2);
}

// Every thread of the grid signals the peer once: many producers racing for tickets through a ring that wraps.
__global__ void kManySignals(Ctx ctx, uint64_t timeoutNs, Report* report) {
  note(report, db::signal(ctx, 1 - ctx.rank, kSigMany, 1, timeoutNs), 1);
}

__global__ void kWaitSignal(Ctx ctx, uint32_t signal, uint64_t atLeast, uint64_t timeoutNs, Report* report,
                            int where) {
  const uint64_t start = db::detail::nowNs();
  note(report, db::wait_signal(ctx, signal, atLeast, timeoutNs), where);
  report->value = db::detail::nowNs() - start;
  report->mismatches = db::read_signal(ctx, signal);
}

// Block scope: put, quiet, overwrite the source (allowed after quiet), then signal.
__global__ void kQuietOverwrite(Ctx ctx, uint32_t window, uint8_t* source, uint64_t sourceOffset,
                                uint64_t targetOffset, uint64_t bytes, uint32_t overwriteSeed, uint64_t timeoutNs,
                                Report* report) {
  const int peer = 1 - ctx.rank;
  note(report, db::put<db::Scope::kBlock>(ctx, peer, window, targetOffset, window, sourceOffset, bytes, timeoutNs),
       1);
  note(report, db::quiet<db::Scope::kBlock>(ctx, timeoutNs), 2);
  for (uint64_t i = threadIdx.x; i < bytes; i += blockDim.x)
    source[sourceOffset + i] = patternByte(i, overwriteSeed);
  note(report, db::signal<db::Scope::kBlock>(ctx, peer, kSigQuiet, 1, timeoutNs), 3);
}

// A put naming a window that does not exist: quiet must return the ring's error, and so must a later wait.
__global__ void kBadWindow(Ctx ctx, uint32_t badWindow, uint64_t timeoutNs, Report* report) {
  const int peer = 1 - ctx.rank;
  const int put = db::put(ctx, peer, badWindow, 0, badWindow, 0, 8, timeoutNs);
  const int quiet = db::quiet(ctx, timeoutNs);
  const int wait = db::wait_signal(ctx, kSigNever, 1, timeoutNs);
  report->status = quiet;
  report->where = wait;
  report->value = static_cast<unsigned long long>(put);
}

// Round trips: rank 0 pings (a signal, or an 8-byte put_signal) and waits for the answer; rank 1 answers. Rank 0
// records each round's time (ns) in times[round].
__global__ void kPingPong(Ctx ctx, uint32_t window, uint64_t sourceOffset, uint64_t targetOffset, int rounds,
                          bool withPut, uint64_t base, uint64_t timeoutNs, unsigned long long* times,
                          Report* report) {
  const int peer = 1 - ctx.rank;
  const uint32_t signal = withPut ? kSigPutPing : kSigPing;
  for (int round = 0; round < rounds; ++round) {
    const uint64_t start = db::detail::nowNs();
    if (ctx.rank == 1) {
      const int waited = db::wait_signal(ctx, signal, base + round + 1, timeoutNs);
      if (waited != RAILNET_DOORBELL_OK) return note(report, waited, 1);
    }
    const int posted = withPut ? db::put_signal(ctx, peer, window, targetOffset, window, sourceOffset, 8, signal, 1,
                                                timeoutNs)
                               : db::signal(ctx, peer, signal, 1, timeoutNs);
    if (posted != RAILNET_DOORBELL_OK) return note(report, posted, 2);
    if (ctx.rank == 0) {
      const int waited = db::wait_signal(ctx, signal, base + round + 1, timeoutNs);
      if (waited != RAILNET_DOORBELL_OK) return note(report, waited, 3);
      times[round] = db::detail::nowNs() - start;
    }
  }
}

// Bandwidth: rank 0 puts `perRound` bytes per round as back-to-back puts of `bytes`, the last one with a signal;
// rank 1 waits for it and answers with a signal; rank 0 times each round to the answer.
__global__ void kPutBurst(Ctx ctx, uint32_t window, uint64_t sourceOffset, uint64_t targetOffset, uint64_t bytes,
                          int putsPerRound, int rounds, uint64_t burstBase, uint64_t ackBase, uint64_t timeoutNs,
                          unsigned long long* times, Report* report) {
  const int peer = 1 - ctx.rank;
  for (int round = 0; round < rounds; ++round) {
    if (ctx.rank == 1) {
      const int waited = db::wait_signal(ctx, kSigBurst, burstBase + round + 1, timeoutNs);
      if (waited != RAILNET_DOORBELL_OK) return note(report, waited, 1);
      const int answered = db::signal(ctx, peer, kSigAck, 1, timeoutNs);
      if (answered != RAILNET_DOORBELL_OK) return note(report, answered, 2);
      continue;
    }
    const uint64_t start = db::detail::nowNs();
    for (int i = 0; i < putsPerRound; ++i) {
      const int posted = i + 1 < putsPerRound
                             ? db::put(ctx, peer, window, targetOffset, window, sourceOffset, bytes, timeoutNs)
                             : db::put_signal(ctx, peer, window, targetOffset, window, sourceOffset, bytes,
                                              kSigBurst, 1, timeoutNs);
      if (posted != RAILNET_DOORBELL_OK) return note(report, posted, 3);
    }
    const int waited = db::wait_signal(ctx, kSigAck, ackBase + round + 1, timeoutNs);
    if (waited != RAILNET_DOORBELL_OK) return note(report, waited, 4);
    times[round] = db::detail::nowNs() - start;
  }
}

}  // namespace doorbell_test
