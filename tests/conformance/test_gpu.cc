// GPU memory (NCCL_PTR_CUDA) through the real .so, as NCCL hands it over when the device reports it (group "gpu"):
// regMr of cuMemAlloc'ed regions, isend/irecv of sub-ranges of them to and from GPU and host memory, grouped
// receives mixing both, the sizes around the TCP transport's staging pieces (1 MiB) and slots (8), messages far
// larger than slots x piece, iflush, oversize, both directions, deregMr. Every byte is checked by copying GPU
// memory back to the host.
//
// Needs a GPU: without a usable CUDA driver and device the group prints "SKIP gpu: <why>" and (alone) exits 77.
// With a GPU the device must offer NCCL_PTR_CUDA, unless RAILNET_TCP_GPU=0, where gpu.properties checks that CUDA
// memory is refused and the other cases skip.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <iterator>
#include <map>
#include <optional>
#include <random>
#include <string>
#include <utility>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "memory.h"
#include "transfer.h"

namespace conformance {
namespace {

constexpr MemKind kGpu = MemKind::Gpu;
constexpr MemKind kHost = MemKind::Host;
constexpr int kMaxRecvs = 8;

// The sizes of interest: empty, tiny, the 4 KiB page, the 64 KiB host-inline limit (GPU memory never goes inline),
// the 1 MiB staging piece, an odd multi-piece size, and one 8x larger than all 8 slots of a comm together.
const std::vector<size_t> kSizes = {0,       1,       4095,        4096,    65535,       65536,
                                    65537,   MiB - 1, MiB,         MiB + 1, 8 * MiB + 3, 64 * MiB};

std::string gpuRequirement() { return gpuUnavailableReason(); }

GROUP_REQUIRES("gpu", gpuRequirement);

// GPU memory is offered to NCCL only with RAILNET_TCP_GPU=1 (off by default, D70).
bool tcpGpuOff() {
  const char* value = std::getenv("RAILNET_TCP_GPU");
  return value == nullptr || std::string(value) != "1";
}

// What the plugin logged about CUDA so far (its reason for host-only ptrSupport, if any).
std::string pluginGpuLines() {
  std::string out;
  for (const LogRecord& record : recordsSince(0, NCCL_LOG_INFO)) {
    const std::string& text = record.text;
    if (text.find("CUDA") == std::string::npos && text.find("GPU") == std::string::npos) continue;
    out += (out.empty() ? "" : " | ") + text;
    if (out.size() > 600) break;
  }
  return out.empty() ? "(nothing about CUDA or GPUs)" : out;
}

// Every data case starts here: skips under RAILNET_TCP_GPU=0, fails when the device does not take GPU memory
// although this machine has a usable GPU, and makes the test thread's context device 0's, as NCCL's are.
void requireGpuPath(const TestEnv& env) {
  if (tcpGpuOff()) SKIP("RAILNET_TCP_GPU=0: host memory only (gpu.properties checks that CUDA memory is refused)");
  NetContext ctx(*env.net, nextCommId());
  DeviceProps props;
  REQUIRE_OK(env.net->getProperties(env.dev, &props));
  REQUIRE(props.ptrSupport & NCCL_PTR_CUDA,
          strf("dev %d (%s) reports ptrSupport 0x%x without NCCL_PTR_CUDA although a GPU is usable here; the plugin "
               "logged: %s",
               env.dev, props.name ? props.name : "?", props.ptrSupport, pluginGpuLines().c_str()));
  bindGpuContext();
}

// "GPU->host" and the like, for messages naming a case.
std::string direction(MemKind send, MemKind recv) { return std::string(kindName(send)) + "->" + kindName(recv); }

// Runs `plan` and names the case in a failure.
void runCase(NetApi& net, Connection& conn, const Plan& plan, const std::string& name) {
  try {
    runTransfer(net, conn, plan);
  } catch (const TestFailure& e) {
    throw TestFailure(name + ": " + e.what());
  }
}

// Tests every request in turn, as NCCL's proxy progresses all its peers, until all are done; each must end in
// ncclSuccess. Returns each request's sizes (-1 where none were reported).
std::vector<std::array<int, kMaxRecvs>> waitAll(NetApi& net, const std::vector<void*>& requests, const char* what,
                                                const Deadline& deadline) {
  std::vector<std::array<int, kMaxRecvs>> sizes(requests.size());
  for (auto& s : sizes) s.fill(-1);
  std::vector<bool> done(requests.size(), false);
  size_t left = requests.size();
  for (Backoff backoff; left > 0;) {
    deadline.check(what);
    bool progressed = false;
    for (size_t i = 0; i < requests.size(); ++i) {
      if (done[i]) continue;
      int finished = 0;
      const ncclResult_t rc = net.test(requests[i], &finished, sizes[i].data());
      REQUIRE(rc == ncclSuccess, strf("test of request #%zu of %s returned %s", i, what, ncclResultName(rc)));
      if (finished) {
        done[i] = true;
        --left;
        progressed = true;
      }
    }
    progressed ? backoff.progressed() : backoff.idle();
  }
  return sizes;
}

// Reorders the sends at random while keeping each tag's own order, which decides matching.
void interleaveTags(Plan& plan, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int> owner;
  for (const SendSpec& s : plan.sends) owner.push_back(s.tag);
  std::shuffle(owner.begin(), owner.end(), rng);
  std::map<int, std::vector<SendSpec>> byTag;
  for (const SendSpec& s : plan.sends) byTag[s.tag].push_back(s);
  std::map<int, size_t> next;
  for (size_t i = 0; i < plan.sends.size(); ++i) plan.sends[i] = byTag[owner[i]][next[owner[i]]++];
}

// The sizes test for one direction: every size of kSizes up to this pass's limit, 32 messages in flight.
void sizesCase(TestEnv& env, MemKind send, MemKind recv, uint64_t seed) {
  requireGpuPath(env);
  const std::vector<size_t> sizes = clampSizes(kSizes, messageLimit(env));
  std::vector<size_t> upTo8M;
  for (size_t s : sizes) {
    if (s <= 8 * MiB + 3) upTo8M.push_back(s);
  }
  LinkedPair pair(*env.net, env.dev);
  const std::string name = direction(send, recv);
  // Three rounds of the sizes up to 8 MiB + 3 (ascending, descending into buffers posted 1 MiB - 1 larger, shuffled):
  // small enough in total that every receive buffer is surrounded by canaries, so a piece copied up whole past
  // the end of a message shows.
  {
    Plan plan;
    plan.seed = seed;
    plan.sendWindow = plan.recvWindow = NCCL_NET_MAX_REQUESTS;
    std::vector<size_t> shuffled = upTo8M;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(seed));
    for (int round = 0; round < 3; ++round) {
      std::vector<size_t> order = round == 2 ? shuffled : upTo8M;
      if (round == 1) std::reverse(order.begin(), order.end());
      for (size_t s : order) {
        plan.sends.push_back({0, s, send});
        plan.recvs.push_back({{0, round == 1 ? s + MiB - 1 : s, recv}});
      }
    }
    runCase(*env.net, pair.conn, plan, name + ", sizes up to 8 MiB + 3 in three rounds");
  }
  // Three rounds of every size, 64 MiB included, with the whole window in flight.
  if (sizes.size() > upTo8M.size()) {
    Plan plan;
    plan.seed = seed + 1;
    plan.sendWindow = plan.recvWindow = NCCL_NET_MAX_REQUESTS;
    std::vector<size_t> shuffled = sizes;
    std::shuffle(shuffled.begin(), shuffled.end(), std::mt19937_64(seed + 1));
    for (const std::vector<size_t>& order : {shuffled, sizes, std::vector<size_t>(sizes.rbegin(), sizes.rend())}) {
      for (size_t s : order) {
        plan.sends.push_back({0, s, send});
        plan.recvs.push_back({{0, s, recv}});
      }
    }
    runCase(*env.net, pair.conn, plan, name + ", every size up to 64 MiB in three rounds");
  }
}

// An oversize message (`sent` bytes of sendMemory into `posted` bytes of recvMemory, which is GPU memory): both
// ends must fail it with ncclInvalidUsage, with a WARN, and nothing may be written past the posted buffer.
void oversizeCase(NetApi& net, Connection& conn, Memory& sendMemory, void* sendHandle, Memory& recvMemory,
                  void* recvHandle, size_t posted, size_t sent) {
  const std::string what = strf("%zu bytes (%s memory) into %zu bytes of GPU memory", sent,
                                kindName(sendMemory.kind()), posted);
  recvMemory.fill(0, kCanary, recvMemory.size());
  writePattern(sendMemory, 0, sent, 77);
  const uint64_t mark = logMark();
  ThreadGroup threads;
  const Deadline deadline(std::chrono::seconds(10), threads.abortFlag());
  threads.spawn([&] {
    bindGpuContext();
    void* request = postRecv(net, conn.recv.get(), recvMemory.data(), posted, recvHandle, deadline);
    int received = -1;
    const ncclResult_t rc = waitRequest(net, request, &received, deadline);
    REQUIRE(rc == ncclInvalidUsage,
            strf("%s: the receive ended in %s (%d bytes), expected ncclInvalidUsage", what.c_str(), ncclResultName(rc),
                 received));
  });
  threads.spawn([&] {
    bindGpuContext();
    void* request = nullptr;
    for (Backoff backoff; !request; backoff.idle()) {
      deadline.check("the oversize isend to be answered");
      const ncclResult_t rc = net.isend(conn.send.get(), sendMemory.data(), sent, 0, sendHandle, &request);
      if (rc == ncclSuccess) continue;
      REQUIRE(rc == ncclInvalidUsage,
              strf("%s: isend returned %s, expected ncclInvalidUsage", what.c_str(), ncclResultName(rc)));
      return;  // failing at isend is how a plugin that sees the posted size first reports it
    }
    int size = -1;
    const ncclResult_t rc = waitRequest(net, request, &size, deadline);
    REQUIRE(rc == ncclInvalidUsage, strf("%s: the send ended in %s (%d bytes), expected ncclInvalidUsage",
                                         what.c_str(), ncclResultName(rc), size));
  });
  threads.join();
  REQUIRE(waitForWarning(mark, {}, std::chrono::seconds(1)), what + ": no WARN was logged");
  const size_t past = findOtherThan(recvMemory, posted, recvMemory.size() - posted, kCanary);
  REQUIRE(past == SIZE_MAX, strf("%s: GPU byte %zu, past the posted buffer, was written", what.c_str(), posted + past));
}

}  // namespace

