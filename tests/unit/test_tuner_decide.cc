// The tuner's table handling: disabled entries untouched, size boundaries, forced algo/proto, interpolation,
// NCCL's choice kept where nothing covers it.
#include <catch2/catch.hpp>

#include <cstring>
#include <sstream>

#include "plugin/tuner/decide.h"
#include "railnet/nccl/tuner.h"

using namespace railnet::tuner;

namespace {

struct Table {
  float cost[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  Table() {
    for (auto& row : cost) {
      for (float& entry : row) entry = NCCL_ALGO_PROTO_IGNORE;
    }
  }
  float* data() { return &cost[0][0]; }
  // NCCL's pick: smallest non-negative, first on a tie (topoGetAlgoInfo).
  std::pair<int, int> pick() const {
    std::pair<int, int> best{-1, -1};
    float bestCost = 1e30f;
    for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a) {
      for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
        if (cost[a][p] >= 0 && cost[a][p] < bestCost) best = {a, p}, bestCost = cost[a][p];
      }
    }
    return best;
  }
};

// A 2-node allreduce table: ring and tree on all protocols, NCCL prefers ring/simple.
Table allreduceTable() {
  Table table;
  for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
    table.cost[NCCL_ALGO_TREE][p] = 50.0f + p;
    table.cost[NCCL_ALGO_RING][p] = 40.0f + p;
  }
  table.cost[NCCL_ALGO_RING][NCCL_PROTO_SIMPLE] = 30.0f;
  return table;
}

Calibration calibrationOf(const std::string& text) {
  Calibration calibration;
  std::string error;
  std::istringstream in(text);
  REQUIRE(parseCalibration(in, &calibration, &error));
  return calibration;
}

Shape twoNodes() {
  Shape shape;
  shape.nRanks = 2;
  shape.nNodes = 2;
  shape.nicGbps = 100;
  return shape;
}

TunerOptions calibrationOnly() {
  TunerOptions options;
  options.useModel = false;
  return options;
}

const char* kMeasured =
    "allreduce,1024,1024,ring,simple,-1,2,2,-1,-1,100\n"
    "allreduce,4096,4096,ring,simple,-1,2,2,-1,-1,400\n"
    "allreduce,1024,1024,ring,ll,-1,2,2,-1,-1,20\n"
    "allreduce,4096,4096,ring,ll,-1,2,2,-1,-1,1000\n"
    "allreduce,1024,1024,tree,ll128,8,2,2,-1,-1,50\n"
    "allreduce,4096,4096,tree,ll128,8,2,2,-1,-1,200\n";

}  // namespace

TEST_CASE("the measured fastest combination gets cost 0 and the rest of the table is untouched", "[tuner]") {
  Tuner tuner(twoNodes(), calibrationOf(kMeasured), calibrationOnly());
  Table table = allreduceTable();
  Table before = table;
  int channels = 0;
  Decision decision = tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, &channels);
  CHECK(decision.source == Source::Calibration);
  CHECK(decision.algo == NCCL_ALGO_RING);
  CHECK(decision.proto == NCCL_PROTO_LL);
  CHECK(table.cost[NCCL_ALGO_RING][NCCL_PROTO_LL] == 0.0f);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_LL});
  CHECK(channels == 0);  // the ring/LL series was measured with NCCL's channel count
  for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a) {
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
      if (a == NCCL_ALGO_RING && p == NCCL_PROTO_LL) continue;
      CHECK(table.cost[a][p] == before.cost[a][p]);
    }
  }
}

TEST_CASE("interpolation between measured sizes is linear in log-size and log-time", "[tuner]") {
  Tuner tuner(twoNodes(), calibrationOf(kMeasured), calibrationOnly());
  // Ring/simple: 100 us at 1 KiB, 400 us at 4 KiB -> 200 us at 2 KiB (geometric midpoint).
  CHECK(tuner.measuredUs(ncclFuncAllReduce, 2048, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, 0, nullptr) == Approx(200));
  // Ring/LL: 20 -> 1000; at 2 KiB sqrt(20*1000).
  CHECK(tuner.measuredUs(ncclFuncAllReduce, 2048, NCCL_ALGO_RING, NCCL_PROTO_LL, 1, 0, nullptr) ==
        Approx(141.421).epsilon(1e-3));
  // Below the smallest size: the smallest size's time (latency).
  CHECK(tuner.measuredUs(ncclFuncAllReduce, 8, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, 0, nullptr) == Approx(100));
  // Above the largest: linear in size up to twice the largest, nothing beyond.
  CHECK(tuner.measuredUs(ncclFuncAllReduce, 8192, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, 0, nullptr) == Approx(800));
  CHECK(tuner.measuredUs(ncclFuncAllReduce, 8193, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, 0, nullptr) < 0);
  // Not measured at all.
  CHECK(tuner.measuredUs(ncclFuncAllReduce, 2048, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE, 1, 0, nullptr) < 0);
  CHECK(tuner.measuredUs(ncclFuncAllGather, 2048, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, 1, 0, nullptr) < 0);
}

