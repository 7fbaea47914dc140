// railnet-gin-device-test: railnet's own test and benchmark of NCCL's device API (GIN, GPU-initiated networking),
// written against NCCL 2.28.9's headers (nccl.h, nccl_device.h). Two ranks in one binary, no MPI: the process forks,
// the parent is rank 0 and the child rank 1. Each rank pretends to be its own node (NCCL_HOSTID), so nNodes=2 and
// ncclDevCommCreate turns GIN on; the GIN backend is then the one that comes with the assigned net plugin (railnet's
// ncclGinPlugin_v11 in PROXY mode; NCCL's Socket transport has none, and ncclDevCommCreate fails).
//
//   railnet-gin-device-test [--check] [--bench] [--max-bytes N] [--iters N] [--bw-iters N] [--timeout-s S]
//                           [--watchdog-s S] [--help] [--version]
// Rank r uses CUDA device r % deviceCount: on a one-GPU machine both ranks share it and their kernels time-slice
// (fine for the checks; the bench timings are then not meaningful and say so).
//
// --check (the default): put + SignalInc at several sizes, 64 puts then one signal, SignalAdd (incl. a 64-bit value),
//   flush (local completion) followed by overwriting the source, and CounterInc + waitCounter. Both ranks put to
//   each other at the same time; each rank prints "PASS rN name" / "FAIL rN name: reason" for what it saw.
// --bench: signal round trip, put bandwidth (1, 16, 64 MiB puts, one signal at the end) and, in the same run, the
//   ncclSend/ncclRecv baseline over the same communicator (railnet's net plugin) with ratios.
// Exit codes: 0 all passed; 1 a check failed; 2 an NCCL/CUDA error or a hang; 3 "GIN unavailable"
//   (ncclDevCommCreate failed, e.g. with NCCL's Socket transport). The parent exits with the worse of both ranks.
// Environment: RAILNET_GIN_TEST_SAME_HOST=1 leaves NCCL_HOSTID alone (both ranks on one node, which needs two GPUs;
//   2.28.9 still turns GIN on because signals and counters are requested).
//
// Notes on the 2.28.9 device API used here (nccl_device/gin.h, core.h, impl/gin__funcs.h):
// - ncclDevCommRequirements has no initializer macro in 2.28: memset it, then set ginSignalCount/ginCounterCount.
// - Signals persist across kernels. Every signal a rank receives is waited for by that rank within the same phase,
//   so each phase reads the current signal/counter values (kReadState) before the host barrier that lets the peer
//   send, and waits for base + what the peer sends.
// - A SignalInc signal must not be mixed with other signal operators without a reset, so each signal id is used
//   with one operator only: kSigData/kSigAck/kSigPing with SignalInc, kSigAdd with SignalAdd.
// - Device waits are bounded (readSignal/readCounter polled against %globaltimer, then the API's
//   waitSignal/waitCounter once the value is there), so a broken backend gives FAIL lines instead of a hang.
//   gin.flush and a full GFD queue have no timeout; the host then detects the hang (cudaStreamQuery) and exits 2.
// - The stream is created non-blocking so that a spinning kernel never blocks a plugin's work on the legacy stream.
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include "gin_device_kernels.cuh"
#include "host_clock_text.h"

#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#ifndef RAILNET_VERSION
#define RAILNET_VERSION "unknown"  // scripts/gpu/build-gin-device-test.sh passes meson.build's version
#endif
#ifndef RAILNET_REVISION
#define RAILNET_REVISION "unknown"
#endif