TEST_CASE("gpu", "properties", Scope::PerVersion) {
  // Every device offers GPU memory next to host memory; regMr of CUDA memory works on both comms of a connection.
  // Under RAILNET_TCP_GPU=0: host memory only, and regMr of CUDA memory is refused with ncclInvalidArgument.
  NetApi& net = *env.net;
  bindGpuContext();
  NetContext ctx(net, nextCommId());
  int ndev = 0;
  REQUIRE_OK(net.devices(&ndev));
  const bool off = tcpGpuOff();
  for (int dev = 0; dev < ndev; ++dev) {
    DeviceProps props;
    REQUIRE_OK(net.getProperties(dev, &props));
    REQUIRE(props.ptrSupport & NCCL_PTR_HOST, strf("dev %d: ptrSupport 0x%x lacks NCCL_PTR_HOST", dev, props.ptrSupport));
    if (off) {
      REQUIRE(!(props.ptrSupport & NCCL_PTR_CUDA),
              strf("dev %d: RAILNET_TCP_GPU=0, yet ptrSupport 0x%x offers NCCL_PTR_CUDA", dev, props.ptrSupport));
    } else {
      REQUIRE(props.ptrSupport & NCCL_PTR_CUDA,
              strf("dev %d (%s): ptrSupport 0x%x lacks NCCL_PTR_CUDA although a GPU is usable here; the plugin "
                   "logged: %s",
                   dev, props.name ? props.name : "?", props.ptrSupport, pluginGpuLines().c_str()));
    }
  }
  std::unique_ptr<Memory> gpu = allocateMemory(kGpu, 4 * MiB + 5);
  LinkedPair pair(net, env.dev);
  if (off) {
    for (void* comm : {pair.conn.send.get(), pair.conn.recv.get()}) {
      const char* which = comm == pair.conn.send.get() ? "send" : "recv";
      void* mhandle = nullptr;
      const ncclResult_t rc = net.regMr(comm, gpu->data(), gpu->size(), NCCL_PTR_CUDA, &mhandle);
      if (rc == ncclSuccess && mhandle != nullptr) (void)net.deregMr(comm, mhandle);
      REQUIRE(rc == ncclInvalidArgument, strf("RAILNET_TCP_GPU=0: regMr(NCCL_PTR_CUDA) on the %s comm returned %s, "
                                              "expected ncclInvalidArgument",
                                              which, ncclResultName(rc)));
    }
    // The refusal leaves the connection usable for host memory.
    runCase(net, pair.conn, simplePlan({0, 1, 65537, MiB + 1}, 4, 101), "host->host after the refused regMr");
    return;
  }
  for (int round = 0; round < 2; ++round) {
    Registration onSend(net, pair.conn.send.get(), gpu->data(), gpu->size(), NCCL_PTR_CUDA);
    Registration onRecv(net, pair.conn.recv.get(), gpu->data() + 4097, MiB + 1, NCCL_PTR_CUDA);
    REQUIRE(onSend.handle() != onRecv.handle(), "two registrations returned the same mhandle");
    REQUIRE_OK(onRecv.release());
    REQUIRE_OK(onSend.release());
  }
}

