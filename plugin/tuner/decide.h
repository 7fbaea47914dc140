// The tuner's decisions for one communicator: built once at init from the shape and the calibration file, then
// queried by getCollInfo without allocating. It only ever lowers one entry NCCL already offers (a
// non-negative cost) to 0.0, so NCCL's "smallest non-negative" pick lands on it; entries at -1 stay -1.
// Do no harm (docs/decisions.md D63): where no rule and no measurement of this communicator's shape covers a
// call, NCCL's table comes back untouched; the model acts only when asked for (TunerOptions::useModel).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "plugin/tuner/calibration.h"
#include "plugin/tuner/model.h"

namespace railnet::tuner {

enum class Source {
  Nccl,         // the table was left as NCCL filled it
  Rule,         // a rule row of the calibration file
  Calibration,  // measured times (interpolated)
  Model,        // railnet's model
};
const char* sourceName(Source source) noexcept;

struct Decision {
  Source source = Source::Nccl;
  int algo = -1;
  int proto = -1;
  int channels = 0;  // 0: NCCL's count
  double estimateUs = -1;
};

struct TunerOptions {
  bool enabled = true;
  bool forced = false;       // NCCL_ALGO or NCCL_PROTO set by the user: leave every table alone
  // Let the model decide where no measurement covers NCCL's own pick. Off unless asked for (D63): without
  // measurements it made NCCL's choice up to 2.3x slower (issue 12).
  bool useModel = false;
  double modelMargin = 1.1;  // the model overrides NCCL only when NCCL's pick is this much slower
  double measuredMargin = 1.03;  // measurements override NCCL only beyond this (noise of short runs)
  ModelParams model;
};

class Tuner {
 public:
  Tuner(const Shape& shape, const Calibration& calibration, const TunerOptions& options);

  // What the tuner would pick for this call given NCCL's table (float[numAlgo][numProto], row-major).
  Decision decide(int coll, size_t bytes, int numPipeOps, int regBuff, const float* table, int numAlgo,
                  int numProto) const noexcept;
  // decide() and write it into the table / *nChannels. Never touches an entry below 0.
  Decision apply(int coll, size_t bytes, int numPipeOps, int regBuff, float* table, int numAlgo, int numProto,
                 int* nChannels) const noexcept;
  // A rule's chunk size for this call, if one matches; false leaves NCCL's.
  bool chunkSize(int coll, size_t bytes, int algo, int proto, size_t* chunk) const noexcept;

  // Measured (interpolated) time of a combination, or -1; channels of the best series in *channels.
  double measuredUs(int coll, size_t bytes, int algo, int proto, int numPipeOps, int regBuff,
                    int* channels) const noexcept;
  double modelUs(int coll, size_t bytes, int algo, int proto) const noexcept;

  const Shape& shape() const noexcept { return shape_; }
  size_t measurementCount() const noexcept;
  size_t ruleCount() const noexcept;
  // Whether any call can change NCCL's table: a rule or measurement for this shape, or the model asked for.
  bool acts() const noexcept { return options_.useModel || measurementCount() + ruleCount() > 0; }

 private:
  struct Point {
    double logBytes;
    double logTimeUs;
  };
  struct Series {
    int algo, proto, channels, numPipeOps, regBuff;
    uint64_t minBytes, maxBytes;
    std::vector<Point> points;
  };
  static double interpolate(const Series& series, size_t bytes) noexcept;

  Shape shape_;
  TunerOptions options_;
  std::vector<Series> series_[5];  // per collective, only rows matching this communicator's shape
  std::vector<CalRow> rules_[5];
};

}  // namespace railnet::tuner