namespace {

using namespace gin_test;

// ----------------------------------------------------------------------------------------------------------------
// Host side.

#include "gin_device_options.h"

struct Shared {  // anonymous shared mapping: each rank counts its own PASS/FAIL lines
  int pass[2], fail[2];
};

struct Fatal {
  int code;
  bool hung;  // a kernel never finished: touch neither CUDA nor NCCL again
};

struct Rank {
  Options o;
  int rank = 0, peer = 1, sock = -1, deviceCount = 0;
  Shared* shared = nullptr;
  ncclComm_t comm = nullptr;
  ncclDevComm dc;
  ncclWindow_t win = nullptr;
  unsigned char* buf = nullptr;
  size_t winBytes = 0, srcBase = 0, dstBase = 0;
  cudaStream_t stream = nullptr;
  KState* dK = nullptr;
  VState* dV = nullptr;
  unsigned long long* dState = nullptr;  // kReadState output
  unsigned long long* dTimes = nullptr;  // kPutBurst rounds
  uint64_t sig[kSignalCount] = {}, ctr = 0;
  bool healthy = true;  // false after a device-side timeout: the remaining GIN phases are skipped
};

Rank R;


void result(bool ok, const std::string& name, const std::string& why) {
  if (ok) {
    printf("PASS r%d %s\n", R.rank, name.c_str());
    R.shared->pass[R.rank]++;
  } else {
    printf("FAIL r%d %s: %s\n", R.rank, name.c_str(), why.c_str());
    R.shared->fail[R.rank]++;
  }
}

[[noreturn]] void cudaFail(const char* what, cudaError_t e) {
  result(false, "cuda", fmt("%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e)));
  throw Fatal{2, false};
}

[[noreturn]] void ncclFail(const char* what, ncclResult_t r) {
  const char* last = ncclGetLastError(R.comm);
  result(false, "nccl", fmt("%s: %s: %s", what, ncclGetErrorString(r), last && *last ? last : "(no last error)"));
  throw Fatal{2, false};
}

#define CUDA_OK(call)                              \
  do {                                             \
    cudaError_t e_ = (call);                       \
    if (e_ != cudaSuccess) cudaFail(#call, e_);    \
  } while (0)
#define NCCL_OK(call)                              \
  do {                                             \
    ncclResult_t r_ = (call);                      \
    if (r_ != ncclSuccess) ncclFail(#call, r_);    \
  } while (0)
#define LAUNCHED(what)                             \
  do {                                             \
    cudaError_t e_ = cudaGetLastError();           \
    if (e_ != cudaSuccess) cudaFail(what, e_);     \
  } while (0)

[[noreturn]] void peerGone() {
  result(false, "barrier", "the other rank is gone (socket closed)");
  throw Fatal{2, false};
}

void writeAll(const void* p, size_t n) {
  const char* c = (const char*)p;
  while (n) {
    ssize_t k = send(R.sock, c, n, MSG_NOSIGNAL);  // no SIGPIPE when the peer is gone
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) peerGone();
    c += k;
    n -= (size_t)k;
  }
}

void readAll(void* p, size_t n) {
  char* c = (char*)p;
  while (n) {
    ssize_t k = read(R.sock, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) peerGone();
    c += k;
    n -= (size_t)k;
  }
}

// Host barrier over the socket pair; returns true if both ranks are still healthy.
bool barrier(bool ok) {
  char mine = ok ? 1 : 0, theirs = 0;
  writeAll(&mine, 1);
  readAll(&theirs, 1);
  return ok && theirs;
}

// Waits for the stream, polling so that a kernel that never ends is reported instead of hanging this process.
void syncStream(const char* what, double limitS = 0) {
  if (limitS <= 0) limitS = 2 * R.o.timeoutS + 60;
  double t0 = wallS();
  for (;;) {
    cudaError_t e = cudaStreamQuery(R.stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) cudaFail(what, e);
    if (wallS() - t0 > limitS) {
      result(false, what, fmt("kernel still running after %.0f s (hang: a flush or a full GIN queue never drained)",
                              limitS));
      throw Fatal{2, true};
    }
    usleep(100);
  }
}

void checkAsync(const char* what) {
  ncclResult_t async = ncclSuccess;
  NCCL_OK(ncclCommGetAsyncError(R.comm, &async));
  if (async != ncclSuccess && async != ncclInProgress) ncclFail(what, async);
}

void fill(size_t off, size_t n, uint64_t key) {
  if (n == 0) return;
  kFill<<<1024, 256, 0, R.stream>>>(R.buf + off, n, key);
  LAUNCHED("kFill");
}

// Poisons the whole receive side (destination region and the scratch tail).
void poison() { CUDA_OK(cudaMemsetAsync(R.buf + R.dstBase, kPoison, R.winBytes - R.dstBase, R.stream)); }

// Reads the signals and the counter (before the barrier that lets the peer send) and clears the kernel state.
void refresh() {
  kReadState<<<1, 1, 0, R.stream>>>(R.dc, R.dState);
  LAUNCHED("kReadState");
  unsigned long long h[kSignalCount + 1];
  CUDA_OK(cudaMemcpyAsync(h, R.dState, sizeof h, cudaMemcpyDeviceToHost, R.stream));
  CUDA_OK(cudaMemsetAsync(R.dK, 0, sizeof(KState), R.stream));
  syncStream("refresh");
  for (int i = 0; i < kSignalCount; i++) R.sig[i] = h[i];
  R.ctr = h[kSignalCount];
}

KState kstate() {
  KState k;
  CUDA_OK(cudaMemcpyAsync(&k, R.dK, sizeof k, cudaMemcpyDeviceToHost, R.stream));
  syncStream("kstate");
  return k;
}

// Verifies n received bytes at dstOff; returns "" if fine, else the reason.
std::string verify(size_t dstOff, size_t n, uint64_t key, size_t chunk = 0, unsigned invMul = 0,
                   unsigned nChunks = 0) {
  size_t guard = std::min(kGuardBytes, R.winBytes - (dstOff + n));
  VState init = {0, ~0ull, 0}, v;
  CUDA_OK(cudaMemcpyAsync(R.dV, &init, sizeof init, cudaMemcpyHostToDevice, R.stream));
  kVerify<<<1024, 256, 0, R.stream>>>(R.buf + dstOff, n, key, chunk, invMul, nChunks, guard, R.dV);
  LAUNCHED("kVerify");
  CUDA_OK(cudaMemcpyAsync(&v, R.dV, sizeof v, cudaMemcpyDeviceToHost, R.stream));
  syncStream("verify");
  std::string why;
  if (v.mismatches)
    why += fmt("%llu of %zu bytes differ from the pattern (first at %llu)", v.mismatches, n, v.firstBad);
  if (v.guardBad) why += fmt("%s%llu bytes after the region were overwritten", why.empty() ? "" : "; ", v.guardBad);
  return why;
}

std::string timeoutText(const KState& k, const char* what) {
  return fmt("timed out after %.0f s waiting for %s (wait #%u: value %llu, wanted %llu)", R.o.timeoutS, what,
             k.timedOut, k.got, k.want);
}

uint64_t timeoutNs() { return (uint64_t)(R.o.timeoutS * 1e9); }

// Starts a phase: both ranks prepared (buffers, signal bases) and healthy. false: skip (a previous phase timed out).
bool beginPhase() {
  refresh();
  R.healthy = barrier(R.healthy);
  return R.healthy;
}

// Ends a GIN kernel: wait for it, take its state; a timeout makes this rank unhealthy.
KState endKernel(const char* what) {
  syncStream(what);
  KState k = kstate();
  if (k.timedOut) R.healthy = false;
  checkAsync(what);
  return k;
}

// ----------------------------------------------------------------------------------------------------------------
// Checks.

void checkPutSignal(size_t n, size_t srcExtra, size_t dstExtra, const char* label) {
  std::string name = fmt("%s size=%zu", label, n);
  if (srcExtra || dstExtra) name += fmt(" src+%zu dst+%zu", srcExtra, dstExtra);
  size_t srcOff = R.srcBase + srcExtra, dstOff = R.dstBase + dstExtra;
  fill(srcOff, n, patKey(n, 1, R.rank));
  poison();
  if (!beginPhase()) return;
  kPutSignal<<<1, 1, 0, R.stream>>>(R.dc, R.win, R.peer, srcOff, dstOff, n, R.sig[kSigData] + 1, timeoutNs(), R.dK);
  LAUNCHED("kPutSignal");
  KState k = endKernel(name.c_str());
  if (k.timedOut) return result(false, name, timeoutText(k, "the peer's SignalInc"));
  std::string why = verify(dstOff, n, patKey(n, 1, R.peer));
  result(why.empty(), name, why);
}

void checkManyPuts() {
  const unsigned nChunks = 64, mul = 37, invMul = 45;  // 37 * 45 = 1665 = 26 * 64 + 1
  size_t chunk = std::min<size_t>(256 * 1024, R.o.maxBytes / nChunks);
  size_t n = chunk * nChunks;
  std::string name = fmt("many_puts_one_signal puts=%u size=%zu", nChunks, chunk);
  fill(R.srcBase, n, patKey(n, 2, R.rank));
  poison();
  if (!beginPhase()) return;
  kManyPuts<<<1, 1, 0, R.stream>>>(R.dc, R.win, R.peer, R.srcBase, R.dstBase, chunk, nChunks, mul,
                                   R.sig[kSigData] + 1, timeoutNs(), R.dK);
  LAUNCHED("kManyPuts");
  KState k = endKernel(name.c_str());
  if (k.timedOut) return result(false, name, timeoutText(k, "the peer's signal after its puts"));
  std::string why = verify(R.dstBase, n, patKey(n, 2, R.peer), chunk, invMul, nChunks);
  result(why.empty(), name, why);
}

void checkSignalAdd() {
  size_t n = std::min<size_t>(kMiB, R.o.maxBytes);
  std::string name = fmt("signal_add value=%llu size=%zu", (unsigned long long)kAddValue, n);
  std::string name64 = fmt("signal_add_64bit value=%llu", (unsigned long long)kAdd64Value);
  fill(R.srcBase, n, patKey(n, 3, R.rank));
  poison();
  if (!beginPhase()) return;
  uint64_t base = R.sig[kSigAdd];
  kSignalAdd<<<1, 1, 0, R.stream>>>(R.dc, R.win, R.peer, R.srcBase, R.dstBase, n, base, timeoutNs(), R.dK);
  LAUNCHED("kSignalAdd");
  KState k = endKernel(name.c_str());
  if (k.timedOut == 1) {
    result(false, name, timeoutText(k, "base + 1000003 (the peer's put with SignalAdd)"));
    return result(false, name64, "not run (the first SignalAdd never arrived)");
  }
  // After the first wait the peer's second signal may or may not have arrived: base+A or base+A+B, nothing else.
  std::string why = verify(R.dstBase, n, patKey(n, 3, R.peer));
  uint64_t a = base + kAddValue, ab = a + kAdd64Value;
  if (k.v[0] != a && k.v[0] != ab)
    why += fmt("%ssignal was %llu after the wait, expected %llu (base %llu + %llu)", why.empty() ? "" : "; ",
               k.v[0], (unsigned long long)a, (unsigned long long)base, (unsigned long long)kAddValue);
  result(why.empty(), name, why);
  if (k.timedOut) return result(false, name64, timeoutText(k, "the peer's 64-bit SignalAdd"));
  if (k.v[1] != ab)
    return result(false, name64, fmt("signal %llu, expected %llu", k.v[1], (unsigned long long)ab));
  result(true, name64, "");
}

void checkFlush() {
  size_t n = std::min<size_t>(64 * kMiB, R.o.maxBytes);
  std::string name = fmt("flush_then_overwrite size=%zu", n);
  fill(R.srcBase, n, patKey(n, 4, R.rank));
  poison();
  if (!beginPhase()) return;
  kFlushOverwrite<<<1, 1024, 0, R.stream>>>(R.dc, R.win, R.peer, R.srcBase, R.dstBase, n, R.buf + R.srcBase,
                                            R.sig[kSigData] + 1, timeoutNs(), R.dK);
  LAUNCHED("kFlushOverwrite");
  KState k = endKernel(name.c_str());
  if (k.timedOut) return result(false, name, timeoutText(k, "the peer's signal after its flush and overwrite"));
  std::string why = verify(R.dstBase, n, patKey(n, 4, R.peer));
  if (!why.empty()) why += " (the peer's source was overwritten after gin.flush: flush returned too early?)";
  result(why.empty(), name, why);
}

void checkCounter() {
  const unsigned nChunks = 8;
  size_t chunk = std::min<size_t>(kMiB, R.o.maxBytes / nChunks);
  size_t n = chunk * nChunks;
  std::string name = fmt("counter_inc puts=%u size=%zu", nChunks, chunk);
  fill(R.srcBase, n, patKey(n, 5, R.rank));
  poison();
  if (!beginPhase()) return;
  uint64_t ctrBase = R.ctr;
  kCounter<<<1, 1024, 0, R.stream>>>(R.dc, R.win, R.peer, R.srcBase, R.dstBase, chunk, nChunks, R.buf + R.srcBase,
                                     ctrBase, R.sig[kSigData] + 1, timeoutNs(), R.dK);
  LAUNCHED("kCounter");
  KState k = endKernel(name.c_str());
  if (k.timedOut == 1) return result(false, name, timeoutText(k, "the local counter (CounterInc of own puts)"));
  if (k.timedOut) return result(false, name, timeoutText(k, "the peer's signal after its counter wait"));
  uint64_t want = (ctrBase + nChunks) & (~0ull >> (64 - kCounterBits));
  std::string why = verify(R.dstBase, n, patKey(n, 5, R.peer));
  if (!why.empty()) why += " (the peer's source was overwritten after its counter reached the put count)";
  if (k.v[0] != want || k.v[1] != want)
    why += fmt("%scounter %llu after the wait and %llu at the end, expected %llu", why.empty() ? "" : "; ", k.v[0],
               k.v[1], (unsigned long long)want);
  result(why.empty(), name, why);
}

void runChecks() {
  const size_t sizes[] = {0, 4, 4096, kMiB + 12, 64 * kMiB, 256 * kMiB};
  for (size_t n : sizes)
    if (n <= R.o.maxBytes) checkPutSignal(n, 0, 0, "put_signal");
  if (kMiB + 12 + 5 <= R.o.maxBytes) checkPutSignal(kMiB + 12, 3, 5, "put_signal_unaligned");
  checkManyPuts();
  checkSignalAdd();
  checkFlush();
  checkCounter();
  if (!R.healthy) result(false, "checks", "stopped early: a device-side wait timed out (on this or the other rank)");
}

// ----------------------------------------------------------------------------------------------------------------
// Benchmarks (results printed by rank 0).

double ginRoundTripUs() {
  int warm = std::max(1, R.o.iters / 10);
  if (!beginPhase()) return -1;
  kPingPong<<<1, 1, 0, R.stream>>>(R.dc, R.rank, R.peer, warm, R.o.iters, R.sig[kSigPing], timeoutNs(), R.dK);
  LAUNCHED("kPingPong");
  syncStream("gin_signal_roundtrip", std::max(600.0, 2 * R.o.timeoutS + 60));
  KState k = kstate();
  checkAsync("gin_signal_roundtrip");
  if (k.timedOut) {
    R.healthy = false;
    result(false, "bench gin_signal_roundtrip", timeoutText(k, "the ping-pong signal"));
    return -1;
  }
  return k.v[0] / 1e3 / R.o.iters;
}

double ginPutGBps(size_t n, unsigned reps) {
  unsigned slots = (unsigned)std::max<size_t>(1, std::min<size_t>(reps, R.o.maxBytes / n));
  int warm = 1, rounds = warm + R.o.bwIters;
  fill(R.srcBase, std::min<size_t>((size_t)slots * n, R.o.maxBytes), patKey(n, 6, R.rank));
  if (!beginPhase()) return -1;
  kPutBurst<<<1, 1, 0, R.stream>>>(R.dc, R.win, R.rank, R.peer, R.srcBase, R.dstBase, n, reps, slots, rounds,
                                   R.sig[kSigData], R.sig[kSigAck], timeoutNs(), R.dK, R.dTimes);
  LAUNCHED("kPutBurst");
  std::string name = fmt("bench gin_put size=%zu", n);
  syncStream(name.c_str(), std::max(600.0, 2 * R.o.timeoutS + 60));
  KState k = kstate();
  checkAsync(name.c_str());
  if (k.timedOut) {
    R.healthy = false;
    result(false, name, timeoutText(k, R.rank == 0 ? "rank 1's ack" : "rank 0's data signal"));
    return -1;
  }
  if (R.rank != 0) return 0;  // only rank 0 times the rounds
  std::vector<unsigned long long> t(rounds);
  CUDA_OK(cudaMemcpyAsync(t.data(), R.dTimes, rounds * sizeof t[0], cudaMemcpyDeviceToHost, R.stream));
  syncStream("kPutBurst times");
  double ns = 0;
  for (int r = warm; r < rounds; r++) ns += (double)t[r];
  return (double)n * reps * R.o.bwIters / ns;  // bytes per ns = GB/s
}

// ncclSend/ncclRecv over the same communicator, same shape: rank 0 sends `reps` messages of n bytes back to back,
// then receives an 8-byte ack; timed with cudaEvents on rank 0 around each round.
double sendRecvGBps(void* sbuf, void* rbuf, void* ack, size_t n, unsigned reps) {
  int warm = 1, rounds = warm + R.o.bwIters;
  R.healthy = barrier(R.healthy);
  if (!R.healthy) return -1;
  std::vector<cudaEvent_t> ev(2 * rounds);
  for (auto& e : ev) CUDA_OK(cudaEventCreate(&e));
  for (int r = 0; r < rounds; r++) {
    CUDA_OK(cudaEventRecord(ev[2 * r], R.stream));
    for (unsigned k = 0; k < reps; k++) {
      if (R.rank == 0)
        NCCL_OK(ncclSend(sbuf, n, ncclInt8, R.peer, R.comm, R.stream));
      else
        NCCL_OK(ncclRecv(rbuf, n, ncclInt8, R.peer, R.comm, R.stream));
    }
    if (R.rank == 0)
      NCCL_OK(ncclRecv(ack, 8, ncclInt8, R.peer, R.comm, R.stream));
    else
      NCCL_OK(ncclSend(ack, 8, ncclInt8, R.peer, R.comm, R.stream));
    CUDA_OK(cudaEventRecord(ev[2 * r + 1], R.stream));
  }
  syncStream(fmt("bench sendrecv size=%zu", n).c_str(), 600);
  checkAsync("sendrecv");
  double ms = 0;
  for (int r = warm; r < rounds; r++) {
    float m = 0;
    CUDA_OK(cudaEventElapsedTime(&m, ev[2 * r], ev[2 * r + 1]));
    ms += m;
  }
  for (auto& e : ev) CUDA_OK(cudaEventDestroy(e));
  return (double)n * reps * R.o.bwIters / (ms * 1e6);
}

double sendRecvRoundTripUs(void* ping) {
  int warm = std::max(1, R.o.iters / 10);
  R.healthy = barrier(R.healthy);
  if (!R.healthy) return -1;
  cudaEvent_t a, b;
  CUDA_OK(cudaEventCreate(&a));
  CUDA_OK(cudaEventCreate(&b));
  for (int i = 0; i < warm + R.o.iters; i++) {
    if (i == warm) CUDA_OK(cudaEventRecord(a, R.stream));
    if (R.rank == 0) {
      NCCL_OK(ncclSend(ping, 8, ncclInt8, R.peer, R.comm, R.stream));
      NCCL_OK(ncclRecv(ping, 8, ncclInt8, R.peer, R.comm, R.stream));
    } else {
      NCCL_OK(ncclRecv(ping, 8, ncclInt8, R.peer, R.comm, R.stream));
      NCCL_OK(ncclSend(ping, 8, ncclInt8, R.peer, R.comm, R.stream));
    }
  }
  CUDA_OK(cudaEventRecord(b, R.stream));
  syncStream("bench sendrecv_roundtrip", 600);
  checkAsync("sendrecv_roundtrip");
  float ms = 0;
  CUDA_OK(cudaEventElapsedTime(&ms, a, b));
  CUDA_OK(cudaEventDestroy(a));
  CUDA_OK(cudaEventDestroy(b));
  return ms * 1e3 / R.o.iters;
}

void runBench() {
  const size_t sizes[] = {kMiB, 16 * kMiB, 64 * kMiB};
  const size_t burst = 256 * kMiB;  // bytes per round: 256 x 1 MiB, 16 x 16 MiB, 4 x 64 MiB
  size_t maxN = 0;
  for (size_t n : sizes)
    if (n <= R.o.maxBytes) maxN = n;
  if (R.rank == 0) {
    printf("# bench: gin_put = rank 0 puts a round of back-to-back puts (%zu MiB per round, the last put with "
           "SignalInc), rank 1 waits and answers with a signal; time from kernel-side round start to the ack's "
           "arrival on rank 0 (%%globaltimer, nothing subtracted), 1 warm-up + %d rounds\n",
           burst / kMiB, R.o.bwIters);
    printf("# bench: sendrecv = the same rounds with ncclSend/ncclRecv + an 8-byte ack over the same communicator, "
           "cudaEvents on rank 0 around each round; round trips: %d after %d warm-up\n",
           R.o.iters, std::max(1, R.o.iters / 10));
    if (R.deviceCount < 2)
      printf("# bench: one GPU shared by both ranks: without MPS their kernels time-slice and these timings mean nothing; "
             "under MPS (nvidia-cuda-mps-control -d) they run at once, sharing the GPU's SMs and copy engines\n");
  }
  double ginRt = ginRoundTripUs();
  if (R.rank == 0 && ginRt >= 0) printf("gin_signal_roundtrip_us %.3f\n", ginRt);
  std::vector<double> gin, sr;
  for (size_t n : sizes) {
    if (n > R.o.maxBytes) continue;
    double g = ginPutGBps(n, (unsigned)std::max<size_t>(1, burst / n));
    gin.push_back(g);
    if (R.rank == 0 && g >= 0) printf("gin_put_GBps size=%zu %.3f\n", n, g);
  }
  void *sbuf = nullptr, *rbuf = nullptr, *small = nullptr;
  if (maxN) {
    CUDA_OK(cudaMalloc(&sbuf, maxN));
    CUDA_OK(cudaMalloc(&rbuf, maxN));
  }
  CUDA_OK(cudaMalloc(&small, 64));
  CUDA_OK(cudaMemset(small, 0, 64));
  for (size_t n : sizes) {
    if (n > R.o.maxBytes) continue;
    double s = sendRecvGBps(sbuf, rbuf, small, n, (unsigned)std::max<size_t>(1, burst / n));
    sr.push_back(s);
    if (R.rank == 0 && s >= 0) printf("sendrecv_GBps size=%zu %.3f\n", n, s);
  }
  double srRt = sendRecvRoundTripUs(small);
  if (R.rank == 0) {
    if (srRt >= 0) printf("sendrecv_roundtrip_us %.3f\n", srRt);
    size_t i = 0;
    for (size_t n : sizes) {
      if (n > R.o.maxBytes) continue;
      if (gin[i] > 0 && sr[i] > 0) printf("gin_put/sendrecv size=%zu %.3f\n", n, gin[i] / sr[i]);
      i++;
    }
    if (ginRt > 0 && srRt > 0) printf("gin_signal_roundtrip/sendrecv_roundtrip %.3f\n", ginRt / srRt);
  }
  if (sbuf) CUDA_OK(cudaFree(sbuf));
  if (rbuf) CUDA_OK(cudaFree(rbuf));
  CUDA_OK(cudaFree(small));
  if (!R.healthy) result(false, "bench", "stopped early: a device-side wait timed out (on this or the other rank)");
}

// ----------------------------------------------------------------------------------------------------------------
// Setup, teardown, one rank.

void setup() {
  int version = 0;
  NCCL_OK(ncclGetVersion(&version));
  if (version / 100 != NCCL_VERSION_CODE / 100) {
    result(false, "nccl_version",
           fmt("libnccl is %d but this program was compiled against %d: the device API structs (ncclDevComm) must "
               "match; put the matching libnccl first on LD_LIBRARY_PATH",
               version, NCCL_VERSION_CODE));
    throw Fatal{2, false};
  }
  CUDA_OK(cudaGetDeviceCount(&R.deviceCount));
  if (R.deviceCount < 1) {
    result(false, "cuda", "no CUDA device");
    throw Fatal{2, false};
  }
  int dev = R.rank % R.deviceCount;
  CUDA_OK(cudaSetDevice(dev));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, dev));
  const char* hostId = getenv("NCCL_HOSTID");
  printf("INFO r%d device %d of %d (%s), NCCL %d (compiled against %d), NCCL_HOSTID=%s\n", R.rank, dev,
         R.deviceCount, prop.name, version, NCCL_VERSION_CODE, hostId ? hostId : "(unset)");

  ncclUniqueId id;
  if (R.rank == 0) {
    NCCL_OK(ncclGetUniqueId(&id));
    writeAll(&id, sizeof id);
  } else {
    readAll(&id, sizeof id);
  }
  NCCL_OK(ncclCommInitRank(&R.comm, 2, id, R.rank));
  CUDA_OK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));