TEST_CASE("gpu", "sizes", Scope::PerVersion) { sizesCase(env, kGpu, kGpu, 201); }

TEST_CASE("gpu", "gpu_to_host", Scope::PerVersion) { sizesCase(env, kGpu, kHost, 202); }

TEST_CASE("gpu", "host_to_gpu", Scope::PerVersion) { sizesCase(env, kHost, kGpu, 203); }

TEST_CASE("gpu", "small_messages", Scope::PerVersion) {
  // 1 B to 64 KiB: host memory would go inline, GPU memory must not. All 32 in flight; then every message with
  // its own random ends (GPU or host on either side) in one stream.
  requireGpuPath(env);
  LinkedPair pair(*env.net, env.dev);
  std::mt19937_64 rng(204);
  std::vector<size_t> sizes;
  for (int i = 0; i < 600; ++i) sizes.push_back(randomSize(rng, 64 * KiB));
  Plan plan = simplePlan(sizes, NCCL_NET_MAX_REQUESTS, 204);
  runCase(*env.net, pair.conn, placeMemory(plan, kGpu, kGpu), "GPU->GPU, 600 messages up to 64 KiB");
  for (SendSpec& s : plan.sends) s.memory = rng() % 2 ? kGpu : kHost;
  for (RecvGroup& group : plan.recvs) group[0].memory = rng() % 2 ? kGpu : kHost;
  plan.seed = 205;
  runCase(*env.net, pair.conn, plan, "600 messages up to 64 KiB, each end GPU or host at random");
}

