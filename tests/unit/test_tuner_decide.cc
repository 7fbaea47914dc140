// The tuner's table handling: disabled entries untouched, size boundaries, forced algo/proto, interpolation,
// NCCL's choice kept where nothing covers it.
#include <catch2/catch.hpp>

#include <cstring>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "plugin/tuner/decide.h"
#include "plugin/tuner/names.h"
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

TEST_CASE("the model, when asked for, overrides NCCL only for a clear predicted gain", "[tuner][model]") {
  TunerOptions options;  // no calibration; the model only because it is asked for (RAILNET_TUNER_MODEL=on, D63)
  options.useModel = true;
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

// Issue 12, D63: without a measurement covering a (collective, size, shape), NCCL's choice stands. NCCL's table
// must come back bit for bit as it was passed in, nChannels untouched, whatever NCCL picked.
namespace {

// The entries NCCL offers per collective on a multi-node communicator (Ring x all protocols; Tree for allreduce;
// PAT/Simple for allgather/reducescatter; CollNet and NVLS where the fabric has them), and every one of them in
// turn as NCCL's pick: the cheapest entry, the others dearer in table order.
std::vector<Table> ncclTables(int coll) {
  std::vector<std::pair<int, int>> offered;
  for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) offered.push_back({NCCL_ALGO_RING, p});
  if (coll == ncclFuncAllReduce) {
    for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) offered.push_back({NCCL_ALGO_TREE, p});
    offered.push_back({NCCL_ALGO_COLLNET_DIRECT, NCCL_PROTO_SIMPLE});
    offered.push_back({NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE});
  }
  if (coll == ncclFuncAllGather || coll == ncclFuncReduceScatter) offered.push_back({NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE});
  std::vector<Table> tables;
  for (const auto& pick : offered) {
    Table table;
    float cost = 20.0f;
    for (const auto& [a, p] : offered) table.cost[a][p] = (a == pick.first && p == pick.second) ? 10.0f : cost++;
    tables.push_back(table);
  }
  return tables;
}

// Shapes a user runs: the 2-GPU machine as 2 fake nodes (1 NIC, or railnet's 3 fused devices), 8 GPUs x 2 and
// x 8 nodes with 8 x 400 Gb/s, one node of 8.
std::vector<Shape> userShapes() {
  std::vector<Shape> shapes;
  Shape shape = twoNodes();
  shapes.push_back(shape);
  shape.nicsPerNode = 3;
  shape.nicGbps = 133;
  shapes.push_back(shape);
  shape.nRanks = 16;
  shape.nicsPerNode = 8;
  shape.nicGbps = 400;
  shape.nvlDomains = 2;
  shape.maxRanksPerNvlDomain = 8;
  shapes.push_back(shape);
  shape.nRanks = 64;
  shape.nNodes = 8;
  shape.nvlDomains = 8;
  shapes.push_back(shape);
  shape.nRanks = 8;
  shape.nNodes = 1;
  shape.nvlDomains = 1;
  shapes.push_back(shape);
  return shapes;
}

// Every collective, 8 B .. 1 GiB, every NCCL pick, regBuff 0/1, numPipeOps 1/4: the number of calls that changed
// the table or *nChannels (0 when NCCL's choice stands), and the first one in *first.
int changedCalls(const Tuner& tuner, const std::function<bool(int coll, size_t bytes)>& covered, std::string* first) {
  int changed = 0;
  for (int coll = 0; coll < kNumColls; ++coll) {
    for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 2) {
      if (covered && covered(coll, bytes)) continue;
      for (const Table& nccl : ncclTables(coll)) {
        for (int regBuff : {0, 1}) {
          for (int pipeOps : {1, 4}) {
            Table table = nccl;
            int channels = 7;
            Decision decision = tuner.apply(coll, bytes, pipeOps, regBuff, table.data(), NCCL_NUM_ALGORITHMS,
                                            NCCL_NUM_PROTOCOLS, &channels);
            if (std::memcmp(table.cost, nccl.cost, sizeof(table.cost)) == 0 && channels == 7 &&
                decision.source == Source::Nccl) {
              continue;
            }
            if (changed++ == 0 && first != nullptr) {
              *first = std::string(collName(coll)) + " " + std::to_string(bytes) + " B, NCCL's pick " +
                       algoName(nccl.pick().first) + "/" + protoName(nccl.pick().second) + ": " +
                       sourceName(decision.source) + " chose " + (decision.algo >= 0 ? algoName(decision.algo) : "-") +
                       "/" + (decision.proto >= 0 ? protoName(decision.proto) : "-");
            }
          }
        }
      }
    }
  }
  return changed;
}

}  // namespace

TEST_CASE("without a calibration file NCCL's table comes back unchanged: every collective, 8 B to 1 GiB",
          "[tuner][no-harm]") {
  for (const Shape& shape : userShapes()) {
    INFO(shape.nRanks << " ranks on " << shape.nNodes << " nodes, " << shape.nicsPerNode << " x " << shape.nicGbps
                      << " Gb/s");
    Tuner tuner(shape, Calibration{}, TunerOptions{});  // as the plugin builds it with no RAILNET_TUNER_* set
    std::string first;
    CHECK(changedCalls(tuner, nullptr, &first) == 0);
    INFO("first change: " << first);
    CHECK(first.empty());
  }
}

TEST_CASE("a calibration file changes nothing outside the shapes, collectives and sizes it measured",
          "[tuner][no-harm]") {
  // allreduce on 2 ranks / 2 nodes, measured at 1-4 KiB (trusted up to 8 KiB): allgather, broadcast, ... and
  // allreduce above 8 KiB have no measurement, nor does any other shape.
  const Calibration calibration = calibrationOf(kMeasured);
  auto covered = [](int coll, size_t bytes) { return coll == ncclFuncAllReduce && bytes <= 8192; };
  for (const Shape& shape : userShapes()) {
    INFO(shape.nRanks << " ranks on " << shape.nNodes << " nodes, " << shape.nicsPerNode << " x " << shape.nicGbps
                      << " Gb/s");
    Tuner tuner(shape, calibration, TunerOptions{});
    std::string first;
    CHECK(changedCalls(tuner, covered, &first) == 0);
    INFO("first change: " << first);
    CHECK(first.empty());
  }
}

TEST_CASE("with a calibration file the calibrated choice still wins under the default options", "[tuner][no-harm]") {
  Tuner tuner(twoNodes(), calibrationOf(kMeasured), TunerOptions{});
  Table table = allreduceTable();
  int channels = 0;
  Decision decision = tuner.apply(ncclFuncAllReduce, 1024, 1, 0, table.data(), 7, 3, &channels);
  CHECK(decision.source == Source::Calibration);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_LL});
  table = allreduceTable();
  decision = tuner.apply(ncclFuncAllReduce, 4096, 1, 0, table.data(), 7, 3, &channels);
  CHECK(decision.source == Source::Calibration);
  CHECK(table.pick() == std::pair<int, int>{NCCL_ALGO_TREE, NCCL_PROTO_LL128});
  CHECK(channels == 8);
  // Rules are explicit settings: they still apply with no measurement at all.
  Tuner rules(twoNodes(), calibrationOf("allgather,0,65536,ring,ll,-1,-1,-1\n"), TunerOptions{});
  Table gather;
  for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) gather.cost[NCCL_ALGO_RING][p] = 20.0f - p;
  CHECK(rules.apply(ncclFuncAllGather, 4096, 1, 0, gather.data(), 7, 3, nullptr).source == Source::Rule);
  CHECK(gather.pick() == std::pair<int, int>{NCCL_ALGO_RING, NCCL_PROTO_LL});
}