  // Window: [0, M) sources, [M, 2M) destinations, then 1 MiB scratch (guard bytes of the largest transfer).
  size_t m = (R.o.maxBytes + 4095) & ~(size_t)4095;
  R.srcBase = 0;
  R.dstBase = m;
  R.winBytes = 2 * m + kMiB;
  void* buf = nullptr;
  NCCL_OK(ncclMemAlloc(&buf, R.winBytes));
  R.buf = (unsigned char*)buf;
  NCCL_OK(ncclCommWindowRegister(R.comm, buf, R.winBytes, &R.win, NCCL_WIN_COLL_SYMMETRIC));

  ncclDevCommRequirements reqs;
  memset(&reqs, 0, sizeof reqs);
  reqs.ginSignalCount = kSignalCount;
  reqs.ginCounterCount = kCounterCount;
  ncclResult_t r = ncclDevCommCreate(R.comm, &reqs, &R.dc);
  if (r != ncclSuccess) {
    const char* last = ncclGetLastError(R.comm);
    printf("GIN unavailable: %s [r%d: ncclDevCommCreate: %s]\n", last && *last ? last : "(no last error)", R.rank,
           ncclGetErrorString(r));
    throw Fatal{3, false};
  }
  printf("INFO r%d devComm rank=%d nRanks=%d lsaSize=%d ginContextCount=%d ginType=%d (2=PROXY 3=GDAKI) "
         "ginSignalCount=%d ginCounterCount=%d window=%zu bytes\n",
         R.rank, R.dc.rank, R.dc.nRanks, R.dc.lsaSize, (int)R.dc.ginContextCount, (int)R.dc.ginTypes[0],
         R.dc.ginSignalCount, R.dc.ginCounterCount, R.winBytes);
  if (R.dc.ginContextCount < 1) {
    result(false, "devcomm", "ncclDevCommCreate succeeded but ginContextCount is 0 (no GIN)");
    throw Fatal{2, false};
  }

