// Each tuner ABI version through dlopen of the real .so, as NCCL loads it: symbols, init, getCollInfo on a
// NCCL-like table, finalize; bad calibration files, forced NCCL_ALGO/NCCL_PROTO and RAILNET_TUNER=off keep
// NCCL's table; every call returns ncclSuccess.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <atomic>

#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <string>
#include <unistd.h>
#include <vector>

#include "railnet/nccl/tuner.h"

// Counts heap allocations of the whole process (the .so's included: its malloc calls bind to this one) while
// gCountAllocations is set. Sanitizers replace malloc themselves, so their builds leave this (and the
// allocation test) out: RAILNET_SANITIZED comes from the build, since under ASan this file itself is compiled
// without instrumentation (tests/meson.build) and __SANITIZE_ADDRESS__ is then not defined.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || RAILNET_SANITIZED
#define RAILNET_COUNT_ALLOCATIONS 0
#else
#define RAILNET_COUNT_ALLOCATIONS 1
#endif
#if RAILNET_COUNT_ALLOCATIONS
extern "C" void* __libc_malloc(size_t size);
namespace {
std::atomic<bool> gCountAllocations{false};
std::atomic<long> gAllocations{0};
}  // namespace
extern "C" void* malloc(size_t size) {
  if (gCountAllocations.load(std::memory_order_relaxed)) gAllocations.fetch_add(1, std::memory_order_relaxed);
  return __libc_malloc(size);
}
#endif