TEST_CASE("gpu", "large", Scope::PerVersion) {
  // Messages far larger than a comm's 8 slots x 1 MiB: 256 MiB + 3 each way and, GPU to GPU, the largest allowed.
  requireGpuPath(env);
  const size_t limit = messageLimit(env);
  constexpr size_t kLarge = 256 * MiB + 3;
  if (!env.heavy) SKIP("the largest sizes run on the first version of the run only (or give --version)");
  if (limit < kLarge) SKIP(strf("--max-size / maxP2pBytes allow %zu bytes, less than 256 MiB + 3", limit));
  LinkedPair pair(*env.net, env.dev);
  auto run = [&](MemKind send, MemKind recv) {
    Plan plan = simplePlan({kLarge, 1, kLarge}, 2, 206);
    runCase(*env.net, pair.conn, placeMemory(plan, send, recv), direction(send, recv) + ", 256 MiB + 3");
  };
  run(kGpu, kGpu);
  run(kGpu, kHost);
  if (limit > kLarge) {
    Plan plan = simplePlan({limit}, 1, 207);
    runCase(*env.net, pair.conn, placeMemory(plan, kGpu, kGpu), strf("GPU->GPU, %zu bytes (the limit)", limit));
  }
  run(kHost, kGpu);
}

TEST_CASE("gpu", "subranges", Scope::PerVersion) {
  // NCCL registers a buffer once and moves sub-ranges of it: messages at offsets that are no multiple of 4 KiB,
  // spanning 1 MiB piece boundaries, to and from one registered region each; nothing outside them changes.
  requireGpuPath(env);
  NetApi& net = *env.net;
  constexpr size_t kRegion = 12 * MiB + 3;
  struct Piece {
    size_t sendOffset, recvOffset, size;
  };
  const std::vector<Piece> pieces = {
      {1, 3, 1},
      {4097, 8191, 4095},
      {65541, 65547, 65537},
      {MiB - 7, MiB + 11, MiB + 13},
      {3 * MiB + 12345, 3 * MiB + 77, 3 * MiB + 1},
      {7 * MiB + 1, 7 * MiB + 4099, 2 * MiB + 3},
      {9 * MiB + 5, 10 * MiB + 9, MiB},
      {kRegion - 1001, kRegion - 1003, 1000},
  };
  std::vector<Piece> byRecv = pieces;
  std::sort(byRecv.begin(), byRecv.end(), [](const Piece& a, const Piece& b) { return a.recvOffset < b.recvOffset; });
  // Memory first: it outlives the comms.
  std::unique_ptr<Memory> memory[2][kMemKinds];  // [send, recv][kind]
  for (auto& side : memory) {
    for (MemKind kind : {kHost, kGpu}) side[kindIndex(kind)] = allocateMemory(kind, kRegion);
  }
  LinkedPair pair(net, env.dev);
  std::optional<Registration> registrations[2][kMemKinds];
  for (int side = 0; side < 2; ++side) {
    for (int k = 0; k < kMemKinds; ++k) {
      const Memory& m = *memory[side][k];
      registrations[side][k].emplace(net, side == 0 ? pair.conn.send.get() : pair.conn.recv.get(), m.data(), m.size(),
                                     ptrType(m.kind()));
    }
  }
  for (const auto& [sendKind, recvKind] : {std::pair{kGpu, kGpu}, std::pair{kHost, kGpu}, std::pair{kGpu, kHost}}) {
    Memory& send = *memory[0][kindIndex(sendKind)];
    Memory& recv = *memory[1][kindIndex(recvKind)];
    void* sendHandle = registrations[0][kindIndex(sendKind)]->handle();
    void* recvHandle = registrations[1][kindIndex(recvKind)]->handle();
    const std::string name = direction(sendKind, recvKind);
    recv.fill(0, kCanary, kRegion);
    for (size_t i = 0; i < pieces.size(); ++i) writePattern(send, pieces[i].sendOffset, pieces[i].size, 300 + i);
    std::vector<std::array<int, kMaxRecvs>> sizes;
    ThreadGroup threads;
    const Deadline deadline(threads.abortFlag());
    threads.spawn([&] {
      bindGpuContext();
      std::vector<void*> requests;
      for (const Piece& p : pieces) {
        requests.push_back(postRecv(net, pair.conn.recv.get(), recv.data() + p.recvOffset, p.size, recvHandle, deadline));
      }
      sizes = waitAll(net, requests, "irecv", deadline);
    });
    threads.spawn([&] {
      bindGpuContext();
      std::vector<void*> requests;
      for (const Piece& p : pieces) {
        requests.push_back(
            postSend(net, pair.conn.send.get(), send.data() + p.sendOffset, p.size, 0, sendHandle, deadline));
      }
      waitAll(net, requests, "isend", deadline);
    });
    threads.join();
    for (size_t i = 0; i < pieces.size(); ++i) {
      const Piece& p = pieces[i];
      const std::string where = strf("%s, message %zu (%zu bytes from offset %zu into offset %zu)", name.c_str(), i,
                                     p.size, p.sendOffset, p.recvOffset);
      REQUIRE(sizes[i][0] == static_cast<int>(p.size), strf("%s: test reported %d bytes", where.c_str(), sizes[i][0]));
      const std::string wrong = describeMismatch(recv, p.recvOffset, p.size, 300 + i);
      REQUIRE(wrong.empty(), where + ": " + wrong);
    }
    size_t end = 0;
    for (const Piece& p : byRecv) {
      const size_t j = findOtherThan(recv, end, p.recvOffset - end, kCanary);
      REQUIRE(j == SIZE_MAX, strf("%s: byte %zu of the receive region, outside every message, was written",
                                  name.c_str(), end + j));
      end = p.recvOffset + p.size;
    }
    const size_t j = findOtherThan(recv, end, kRegion - end, kCanary);
    REQUIRE(j == SIZE_MAX, strf("%s: byte %zu of the receive region, after the last message, was written",
                                name.c_str(), end + j));
  }
}