  CUDA_OK(cudaMalloc(&R.dK, sizeof(KState)));
  CUDA_OK(cudaMalloc(&R.dV, sizeof(VState)));
  CUDA_OK(cudaMalloc(&R.dState, (kSignalCount + 1) * sizeof(unsigned long long)));
  CUDA_OK(cudaMalloc(&R.dTimes, (size_t)(1 + R.o.bwIters) * sizeof(unsigned long long)));
}

void teardown() {
  R.healthy = barrier(R.healthy);  // both done with GIN traffic before either side tears down
  if (!R.healthy) throw Fatal{1, false};
  CUDA_OK(cudaFree(R.dK));
  CUDA_OK(cudaFree(R.dV));
  CUDA_OK(cudaFree(R.dState));
  CUDA_OK(cudaFree(R.dTimes));
  NCCL_OK(ncclDevCommDestroy(R.comm, &R.dc));
  NCCL_OK(ncclCommWindowDeregister(R.comm, R.win));
  NCCL_OK(ncclMemFree(R.buf));
  R.buf = nullptr;
  CUDA_OK(cudaStreamDestroy(R.stream));
  NCCL_OK(ncclCommFinalize(R.comm));
  NCCL_OK(ncclCommDestroy(R.comm));
  R.comm = nullptr;
}