namespace {

std::mutex gLogMutex;
std::vector<std::string> gLog;

void captureLog(ncclDebugLogLevel level, unsigned long, const char*, int, const char* fmt, ...) {
  char line[1024];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(line, sizeof(line), fmt, args);
  va_end(args);
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.push_back(std::string(level == NCCL_LOG_WARN ? "WARN " : "INFO ") + line);
}

void clearLog() {
  std::lock_guard<std::mutex> lock(gLogMutex);
  gLog.clear();
}

bool logged(const std::string& text) {
  std::lock_guard<std::mutex> lock(gLogMutex);
  for (const std::string& line : gLog) {
    if (line.find(text) != std::string::npos) return true;
  }
  return false;
}

void* library(const char* path = RAILNET_PLUGIN_PATH) {
  static void* handle = nullptr;
  if (handle == nullptr) handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(handle != nullptr);
  return handle;
}

// A table as NCCL 2.28 fills it for a 2-node allreduce: tree and ring on every protocol, the rest -1.
struct Table {
  float cost[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  Table() {
    for (auto& row : cost) {
      for (float& entry : row) entry = NCCL_ALGO_PROTO_IGNORE;
    }
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
      cost[NCCL_ALGO_TREE][p] = 50.0f + p;
      cost[NCCL_ALGO_RING][p] = 40.0f + p;
    }
  }
  float** raw() { return reinterpret_cast<float**>(cost); }
  bool operator==(const Table& other) const { return std::memcmp(cost, other.cost, sizeof(cost)) == 0; }
};

// A calibration file in which tree/LL128 is fastest for a 2-rank, 2-node allreduce at 1 KiB, plus (unless
// measurementsOnly) a chunk rule for allgather on any shape.
std::string writeCalibration(bool measurementsOnly = false) {
  char path[] = "/tmp/railnet-tuner-abi-XXXXXX";
  int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  std::ofstream out(path);
  out << "# test\n"
         "allreduce,1024,1024,ring,ll,-1,2,2,-1,-1,90\n"
         "allreduce,1024,1024,ring,ll128,-1,2,2,-1,-1,80\n"
         "allreduce,1024,1024,ring,simple,-1,2,2,-1,-1,100\n"
         "allreduce,1024,1024,tree,ll,-1,2,2,-1,-1,70\n"
         "allreduce,1024,1024,tree,ll128,-1,2,2,-1,-1,10\n"
         "allreduce,1024,1024,tree,simple,-1,2,2,-1,-1,60\n";
  if (!measurementsOnly) out << "allgather,0,4294967295,ring,simple,-1,-1,-1,-1,-1,,,524288\n";
  return path;
}

struct Env {
  Env(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old, had_ = true;
    if (value != nullptr) setenv(name, value, 1);
    else unsetenv(name);
  }
  ~Env() {
    if (had_) setenv(name_, old_.c_str(), 1);
    else unsetenv(name_);
  }
  const char* name_;
  std::string old_;
  bool had_ = false;
};

// One version's calls, normalised: init(nRanks, nNodes) -> ctx; getCollInfo; finalize.
struct Version {
  int number;
  void* (*init)(void* table, size_t nRanks, size_t nNodes);
  ncclResult_t (*collInfo)(void* table, void* ctx, ncclFunc_t coll, size_t bytes, Table* costs, int* channels);
  ncclResult_t (*finalize)(void* table, void* ctx);
};

template <class T>
T* symbol(const char* name) {
  auto* table = static_cast<T*>(dlsym(library(), name));
  REQUIRE(table != nullptr);
  return table;
}

std::vector<Version> versions() {
  return {
      {6,
       [](void* t, size_t r, size_t n) {
         void* ctx = nullptr;
         ncclNvlDomainInfo_v6_t nvl{2, 1, 1};
         ncclTunerConstants_v6_t constants{};
         CHECK(static_cast<ncclTuner_v6_t*>(t)->init(&ctx, 42, r, n, captureLog, &nvl, &constants) == ncclSuccess);
         return ctx;
       },
       [](void* t, void* ctx, ncclFunc_t c, size_t b, Table* costs, int* ch) {
         return static_cast<ncclTuner_v6_t*>(t)->getCollInfo(ctx, c, b, 1, costs->raw(), 7, 3, 0, ch);
       },
       [](void* t, void* ctx) { return static_cast<ncclTuner_v6_t*>(t)->finalize(ctx); }},
      {5,
       [](void* t, size_t r, size_t n) {
         void* ctx = nullptr;
         ncclNvlDomainInfo_v5_t nvl{2, 1, 1};
         ncclTunerConstants_v5_t constants{};
         CHECK(static_cast<ncclTuner_v5_t*>(t)->init(&ctx, 42, r, n, captureLog, &nvl, &constants) == ncclSuccess);
         return ctx;
       },
       [](void* t, void* ctx, ncclFunc_t c, size_t b, Table* costs, int* ch) {
         return static_cast<ncclTuner_v5_t*>(t)->getCollInfo(ctx, c, b, 1, costs->raw(), 7, 3, 0, ch);
       },
       [](void* t, void* ctx) { return static_cast<ncclTuner_v5_t*>(t)->finalize(ctx); }},
      {4,
       [](void* t, size_t r, size_t n) {
         void* ctx = nullptr;
         CHECK(static_cast<ncclTuner_v4_t*>(t)->init(r, n, captureLog, &ctx) == ncclSuccess);
         return ctx;
       },
       [](void* t, void* ctx, ncclFunc_t c, size_t b, Table* costs, int* ch) {
         return static_cast<ncclTuner_v4_t*>(t)->getCollInfo(ctx, c, b, 1, costs->raw(), 7, 3, 0, ch);
       },
       [](void* t, void* ctx) { return static_cast<ncclTuner_v4_t*>(t)->destroy(ctx); }},
      {3,
       [](void* t, size_t r, size_t n) {
         void* ctx = nullptr;
         CHECK(static_cast<ncclTuner_v3_t*>(t)->init(r, n, captureLog, &ctx) == ncclSuccess);
         return ctx;
       },
       [](void* t, void* ctx, ncclFunc_t c, size_t b, Table* costs, int* ch) {
         return static_cast<ncclTuner_v3_t*>(t)->getCollInfo(ctx, c, b, 1, costs->raw(), 7, 3, ch);
       },
       [](void* t, void* ctx) { return static_cast<ncclTuner_v3_t*>(t)->destroy(ctx); }},
  };
}

void* tableOf(int version) {
  std::string name = "ncclTunerPlugin_v" + std::to_string(version);
  void* table = dlsym(library(), name.c_str());
  REQUIRE(table != nullptr);
  REQUIRE(std::strcmp(*static_cast<const char* const*>(table), "railnet") == 0);  // name is the first field
  return table;
}

}  // namespace