TEST_CASE("gpu", "grouped_mixed", Scope::PerVersion) {
  // Grouped receives of 8 tags whose buffers alternate between GPU and host memory, from sends of either kind,
  // with sizes around the piece size and zero; in tag order, then in a random order across tags.
  requireGpuPath(env);
  LinkedPair pair(*env.net, env.dev);
  const size_t capacities[] = {1, 4096, 65537, MiB - 1, MiB + 1, 2 * MiB + 3};
  for (uint64_t seed : {211, 212}) {
    std::mt19937_64 rng(seed);
    Plan plan;
    plan.seed = seed;
    plan.sendWindow = seed == 211 ? 8 : 2;
    plan.recvWindow = 8;
    for (int g = 0; g < 8; ++g) {
      RecvGroup group;
      for (int tag = 0; tag < kMaxRecvs; ++tag) {
        const size_t capacity = capacities[rng() % std::size(capacities)];
        group.push_back({tag, capacity, (g + tag) % 2 ? kHost : kGpu});
        const size_t size = rng() % 2 ? capacity : randomSize(rng, capacity);
        plan.sends.push_back({tag, size, rng() % 3 ? kGpu : kHost});
      }
      plan.recvs.push_back(group);
    }
    if (seed == 212) interleaveTags(plan, seed);
    runCase(*env.net, pair.conn, plan, seed == 211 ? "in tag order" : "random order across tags, send window 2");
  }
}

