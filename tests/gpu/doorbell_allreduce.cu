// railnet-doorbell-allreduce: a rail-aligned alternating-ring all-reduce written on railnet's GPU doorbells
// (include/railnet/doorbell.h, doorbell_device.cuh), checked against and timed against ncclAllReduce through
// railnet (NCCL's net plugin) in the same run.
//
// Alternating rings (Penny's design): the ring walks the local GPUs forward on even nodes and in reverse on odd
// nodes, so every inter-node hop joins GPUs of the same local rank, the same rail. Two rings run at once, one
// walking that order forward and one backward, each carrying half of the buffer (--blocks-per-ring CUDA blocks
// each, every block its own slice, signal words and staging slots). Inter-node hops are doorbell put_signals;
// intra-node hops are plain stores over CUDA IPC (--intra nvlink) or doorbells too (--intra doorbell). The kernels
// and the argument that nothing deadlocks or is overwritten too early: doorbell_allreduce_kernels.cuh.
//
//   railnet-doorbell-allreduce [--ranks N] [--gpus-per-node G] [--sizes 1,16,64,256] [--iters 20] [--warmup 5]
//                              [--timeout-s 30] [--intra doorbell|nvlink] [--blocks-per-ring B] [--piece-kib K]
//                              [--watchdog-s S]
// Run it through scripts/gpu/doorbell-allreduce.sh (sets NCCL_NET_PLUGIN and RAILNET_PLUGIN to railnet's .so).
// One process per rank, no MPI: the parent (rank 0) forks ranks 1..N-1 before any CUDA call and is the hub of a
// star of socket pairs (bootstrap ids, IPC handles, host barriers, timings). Rank r is node r / G, local GPU r % G,
// CUDA device r % deviceCount, NCCL_HOSTID=railnet-node-<node> (NCCL sees N / G hosts, so its inter-node traffic
// goes through the net plugin). With fewer GPUs than ranks, ranks share GPUs: their kernels time-slice unless MPS
// runs (the checks hold; the timings are then not meaningful, and the program says so).
//
// Per size: one all-reduce of each kind on the same input ((rank + 1) * ((i % 13) + 1): exact in any order),
// compared bitwise on the GPU with each other and with the closed form ("PASS rN allreduce_<size>MiB" / "FAIL ...");
// then --warmup + --iters timed runs of each (cudaEvents per iteration; the doorbell ring with a host barrier before
// each run, NCCL back to back), and the last timed doorbell result checked again (allreduce_<size>MiB_last_timed).
// Rank 0 prints "allreduce <size> MiB: doorbell_ring <busbw GB/s> (<us>), nccl <busbw> (<us>), ratio <db/nccl>",
// busbw = 2 (R - 1) / R * bytes / time, time = the slowest rank's mean.
// Exit codes: 0 all passed; 1 a check failed or a device call reported an error (FAIL rN ... names the call,
// channel, step and piece); 2 a CUDA, NCCL or API error, a bad command line, a kernel that outlived its limit, or
// the watchdog (the parent kills every rank after --watchdog-s). The parent exits with the worst rank's code.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <errno.h>
#include <nccl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "doorbell_allreduce_kernels.cuh"
#include "doorbell_api_loader.h"
#include "host_clock_text.h"

#ifndef RAILNET_VERSION
#define RAILNET_VERSION "unknown"
#endif
#ifndef RAILNET_REVISION
#define RAILNET_REVISION "unknown"
#endif

