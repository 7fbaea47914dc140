// nccl-tests logs -> calibration measurements (railnet-tune calibrate).
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "plugin/tools/tests_log.h"
#include "railnet/nccl/tuner.h"

using namespace railnet::tuner;

namespace {

struct TempLog {
  std::string path;
  TempLog(const std::string& name, const std::string& text) {
    char dir[] = "/tmp/railnet-tests-log-XXXXXX";
    REQUIRE(mkdtemp(dir) != nullptr);
    path = std::string(dir) + "/" + name;
    std::ofstream(path) << text;
  }
  ~TempLog() {
    std::remove(path.c_str());
    rmdir(path.substr(0, path.find_last_of('/')).c_str());
  }
};

const char* kLog =
    "# railnet-tune: coll=all_reduce algo=Tree proto=LL128\n"
    "# nccl-tests version 2.19.6 nccl-headers=22809 nccl-library=22809\n"
    "# Collective test starting: all_reduce_perf\n"
    "#  Rank  0 Group  0 Pid   2710 on         vm device  0 [0000:00:06] NVIDIA H200\n"
    "#  Rank  1 Group  0 Pid   2711 on         vm device  1 [0000:00:07] NVIDIA H200\n"
    "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong\n"
    "           8             2     float     sum      -1    40.00    0.00    0.00    N/A    30.00    0.00    0.00    N/A\n"
    "vm:2710:2710 [0] NCCL INFO Channel 00/02 : 0 1\n"
    "        1024           256     float     sum      -1    42.99    0.02    0.02      0    44.72    0.02    0.04      0\n"
    "        2048           512     float     sum      -1    45.91\n"  // split by a log line: dropped
    "vm:2710:2711 [0] NCCL INFO something    0.04    0.04    N/A    43.16    0.05    0.05    N/A\n"
    "  1073741824     268435456     float     sum      -1  94508.4   11.36   11.36    N/A  95925.7   11.19   11.19    N/A\n"
    "# Avg bus bandwidth    : 3.58483\n";

}  // namespace

TEST_CASE("an nccl-tests log gives one measurement per size, in/out-of-place averaged", "[tuner][calibrate]") {
  TempLog log("whatever.log", kLog);
  TestsLog parsed;
  std::string why;
  REQUIRE(readTestsLog(log.path, &parsed, &why));
  CHECK(parsed.coll == ncclFuncAllReduce);
  CHECK(parsed.algo == NCCL_ALGO_TREE);
  CHECK(parsed.proto == NCCL_PROTO_LL128);
  CHECK(parsed.ranks == 2);
  REQUIRE(parsed.rows.size() == 3);
  CHECK(parsed.rows[0].minBytes == 8);
  CHECK(parsed.rows[0].maxBytes == 8);
  CHECK(parsed.rows[0].timeUs == Approx(35.0));
  CHECK(parsed.rows[1].minBytes == 1024);
  CHECK(parsed.rows[1].timeUs == Approx((42.99 + 44.72) / 2));
  CHECK(parsed.rows[1].busbwGBs == Approx(0.03));
  CHECK(parsed.rows[2].minBytes == 1073741824ULL);
  CHECK(parsed.rows[2].timeUs == Approx((94508.4 + 95925.7) / 2));
}

TEST_CASE("the combination can come from the file name", "[tuner][calibrate]") {
  std::string text = kLog;
  text.erase(0, text.find('\n') + 1);  // no railnet-tune line
  TempLog log("reduce_scatter__PAT_Simple.log", text);
  TestsLog parsed;
  std::string why;
  REQUIRE(readTestsLog(log.path, &parsed, &why));
  // "Collective test starting" (all_reduce) overrides the file name's collective; algo/proto from the name.
  CHECK(parsed.coll == ncclFuncAllReduce);
  CHECK(parsed.algo == NCCL_ALGO_PAT);
  CHECK(parsed.proto == NCCL_PROTO_SIMPLE);
}

TEST_CASE("logs without a forced combination or without rows are refused with a reason", "[tuner][calibrate]") {
  std::string text = kLog;
  text.erase(0, text.find('\n') + 1);
  TempLog unnamed("all_reduce.log", text);
  TestsLog parsed;
  std::string why;
  CHECK_FALSE(readTestsLog(unnamed.path, &parsed, &why));
  CHECK(why.find("no forced algorithm/protocol") != std::string::npos);
  TempLog failed("all_gather__PAT_LL.log", "vm: Test NCCL failure all_gather.cu:50 'invalid usage'\n");
  TestsLog empty;
  CHECK_FALSE(readTestsLog(failed.path, &empty, &why));
  TestsLog missing;
  CHECK_FALSE(readTestsLog("/nonexistent/all_reduce__Ring_LL.log", &missing, &why));
  CHECK(why == "cannot open");
}

TEST_CASE("a forced channel count on the railnet-tune line is kept", "[tuner][calibrate]") {
  std::string text = kLog;
  text.replace(0, text.find('\n'), "# railnet-tune: coll=all_reduce algo=Ring proto=Simple channels=4");
  TempLog log("all_reduce__Ring_Simple__ch4.log", text);
  TestsLog parsed;
  std::string why;
  REQUIRE(readTestsLog(log.path, &parsed, &why));
  CHECK(parsed.algo == NCCL_ALGO_RING);
  CHECK(parsed.proto == NCCL_PROTO_SIMPLE);
  CHECK(parsed.channels == 4);
  TestsLog plain;
  TempLog other("x.log", kLog);
  REQUIRE(readTestsLog(other.path, &plain, &why));
  CHECK(plain.channels == -1);
}