TEST_CASE("gpu", "iflush", Scope::PerVersion) {
  // The receive completes once every byte is in GPU memory: iflush has nothing left and returns a NULL request.
  requireGpuPath(env);
  NetApi& net = *env.net;
  std::unique_ptr<Memory> send = allocateMemory(kGpu, 4 * MiB);
  std::unique_ptr<Memory> gpu = allocateMemory(kGpu, 4 * MiB);
  std::unique_ptr<Memory> host = allocateMemory(kHost, 4 * MiB);
  LinkedPair pair(net, env.dev);
  Registration sendReg(net, pair.conn.send.get(), send->data(), send->size(), NCCL_PTR_CUDA);
  Registration gpuReg(net, pair.conn.recv.get(), gpu->data(), gpu->size(), NCCL_PTR_CUDA);
  Registration hostReg(net, pair.conn.recv.get(), host->data(), host->size(), NCCL_PTR_HOST);
  // One grouped receive: 1 MiB + 1 into GPU memory, 4097 bytes into host memory, 0 bytes into GPU memory.
  const size_t sent[3] = {MiB + 1, 4097, 0};
  const size_t sendOffset[3] = {0, 2 * MiB, 3 * MiB};
  void* data[3] = {gpu->data() + 5, host->data() + 7, gpu->data() + 2 * MiB + 9};
  size_t capacity[3] = {2 * MiB, 8192, 4096};
  int tags[3] = {0, 1, 2};
  void* handles[3] = {gpuReg.handle(), hostReg.handle(), gpuReg.handle()};
  for (int i = 0; i < 3; ++i) writePattern(*send, sendOffset[i], sent[i], 400 + i);
  const Deadline deadline;
  void* recvRequest = postRecv(net, pair.conn.recv.get(), 3, data, capacity, tags, handles, deadline);
  std::vector<void*> requests = {recvRequest};
  for (int i = 0; i < 3; ++i) {
    requests.push_back(postSend(net, pair.conn.send.get(), send->data() + sendOffset[i], sent[i], tags[i],
                                sendReg.handle(), deadline));
  }
  const auto sizes = waitAll(net, requests, "request (grouped receive first, then its 3 sends)", deadline);
  const Memory* where[3] = {gpu.get(), host.get(), gpu.get()};
  const size_t at[3] = {5, 7, 2 * MiB + 9};
  for (int i = 0; i < 3; ++i) {
    REQUIRE(sizes[0][i] == static_cast<int>(sent[i]),
            strf("receive buffer %d reported %d bytes, sent %zu", i, sizes[0][i], sent[i]));
    const std::string wrong = describeMismatch(*where[i], at[i], sent[i], 400 + i);
    REQUIRE(wrong.empty(), strf("receive buffer %d: %s", i, wrong.c_str()));
  }
  int flushSizes[3] = {static_cast<int>(sent[0]), static_cast<int>(sent[1]), 0};
  void* request = reinterpret_cast<void*>(0x1);
  REQUIRE_OK(net.iflush(pair.conn.recv.get(), 1, data, flushSizes, handles, &request));
  REQUIRE(request == nullptr, "iflush of a completed GPU receive returned a request; expected NULL (nothing to flush)");
  request = reinterpret_cast<void*>(0x1);
  REQUIRE_OK(net.iflush(pair.conn.recv.get(), 3, data, flushSizes, handles, &request));
  REQUIRE(request == nullptr, "iflush of a completed grouped GPU + host receive returned a request; expected NULL");
  REQUIRE(describeMismatch(*gpu, 5, sent[0], 400).empty(), "iflush changed the received GPU bytes");
}

TEST_CASE("gpu", "oversize", Scope::PerVersion) {
  // A message larger than the posted GPU buffer fails on both ends with ncclInvalidUsage; the connection then
  // moves every later message intact.
  requireGpuPath(env);
  NetApi& net = *env.net;
  std::unique_ptr<Memory> gpuSend = allocateMemory(kGpu, 2 * MiB);
  std::unique_ptr<Memory> hostSend = allocateMemory(kHost, 2 * MiB);
  std::unique_ptr<Memory> gpuRecv = allocateMemory(kGpu, 2 * MiB);
  LinkedPair pair(net, env.dev);
  {
    Registration gpuSendReg(net, pair.conn.send.get(), gpuSend->data(), gpuSend->size(), NCCL_PTR_CUDA);
    Registration hostSendReg(net, pair.conn.send.get(), hostSend->data(), hostSend->size(), NCCL_PTR_HOST);
    Registration recvReg(net, pair.conn.recv.get(), gpuRecv->data(), gpuRecv->size(), NCCL_PTR_CUDA);
    oversizeCase(net, pair.conn, *gpuSend, gpuSendReg.handle(), *gpuRecv, recvReg.handle(), 64 * KiB, 64 * KiB + 1);
    oversizeCase(net, pair.conn, *hostSend, hostSendReg.handle(), *gpuRecv, recvReg.handle(), MiB, MiB + 1);
    oversizeCase(net, pair.conn, *gpuSend, gpuSendReg.handle(), *gpuRecv, recvReg.handle(), 4096, 2 * MiB);
  }
  Plan after = simplePlan({0, 1, 65537, MiB, MiB + 1, 3 * MiB + 5}, 4, 221);
  runCase(net, pair.conn, placeMemory(after, kGpu, kGpu), "GPU->GPU on the same connection after the oversizes");
  runCase(net, pair.conn, placeMemory(after, kHost, kGpu), "host->GPU on the same connection after the oversizes");
}

