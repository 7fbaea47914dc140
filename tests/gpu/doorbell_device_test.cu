// railnet-doorbell-device-test: railnet's own GPU doorbells (include/railnet/doorbell.h, doorbell_device.cuh)
// driven by kernels, checked and timed. Two ranks in one binary, no MPI and no NCCL: the process forks, the parent
// is rank 0 and the child rank 1; rank 0 makes the unique id and hands it to rank 1 through a socket pair, as an
// application would through its own launcher. The doorbell API comes from railnet's .so, dlopen'ed
// (RAILNET_PLUGIN, default libnccl-net-railnet.so from the library path).
//
//   railnet-doorbell-device-test [--check] [--bench] [--max-bytes N] [--iters N] [--bw-iters N] [--timeout-s S]
// Rank r uses CUDA device r % deviceCount: on a one-GPU machine both ranks share it and their kernels time-slice
// unless MPS runs (the checks hold either way; timings are then not meaningful and say so).
//
// --check (the default): put_signal at 0 B, 4 B, 4 KiB, 1 MiB + 12 (unaligned), and the largest size, byte-exact
//   with guard bytes after each; warp-scope puts with block-scope signals; 16384 threads signalling at once through a
//   1024-slot ring; quiet, then overwriting the source; a wait that must time out; a bad window that quiet and a
//   later wait must report; and a peer that dies while a kernel waits for its signal (rank 1 exits without
//   finalizing; rank 0's wait must end with PEER_FAILED, not the timeout). Each rank prints "PASS rN name" or
//   "FAIL rN name: reason".
// --bench: signal round trip, 8-byte put+signal round trip, and put bandwidth (1, 16, 64 MiB puts, 256 MiB rounds),
//   all timed by the kernels (%globaltimer).
// Exit codes: 0 all passed; 1 a check failed; 2 a CUDA or API error. The parent exits with the worse of both.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <vector>

#include "doorbell_api_loader.h"
#include "doorbell_device_kernels.cuh"

#ifndef RAILNET_VERSION
#define RAILNET_VERSION "unknown"
#endif
#ifndef RAILNET_REVISION
#define RAILNET_REVISION "unknown"
#endif

namespace {

using namespace doorbell_test;

constexpr uint64_t kMiB = 1024 * 1024;
constexpr uint64_t kGuard = 4096;
constexpr uint8_t kSentinel = 0xEE;
constexpr uint32_t kRingSlots = 1024;  // ContextOptions' default; the many-signals check wraps it 16 times

struct Options {
  bool check = false, bench = false;
  uint64_t maxBytes = 64 * kMiB;
  int iters = 1000;
  int bwIters = 5;
  double timeoutS = 30;
};

void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s [--check] [--bench] [--max-bytes MiB] [--iters N] [--bw-iters N] [--timeout-s S] [--version]\n"
          "  --check      every device call, verified (the default when neither is given)\n"
          "  --bench      round trips (signal, 8-byte put+signal) and put bandwidth, timed by the kernels\n"
          "  --max-bytes  largest put in MiB (default 64; the window is 2 x this + 1 MiB)\n"
          "  --iters      round trips (default 1000, plus 1/10 warm-up); --bw-iters rounds per size (default 5)\n"
          "  --timeout-s  limit of every device-side wait (default 30)\n"
          "RAILNET_PLUGIN: the railnet .so to dlopen (default libnccl-net-railnet.so).\n",
          argv0);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) { usage(stderr, argv[0]); exit(2); }
      return argv[++i];
    };
    if (a == "--check") o.check = true;
    else if (a == "--bench") o.bench = true;
    else if (a == "--max-bytes") o.maxBytes = strtoull(next(), nullptr, 10) * kMiB;
    else if (a == "--iters") o.iters = atoi(next());
    else if (a == "--bw-iters") o.bwIters = atoi(next());
    else if (a == "--timeout-s") o.timeoutS = atof(next());
    else if (a == "--version") { printf("railnet-doorbell-device-test %s (revision %s)\n", RAILNET_VERSION, RAILNET_REVISION); exit(0); }
    else if (a == "-h" || a == "--help") { usage(stdout, argv[0]); exit(0); }
    else { fprintf(stderr, "unknown option %s\n", a.c_str()); usage(stderr, argv[0]); exit(2); }
  }
  if (!o.check && !o.bench) o.check = true;
  if (o.maxBytes < 2 * kMiB || o.iters < 1 || o.bwIters < 1 || o.timeoutS <= 0) {
    fprintf(stderr, "need --max-bytes >= 2, --iters >= 1, --bw-iters >= 1, --timeout-s > 0\n");
    exit(2);
  }
  return o;
}

