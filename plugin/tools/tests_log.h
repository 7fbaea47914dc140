// nccl-tests logs -> calibration measurements (railnet-tune calibrate).
#pragma once

#include <string>
#include <vector>

#include "plugin/tuner/calibration.h"

namespace railnet::tuner {

// One log of one forced combination. Rows carry size, time (mean of out-of-place and in-place) and busbw;
// coll/algo/proto/nNodes/nRanks are left for the caller to stamp.
struct TestsLog {
  int coll = -1, algo = -1, proto = -1;
  int channels = -1;  // "channels=N" on the railnet-tune line (NCCL_MIN/MAX_NCHANNELS forced); -1: NCCL's
  int ranks = 0;  // "# Rank N ..." lines
  std::vector<CalRow> rows;
};

// The combination comes from a "# railnet-tune: coll=C algo=A proto=P [channels=N]" line, else from the file name
// COLL__ALGO_PROTO.log; the collective also from "Collective test starting: X_perf". NCCL's own log lines
// are skipped, and a row they split in two is dropped, never misread. false with *why when nothing usable
// is found.
bool readTestsLog(const std::string& path, TestsLog* out, std::string* why);

}  // namespace railnet::tuner