TEST_CASE("the crossover between measured combinations follows the interpolation", "[tuner]") {
  Tuner tuner(twoNodes(), calibrationOf(kMeasured), calibrationOnly());
  // At 4 KiB tree/LL128 (200 us, 8 channels) beats ring/simple (400) and ring/LL (1000).
  Table table = allreduceTable();
  int channels = 0;
  Decision decision = tuner.apply(ncclFuncAllReduce, 4096, 1, 0, table.data(), 7, 3, &channels);
  CHECK(decision.algo == NCCL_ALGO_TREE);
  CHECK(decision.proto == NCCL_PROTO_LL128);
  CHECK(channels == 8);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_TREE, NCCL_PROTO_LL128});
  // At 1 KiB ring/LL (20) wins.
  table = allreduceTable();
  CHECK(tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, &channels).proto == NCCL_PROTO_LL);
}

TEST_CASE("entries NCCL disabled (-1) are never chosen nor changed", "[tuner]") {
  Tuner tuner(twoNodes(), calibrationOf(kMeasured), calibrationOnly());
  Table table = allreduceTable();
  table.cost[NCCL_ALGO_RING][NCCL_PROTO_LL] = NCCL_ALGO_PROTO_IGNORE;  // e.g. NCCL_PROTO=^LL
  int channels = 0;
  Decision decision = tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, &channels);
  CHECK(table.cost[NCCL_ALGO_RING][NCCL_PROTO_LL] == NCCL_ALGO_PROTO_IGNORE);
  CHECK_FALSE((decision.algo == NCCL_ALGO_RING && decision.proto == NCCL_PROTO_LL));
  // Tree/LL128 (50 us) is the fastest measured entry still offered.
  CHECK(decision.algo == NCCL_ALGO_TREE);
  CHECK(decision.proto == NCCL_PROTO_LL128);
  for (int a = 2; a < NCCL_NUM_ALGORITHMS; ++a) {
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) CHECK(table.cost[a][p] == NCCL_ALGO_PROTO_IGNORE);
  }
}

TEST_CASE("a forced NCCL_ALGO/NCCL_PROTO or RAILNET_TUNER=off leaves the table as NCCL filled it", "[tuner]") {
  for (int which = 0; which < 2; ++which) {
    TunerOptions options;
    if (which == 0) options.forced = true;
    else options.enabled = false;
    Tuner tuner(twoNodes(), calibrationOf(kMeasured), options);
    Table table = allreduceTable();
    Table before = table;
    int channels = 0;
    CHECK(tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, &channels).source == Source::Nccl);
    CHECK(std::memcmp(table.cost, before.cost, sizeof(table.cost)) == 0);
    CHECK(channels == 0);
  }
}

TEST_CASE("measurements that do not cover NCCL's own pick leave the table alone", "[tuner]") {
  // Only tree/ll128 is measured; NCCL's pick (ring/simple) is not, so the tuner cannot compare.
  Tuner tuner(twoNodes(), calibrationOf("allreduce,1024,1024,tree,ll128,-1,2,2,-1,-1,5\n"), calibrationOnly());
  Table table = allreduceTable();
  Table before = table;
  int channels = 0;
  CHECK(tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, &channels).source == Source::Nccl);
  CHECK(std::memcmp(table.cost, before.cost, sizeof(table.cost)) == 0);
}

TEST_CASE("NCCL's pick stays when it is within the noise margin of the best measured", "[tuner]") {
  Tuner tuner(twoNodes(),
              calibrationOf("allreduce,1024,1024,ring,simple,-1,2,2,-1,-1,101\n"
                            "allreduce,1024,1024,tree,simple,-1,2,2,-1,-1,100\n"),
              calibrationOnly());
  Table table = allreduceTable();
  Decision decision = tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, nullptr);
  CHECK(decision.algo == NCCL_ALGO_RING);
  CHECK(decision.proto == NCCL_PROTO_SIMPLE);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_SIMPLE});
}

TEST_CASE("measurements for another shape do not apply", "[tuner]") {
  Shape four = twoNodes();
  four.nRanks = 4;
  Tuner tuner(four, calibrationOf(kMeasured), calibrationOnly());
  CHECK(tuner.measurementCount() == 0);
  Table table = allreduceTable();
  Table before = table;
  CHECK(tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, nullptr).source == Source::Nccl);
  CHECK(std::memcmp(table.cost, before.cost, sizeof(table.cost)) == 0);
}