TEST_CASE("every tuner version applies the calibration through the real .so", "[tuner-abi]") {
  std::string file = writeCalibration();
  Env tunerFile("RAILNET_TUNER_FILE", file.c_str());
  Env model("RAILNET_TUNER_MODEL", "off");
  Env algo("NCCL_ALGO", nullptr);
  Env proto("NCCL_PROTO", nullptr);
  for (const Version& version : versions()) {
    INFO("ncclTunerPlugin_v" << version.number);
    void* table = tableOf(version.number);
    void* ctx = version.init(table, 2, 2);
    REQUIRE(ctx != nullptr);
    CHECK(logged("tuner ABI v" + std::to_string(version.number)));
    Table costs;
    int channels = 0;
    CHECK(version.collInfo(table, ctx, ncclFuncAllReduce, 1024, &costs, &channels) == ncclSuccess);
    CHECK(costs.cost[NCCL_ALGO_TREE][NCCL_PROTO_LL128] == 0.0f);
    CHECK(channels == 0);
    Table untouched;
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a) {
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
        if (a == NCCL_ALGO_TREE && p == NCCL_PROTO_LL128) continue;
        CHECK(costs.cost[a][p] == untouched.cost[a][p]);  // -1 entries stay -1, others unchanged
      }
    }
    // A collective with no measurement: the table is left as NCCL filled it.
    Table broadcast;
    CHECK(version.collInfo(table, ctx, ncclFuncBroadcast, 1024, &broadcast, &channels) == ncclSuccess);
    CHECK(broadcast == Table{});
    // A NULL table or context is survived, not dereferenced.
    CHECK(version.collInfo(table, nullptr, ncclFuncAllReduce, 1024, &costs, &channels) == ncclSuccess);
    CHECK(version.finalize(table, ctx) == ncclSuccess);
  }
  unlink(file.c_str());
}

TEST_CASE("v6 getChunkSize returns a rule's chunk and leaves NCCL's otherwise", "[tuner-abi]") {
  std::string file = writeCalibration();
  Env tunerFile("RAILNET_TUNER_FILE", file.c_str());
  auto* v6 = static_cast<ncclTuner_v6_t*>(tableOf(6));
  REQUIRE(v6->getChunkSize != nullptr);
  void* ctx = nullptr;
  ncclNvlDomainInfo_v6_t nvl{2, 1, 1};
  ncclTunerConstants_v6_t constants{};
  REQUIRE(v6->init(&ctx, 7, 2, 2, captureLog, &nvl, &constants) == ncclSuccess);
  size_t chunk = 131072;
  CHECK(v6->getChunkSize(ctx, ncclFuncAllGather, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 4, &chunk) == ncclSuccess);
  CHECK(chunk == 524288);
  chunk = 131072;
  CHECK(v6->getChunkSize(ctx, ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 4, &chunk) == ncclSuccess);
  CHECK(chunk == 131072);
  CHECK(v6->finalize(ctx) == ncclSuccess);
  unlink(file.c_str());
}

TEST_CASE("a missing or malformed calibration file is logged and NCCL's choice kept", "[tuner-abi]") {
  Env model("RAILNET_TUNER_MODEL", "off");
  char bad[] = "/tmp/railnet-tuner-bad-XXXXXX";
  int fd = mkstemp(bad);
  REQUIRE(fd >= 0);
  REQUIRE(write(fd, "allreduce,0,10,warp,simple,-1,-1,-1\n", 37) == 37);
  close(fd);
  for (const char* path : {"/nonexistent/railnet.csv", static_cast<const char*>(bad)}) {
    INFO(path);
    Env tunerFile("RAILNET_TUNER_FILE", path);
    for (const Version& version : versions()) {
      void* table = tableOf(version.number);
      void* ctx = version.init(table, 2, 2);
      CHECK(logged(std::string("WARN TUNER/railnet: RAILNET_TUNER_FILE: ")));
      Table costs;
      int channels = 0;
      CHECK(version.collInfo(table, ctx, ncclFuncAllReduce, 1024, &costs, &channels) == ncclSuccess);
      CHECK(costs == Table{});
      CHECK(channels == 0);
      CHECK(version.finalize(table, ctx) == ncclSuccess);
    }
  }
  CHECK(logged("line 1: unknown algorithm 'warp'"));
  unlink(bad);
}