int runRank() {
  int code = 0;
  bool hung = false;
  try {
    setup();
    if (R.o.check) runChecks();
    if (R.o.bench) runBench();
    teardown();
  } catch (const Fatal& f) {
    code = f.code;
    hung = f.hung;
  }
  if (code == 0 && R.shared->fail[R.rank] > 0) code = 1;
  if (code != 0 && !hung && R.comm) ncclCommAbort(R.comm);  // local; frees the device comm and the window too
  fflush(stdout);
  return code;
}

// ----------------------------------------------------------------------------------------------------------------
// Process handling.

pid_t gChild = -1;

void onAlarm(int) {
  const char msg[] = "FAIL r0 watchdog: the run took longer than --watchdog-s; killing both ranks\n";
  ssize_t ignored = write(1, msg, sizeof msg - 1);
  (void)ignored;
  if (gChild > 0) kill(gChild, SIGKILL);
  _exit(2);
}


int worse(int a, int b) {  // 3 (GIN unavailable) > 2 (error) > 1 (check failed) > 0
  return std::max(a, b);
}

}  // namespace

int main(int argc, char** argv) {
  Options o = parse(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);  // one write per line: the two ranks' lines do not interleave

  Shared* shared = (Shared*)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  int sv[2];
  if (shared == MAP_FAILED || socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
    perror("railnet-gin-device-test: setup");
    return 2;
  }
  memset(shared, 0, sizeof *shared);

  // Nothing may touch CUDA or NCCL before the fork.
  pid_t parent = getpid();
  pid_t child = fork();
  if (child < 0) {
    perror("railnet-gin-device-test: fork");
    return 2;
  }
  int rank = child == 0 ? 1 : 0;
  if (rank == 1) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(2);
    close(sv[0]);
    R.sock = sv[1];
  } else {
    close(sv[1]);
    R.sock = sv[0];
    gChild = child;
    signal(SIGALRM, onAlarm);
    alarm(o.watchdogS);
  }
  R.o = o;
  R.rank = rank;
  R.peer = 1 - rank;
  R.shared = shared;
  const char* same = getenv("RAILNET_GIN_TEST_SAME_HOST");
  if (!(same && strcmp(same, "1") == 0)) {
    std::string hostId = fmt("railnet-gin-host-%d", rank);
    setenv("NCCL_HOSTID", hostId.c_str(), 1);
  }

  int code = runRank();
  close(R.sock);
  if (rank == 1) _exit(code);

  // Parent: wait for the child; if this rank failed, give the child time to notice (its device waits time out, its
  // barrier sees the closed socket), then kill it (it may be stuck in an NCCL collective).
  int status = 0;
  double t0 = wallS(), grace = 2 * o.timeoutS + 30;
  for (;;) {
    pid_t w = waitpid(child, &status, code != 0 ? WNOHANG : 0);
    if (w == child) break;
    if (w < 0 && errno != EINTR) break;
    if (w == 0) {
      if (wallS() - t0 > grace) {
        kill(child, SIGKILL);
        waitpid(child, &status, 0);
        break;
      }
      usleep(100000);
    }
  }
  alarm(0);
  int childCode = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
  if (!WIFEXITED(status))
    printf("FAIL r1 process: %s %d\n", WIFSIGNALED(status) ? "killed by signal" : "ended with status",
           WIFSIGNALED(status) ? WTERMSIG(status) : status);
  int total = worse(code, childCode);
  printf("SUMMARY r0: %d passed, %d failed, exit %d; r1: %d passed, %d failed, exit %d -> %s (exit %d)\n",
         shared->pass[0], shared->fail[0], code, shared->pass[1], shared->fail[1], childCode,
         total == 0 ? "PASS" : total == 3 ? "GIN unavailable" : "FAIL", total);
  fflush(stdout);
  if (total != 0) _exit(total);  // a failed rank may leave NCCL/CUDA state that must not be torn down again
  return 0;
}
