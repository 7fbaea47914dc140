#include "plugin/tools/report.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <iterator>

#include "plugin/tools/harness.h"

namespace railnet::bench {
namespace {

double ratio(double numerator, double denominator) { return denominator > 0 ? numerator / denominator : 0; }
double bwRatio(const Row& row) { return ratio(row.railnet.gbps, row.raw.gbps); }
// Above 1: railnet is slower than raw TCP.
double latRatio(const Row& row) { return ratio(row.railnet.latencyUs, row.raw.latencyUs); }

// The labels of a table's columns, by what the second column measures.
struct Columns {
  const char* gbps;
  const char* baseGbps;
  const char* latency;
  const char* baseLatency;
  const char* cpu;
  const char* baseCpu;
};

Columns columnsFor(BaselineKind baseline) {
  switch (baseline) {
    case BaselineKind::kRawTcp:
      return {"railnet GB/s", "raw TCP GB/s", "railnet lat us", "raw lat us", "railnet cpu/GB", "raw cpu/GB"};
    case BaselineKind::kRawCopyEnginesTcp:
      return {"railnet GB/s", "CE+TCP GB/s", "railnet lat us", "CE lat us", "railnet cpu/GB", "CE cpu/GB"};
    case BaselineKind::kRailnetDevice:
      break;
  }
  return {"device GB/s", "base GB/s", "device lat us", "base lat us", "device cpu/GB", "base cpu/GB"};
}

}  // namespace

void printHeader(const RunDescription& run) {
  printf("railnet-bench: loopback, plugin %s (%s \"%s\"), device %d \"%s\"\n", run.pluginPath.c_str(),
         run.pluginSymbol.c_str(), run.pluginName.c_str(), run.deviceIndex, run.deviceName.c_str());
  if (run.onGpu()) printf("%s; buffers on %s, registered as NCCL_PTR_CUDA\n", run.comparison.c_str(), run.gpu.c_str());
  switch (run.baselineKind) {
    case BaselineKind::kRawTcp:
      printf("streams %d (RAILNET_TCP_STREAMS; raw TCP splits each message over min(%d, size) sockets), window %d, "
             "%.2g s per measurement\n", run.streams, run.streams, run.window, run.seconds);
      printf("goals: one way, bw ratio >= %.2f at >= %s; both ways at once, >= %.2f at %s and >= %s\n\n",
             kGoalRatio, sizeText(kGoalFromSize).c_str(), kBothWaysGoalRatio, sizeText(kBothWaysGoalSize).c_str(),
             sizeText(kGoalFromSize).c_str());
      break;
    case BaselineKind::kRawCopyEnginesTcp:
      printf("streams %d (RAILNET_TCP_STREAMS; raw CE+TCP splits each message over min(%d, size) sockets, each with "
             "its own CUDA stream and %d pinned slots of %s), window %d, %.2g s per measurement\n", run.streams,
             run.streams, run.ceTcpSlots, sizeText(run.ceTcpPieceBytes).c_str(), run.window, run.seconds);
      printf("goals: none yet for GPU memory (ratios are printed, not judged)\n\n");
      break;
    case BaselineKind::kRailnetDevice:
      printf("baseline: railnet device \"%s\", measured in the same run; streams %d per NIC, window %d, %.2g s per "
             "measurement\n\n", run.baseline.c_str(), run.streams, run.window, run.seconds);
      break;
  }
  if (!run.oneWayTable) return;
  const Columns columns = columnsFor(run.baselineKind);
  printf("one direction:\n");
  printf("%10s | %12s | %12s | %8s | %14s | %10s | %9s | %13s | %9s\n", "size", columns.gbps, columns.baseGbps,
         "bw ratio", columns.latency, columns.baseLatency, "lat ratio", columns.cpu, columns.baseCpu);
  printf("-----------+--------------+--------------+----------+----------------+------------+-----------+----------------"
         "+-----------\n");
  fflush(stdout);
}

void printRow(const Row& row) {
  printf("%10s | %12.4g | %12.4g | %8.2f | %14.1f | %10.1f | %9.2f | %14.3f | %9.3f\n", sizeText(row.size).c_str(),
         row.railnet.gbps, row.raw.gbps, bwRatio(row), row.railnet.latencyUs, row.raw.latencyUs, latRatio(row),
         row.railnet.cpuPerGB, row.raw.cpuPerGB);
  fflush(stdout);
}

void printBothWaysHeader(const RunDescription& run) {
  const bool raw = run.baselineKind == BaselineKind::kRawTcp;
  const Columns columns = columnsFor(run.baselineKind);
  printf("\nboth directions at once (GB/s per direction; %s streams %d each way):\n",
         raw ? "raw TCP" : run.baseline.c_str(), run.streams);
  printf("%10s | %12s | %12s | %8s | %14s | %10s\n", "size", columns.gbps, columns.baseGbps, "bw ratio", columns.cpu,
         columns.baseCpu);
  printf("-----------+--------------+--------------+----------+----------------+-----------\n");
  fflush(stdout);
}

void printBothWaysRow(const Row& row) {
  printf("%10s | %12.4g | %12.4g | %8.2f | %14.3f | %10.3f\n", sizeText(row.size).c_str(), row.railnet.gbps,
         row.raw.gbps, bwRatio(row), row.railnet.cpuPerGB, row.raw.cpuPerGB);
  fflush(stdout);
}

namespace {

// One table's summary line over the rows `judged` selects: a verdict against raw TCP over host memory, else the
// ratios alone (GPU memory: after what was compared, and "no goal").
void summarize(const char* label, const std::vector<Row>& rows, bool (*judged)(const Row&), const std::string& where,
               double goal, const RunDescription& run) {
  const Row* worst = nullptr;
  std::vector<double> ratios;
  for (const Row& row : rows) {
    if (!judged(row)) continue;
    ratios.push_back(bwRatio(row));
    if (!worst || bwRatio(row) < bwRatio(*worst)) worst = &row;
  }
  const bool judge = run.baselineKind == BaselineKind::kRawTcp && !run.onGpu();
  if (run.onGpu()) {
    if (!worst) {
      printf("summary, %s (%s): no size %s in this sweep; no goal\n", label, run.comparison.c_str(), where.c_str());
    } else {
      printf("summary, %s (%s): bw ratio %s: min %.2f (at %s), median %.2f; no goal\n", label,
             run.comparison.c_str(), where.c_str(), bwRatio(*worst), sizeText(worst->size).c_str(), median(ratios));
    }
  } else if (!worst) {
    printf("summary, %s: no size %s in this sweep; %s\n", label, where.c_str(),
           judge ? "goal not evaluated" : "no ratio to summarize");
  } else if (judge) {
    printf("summary, %s: min bw ratio %s = %.2f (at %s): %s (goal >= %.2f)\n", label, where.c_str(), bwRatio(*worst),
           sizeText(worst->size).c_str(), bwRatio(*worst) >= goal ? "PASS" : "MISS", goal);
  } else {
    printf("summary, %s: bw ratio %s: min %.2f (at %s), median %.2f\n", label, where.c_str(), bwRatio(*worst),
           sizeText(worst->size).c_str(), median(ratios));
  }
}

bool oneWayJudged(const Row& row) { return row.size >= kGoalFromSize; }
bool everySize(const Row&) { return true; }
bool bothWaysJudged(const Row& row) { return row.size == kBothWaysGoalSize || row.size >= kGoalFromSize; }

}  // namespace

void printSummary(const std::vector<Row>& oneWay, const std::vector<Row>& bothWays, const RunDescription& run) {
  printf("\n");
  if (!oneWay.empty() && run.everySize) {
    summarize("one way", oneWay, everySize, "at every size", kGoalRatio, run);
  } else if (!oneWay.empty()) {
    summarize("one way", oneWay, oneWayJudged, "at >= " + sizeText(kGoalFromSize), kGoalRatio, run);
  }
  if (!bothWays.empty()) {
    summarize("both ways", bothWays, bothWaysJudged,
              "at " + sizeText(kBothWaysGoalSize) + " and >= " + sizeText(kGoalFromSize), kBothWaysGoalRatio, run);
  }
  fflush(stdout);
}

namespace {

// The columns after "direction": the raw-TCP names (raw_tcp_gbps, raw_lat_us) kept as they were; raw CE+TCP's
// are raw_ce_tcp_*, another railnet device's baseline_*.
std::vector<std::string> columnNames(BaselineKind baseline) {
  const char* base = baseline == BaselineKind::kRawTcp              ? "raw_tcp"
                     : baseline == BaselineKind::kRawCopyEnginesTcp ? "raw_ce_tcp"
                                                                    : "baseline";
  const std::string latency = baseline == BaselineKind::kRawTcp ? "raw" : base;
  return {"size_bytes",        "railnet_gbps",          std::string(base) + "_gbps",
          "bw_ratio",          "railnet_lat_us",        latency + "_lat_us",
          "lat_ratio",         "railnet_cpu_s_per_gb",  std::string(base) + "_cpu_s_per_gb"};
}

// JSON has no NaN or infinity: a value that is not finite (an unmeasured latency) is null.
std::string jsonNumber(double value, const char* format) {
  return std::isfinite(value) ? railnet::bench::format(format, value) : "null";
}

// A JSON string literal of `text` (the run's paths and names: quotes, backslashes and control bytes escaped).
std::string jsonString(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += railnet::bench::format("\\u%04x", static_cast<unsigned>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

RowFile::RowFile(const std::string& path, Format format, BaselineKind baseline)
    : format_(format), columns_(columnNames(baseline)) {
  if (path.empty()) return;
  file_.reset(fopen(path.c_str(), "w"));
  if (!file_) fail("cannot write %s: %s", path.c_str(), strerror(errno));
  if (format_ == Format::kCsv) {
    std::string header = "direction";
    for (const std::string& column : columns_) header += "," + column;
    fprintf(file_.get(), "%s\n", header.c_str());
    fflush(file_.get());
  }
}

void RowFile::describe(const RunDescription& run) {
  if (!file_ || format_ != Format::kJsonLines) return;
  fprintf(file_.get(),
          "{\"run\": {\"plugin\": %s, \"symbol\": %s, \"device\": %s, \"baseline\": %s, \"streams\": %d, "
          "\"window\": %d, \"seconds_per_point\": %g, \"gpu\": %s, \"comparison\": %s}}\n",
          jsonString(run.pluginPath).c_str(), jsonString(run.pluginSymbol).c_str(), jsonString(run.deviceName).c_str(),
          jsonString(run.baseline).c_str(), run.streams, run.window, run.seconds, jsonString(run.gpu).c_str(),
          jsonString(run.comparison).c_str());
  fflush(file_.get());
}

void RowFile::write(const Row& row, const char* direction) {
  if (!file_) return;
  const double values[] = {row.railnet.gbps, row.raw.gbps,        bwRatio(row),         row.railnet.latencyUs,
                           row.raw.latencyUs, latRatio(row),       row.railnet.cpuPerGB, row.raw.cpuPerGB};
  const char* formats[] = {"%.6g", "%.6g", "%.4f", "%.3f", "%.3f", "%.4f", "%.4f", "%.4f"};
  if (format_ == Format::kCsv) {
    std::string line = format("%s,%zu", direction, row.size);
    for (size_t i = 0; i < std::size(values); ++i) line += "," + format(formats[i], values[i]);
    fprintf(file_.get(), "%s\n", line.c_str());
  } else {
    std::string line = format("{\"direction\": \"%s\", \"%s\": %zu", direction, columns_[0].c_str(), row.size);
    for (size_t i = 0; i < std::size(values); ++i) {
      line += ", \"" + columns_[i + 1] + "\": " + jsonNumber(values[i], formats[i]);
    }
    fprintf(file_.get(), "%s}\n", line.c_str());
  }
  fflush(file_.get());
}

Progress::Progress() : terminal_(isatty(STDERR_FILENO) != 0) {}

void Progress::show(size_t index, size_t total, size_t size, const std::string& what) {
  std::string point = format("[%zu/%zu] %s", index + 1, total, sizeText(size).c_str());
  if (terminal_) {
    fprintf(stderr, "\r%-60s", (point + " " + what + " ...").c_str());
  } else if (index != lastIndex_) {
    fprintf(stderr, "%s ...\n", point.c_str());
  }
  lastIndex_ = index;
  fflush(stderr);
}

void Progress::finish() {
  if (terminal_) fprintf(stderr, "\r%-60s\r", "");
  fflush(stderr);
}

}  // namespace railnet::bench
