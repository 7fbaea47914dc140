// The calibration file: NCCL's example tuner CSV, its optional columns, and the extension (time_us, busbw, chunk).
#include <catch2/catch.hpp>

#include <sstream>

#include "plugin/tuner/calibration.h"
#include "plugin/tuner/names.h"
#include "railnet/nccl/tuner.h"

using namespace railnet::tuner;

namespace {
bool parse(const std::string& text, Calibration* out, std::string* error) {
  std::istringstream in(text);
  return parseCalibration(in, out, error);
}
}  // namespace

TEST_CASE("NCCL's example tuner rows parse with 8, 9 and 10 fields", "[tuner][calibration]") {
  Calibration calibration;
  std::string error;
  REQUIRE(parse("# comment\n\n"
                "allreduce,0,65536,tree,simple,2,1,-1,-1,1\n"
                "broadcast,32769,4294967295,ring,simple,2,-1,-1,1\n"
                "allgather,0,4294967295,ring,simple,4,2,-1\n",
                &calibration, &error));
  REQUIRE(calibration.rows.size() == 3);
  const CalRow& first = calibration.rows[0];
  CHECK(first.coll == ncclFuncAllReduce);
  CHECK(first.algo == NCCL_ALGO_TREE);
  CHECK(first.proto == NCCL_PROTO_SIMPLE);
  CHECK(first.channels == 2);
  CHECK(first.nNodes == 1);
  CHECK(first.nRanks == -1);
  CHECK(first.regBuff == 1);
  CHECK_FALSE(first.isMeasurement());
  CHECK(calibration.rows[1].maxBytes == 4294967295ULL);
  CHECK(calibration.rows[1].numPipeOps == 1);
  CHECK(calibration.rows[1].regBuff == -1);
  CHECK(calibration.rows[2].numPipeOps == -1);
}

TEST_CASE("measurement rows carry time, busbw and chunk, and round-trip through formatRow", "[tuner][calibration]") {
  Calibration calibration;
  std::string error;
  REQUIRE(parse("all_reduce,1024,1024,Ring,LL128,-1,2,2,-1,-1,42.5,0.02,131072\n", &calibration, &error));
  REQUIRE(calibration.rows.size() == 1);
  const CalRow& row = calibration.rows[0];
  CHECK(row.isMeasurement());
  CHECK(row.timeUs == Approx(42.5));
  CHECK(row.busbwGBs == Approx(0.02));
  CHECK(row.chunkBytes == 131072);
  CHECK(row.proto == NCCL_PROTO_LL128);
  Calibration again;
  REQUIRE(parse(formatRow(row) + "\n", &again, &error));
  REQUIRE(again.rows.size() == 1);
  CHECK(formatRow(again.rows[0]) == formatRow(row));
}

TEST_CASE("bad calibration lines are refused with their line number", "[tuner][calibration]") {
  Calibration calibration;
  std::string error;
  const char* bad[] = {
      "allreduce,0,10,ring\n",                            // too few fields
      "alltoall,0,10,ring,simple,-1,-1,-1\n",             // not a tuned collective
      "allreduce,0,10,warp,simple,-1,-1,-1\n",            // unknown algorithm
      "allreduce,0,10,ring,ll256,-1,-1,-1\n",             // unknown protocol
      "allreduce,10,5,ring,simple,-1,-1,-1\n",            // max below min
      "allreduce,-5,10,ring,simple,-1,-1,-1\n",           // negative size
      "allreduce,0,10,ring,simple,0,-1,-1\n",             // zero channels
      "allreduce,0,10,ring,simple,-1,-1,-1,-1,2\n",       // regBuff out of range
      "allreduce,8,16,ring,simple,-1,-1,-1,-1,-1,3.5\n",  // a measurement over a range
      "allreduce,8,8,ring,simple,-1,-1,-1,-1,-1,abc\n",   // bad time
  };
  for (const char* line : bad) {
    INFO(line);
    error.clear();
    CHECK_FALSE(parse(std::string("# header\n") + line, &calibration, &error));
    CHECK(error.rfind("line 2: ", 0) == 0);
  }
}

TEST_CASE("a missing calibration file is an error naming the path", "[tuner][calibration]") {
  Calibration calibration;
  std::string error;
  CHECK_FALSE(loadCalibration("/nonexistent/railnet-tuner.csv", &calibration, &error));
  CHECK(error.find("/nonexistent/railnet-tuner.csv") != std::string::npos);
}

TEST_CASE("names map both ways and accept nccl-tests spellings", "[tuner][calibration]") {
  for (int coll = 0; coll < kNumColls; ++coll) CHECK(parseColl(collName(coll)) == coll);
  for (int algo = 0; algo < NCCL_NUM_ALGORITHMS; ++algo) CHECK(parseAlgo(algoName(algo)) == algo);
  for (int proto = 0; proto < NCCL_NUM_PROTOCOLS; ++proto) CHECK(parseProto(protoName(proto)) == proto);
  CHECK(parseColl("reduce_scatter_perf") == ncclFuncReduceScatter);
  CHECK(parseColl("AllGather") == ncclFuncAllGather);
  CHECK(parseAlgo("PAT") == NCCL_ALGO_PAT);
  CHECK(parseProto("Simple") == NCCL_PROTO_SIMPLE);
  CHECK(parseColl("sendrecv") == -1);
  CHECK(collName(5) == nullptr);
}