// The C API, from the .so.
using Api = DoorbellApi;

int gRank = 0;
int gFailures = 0;

[[noreturn]] void die(const char* what, const char* why) {
  fprintf(stderr, "r%d: %s: %s\n", gRank, what, why);
  fflush(stderr);
  _exit(2);
}

#define CUDA_OK(call)                                                    \
  do {                                                                   \
    cudaError_t e_ = (call);                                             \
    if (e_ != cudaSuccess) die(#call, cudaGetErrorString(e_));           \
  } while (0)
#define API_OK(call)                                                     \
  do {                                                                   \
    int r_ = (call);                                                     \
    if (r_ != 0) die(#call, ("returned " + std::to_string(r_)).c_str()); \
  } while (0)


Api loadApi() {
  Api api;
  std::string why;
  if (!loadDoorbellApi(&api, &why)) die("the doorbell API", why.c_str());
  return api;
}

// Host barrier over the socket pair: both ranks reach it before either goes on.
struct Link {
  int fd;
  void send(const void* data, size_t bytes) const {
    if (write(fd, data, bytes) != static_cast<ssize_t>(bytes)) die("link", "write");
  }
  void receive(void* data, size_t bytes) const {
    size_t got = 0;
    while (got < bytes) {
      const ssize_t n = read(fd, static_cast<char*>(data) + got, bytes - got);
      if (n <= 0) die("link", "the other rank is gone");
      got += static_cast<size_t>(n);
    }
  }
  void barrier() const {
    char token = 'b';
    send(&token, 1);
    receive(&token, 1);
  }
};

void result(bool pass, const char* name, const std::string& detail) {
  printf("%s r%d %s%s%s\n", pass ? "PASS" : "FAIL", gRank, name, detail.empty() ? "" : ": ", detail.c_str());
  fflush(stdout);
  if (!pass) ++gFailures;
}

std::string statusText(const Report& report) {
  if (report.status == 0) return "";
  return "status " + std::to_string(report.status) + " at call " + std::to_string(report.where);
}

struct Rank {
  Options o;
  Api api;
  Link link;
  railnet_doorbell_ctx_t* ctx = nullptr;
  railnet_doorbell_device_t view{};
  uint32_t window = 0;
  uint8_t* data = nullptr;  // the window: [0, M) source, [M, 2M) where the peer's puts land, then guard
  uint64_t M = 0;
  cudaStream_t stream{};
  Report* report = nullptr;  // mapped host memory
  unsigned long long* mismatches = nullptr;
  uint64_t timeoutNs = 0;

  void resetReport() { memset(report, 0, 4 * sizeof(*report)); }
  void sync(const char* what) {
    const cudaError_t e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) die(what, cudaGetErrorString(e));
  }
  unsigned long long verify(uint64_t offset, uint64_t bytes, uint32_t seed, uint64_t guard) {
    *mismatches = 0;
    kVerify<<<256, 256, 0, stream>>>(data + offset, bytes, seed, guard, kSentinel, mismatches);
    sync("verify");
    return *mismatches;
  }
  uint32_t seedOf(int rank, int phase) const { return 1000u * rank + phase; }
};

// After a phase's kernels (their reports in R.report[0] and [1]): PASS when neither reported an error and the
// `bytes` at `offset` are the peer's pattern `seed`, followed by guard bytes left as they were.
void judgeLanded(Rank& R, const char* name, uint64_t offset, uint64_t bytes, uint32_t seed, const char* wrongWhat) {
  const Report& first = R.report->status != 0 ? R.report[0] : R.report[1];
  const unsigned long long bad = first.status == 0 ? R.verify(offset, bytes, seed, kGuard) : 0;
  std::string detail = statusText(first);
  if (bad != 0) detail = std::to_string(bad) + " " + wrongWhat;
  result(first.status == 0 && bad == 0, name, detail);
}

// put_signal at each size, both ranks at once; each verifies what the peer put, and the guard bytes after it.
void checkSizes(Rank& R) {
  const uint64_t sizes[] = {0, 4, 4096, kMiB + 12, R.M - 8};
  const int peer = 1 - gRank;
  for (int i = 0; i < 5; ++i) {
    const uint64_t bytes = sizes[i];
    const uint64_t sourceOffset = i == 3 ? 5 : 0, targetOffset = i == 3 ? 3 : 0;  // 1 MiB + 12 unaligned
    kFill<<<256, 256, 0, R.stream>>>(R.data + sourceOffset, bytes, R.seedOf(gRank, i));
    CUDA_OK(cudaMemsetAsync(R.data + R.M, kSentinel, R.M + kGuard, R.stream));
    R.sync("fill");
    R.link.barrier();  // the peer's landing zone is ready before anything is put into it
    R.resetReport();
    kPutSignalOne<<<1, 1, 0, R.stream>>>(R.view, R.window, R.M + targetOffset, sourceOffset, bytes, i + 1,
                                         R.timeoutNs, R.report);
    R.sync("put_signal");
    char name[64];
    snprintf(name, sizeof name, "put_signal_%llu_bytes", static_cast<unsigned long long>(bytes));
    judgeLanded(R, name, R.M + targetOffset, bytes, R.seedOf(peer, i), "bytes wrong (payload or guard)");
    R.link.barrier();  // both verified before the next size overwrites
  }
}

void checkWarpsAndBlocks(Rank& R) {
  const int blocks = 4, threads = 128;
  const uint64_t slice = 64 * 1024, total = blocks * (threads / 32) * slice;
  CUDA_OK(cudaMemsetAsync(R.data + R.M, kSentinel, total + kGuard, R.stream));
  R.sync("memset");
  R.link.barrier();
  R.resetReport();
  kWarpsAndBlocks<<<blocks, threads, 0, R.stream>>>(R.view, R.window, R.data, 0, R.M, slice,
                                                    R.seedOf(gRank, 10), R.timeoutNs, R.report);
  kWaitSignal<<<1, 1, 0, R.stream>>>(R.view, kSigWarps, blocks, R.timeoutNs, R.report + 1, 9);
  R.sync("warps");
  judgeLanded(R, "warp_puts_block_signals", R.M, total, R.seedOf(1 - gRank, 10), "bytes wrong");
  R.link.barrier();
}

void checkManySignals(Rank& R) {
  const int blocks = 64, threads = 256;
  const uint64_t expected = uint64_t(blocks) * threads;
  R.resetReport();
  kManySignals<<<blocks, threads, 0, R.stream>>>(R.view, R.timeoutNs, R.report);
  kWaitSignal<<<1, 1, 0, R.stream>>>(R.view, kSigMany, expected, R.timeoutNs, R.report + 1, 9);
  R.sync("many signals");
  R.link.barrier();  // the peer's producers are all done: no more adds can come
  kWaitSignal<<<1, 1, 0, R.stream>>>(R.view, kSigMany, expected, R.timeoutNs, R.report + 1, 9);
  R.sync("many signals, settled");
  const unsigned long long value = R.report[1].mismatches;  // the word's value
  std::string detail = statusText(R.report->status != 0 ? R.report[0] : R.report[1]);
  if (value != expected) detail += " signal word " + std::to_string(value) + ", expected " + std::to_string(expected);
  result(R.report->status == 0 && R.report[1].status == 0 && value == expected, "16384_threads_signal_at_once",
         detail + " (" + std::to_string(expected / kRingSlots) + " laps of the ring)");
}

void checkQuietOverwrite(Rank& R) {
  const uint64_t bytes = 2 * kMiB;
  kFill<<<256, 256, 0, R.stream>>>(R.data, bytes, R.seedOf(gRank, 20));
  CUDA_OK(cudaMemsetAsync(R.data + R.M, kSentinel, bytes + kGuard, R.stream));
  R.sync("fill");
  R.link.barrier();
  R.resetReport();
  kQuietOverwrite<<<1, 256, 0, R.stream>>>(R.view, R.window, R.data, 0, R.M, bytes, R.seedOf(gRank, 21),
                                           R.timeoutNs, R.report);
  kWaitSignal<<<1, 1, 0, R.stream>>>(R.view, kSigQuiet, 1, R.timeoutNs, R.report + 1, 9);
  R.sync("quiet");
  // What landed is the bytes before the overwrite: quiet waited until the put had taken them.
  judgeLanded(R, "quiet_then_overwrite", R.M, bytes, R.seedOf(1 - gRank, 20),
              "bytes differ from the bytes put before quiet");
  R.link.barrier();
}

void checkTimeout(Rank& R) {
  const uint64_t limitNs = 50'000'000;
  R.resetReport();
  kWaitSignal<<<1, 1, 0, R.stream>>>(R.view, kSigNever, 1, limitNs, R.report, 1);
  R.sync("timeout");
  const double ms = R.report->value / 1e6;
  const bool ok = R.report->status == RAILNET_DOORBELL_TIMEOUT && ms >= 50 && ms < 2000;
  result(ok, "wait_signal_times_out",
         "status " + std::to_string(R.report->status) + " after " + std::to_string(ms) + " ms (limit 50 ms)");
}

// Rank 1: a bad window (its own ring fails); then it dies without finalizing. Rank 0: waits for a signal that will
// never come and must see the peer's death, not its own timeout.
void checkBadWindowAndDeath(Rank& R) {
  R.link.barrier();
  if (gRank == 1) {
    R.resetReport();
    kBadWindow<<<1, 1, 0, R.stream>>>(R.view, 99, R.timeoutNs, R.report);
    R.sync("bad window");
    uint32_t hostError = 0;
    API_OK(R.api.error(R.ctx, &hostError));
    const bool ok = R.report->value == RAILNET_DOORBELL_OK && R.report->status == RAILNET_DOORBELL_BAD_DESCRIPTOR &&
                    R.report->where == RAILNET_DOORBELL_BAD_DESCRIPTOR &&
                    hostError == RAILNET_DOORBELL_BAD_DESCRIPTOR;
    result(ok, "bad_window_reported",
           "put " + std::to_string(R.report->value) + ", quiet " + std::to_string(R.report->status) +
               ", later wait " + std::to_string(R.report->where) + ", railnet_doorbell_error " +
               std::to_string(hostError));
    fflush(stdout);
    R.link.barrier();
    _exit(gFailures == 0 ? 0 : 1);  // dies with its sockets open: the kernel closes them, as for a crash
  }
  R.resetReport();
  kWaitSignal<<<1, 1, 0, R.stream>>>(R.view, kSigDeath, 1, R.timeoutNs, R.report, 1);
  R.link.barrier();  // lets rank 1 die while the kernel waits
  R.sync("death");
  const double s = R.report->value / 1e9;
  result(R.report->status == RAILNET_DOORBELL_PEER_FAILED && s < 5, "peer_death_ends_wait",
         "status " + std::to_string(R.report->status) + " after " + std::to_string(s) + " s (want " +
             std::to_string(RAILNET_DOORBELL_PEER_FAILED) + " within 5 s; the wait's own limit is " +
             std::to_string(R.o.timeoutS) + " s)");
}

double median(std::vector<unsigned long long> values) {
  std::sort(values.begin(), values.end());
  return values.empty() ? 0 : static_cast<double>(values[values.size() / 2]);
}

void benchRoundTrips(Rank& R, bool withPut, uint64_t* base) {
  const int warm = std::max(1, R.o.iters / 10), rounds = warm + R.o.iters;
  unsigned long long* times = nullptr;
  CUDA_OK(cudaMallocHost(&times, rounds * sizeof(*times)));
  R.resetReport();
  R.link.barrier();
  kPingPong<<<1, 1, 0, R.stream>>>(R.view, R.window, 0, R.M, rounds, withPut, *base, R.timeoutNs, times, R.report);
  R.sync("ping-pong");
  *base += rounds;
  if (R.report->status != 0) die("ping-pong", statusText(*R.report).c_str());
  if (gRank == 0) {
    std::vector<unsigned long long> timed(times + warm, times + rounds);
    double sum = 0;
    for (unsigned long long t : timed) sum += static_cast<double>(t);
    const char* name = withPut ? "doorbell_put8_signal_roundtrip" : "doorbell_signal_roundtrip";
    printf("%s_us median %.3f mean %.3f (%d rounds after %d warm-up)\n", name, median(timed) / 1e3,
           sum / timed.size() / 1e3, R.o.iters, warm);
  }
  cudaFreeHost(times);
}

void benchBandwidth(Rank& R) {
  const uint64_t perRound = 256 * kMiB;
  const uint64_t sizes[] = {kMiB, 16 * kMiB, 64 * kMiB};
  uint64_t burstBase = 0, ackBase = 0;
  const int warm = 1, rounds = warm + R.o.bwIters;
  unsigned long long* times = nullptr;
  CUDA_OK(cudaMallocHost(&times, rounds * sizeof(*times)));
  for (uint64_t bytes : sizes) {
    if (bytes > R.M) continue;
    R.resetReport();
    R.link.barrier();
    kPutBurst<<<1, 1, 0, R.stream>>>(R.view, R.window, 0, R.M, bytes, static_cast<int>(perRound / bytes), rounds,
                                     burstBase, ackBase, R.timeoutNs, times, R.report);
    R.sync("put burst");
    burstBase += rounds;
    ackBase += rounds;
    if (R.report->status != 0) die("put burst", statusText(*R.report).c_str());
    if (gRank == 0) {
      double ns = 0;
      for (int r = warm; r < rounds; ++r) ns += static_cast<double>(times[r]);
      printf("doorbell_put_GBps %llu MiB puts: %.2f GB/s (%d rounds of %llu MiB after %d warm-up)\n",
             static_cast<unsigned long long>(bytes / kMiB), perRound * double(R.o.bwIters) / ns, R.o.bwIters,
             static_cast<unsigned long long>(perRound / kMiB), warm);
    }
  }
  cudaFreeHost(times);
}

int runRank(const Options& o, int rank, int fd) {
  gRank = rank;
  Rank R;
  R.o = o;
  R.link.fd = fd;
  R.api = loadApi();
  R.M = o.maxBytes;
  R.timeoutNs = static_cast<uint64_t>(o.timeoutS * 1e9);
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  const int device = rank % devices;
  CUDA_OK(cudaSetDevice(device));
  CUDA_OK(cudaStreamCreateWithFlags(&R.stream, cudaStreamNonBlocking));
  railnet_doorbell_unique_id_t id{};
  if (rank == 0) {
    API_OK(R.api.getUniqueId(&id));
    R.link.send(&id, sizeof id);
  } else {
    R.link.receive(&id, sizeof id);
  }
  API_OK(R.api.init(&id, rank, 2, device, &R.ctx));
  CUDA_OK(cudaMalloc(&R.data, 2 * R.M + kMiB));
  API_OK(R.api.registerWindow(R.ctx, R.data, 2 * R.M + kMiB, &R.window));
  API_OK(R.api.device(R.ctx, &R.view));
  CUDA_OK(cudaHostAlloc(&R.report, 4 * sizeof(Report), cudaHostAllocMapped));
  CUDA_OK(cudaHostAlloc(&R.mismatches, sizeof(*R.mismatches), cudaHostAllocMapped));
  if (rank == 0) {
    int atomics = 0;
    cudaDeviceGetAttribute(&atomics, cudaDevAttrHostNativeAtomicSupported, device);
    printf("# ranks on CUDA devices 0 and %d of %d (%s); ring %llu slots; host-native atomics %d; window %llu MiB\n",
           devices > 1 ? 1 : 0, devices, devices > 1 ? "one GPU each" : "one GPU shared: kernels time-slice unless MPS",
           static_cast<unsigned long long>(R.view.capacity), atomics,
           static_cast<unsigned long long>((2 * R.M + kMiB) / kMiB));
    fflush(stdout);
  }
  if (o.bench) {
    uint64_t pingBase = 0, putPingBase = 0;
    benchRoundTrips(R, false, &pingBase);
    benchRoundTrips(R, true, &putPingBase);
    benchBandwidth(R);
  }
  if (o.check) {
    checkSizes(R);
    checkWarpsAndBlocks(R);
    checkManySignals(R);
    checkQuietOverwrite(R);
    checkTimeout(R);
    checkBadWindowAndDeath(R);  // rank 1 exits inside
  } else {
    R.link.barrier();
  }
  API_OK(R.api.finalize(R.ctx));
  return gFailures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  int fds[2];
  if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) die("socketpair", strerror(errno));
  fflush(stdout);
  const pid_t child = fork();  // nothing may touch CUDA before the fork
  if (child < 0) die("fork", strerror(errno));
  if (child == 0) {
    close(fds[0]);
    _exit(runRank(o, 1, fds[1]));
  }
  close(fds[1]);
  const int mine = runRank(o, 0, fds[0]);
  int status = 0;
  waitpid(child, &status, 0);
  const int theirs = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
  printf("# rank 0 exit %d, rank 1 exit %d\n", mine, theirs);
  return std::max(mine, theirs);
}