TEST_CASE("gpu", "both_directions", Scope::PerVersion) {
  // Two communicators with a connection each way, both moving GPU memory at once (each comm has its own staging).
  requireGpuPath(env);
  NetContext a(*env.net, nextCommId());
  NetContext b(*env.net, nextCommId());
  Connection ab = connectPair(*env.net, a.get(), b.get(), env.dev);
  Connection ba = connectPair(*env.net, b.get(), a.get(), env.dev);
  auto plan = [](uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::vector<size_t> sizes = {MiB + 1, 8 * MiB + 3, 0, 65537, MiB - 1};
    for (int i = 0; i < 200; ++i) sizes.push_back(rng() % 4 ? randomSize(rng, 4 * MiB) : rng() % (4 * MiB + 1));
    Plan p = simplePlan(sizes, 8, seed);
    return placeMemory(p, kGpu, kGpu);
  };
  ThreadGroup threads;
  threads.spawn([&] { runCase(*env.net, ab, plan(231), "a->b"); });
  threads.spawn([&] { runCase(*env.net, ba, plan(232), "b->a"); });
  threads.join();
}

TEST_CASE("gpu", "deregister", Scope::PerVersion) {
  // deregMr of GPU regions after use succeeds on both comms; new regions (two at once on one comm, and the first
  // again after its deregistration) work afterwards, also once the old memory is freed.
  requireGpuPath(env);
  NetApi& net = *env.net;
  std::unique_ptr<Memory> first[2] = {allocateMemory(kGpu, 3 * MiB + 7), allocateMemory(kGpu, 3 * MiB + 7)};
  std::unique_ptr<Memory> second[2] = {allocateMemory(kGpu, 2 * MiB), allocateMemory(kGpu, 2 * MiB)};
  std::unique_ptr<Memory> freed[2] = {allocateMemory(kGpu, MiB), allocateMemory(kGpu, MiB)};
  LinkedPair pair(net, env.dev);
  const Deadline deadline;
  // Moves `size` bytes from sender memory s at sendOffset to receiver memory r at recvOffset and checks them.
  auto move = [&](Memory& s, void* sh, size_t sendOffset, Memory& r, void* rh, size_t recvOffset, size_t size,
                  uint64_t seed, const char* what) {
    REQUIRE(sendOffset + size <= s.size() && recvOffset + size <= r.size(), strf("%s: outside the regions", what));
    writePattern(s, sendOffset, size, seed);
    void* recv = postRecv(net, pair.conn.recv.get(), r.data() + recvOffset, size, rh, deadline);
    void* send = postSend(net, pair.conn.send.get(), s.data() + sendOffset, size, 0, sh, deadline);
    const auto sizes = waitAll(net, {recv, send}, strf("%s (#0 the irecv, #1 the isend)", what).c_str(), deadline);
    REQUIRE(sizes[0][0] == static_cast<int>(size), strf("%s: received %d bytes, sent %zu", what, sizes[0][0], size));
    const std::string wrong = describeMismatch(r, recvOffset, size, seed);
    REQUIRE(wrong.empty(), std::string(what) + ": " + wrong);
  };
  auto deregister = [](Registration& registration, const char* what) {
    const ncclResult_t rc = registration.release();
    REQUIRE(rc == ncclSuccess, strf("deregMr of %s returned %s", what, ncclResultName(rc)));
  };
  {
    Registration s1(net, pair.conn.send.get(), first[0]->data(), first[0]->size(), NCCL_PTR_CUDA);
    Registration r1(net, pair.conn.recv.get(), first[1]->data(), first[1]->size(), NCCL_PTR_CUDA);
    move(*first[0], s1.handle(), 3, *first[1], r1.handle(), 4, 3 * MiB, 501, "first regions");
    deregister(r1, "the receiver's first GPU region");
    deregister(s1, "the sender's first GPU region");
  }
  {
    // Two regions registered on each comm at once, each used; then the first registered again.
    Registration s2(net, pair.conn.send.get(), second[0]->data(), second[0]->size(), NCCL_PTR_CUDA);
    Registration r2(net, pair.conn.recv.get(), second[1]->data(), second[1]->size(), NCCL_PTR_CUDA);
    Registration s3(net, pair.conn.send.get(), freed[0]->data(), freed[0]->size(), NCCL_PTR_CUDA);
    Registration r3(net, pair.conn.recv.get(), freed[1]->data(), freed[1]->size(), NCCL_PTR_CUDA);
    move(*second[0], s2.handle(), 0, *freed[1], r3.handle(), 1, MiB - 1, 502, "second send region into third");
    move(*freed[0], s3.handle(), 5, *second[1], r2.handle(), 4099, MiB - 5, 503, "third send region into second");
    Registration s1(net, pair.conn.send.get(), first[0]->data(), first[0]->size(), NCCL_PTR_CUDA);
    Registration r1(net, pair.conn.recv.get(), first[1]->data(), first[1]->size(), NCCL_PTR_CUDA);
    move(*first[0], s1.handle(), 1, *first[1], r1.handle(), 0, 2 * MiB + 1, 504, "first regions registered again");
    for (Registration* r : {&r3, &s3, &r1, &s1, &r2, &s2}) deregister(*r, "a GPU region");
  }
  // Regions deregistered and their memory freed; fresh memory registered on the same comms still moves.
  freed[0].reset();
  freed[1].reset();
  std::unique_ptr<Memory> fresh[2] = {allocateMemory(kGpu, MiB + 3), allocateMemory(kGpu, MiB + 3)};
  Registration s4(net, pair.conn.send.get(), fresh[0]->data(), fresh[0]->size(), NCCL_PTR_CUDA);
  Registration r4(net, pair.conn.recv.get(), fresh[1]->data(), fresh[1]->size(), NCCL_PTR_CUDA);
  move(*fresh[0], s4.handle(), 0, *fresh[1], r4.handle(), 3, MiB, 505, "fresh regions after frees");
  deregister(r4, "the receiver's fresh GPU region");
  deregister(s4, "the sender's fresh GPU region");
}