namespace {

using namespace allreduce;

constexpr uint64_t kMiB = 1024 * 1024;

struct Options {
  int ranks = 4, gpusPerNode = 2;
  std::vector<int> sizesMiB = {1, 16, 64, 256};
  int iters = 20, warmup = 5;
  double timeoutS = 30;
  bool nvlink = true;  // --intra
  int blocksPerRing = 2;
  int pieceKiB = 1024;
  int watchdogS = 600;
};

void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s [--ranks N] [--gpus-per-node G] [--sizes MiB,...] [--iters N] [--warmup N] [--timeout-s S]\n"
          "          [--intra doorbell|nvlink] [--blocks-per-ring B] [--piece-kib K] [--watchdog-s S] [--version]\n"
          "  --ranks          processes (default 4); --gpus-per-node G: ranks per fake node (default 2)\n"
          "  --sizes          all-reduce sizes in MiB per rank (default 1,16,64,256)\n"
          "  --iters/--warmup timed and untimed runs of each all-reduce per size (default 20 and 5)\n"
          "  --timeout-s      limit of every device-side wait (default 30)\n"
          "  --intra          intra-node hops: nvlink (CUDA IPC stores, the default) or doorbell\n"
          "  --blocks-per-ring CUDA blocks (channels) per ring direction (default 2)\n"
          "  --piece-kib      pipelining unit (default 1024 KiB)\n"
          "  --watchdog-s     limit of the whole run (default 600)\n"
          "RAILNET_PLUGIN: the railnet .so to dlopen (default libnccl-net-railnet.so); NCCL_NET_PLUGIN: NCCL's.\n"
          "Exit: 0 pass, 1 check failed or device call failed, 2 CUDA/NCCL/API error or hang.\n",
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
    if (a == "--ranks") o.ranks = atoi(next());
    else if (a == "--gpus-per-node") o.gpusPerNode = atoi(next());
    else if (a == "--sizes") {
      o.sizesMiB.clear();
      std::string list = next();
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        const int mib = atoi(list.substr(at, comma - at).c_str());
        if (mib < 1 || mib > 4096) { fprintf(stderr, "bad size in --sizes %s\n", list.c_str()); exit(2); }
        o.sizesMiB.push_back(mib);
        at = comma + 1;
      }
    }
    else if (a == "--iters") o.iters = atoi(next());
    else if (a == "--warmup") o.warmup = atoi(next());
    else if (a == "--timeout-s") o.timeoutS = atof(next());
    else if (a == "--intra") {
      const std::string v = next();
      if (v != "nvlink" && v != "doorbell") { fprintf(stderr, "--intra takes nvlink or doorbell\n"); exit(2); }
      o.nvlink = v == "nvlink";
    }
    else if (a == "--blocks-per-ring") o.blocksPerRing = atoi(next());
    else if (a == "--piece-kib") o.pieceKiB = atoi(next());
    else if (a == "--watchdog-s") o.watchdogS = atoi(next());
    else if (a == "--version") {
      printf("railnet-doorbell-allreduce %s (revision %s)\n", RAILNET_VERSION, RAILNET_REVISION);
      exit(0);
    }
    else if (a == "-h" || a == "--help") { usage(stdout, argv[0]); exit(0); }
    else { fprintf(stderr, "unknown option %s\n", a.c_str()); usage(stderr, argv[0]); exit(2); }
  }
  if (o.ranks < 2 || o.ranks > 64 || o.gpusPerNode < 1 || o.ranks % o.gpusPerNode != 0 || o.iters < 1 ||
      o.warmup < 0 || o.timeoutS <= 0 || o.blocksPerRing < 1 || o.blocksPerRing > 32 || o.pieceKiB < 4 ||
      o.watchdogS < 1) {
    fprintf(stderr, "need 2 <= --ranks <= 64, a multiple of --gpus-per-node >= 1; --iters >= 1, --warmup >= 0, "
                    "--timeout-s > 0, 1 <= --blocks-per-ring <= 32, --piece-kib >= 4, --watchdog-s >= 1\n");
    exit(2);
  }
  return o;
}

// ---------------------------------------------------------------------------------------------------------------
// The alternating ring.

struct Ring {
  std::vector<int> order[2];  // by direction: ranks in ring order (1 is 0 reversed)
};

Ring alternatingRing(int ranks, int gpusPerNode) {
  Ring ring;
  for (int node = 0; node < ranks / gpusPerNode; ++node)
    for (int i = 0; i < gpusPerNode; ++i)
      ring.order[0].push_back(node * gpusPerNode + (node % 2 == 0 ? i : gpusPerNode - 1 - i));
  ring.order[1].assign(ring.order[0].rbegin(), ring.order[0].rend());
  return ring;
}

int positionOf(const std::vector<int>& order, int rank) {
  return static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
}

// Prints the ring with each hop's kind (rank 0, before the fork); false when an inter-node hop joins different
// local ranks (an odd number of nodes > 1 with G > 1 cannot close the ring on one rail).
bool printRing(const Options& o, const Ring& ring) {
  const int G = o.gpusPerNode, R = o.ranks;
  std::string line;
  for (int r : ring.order[0]) line += "r" + std::to_string(r) + " -> ";
  printf("# alternating ring, %d nodes x %d GPUs: %sr%d (ring A walks it forward, ring B backward, %d block%s "
         "each)\n",
         R / G, G, line.c_str(), ring.order[0][0], o.blocksPerRing, o.blocksPerRing > 1 ? "s" : "");
  bool railAligned = true;
  for (int p = 0; p < R; ++p) {
    const int from = ring.order[0][p], to = ring.order[0][(p + 1) % R];
    std::string kind;
    if (from / G == to / G) {
      kind = o.nvlink ? "nvlink (intra-node)" : "intra-node (doorbell)";
    } else {
      kind = "rail " + std::to_string(from % G) + " (inter-node)";
      if (from % G != to % G) {
        kind += ": NOT rail-aligned (local " + std::to_string(from % G) + " -> " + std::to_string(to % G) + ")";
        railAligned = false;
      }
    }
    printf("#   r%d -> r%d: %s\n", from, to, kind.c_str());
  }
  if (!railAligned)
    fprintf(stderr, "the alternating ring needs an even number of nodes (or one node, or --gpus-per-node 1)\n");
  fflush(stdout);
  return railAligned;
}

