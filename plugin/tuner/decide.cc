#include "plugin/tuner/decide.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <tuple>

#include "plugin/tuner/names.h"
#include "railnet/nccl/tuner.h"

namespace railnet::tuner {
namespace {

bool matchesAny(int wanted, int actual) noexcept { return wanted == -1 || wanted == actual; }

double logOf(size_t bytes) noexcept { return std::log(static_cast<double>(std::max<size_t>(bytes, 1))); }

}  // namespace

const char* sourceName(Source source) noexcept {
  switch (source) {
    case Source::Nccl: return "nccl";
    case Source::Rule: return "rule";
    case Source::Calibration: return "calibration";
    case Source::Model: return "model";
  }
  return "?";
}

Tuner::Tuner(const Shape& shape, const Calibration& calibration, const TunerOptions& options)
    : shape_(shape), options_(options) {
  // Measurements grouped into series of one combination, in size order; repeated sizes are averaged.
  using Key = std::tuple<int, int, int, int, int, int>;
  std::map<Key, std::map<uint64_t, std::pair<double, int>>> grouped;
  for (const CalRow& row : calibration.rows) {
    if (row.coll < 0 || row.coll >= kNumColls) continue;
    if (!matchesAny(row.nNodes, shape.nNodes) || !matchesAny(row.nRanks, shape.nRanks)) continue;
    if (!row.isMeasurement()) {
      rules_[row.coll].push_back(row);
      continue;
    }
    auto& slot = grouped[Key{row.coll, row.algo, row.proto, row.channels, row.numPipeOps, row.regBuff}][row.minBytes];
    slot.first += std::log(row.timeUs);
    slot.second += 1;
  }
  for (const auto& [key, points] : grouped) {
    auto [coll, algo, proto, channels, pipeOps, regBuff] = key;
    Series series{algo, proto, channels, pipeOps, regBuff, points.begin()->first, points.rbegin()->first, {}};
    for (const auto& [bytes, sum] : points) series.points.push_back({logOf(bytes), sum.first / sum.second});
    series_[coll].push_back(std::move(series));
  }
}

size_t Tuner::measurementCount() const noexcept {
  size_t count = 0;
  for (const auto& list : series_) {
    for (const Series& series : list) count += series.points.size();
  }
  return count;
}

size_t Tuner::ruleCount() const noexcept {
  size_t count = 0;
  for (const auto& list : rules_) count += list.size();
  return count;
}

double Tuner::interpolate(const Series& series, size_t bytes) noexcept {
  const std::vector<Point>& points = series.points;
  if (points.empty()) return -1;
  const double x = logOf(bytes);
  // Below the smallest measured size the time is latency: keep the smallest size's time.
  if (x <= points.front().logBytes) return std::exp(points.front().logTimeUs);
  if (x >= points.back().logBytes) {
    // Above it, time grows with size (bandwidth-bound); trusted up to twice the largest measured size.
    if (static_cast<double>(bytes) > 2.0 * static_cast<double>(series.maxBytes)) return -1;
    return std::exp(points.back().logTimeUs) * static_cast<double>(bytes) / static_cast<double>(series.maxBytes);
  }
  auto upper = std::upper_bound(points.begin(), points.end(), x,
                                [](double value, const Point& point) { return value < point.logBytes; });
  const Point& hi = *upper;
  const Point& lo = *(upper - 1);
  const double span = hi.logBytes - lo.logBytes;
  const double t = span > 0 ? (x - lo.logBytes) / span : 0;
  return std::exp(lo.logTimeUs + t * (hi.logTimeUs - lo.logTimeUs));
}

double Tuner::measuredUs(int coll, size_t bytes, int algo, int proto, int numPipeOps, int regBuff,
                         int* channels) const noexcept {
  if (coll < 0 || coll >= kNumColls) return -1;
  double best = -1;
  for (const Series& series : series_[coll]) {
    if (series.algo != algo || series.proto != proto) continue;
    if (!matchesAny(series.numPipeOps, numPipeOps) || !matchesAny(series.regBuff, regBuff)) continue;
    double time = interpolate(series, bytes);
    if (time > 0 && (best < 0 || time < best)) {
      best = time;
      if (channels != nullptr) *channels = series.channels;
    }
  }
  return best;
}

double Tuner::modelUs(int coll, size_t bytes, int algo, int proto) const noexcept {
  return modelTimeUs(shape_, options_.model, coll, bytes, algo, proto);
}

Decision Tuner::decide(int coll, size_t bytes, int numPipeOps, int regBuff, const float* table, int numAlgo,
                       int numProto) const noexcept {
  const Decision keep;
  if (!options_.enabled || options_.forced || table == nullptr) return keep;
  if (coll < 0 || coll >= kNumColls || numAlgo <= 0 || numProto <= 0 || shape_.nRanks <= 1) return keep;
  // Nothing measured or ruled for this collective on this shape, and no model asked for: NCCL's choice stands.
  if (rules_[coll].empty() && series_[coll].empty() && !options_.useModel) return keep;
  const int algos = std::min(numAlgo, NCCL_NUM_ALGORITHMS);
  const int protos = std::min(numProto, NCCL_NUM_PROTOCOLS);
  auto offered = [&](int a, int p) { return a >= 0 && a < algos && p >= 0 && p < protos && table[a * numProto + p] >= 0; };

  // NCCL's own pick: the smallest non-negative cost, first in table order on a tie (as topoGetAlgoInfo).
  int ncclAlgo = -1, ncclProto = -1;
  float ncclCost = std::numeric_limits<float>::max();
  for (int a = 0; a < algos; ++a) {
    for (int p = 0; p < protos; ++p) {
      float cost = table[a * numProto + p];
      if (cost >= 0 && cost < ncclCost) {
        ncclCost = cost;
        ncclAlgo = a;
        ncclProto = p;
      }
    }
  }
  if (ncclAlgo < 0) return keep;

  for (const CalRow& rule : rules_[coll]) {
    if (bytes < rule.minBytes || bytes > rule.maxBytes) continue;
    if (!matchesAny(rule.numPipeOps, numPipeOps) || !matchesAny(rule.regBuff, regBuff)) continue;
    if (!offered(rule.algo, rule.proto)) continue;  // never revive what NCCL disabled
    return Decision{Source::Rule, rule.algo, rule.proto, rule.channels > 0 ? rule.channels : 0, -1};
  }

  // Measurements decide only where they cover NCCL's own pick, so the choice is never worse than NCCL's
  // as measured.
  int channels = -1;
  double ncclMeasured = measuredUs(coll, bytes, ncclAlgo, ncclProto, numPipeOps, regBuff, &channels);
  if (ncclMeasured > 0) {
    Decision best{Source::Calibration, ncclAlgo, ncclProto, channels > 0 ? channels : 0, ncclMeasured};
    for (int a = 0; a < algos; ++a) {
      for (int p = 0; p < protos; ++p) {
        if (!offered(a, p)) continue;
        double time = measuredUs(coll, bytes, a, p, numPipeOps, regBuff, &channels);
        if (time > 0 && time < best.estimateUs) best = Decision{Source::Calibration, a, p, channels > 0 ? channels : 0, time};
      }
    }
    // Within the margin NCCL's own pick stays (as measured, it is as good); the decision still reports it.
    if (ncclMeasured <= options_.measuredMargin * best.estimateUs) {
      int ncclChannels = -1;
      measuredUs(coll, bytes, ncclAlgo, ncclProto, numPipeOps, regBuff, &ncclChannels);
      return Decision{Source::Calibration, ncclAlgo, ncclProto, ncclChannels > 0 ? ncclChannels : 0, ncclMeasured};
    }
    return best;
  }

  // No measurement covers NCCL's pick at this size: NCCL's choice stands unless the model was asked for.
  if (!options_.useModel) return keep;
  double ncclModel = modelUs(coll, bytes, ncclAlgo, ncclProto);
  if (ncclModel <= 0) return keep;
  Decision best{Source::Model, ncclAlgo, ncclProto, 0, ncclModel};
  for (int a = 0; a < algos; ++a) {
    for (int p = 0; p < protos; ++p) {
      if (!offered(a, p)) continue;
      double time = modelUs(coll, bytes, a, p);
      if (time > 0 && time < best.estimateUs) best = Decision{Source::Model, a, p, 0, time};
    }
  }
  if (ncclModel <= options_.modelMargin * best.estimateUs) return keep;
  return best;
}

Decision Tuner::apply(int coll, size_t bytes, int numPipeOps, int regBuff, float* table, int numAlgo, int numProto,
                      int* nChannels) const noexcept {
  Decision decision = decide(coll, bytes, numPipeOps, regBuff, table, numAlgo, numProto);
  if (decision.source == Source::Nccl) return decision;
  float& entry = table[decision.algo * numProto + decision.proto];
  if (entry < 0) return Decision{};  // decide() only returns offered entries; this is belt and braces
  entry = 0.0f;
  if (decision.channels > 0 && nChannels != nullptr) *nChannels = decision.channels;
  return decision;
}

bool Tuner::chunkSize(int coll, size_t bytes, int algo, int proto, size_t* chunk) const noexcept {
  if (!options_.enabled || options_.forced || coll < 0 || coll >= kNumColls || chunk == nullptr) return false;
  for (const CalRow& rule : rules_[coll]) {
    if (rule.chunkBytes == 0 || rule.algo != algo || rule.proto != proto) continue;
    if (bytes < rule.minBytes || bytes > rule.maxBytes) continue;
    *chunk = rule.chunkBytes;
    return true;
  }
  return false;
}

}  // namespace railnet::tuner