TEST_CASE("NCCL_ALGO / NCCL_PROTO set by the user, or RAILNET_TUNER=off, leave every table alone", "[tuner-abi]") {
  std::string file = writeCalibration();
  Env tunerFile("RAILNET_TUNER_FILE", file.c_str());
  const char* cases[][2] = {{"NCCL_ALGO", "Ring"}, {"NCCL_PROTO", "^LL128"}, {"RAILNET_TUNER", "off"}};
  for (const auto& setting : cases) {
    INFO(setting[0] << "=" << setting[1]);
    Env forced(setting[0], setting[1]);
    for (const Version& version : versions()) {
      void* table = tableOf(version.number);
      void* ctx = version.init(table, 2, 2);
      Table costs;
      int channels = 0;
      CHECK(version.collInfo(table, ctx, ncclFuncAllReduce, 1024, &costs, &channels) == ncclSuccess);
      CHECK(costs == Table{});
      CHECK(channels == 0);
      CHECK(version.finalize(table, ctx) == ncclSuccess);
    }
  }
  unlink(file.c_str());
}

namespace {

// NCCL's table with (algo, proto) as its pick: that entry cheapest, the rest as Table{} fills them.
Table pickedBy(int algo, int proto) {
  Table table;
  table.cost[algo][proto] = 10.0f;
  return table;
}

// Every collective NCCL asks about, 8 B .. 1 GiB, with NCCL's pick at each tree/ring entry in turn: how many
// calls changed the table or *nChannels; `skip` leaves out what a calibration covers.
int changedCalls(const Version& version, void* table, void* ctx, bool (*skip)(int coll, size_t bytes)) {
  int changed = 0;
  for (int coll = 0; coll < 5; ++coll) {
    for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 2) {
      if (skip != nullptr && skip(coll, bytes)) continue;
      for (int algo : {NCCL_ALGO_TREE, NCCL_ALGO_RING}) {
        for (int proto = 0; proto < NCCL_NUM_PROTOCOLS; ++proto) {
          Table costs = pickedBy(algo, proto);
          int channels = 7;
          CHECK(version.collInfo(table, ctx, static_cast<ncclFunc_t>(coll), bytes, &costs, &channels) == ncclSuccess);
          if (!(costs == pickedBy(algo, proto)) || channels != 7) ++changed;
        }
      }
    }
  }
  return changed;
}

}  // namespace

// Issue 12, D63: auto-loaded with no calibration file, as users get it, the tuner leaves every table alone.
TEST_CASE("with no calibration file every version leaves NCCL's table unchanged, every collective and size",
          "[tuner-abi]") {
  Env tunerFile("RAILNET_TUNER_FILE", nullptr);
  Env model("RAILNET_TUNER_MODEL", nullptr);
  Env tuner("RAILNET_TUNER", nullptr);
  Env algo("NCCL_ALGO", nullptr);
  Env proto("NCCL_PROTO", nullptr);
  for (const Version& version : versions()) {
    INFO("ncclTunerPlugin_v" << version.number);
    void* table = tableOf(version.number);
    for (size_t nodes : {size_t{1}, size_t{2}, size_t{8}}) {
      INFO(nodes << " nodes");
      clearLog();
      void* ctx = version.init(table, 8 * nodes, nodes);
      CHECK(logged("no calibration for this shape: NCCL's choice stands"));
      CHECK(changedCalls(version, table, ctx, nullptr) == 0);
      CHECK(version.finalize(table, ctx) == ncclSuccess);
    }
  }
}