// ---------------------------------------------------------------------------------------------------------------
// Processes: the star of socket pairs, barriers, the end.

int gRank = 0, gRanks = 0;
std::vector<int> gDown;          // rank 0: socket to rank r at index r
int gUp = -1;                    // ranks > 0: socket to rank 0
std::vector<pid_t> gChildren;    // rank 0: pid of rank r at index r
double gGraceS = 90;


// Rank 0's end: closes the sockets (ranks blocked on a barrier see it and exit), waits for the ranks (a rank stuck
// in a kernel or in NCCL is killed after a grace period), and exits with the worst code.
[[noreturn]] void parentFinish(int code) {
  fflush(stdout);
  for (int fd : gDown)
    if (fd >= 0) close(fd);
  const double deadline = wallS() + (code == 0 ? 1e9 : gGraceS);
  int worst = code;
  std::string codes = "r0 " + std::to_string(code);
  for (int r = 1; r < gRanks; ++r) {
    if (gChildren[r] <= 0) continue;  // never forked
    int status = 0;
    for (;;) {
      const pid_t w = waitpid(gChildren[r], &status, WNOHANG);
      if (w == gChildren[r] || (w < 0 && errno != EINTR)) break;
      if (wallS() > deadline) {
        kill(gChildren[r], SIGKILL);
        waitpid(gChildren[r], &status, 0);
        break;
      }
      usleep(50000);
    }
    const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 2;
    if (!WIFEXITED(status)) printf("FAIL r%d process: killed by signal %d\n", r, WTERMSIG(status));
    worst = std::max(worst, rc);
    codes += ", r" + std::to_string(r) + " " + std::to_string(rc);
  }
  alarm(0);
  printf("# exit codes: %s -> %s (exit %d)\n", codes.c_str(), worst == 0 ? "PASS" : "FAIL", worst);
  fflush(stdout);
  _exit(worst);
}

// This rank ends here with `code` (no teardown: a failed rank may leave CUDA, NCCL or the doorbells mid-operation).
[[noreturn]] void finish(int code) {
  if (gRank == 0) parentFinish(code);
  fflush(stdout);
  _exit(code);
}

[[noreturn]] void die(const std::string& what, const std::string& why) {
  printf("FAIL r%d %s: %s\n", gRank, what.c_str(), why.c_str());
  finish(2);
}

void onAlarm(int) {
  const char msg[] = "FAIL r0 watchdog: the run took longer than --watchdog-s; killing every rank\n";
  ssize_t ignored = write(1, msg, sizeof msg - 1);
  (void)ignored;
  for (size_t r = 1; r < gChildren.size(); ++r)
    if (gChildren[r] > 0) kill(gChildren[r], SIGKILL);
  _exit(2);
}

bool sendAll(int fd, const void* data, size_t bytes) {
  const char* c = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t k = send(fd, c, bytes, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    bytes -= static_cast<size_t>(k);
  }
  return true;
}

bool recvAll(int fd, void* data, size_t bytes) {
  char* c = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t k = read(fd, c, bytes);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return false;
    c += k;
    bytes -= static_cast<size_t>(k);
  }
  return true;
}

[[noreturn]] void lost(int rank) {
  die("bootstrap", fmt("rank %d is gone (its socket closed)", rank));
}

// Every rank contributes `bytes`; every rank gets all of them, by rank.
void allGather(const void* mine, size_t bytes, void* all) {
  char* out = static_cast<char*>(all);
  if (gRank != 0) {
    if (!sendAll(gUp, mine, bytes) || !recvAll(gUp, out, bytes * gRanks)) lost(0);
    return;
  }
  memcpy(out, mine, bytes);
  for (int r = 1; r < gRanks; ++r)
    if (!recvAll(gDown[r], out + r * bytes, bytes)) lost(r);
  for (int r = 1; r < gRanks; ++r)
    if (!sendAll(gDown[r], out, bytes * gRanks)) lost(r);
}