TEST_CASE("rules apply inside [min_bytes, max_bytes] only, and only to offered entries", "[tuner]") {
  Tuner tuner(twoNodes(),
              calibrationOf("allreduce,0,65536,tree,ll,4,-1,-1\n"
                            "allreduce,65537,4294967295,ring,ll128,-1,-1,-1,-1,-1,,,262144\n"),
              calibrationOnly());
  int channels = 0;
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{65536}}) {
    Table table = allreduceTable();
    channels = 0;
    Decision decision = tuner.apply(ncclFuncAllReduce, bytes, 1, 0, table.data(), 7, 3, &channels);
    CHECK(decision.source == Source::Rule);
    CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_TREE, NCCL_PROTO_LL});
    CHECK(channels == 4);
  }
  Table table = allreduceTable();
  channels = 0;
  tuner.apply(ncclFuncAllReduce, 65537, 1, 0, table.data(), 7, 3, &channels);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_LL128});
  CHECK(channels == 0);
  // The chunk size of the second rule, for its combination only.
  size_t chunk = 0;
  CHECK(tuner.chunkSize(ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_LL128, &chunk));
  CHECK(chunk == 262144);
  CHECK_FALSE(tuner.chunkSize(ncclFuncAllReduce, 1 << 20, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE, &chunk));
  CHECK_FALSE(tuner.chunkSize(ncclFuncAllReduce, 100, NCCL_ALGO_RING, NCCL_PROTO_LL128, &chunk));
  // A rule whose entry NCCL disabled is skipped: the table stays as NCCL filled it.
  table = allreduceTable();
  table.cost[NCCL_ALGO_TREE][NCCL_PROTO_LL] = NCCL_ALGO_PROTO_IGNORE;
  Table before = table;
  CHECK(tuner.apply(ncclFuncAllReduce, 100, 1, 0, table.data(), 7, 3, &channels).source == Source::Nccl);
  CHECK(std::memcmp(table.cost, before.cost, sizeof(table.cost)) == 0);
}

TEST_CASE("regBuff and numPipeOps select rows that name them", "[tuner]") {
  Tuner tuner(twoNodes(),
              calibrationOf("allreduce,0,100,tree,ll,-1,-1,-1,-1,1\n"
                            "allreduce,0,100,ring,ll128,-1,-1,-1,4,-1\n"),
              calibrationOnly());
  Table table = allreduceTable();
  tuner.apply(ncclFuncAllReduce, 10, 1, 1, table.data(), 7, 3, nullptr);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_TREE, NCCL_PROTO_LL});
  table = allreduceTable();
  tuner.apply(ncclFuncAllReduce, 10, 4, 0, table.data(), 7, 3, nullptr);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_LL128});
  table = allreduceTable();
  CHECK(tuner.apply(ncclFuncAllReduce, 10, 1, 0, table.data(), 7, 3, nullptr).source == Source::Nccl);
}

TEST_CASE("the model overrides NCCL only for a clear predicted gain", "[tuner][model]") {
  TunerOptions options;  // model on, no calibration
  Tuner tuner(twoNodes(), Calibration{}, options);
  // 1 GiB allreduce: the model must not pick LL (its network efficiency is low); if NCCL picked ring/LL the model
  // moves it to a bandwidth protocol.
  Table table = allreduceTable();
  table.cost[NCCL_ALGO_RING][NCCL_PROTO_LL] = 1.0f;
  Decision decision = tuner.apply(ncclFuncAllReduce, size_t{1} << 30, 1, 0, table.data(), 7, 3, nullptr);
  CHECK(decision.source == Source::Model);
  CHECK(decision.proto != NCCL_PROTO_LL);
  CHECK(table.cost[decision.algo][decision.proto] == 0.0f);
  // 8 B: LL is the model's latency winner; NCCL's ring/LL pick is kept (no override).
  table = allreduceTable();
  table.cost[NCCL_ALGO_RING][NCCL_PROTO_LL] = 1.0f;
  decision = tuner.apply(ncclFuncAllReduce, 8, 1, 0, table.data(), 7, 3, nullptr);
  CHECK(decision.source == Source::Nccl);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_LL});
  CHECK(table.cost[NCCL_ALGO_RING][NCCL_PROTO_LL] == 1.0f);
}

TEST_CASE("tables smaller than NCCL's, single ranks and unknown collectives are left alone", "[tuner]") {
  Tuner tuner(twoNodes(), calibrationOf(kMeasured), TunerOptions{});
  Table table = allreduceTable();
  Table before = table;
  CHECK(tuner.apply(7, 1024, 1, 0, table.data(), 7, 3, nullptr).source == Source::Nccl);
  CHECK(tuner.apply(-1, 1024, 1, 0, table.data(), 7, 3, nullptr).source == Source::Nccl);
  CHECK(tuner.apply(ncclFuncAllReduce, 1024, 1, 0, nullptr, 7, 3, nullptr).source == Source::Nccl);
  CHECK(std::memcmp(table.cost, before.cost, sizeof(table.cost)) == 0);
  // A 2x3 table (numAlgo 2): only tree and ring exist; ring/LL is still found at the right offset.
  float small[2][3] = {{50, 51, 52}, {40, 41, 30}};
  tuner.apply(ncclFuncAllReduce, 1024, 1, 0, &small[0][0], 2, 3, nullptr);
  CHECK(small[1][0] == 0.0f);
  CHECK(small[1][2] == 30.0f);
  Shape one = twoNodes();
  one.nRanks = one.nNodes = 1;
  Tuner single(one, calibrationOf(kMeasured), TunerOptions{});
  table = allreduceTable();
  CHECK(single.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, nullptr).source == Source::Nccl);
}
