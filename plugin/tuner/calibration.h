// The calibration file: NCCL's example tuner CSV (plugins/tuner/example/README.md)
//   collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps[,regBuff]]
// extended with three optional columns
//   [,time_us[,busbw_gbs[,chunk_bytes]]]
// A row without time_us (or with time_us <= 0) is a RULE, as in NCCL's example: in [min_bytes, max_bytes] use
// this algorithm/protocol (and channels, chunk size when > 0). A row with time_us > 0 is a MEASUREMENT: the
// combination took time_us at message size min_bytes (= max_bytes); the tuner interpolates between
// measurements in log-size. -1 in channels/nNodes/nRanks/numPipeOps/regBuff means "any" (channels: NCCL's).
#pragma once

#include <cstdint>
#include <istream>
#include <string>
#include <vector>

namespace railnet::tuner {

struct CalRow {
  int coll = -1;
  uint64_t minBytes = 0;
  uint64_t maxBytes = 0;
  int algo = -1;
  int proto = -1;
  int channels = -1;
  int nNodes = -1;
  int nRanks = -1;
  int numPipeOps = -1;
  int regBuff = -1;
  double timeUs = -1;  // > 0: a measurement
  double busbwGBs = -1;
  uint64_t chunkBytes = 0;

  bool isMeasurement() const noexcept { return timeUs > 0; }
};

struct Calibration {
  std::vector<CalRow> rows;
};

// Parses the whole stream. On the first bad line returns false with "line N: why" in *error; comments (#) and
// blank lines are skipped.
bool parseCalibration(std::istream& in, Calibration* out, std::string* error);
// Opens and parses `path`; a missing file is an error too.
bool loadCalibration(const std::string& path, Calibration* out, std::string* error);

// One CSV line (no newline) in the extended format, and the header comment written above the rows.
std::string formatRow(const CalRow& row);
const char* calibrationHeader();

}  // namespace railnet::tuner