TEST_CASE("gpu", "caller_context", Scope::PerVersion) {
  // NCCL's threads keep their GPU's context current and rely on the plugin to leave it so: after every call with
  // GPU memory the calling thread's current context is still device 0's primary context.
  requireGpuPath(env);
  NetApi& net = *env.net;
  std::unique_ptr<Memory> send = allocateMemory(kGpu, 2 * MiB + 1);
  std::unique_ptr<Memory> recv = allocateMemory(kGpu, 2 * MiB + 1);
  LinkedPair pair(net, env.dev);
  writePattern(*send, 0, send->size(), 601);
  bindGpuContext();
  auto expectContext = [](const char* after) {
    REQUIRE(gpuContextCurrent(), std::string("after ") + after +
                                     " the calling thread's current CUDA context is no longer device 0's primary one");
  };
  Registration sendReg(net, pair.conn.send.get(), send->data(), send->size(), NCCL_PTR_CUDA);
  expectContext("regMr on the send comm");
  Registration recvReg(net, pair.conn.recv.get(), recv->data(), recv->size(), NCCL_PTR_CUDA);
  expectContext("regMr on the recv comm");
  const Deadline deadline;
  void* recvRequest = postRecv(net, pair.conn.recv.get(), recv->data(), recv->size(), recvReg.handle(), deadline);
  expectContext("irecv");
  void* sendRequest = postSend(net, pair.conn.send.get(), send->data(), send->size(), 0, sendReg.handle(), deadline);
  expectContext("isend");
  bool sendDone = false, recvDone = false;
  for (Backoff backoff; !sendDone || !recvDone; backoff.idle()) {
    deadline.check("the requests to complete");
    int done = 0;
    if (!sendDone) {
      REQUIRE_OK(net.test(sendRequest, &done, nullptr));
      expectContext("test of the isend");
      sendDone = done;
    }
    if (!recvDone) {
      REQUIRE_OK(net.test(recvRequest, &done, nullptr));
      expectContext("test of the irecv");
      recvDone = done;
    }
  }
  REQUIRE_OK(recvReg.release());
  expectContext("deregMr on the recv comm");
  REQUIRE_OK(sendReg.release());
  expectContext("deregMr on the send comm");
  const std::string wrong = describeMismatch(*recv, 0, recv->size(), 601);
  REQUIRE(wrong.empty(), wrong);
}

}  // namespace conformance