void broadcast(void* data, size_t bytes) {
  if (gRank != 0) {
    if (!recvAll(gUp, data, bytes)) lost(0);
    return;
  }
  for (int r = 1; r < gRanks; ++r)
    if (!sendAll(gDown[r], data, bytes)) lost(r);
}

// Host barrier that also agrees on the state: every rank gives its own, all get the worst.
enum State : char { kOk = 0, kMismatch = 1, kAbort = 2 };

int gExit = 0;  // this rank's code so far (1 once a check failed)

// A barrier after which every rank stops if any rank must (a device call failed: the signal counts are no longer
// known, so nothing can run after it).
void agree(State mine) {
  std::vector<char> all(gRanks);
  const char c = mine;
  allGather(&c, 1, all.data());
  if (*std::max_element(all.begin(), all.end()) == kAbort) {
    if (mine != kAbort) printf("FAIL r%d stopped: another rank failed\n", gRank);
    finish(std::max(gExit, 1));
  }
}

// ---------------------------------------------------------------------------------------------------------------
// CUDA, NCCL, the doorbell API.

#define CUDA_OK(call)                                                                           \
  do {                                                                                          \
    const cudaError_t e_ = (call);                                                              \
    if (e_ != cudaSuccess) die("cuda", fmt("%s: %s", #call, cudaGetErrorString(e_)));           \
  } while (0)
#define NCCL_OK(call)                                                                           \
  do {                                                                                          \
    const ncclResult_t r_ = (call);                                                             \
    if (r_ != ncclSuccess) die("nccl", fmt("%s: %s", #call, ncclGetErrorString(r_)));           \
  } while (0)
#define API_OK(call)                                                                            \
  do {                                                                                          \
    const int r_ = (call);                                                                      \
    if (r_ != 0) die("doorbell", fmt("%s returned %d", #call, r_));                             \
  } while (0)

using Api = DoorbellApi;

Api loadApi() {
  Api api;
  std::string why;
  if (!loadDoorbellApi(&api, &why)) die("the doorbell API", why.c_str());
  return api;
}

const char* statusName(int status) {
  switch (status) {
    case RAILNET_DOORBELL_OK: return "ok";
    case RAILNET_DOORBELL_PEER_FAILED: return "peer failed";
    case RAILNET_DOORBELL_BAD_DESCRIPTOR: return "bad descriptor";
    case RAILNET_DOORBELL_STALLED: return "stalled";
    case RAILNET_DOORBELL_TIMEOUT: return "timeout";
    default: return "unknown";
  }
}

const char* whereName(int where) {
  switch (where) {
    case kRsSend: return "reduce-scatter send";
    case kRsWait: return "reduce-scatter wait";
    case kAgSend: return "all-gather send";
    case kAgWait: return "all-gather wait";
    case kQuietEnd: return "final quiet";
    default: return "?";
  }
}

struct Ids {
  railnet_doorbell_unique_id_t doorbell;
  ncclUniqueId nccl;
};

struct IpcInfo {
  cudaIpcMemHandle_t window, flags;
};

// The sizes of one all-reduce: every rank computes the same from (count, channels, R, piece size).
struct Geometry {
  uint64_t count = 0, slotFloats = 0;
  int pieces = 1;
};

Geometry geometryOf(uint64_t count, int channels, int R, uint64_t pieceFloats) {
  Geometry g;
  g.count = count;
  for (int ch = 0; ch < channels; ++ch) {
    const uint64_t chLen = cut(count, channels, ch + 1) - cut(count, channels, ch);
    for (int k = 0; k < R; ++k) g.slotFloats = std::max(g.slotFloats, cut(chLen, R, k + 1) - cut(chLen, R, k));
  }
  g.slotFloats = (g.slotFloats + kAlign - 1) / kAlign * kAlign;
  const uint64_t pieces = (g.slotFloats + pieceFloats - 1) / pieceFloats;
  g.pieces = static_cast<int>(std::min<uint64_t>(256, std::max<uint64_t>(1, pieces)));
  return g;
}

struct Rank {
  Options o;
  Ring ring;
  int R = 0, node = 0, local = 0, device = 0, deviceCount = 0, channels = 0;
  Api api{};
  railnet_doorbell_ctx_t* ctx = nullptr;
  railnet_doorbell_device_t view{};
  uint32_t window = 0;
  char* win = nullptr;  // the window: data (the largest size), then staging
  uint64_t winBytes = 0, stageOffset = 0;
  uint64_t* flags = nullptr;  // nvlink flag words, 2 per channel
  float* input = nullptr;
  float* ncclOut = nullptr;
  unsigned long long* counts = nullptr;  // kCompare's, device memory
  Report* report = nullptr;              // mapped host memory
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  std::map<int, std::pair<char*, uint64_t*>> opened;  // nvlink peers' window and flags, by rank
  Plan plan{};
  uint64_t signalsSoFar = 0;  // what each (channel, phase) word has received
  uint64_t pieceFloats = 0;
};

// Waits for the stream, polling: a kernel past its limit is reported as a hang (exit 2), and NCCL's asynchronous
// errors end the rank.
void syncStream(Rank& K, const char* what) {
  const double limit = 2 * K.o.timeoutS + 60, start = wallS();
  for (;;) {
    const cudaError_t e = cudaStreamQuery(K.stream);
    if (e == cudaSuccess) return;
    if (e != cudaErrorNotReady) die("cuda", fmt("%s: %s", what, cudaGetErrorString(e)));
    if (K.comm != nullptr) {
      ncclResult_t async = ncclSuccess;
      if (ncclCommGetAsyncError(K.comm, &async) == ncclSuccess && async != ncclSuccess && async != ncclInProgress)
        die("nccl", fmt("%s: asynchronous error %s", what, ncclGetErrorString(async)));
    }
    if (wallS() - start > limit) {
      if (K.report->status != 0)
        printf("FAIL r%d %s: device status %d (%s) in %s, channel %d step %d piece %d\n", gRank, what,
               K.report->status, statusName(K.report->status), whereName(K.report->where), K.report->channel,
               K.report->step, K.report->piece);
      die(what, fmt("still running after %.0f s (a hang)", limit));
    }
    usleep(20);
  }
}

void setup(Rank& K) {
  const Options& o = K.o;
  K.R = o.ranks;
  K.node = gRank / o.gpusPerNode;
  K.local = gRank % o.gpusPerNode;
  K.channels = 2 * o.blocksPerRing;
  K.pieceFloats = uint64_t(o.pieceKiB) * 1024 / sizeof(float);
  K.api = loadApi();
  CUDA_OK(cudaGetDeviceCount(&K.deviceCount));
  if (K.deviceCount < 1) die("cuda", "no CUDA device");
  K.device = gRank % K.deviceCount;
  CUDA_OK(cudaSetDevice(K.device));
  cudaDeviceProp prop;
  CUDA_OK(cudaGetDeviceProperties(&prop, K.device));
  int ncclVersion = 0;
  NCCL_OK(ncclGetVersion(&ncclVersion));
  const char* hostId = getenv("NCCL_HOSTID");
  printf("# r%d: node %d local %d, CUDA device %d of %d (%s), NCCL_HOSTID=%s\n", gRank, K.node, K.local, K.device,
         K.deviceCount, prop.name, hostId != nullptr ? hostId : "(unset)");
  if (gRank == 0) {
    printf("# NCCL %d.%d.%d (%d; compiled against %d), railnet-doorbell-allreduce %s (revision %s)\n",
           ncclVersion / 10000, ncclVersion / 100 % 100, ncclVersion % 100, ncclVersion, NCCL_VERSION_CODE,
           RAILNET_VERSION, RAILNET_REVISION);
    if (K.deviceCount < K.R)
      printf("# %d ranks on %d GPUs: ranks share GPUs and their kernels time-slice unless MPS runs; the checks hold, "
             "the timings are not meaningful\n",
             K.R, K.deviceCount);
  }
  fflush(stdout);

  Ids ids{};
  if (gRank == 0) {
    API_OK(K.api.getUniqueId(&ids.doorbell));
    NCCL_OK(ncclGetUniqueId(&ids.nccl));
  }
  broadcast(&ids, sizeof ids);
  CUDA_OK(cudaStreamCreateWithFlags(&K.stream, cudaStreamNonBlocking));
  API_OK(K.api.init(&ids.doorbell, gRank, K.R, K.device, &K.ctx));
  NCCL_OK(ncclCommInitRank(&K.comm, K.R, ids.nccl, gRank));

  // Buffers for the largest size; the window holds its data and its staging slots.
  const int maxMiB = *std::max_element(o.sizesMiB.begin(), o.sizesMiB.end());
  const uint64_t maxCount = uint64_t(maxMiB) * kMiB / sizeof(float);
  const Geometry largest = geometryOf(maxCount, K.channels, K.R, K.pieceFloats);
  K.stageOffset = maxCount * sizeof(float);
  K.winBytes = K.stageOffset + uint64_t(K.channels) * (K.R - 1) * largest.slotFloats * sizeof(float);
  CUDA_OK(cudaMalloc(&K.win, K.winBytes));
  CUDA_OK(cudaMalloc(&K.flags, 2 * K.channels * sizeof(uint64_t)));
  CUDA_OK(cudaMemset(K.flags, 0, 2 * K.channels * sizeof(uint64_t)));
  CUDA_OK(cudaMalloc(&K.input, maxCount * sizeof(float)));
  CUDA_OK(cudaMalloc(&K.ncclOut, maxCount * sizeof(float)));
  CUDA_OK(cudaMalloc(&K.counts, 3 * sizeof(unsigned long long)));
  CUDA_OK(cudaHostAlloc(&K.report, sizeof(Report), cudaHostAllocMapped));
  memset(K.report, 0, sizeof(Report));
  API_OK(K.api.registerWindow(K.ctx, K.win, K.winBytes, &K.window));
  API_OK(K.api.device(K.ctx, &K.view));
  if (uint32_t(2 * K.channels) > K.view.signal_count)
    die("doorbell", fmt("%d signal words needed, the context has %u", 2 * K.channels, K.view.signal_count));
  CUDA_OK(cudaDeviceSynchronize());

  // nvlink hops: each rank maps the window and flags of its next rank in each direction when that rank shares its
  // node (the handles travel through rank 0).
  Plan& plan = K.plan;
  plan.ctx = K.view;
  plan.window = K.window;
  plan.myWindow = K.win;
  plan.myFlags = K.flags;
  plan.R = K.R;
  plan.stageOffset = K.stageOffset;
  plan.timeoutNs = static_cast<uint64_t>(o.timeoutS * 1e9);
  plan.report = K.report;
  const bool ipc = o.nvlink && o.gpusPerNode > 1;
  std::vector<IpcInfo> handles(K.R);
  if (ipc) {
    IpcInfo mine{};
    CUDA_OK(cudaIpcGetMemHandle(&mine.window, K.win));
    CUDA_OK(cudaIpcGetMemHandle(&mine.flags, K.flags));
    allGather(&mine, sizeof mine, handles.data());
  }
  for (int d = 0; d < 2; ++d) {
    const std::vector<int>& order = K.ring.order[d];
    const int pos = positionOf(order, gRank);
    const int next = order[(pos + 1) % K.R], prev = order[(pos + K.R - 1) % K.R];
    plan.pos[d] = pos;
    plan.out[d].peer = next;
    plan.inIpc[d] = ipc && prev / o.gpusPerNode == K.node;
    if (ipc && next / o.gpusPerNode == K.node) {
      if (K.opened.count(next) == 0) {
        void* peerWindow = nullptr;
        void* peerFlags = nullptr;
        const cudaError_t e = cudaIpcOpenMemHandle(&peerWindow, handles[next].window, cudaIpcMemLazyEnablePeerAccess);
        if (e != cudaSuccess)
          die("cuda", fmt("cudaIpcOpenMemHandle of r%d's window: %s (no P2P between these GPUs? try --intra "
                          "doorbell)", next, cudaGetErrorString(e)));
        CUDA_OK(cudaIpcOpenMemHandle(&peerFlags, handles[next].flags, cudaIpcMemLazyEnablePeerAccess));
        K.opened[next] = {static_cast<char*>(peerWindow), static_cast<uint64_t*>(peerFlags)};
      }
      plan.out[d].ipcWindow = K.opened[next].first;
      plan.out[d].ipcFlags = K.opened[next].second;
    }
  }
  agree(kOk);
}

void teardown(Rank& K) {
  agree(kOk);  // every kernel and collective of every rank is done
  for (auto& entry : K.opened) {
    CUDA_OK(cudaIpcCloseMemHandle(entry.second.first));
    CUDA_OK(cudaIpcCloseMemHandle(entry.second.second));
  }
  agree(kOk);  // nobody maps a buffer that is about to be freed
  API_OK(K.api.finalize(K.ctx));
  NCCL_OK(ncclCommFinalize(K.comm));
  NCCL_OK(ncclCommDestroy(K.comm));
  K.comm = nullptr;
  CUDA_OK(cudaFree(K.win));
  CUDA_OK(cudaFree(K.flags));
  CUDA_OK(cudaFree(K.input));
  CUDA_OK(cudaFree(K.ncclOut));
  CUDA_OK(cudaFree(K.counts));
  CUDA_OK(cudaFreeHost(K.report));
  CUDA_OK(cudaStreamDestroy(K.stream));
}

// One doorbell all-reduce on the window's data, reset from the input first. The barrier before the launch is what
// makes reuse safe: every rank's previous kernel has ended (so its staging slots are read and, after its final
// quiet, its puts' sources too) and every rank's data holds the new input before anyone's first put can land.
// Returns kAbort (after a FAIL line) when a device call failed.
State doorbellOnce(Rank& K, const Geometry& g, int sizeMiB, cudaEvent_t start, cudaEvent_t stop) {
  CUDA_OK(cudaMemcpyAsync(K.win, K.input, g.count * sizeof(float), cudaMemcpyDeviceToDevice, K.stream));
  syncStream(K, "reset");
  agree(kOk);
  memset(K.report, 0, sizeof(Report));
  Plan plan = K.plan;
  plan.count = g.count;
  plan.slotFloats = g.slotFloats;
  plan.pieces = g.pieces;
  plan.base = K.signalsSoFar;
  if (start != nullptr) CUDA_OK(cudaEventRecord(start, K.stream));
  kRingAllReduce<<<K.channels, kThreads, 0, K.stream>>>(plan);
  CUDA_OK(cudaGetLastError());
  if (stop != nullptr) CUDA_OK(cudaEventRecord(stop, K.stream));
  K.signalsSoFar += uint64_t(K.R - 1) * g.pieces;
  const std::string name = fmt("allreduce_%dMiB", sizeMiB);
  syncStream(K, name.c_str());
  if (K.report->status == 0) return kOk;
  uint32_t ringError = 0;
  K.api.error(K.ctx, &ringError);
  printf("FAIL r%d %s: device status %d (%s) in %s, channel %d step %d piece %d (doorbell ring error %u)\n", gRank,
         name.c_str(), K.report->status, statusName(K.report->status), whereName(K.report->where),
         K.report->channel, K.report->step, K.report->piece, ringError);
  gExit = std::max(gExit, 1);
  return kAbort;
}

// Counts of kCompare: ring vs NCCL bitwise, ring vs closed form, NCCL vs closed form.
std::vector<unsigned long long> compare(Rank& K, uint64_t count) {
  CUDA_OK(cudaMemsetAsync(K.counts, 0, 3 * sizeof(unsigned long long), K.stream));
  kCompare<<<256, 256, 0, K.stream>>>(reinterpret_cast<const float*>(K.win), K.ncclOut, count,
                                      float(K.R) * float(K.R + 1) / 2, K.counts);
  CUDA_OK(cudaGetLastError());
  std::vector<unsigned long long> counts(3);
  CUDA_OK(cudaMemcpyAsync(counts.data(), K.counts, 3 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, K.stream));
  syncStream(K, "compare");
  return counts;
}

State verdict(const std::string& name, const std::vector<unsigned long long>& c, uint64_t count) {
  if (c[0] == 0 && c[1] == 0 && c[2] == 0) {
    printf("PASS r%d %s\n", gRank, name.c_str());
    return kOk;
  }
  printf("FAIL r%d %s: %llu of %llu floats differ between the doorbell ring and NCCL; %llu doorbell and %llu NCCL "
         "floats differ from the expected sums\n",
         gRank, name.c_str(), c[0], static_cast<unsigned long long>(count), c[1], c[2]);
  gExit = std::max(gExit, 1);
  return kMismatch;
}

void runSize(Rank& K, int sizeMiB) {
  const uint64_t count = uint64_t(sizeMiB) * kMiB / sizeof(float);
  const Geometry g = geometryOf(count, K.channels, K.R, K.pieceFloats);
  const std::string name = fmt("allreduce_%dMiB", sizeMiB);
  kFillInput<<<1024, 256, 0, K.stream>>>(K.input, count, gRank);
  CUDA_OK(cudaGetLastError());

  // Check: one of each on the same input.
  agree(doorbellOnce(K, g, sizeMiB, nullptr, nullptr));
  NCCL_OK(ncclAllReduce(K.input, K.ncclOut, count, ncclFloat, ncclSum, K.comm, K.stream));
  syncStream(K, "ncclAllReduce");
  agree(verdict(name, compare(K, count), count));

  // Doorbell ring: warm-up, then timed runs, each after a host barrier.
  cudaEvent_t start, stop;
  CUDA_OK(cudaEventCreate(&start));
  CUDA_OK(cudaEventCreate(&stop));
  double ringMs = 0;
  for (int i = 0; i < K.o.warmup + K.o.iters; ++i) {
    const bool timed = i >= K.o.warmup;
    agree(doorbellOnce(K, g, sizeMiB, timed ? start : nullptr, timed ? stop : nullptr));
    if (timed) {
      float ms = 0;
      CUDA_OK(cudaEventElapsedTime(&ms, start, stop));
      ringMs += ms;
    }
  }
  CUDA_OK(cudaEventDestroy(start));
  CUDA_OK(cudaEventDestroy(stop));

  // NCCL: warm-up, then timed runs back to back.
  for (int i = 0; i < K.o.warmup; ++i)
    NCCL_OK(ncclAllReduce(K.input, K.ncclOut, count, ncclFloat, ncclSum, K.comm, K.stream));
  syncStream(K, "ncclAllReduce warm-up");
  agree(kOk);
  std::vector<cudaEvent_t> events(K.o.iters + 1);
  for (auto& e : events) CUDA_OK(cudaEventCreate(&e));
  CUDA_OK(cudaEventRecord(events[0], K.stream));
  for (int i = 0; i < K.o.iters; ++i) {
    NCCL_OK(ncclAllReduce(K.input, K.ncclOut, count, ncclFloat, ncclSum, K.comm, K.stream));
    CUDA_OK(cudaEventRecord(events[i + 1], K.stream));
  }
  syncStream(K, "ncclAllReduce timed");
  double ncclMs = 0;
  for (int i = 0; i < K.o.iters; ++i) {
    float ms = 0;
    CUDA_OK(cudaEventElapsedTime(&ms, events[i], events[i + 1]));
    ncclMs += ms;
  }
  for (auto& e : events) CUDA_OK(cudaEventDestroy(e));

  // The last timed doorbell result, still in the window, against NCCL's last and the closed form.
  agree(verdict(name + "_last_timed", compare(K, count), count));

  // Timings: each rank's mean per run; rank 0 reports the slowest rank's.
  const double mine[2] = {ringMs / K.o.iters * 1e3, ncclMs / K.o.iters * 1e3};  // us
  std::vector<double> all(2 * K.R);
  allGather(mine, sizeof mine, all.data());
  if (gRank == 0) {
    double ringUs = 0, ncclUs = 0;
    for (int r = 0; r < K.R; ++r) {
      ringUs = std::max(ringUs, all[2 * r]);
      ncclUs = std::max(ncclUs, all[2 * r + 1]);
    }
    const double bytes = double(count) * sizeof(float), factor = 2.0 * (K.R - 1) / K.R;
    const double ringBw = factor * bytes / (ringUs * 1e3), ncclBw = factor * bytes / (ncclUs * 1e3);  // GB/s
    printf("allreduce %d MiB: doorbell_ring %.2f GB/s busbw (%.1f us), nccl %.2f GB/s busbw (%.1f us), ratio %.3f "
           "(%d pieces of %llu KiB per chunk, %d channels)\n",
           sizeMiB, ringBw, ringUs, ncclBw, ncclUs, ringBw / ncclBw, g.pieces,
           static_cast<unsigned long long>((g.slotFloats * sizeof(float) / g.pieces + 1023) / 1024), K.channels);
    fflush(stdout);
  }
}

int runRank(const Options& o, const Ring& ring) {
  Rank K;
  K.o = o;
  K.ring = ring;
  gGraceS = 2 * o.timeoutS + 60;
  setup(K);
  for (int sizeMiB : o.sizesMiB) runSize(K, sizeMiB);
  teardown(K);
  return gExit;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);  // one write per line: the ranks' lines do not interleave
  const Ring ring = alternatingRing(o.ranks, o.gpusPerNode);
  if (!printRing(o, ring)) return 2;

  // Nothing may touch CUDA or NCCL before the forks.
  gRanks = o.ranks;
  gDown.assign(o.ranks, -1);
  gChildren.assign(o.ranks, -1);
  const pid_t parent = getpid();
  int rank = 0;
  for (int r = 1; r < o.ranks; ++r) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
      perror("railnet-doorbell-allreduce: socketpair");
      parentFinish(2);
    }
    fflush(stdout);
    const pid_t child = fork();
    if (child < 0) {
      perror("railnet-doorbell-allreduce: fork");
      parentFinish(2);
    }
    if (child == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(2);
      close(sv[0]);
      for (int fd : gDown)
        if (fd >= 0) close(fd);
      gDown.clear();
      gChildren.clear();
      gUp = sv[1];
      rank = r;
      break;
    }
    close(sv[1]);
    gDown[r] = sv[0];
    gChildren[r] = child;
  }
  gRank = rank;
  if (rank == 0) {
    signal(SIGALRM, onAlarm);
    alarm(static_cast<unsigned>(o.watchdogS));
  }
  const std::string hostId = fmt("railnet-node-%d", rank / o.gpusPerNode);
  setenv("NCCL_HOSTID", hostId.c_str(), 1);
  finish(runRank(o, ring));
}
