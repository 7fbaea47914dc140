#include "plugin/tools/report.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "plugin/tools/harness.h"

namespace railnet::bench {
namespace {

double ratio(double numerator, double denominator) { return denominator > 0 ? numerator / denominator : 0; }
double bwRatio(const Row& row) { return ratio(row.railnet.gbps, row.raw.gbps); }
// Above 1: railnet is slower than raw TCP.
double latRatio(const Row& row) { return ratio(row.railnet.latencyUs, row.raw.latencyUs); }

}  // namespace

void printHeader(const RunDescription& run) {
  printf("railnet-bench: loopback, plugin %s (%s \"%s\"), device %d \"%s\"\n", run.pluginPath.c_str(),
         run.pluginSymbol.c_str(), run.pluginName.c_str(), run.deviceIndex, run.deviceName.c_str());
  if (run.baselineIsRaw) {
    printf("streams %d (RAILNET_TCP_STREAMS; raw TCP splits each message over min(%d, size) sockets), window %d, "
           "%.2g s per measurement\n", run.streams, run.streams, run.window, run.seconds);
    printf("goals: one way, bw ratio >= %.2f at >= %s; both ways at once, >= %.2f at %s and >= %s\n\n", kGoalRatio,
           sizeText(kGoalFromSize).c_str(), kBothWaysGoalRatio, sizeText(kBothWaysGoalSize).c_str(),
           sizeText(kGoalFromSize).c_str());
    if (!run.oneWayTable) return;
    printf("one direction:\n");
    printf("%10s | %12s | %12s | %8s | %14s | %10s | %9s | %13s | %9s\n", "size", "railnet GB/s", "raw TCP GB/s",
           "bw ratio", "railnet lat us", "raw lat us", "lat ratio", "railnet cpu/GB", "raw cpu/GB");
  } else {
    printf("baseline: railnet device \"%s\", measured in the same run; streams %d per NIC, window %d, %.2g s per "
           "measurement\n\n", run.baseline.c_str(), run.streams, run.window, run.seconds);
    if (!run.oneWayTable) return;
    printf("one direction:\n");
    printf("%10s | %12s | %12s | %8s | %14s | %10s | %9s | %13s | %9s\n", "size", "device GB/s", "base GB/s",
           "bw ratio", "device lat us", "base lat us", "lat ratio", "device cpu/GB", "base cpu/GB");
  }
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
  printf("\nboth directions at once (GB/s per direction; %s streams %d each way):\n",
         run.baselineIsRaw ? "raw TCP" : run.baseline.c_str(), run.streams);
  printf("%10s | %12s | %12s | %8s | %14s | %10s\n", "size", run.baselineIsRaw ? "railnet GB/s" : "device GB/s",
         run.baselineIsRaw ? "raw TCP GB/s" : "base GB/s", "bw ratio", run.baselineIsRaw ? "railnet cpu/GB" : "device cpu/GB",
         run.baselineIsRaw ? "raw cpu/GB" : "base cpu/GB");
  printf("-----------+--------------+--------------+----------+----------------+-----------\n");
  fflush(stdout);
}

void printBothWaysRow(const Row& row) {
  printf("%10s | %12.4g | %12.4g | %8.2f | %14.3f | %10.3f\n", sizeText(row.size).c_str(), row.railnet.gbps,
         row.raw.gbps, bwRatio(row), row.railnet.cpuPerGB, row.raw.cpuPerGB);
  fflush(stdout);
}

namespace {

// One table's summary line over the rows `judged` selects.
void summarize(const char* label, const std::vector<Row>& rows, bool (*judged)(const Row&), const std::string& where,
               double goal, bool baselineIsRaw) {
  const Row* worst = nullptr;
  std::vector<double> ratios;
  for (const Row& row : rows) {
    if (!judged(row)) continue;
    ratios.push_back(bwRatio(row));
    if (!worst || bwRatio(row) < bwRatio(*worst)) worst = &row;
  }
  if (!worst) {
    printf("summary, %s: no size %s in this sweep; %s\n", label, where.c_str(),
           baselineIsRaw ? "goal not evaluated" : "no ratio to summarize");
  } else if (baselineIsRaw) {
    printf("summary, %s: min bw ratio %s = %.2f (at %s): %s (goal >= %.2f)\n", label, where.c_str(), bwRatio(*worst),
           sizeText(worst->size).c_str(), bwRatio(*worst) >= goal ? "PASS" : "MISS", goal);
  } else {
    printf("summary, %s: bw ratio %s: min %.2f (at %s), median %.2f\n", label, where.c_str(), bwRatio(*worst),
           sizeText(worst->size).c_str(), median(ratios));
  }
}

bool oneWayJudged(const Row& row) { return row.size >= kGoalFromSize; }
bool bothWaysJudged(const Row& row) { return row.size == kBothWaysGoalSize || row.size >= kGoalFromSize; }

}  // namespace

void printSummary(const std::vector<Row>& oneWay, const std::vector<Row>& bothWays, bool baselineIsRaw) {
  printf("\n");
  if (!oneWay.empty()) {
    summarize("one way", oneWay, oneWayJudged, "at >= " + sizeText(kGoalFromSize), kGoalRatio, baselineIsRaw);
  }
  if (!bothWays.empty()) {
    summarize("both ways", bothWays, bothWaysJudged,
              "at " + sizeText(kBothWaysGoalSize) + " and >= " + sizeText(kGoalFromSize), kBothWaysGoalRatio,
              baselineIsRaw);
  }
  fflush(stdout);
}

CsvFile::CsvFile(const std::string& path, bool baselineIsRaw) {
  if (path.empty()) return;
  file_.reset(fopen(path.c_str(), "w"));
  if (!file_) fail("cannot write %s: %s", path.c_str(), strerror(errno));
  fprintf(file_.get(), baselineIsRaw ? "direction,size_bytes,railnet_gbps,raw_tcp_gbps,bw_ratio,railnet_lat_us,raw_lat_us,"
                                       "lat_ratio,railnet_cpu_s_per_gb,raw_cpu_s_per_gb\n"
                                     : "direction,size_bytes,railnet_gbps,baseline_gbps,bw_ratio,railnet_lat_us,"
                                       "baseline_lat_us,lat_ratio,railnet_cpu_s_per_gb,baseline_cpu_s_per_gb\n");
  fflush(file_.get());
}

void CsvFile::write(const Row& row, const char* direction) {
  if (!file_) return;
  fprintf(file_.get(), "%s,%zu,%.6g,%.6g,%.4f,%.3f,%.3f,%.4f,%.4f,%.4f\n", direction, row.size, row.railnet.gbps,
          row.raw.gbps, bwRatio(row), row.railnet.latencyUs, row.raw.latencyUs, latRatio(row), row.railnet.cpuPerGB,
          row.raw.cpuPerGB);
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