TEST_CASE("with a calibration file and default settings the calibrated choice wins and the rest stays NCCL's",
          "[tuner-abi]") {
  std::string file = writeCalibration(/*measurementsOnly=*/true);
  Env tunerFile("RAILNET_TUNER_FILE", file.c_str());
  Env model("RAILNET_TUNER_MODEL", nullptr);
  Env algo("NCCL_ALGO", nullptr);
  Env proto("NCCL_PROTO", nullptr);
  for (const Version& version : versions()) {
    INFO("ncclTunerPlugin_v" << version.number);
    void* table = tableOf(version.number);
    clearLog();
    void* ctx = version.init(table, 2, 2);
    CHECK(logged("calibrated from " + file));
    Table costs;
    int channels = 0;
    CHECK(version.collInfo(table, ctx, ncclFuncAllReduce, 1024, &costs, &channels) == ncclSuccess);
    CHECK(costs.cost[NCCL_ALGO_TREE][NCCL_PROTO_LL128] == 0.0f);
    // Measured: allreduce at 1 KiB, trusted from 0 B up to 2 KiB. Everything else: NCCL's choice.
    CHECK(changedCalls(version, table, ctx, [](int coll, size_t bytes) {
            return coll == ncclFuncAllReduce && bytes <= 2048;
          }) == 0);
    CHECK(version.finalize(table, ctx) == ncclSuccess);
    // Another shape: the file has no row for it.
    clearLog();
    ctx = version.init(table, 4, 2);
    CHECK(logged("no calibration for this shape: NCCL's choice stands (" + file +
                 " has no row for 4 ranks on 2 nodes)"));
    CHECK(changedCalls(version, table, ctx, nullptr) == 0);
    CHECK(version.finalize(table, ctx) == ncclSuccess);
  }
  unlink(file.c_str());
}

TEST_CASE("libnccl-tuner-railnet.so (NCCL_TUNER_PLUGIN=railnet) is the same object", "[tuner-abi]") {
  void* byName = dlopen(RAILNET_TUNER_LINK_PATH, RTLD_NOW | RTLD_LOCAL);
  REQUIRE(byName != nullptr);
  CHECK(dlsym(byName, "ncclTunerPlugin_v6") == dlsym(library(), "ncclTunerPlugin_v6"));
  CHECK(dlsym(byName, "ncclTunerPlugin_v5") == dlsym(library(), "ncclTunerPlugin_v5"));
  dlclose(byName);
}

#if RAILNET_COUNT_ALLOCATIONS
TEST_CASE("getCollInfo allocates nothing", "[tuner-abi]") {
  std::string file = writeCalibration();
  Env tunerFile("RAILNET_TUNER_FILE", file.c_str());
  Env model("RAILNET_TUNER_MODEL", "on");
  auto* v5 = static_cast<ncclTuner_v5_t*>(tableOf(5));
  void* ctx = nullptr;
  ncclNvlDomainInfo_v5_t nvl{2, 1, 1};
  ncclTunerConstants_v5_t constants{};
  REQUIRE(v5->init(&ctx, 9, 2, 2, captureLog, &nvl, &constants) == ncclSuccess);
  REQUIRE(ctx != nullptr);
  // The probe works: an allocation in the window is counted.
  gAllocations = 0;
  gCountAllocations = true;
  void* probe = std::malloc(16);
  gCountAllocations = false;
  std::free(probe);
  REQUIRE(gAllocations == 1);
  gAllocations = 0;
  gCountAllocations = true;
  int changed = 0;
  for (int i = 0; i < 10000; ++i) {
    Table costs;
    int channels = 0;
    const ncclFunc_t coll = (i & 1) ? ncclFuncAllReduce : ncclFuncAllGather;
    v5->getCollInfo(ctx, coll, size_t{8} << (i % 28), 1, costs.raw(), 7, 3, 0, &channels);
    changed += costs == Table{} ? 0 : 1;
  }
  gCountAllocations = false;
  CHECK(gAllocations == 0);
  CHECK(changed > 0);  // the calls did decide something (calibration at 1 KiB, the model elsewhere)
  CHECK(v5->finalize(ctx) == ncclSuccess);
  unlink(file.c_str());
}
#endif  // RAILNET_COUNT_ALLOCATIONS
