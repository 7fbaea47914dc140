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
    printf("goal: bw ratio >= %.1f at >= %s\n\n", kGoalRatio, sizeText(kGoalFromSize).c_str());
    printf("%10s | %12s | %12s | %8s | %14s | %10s | %9s\n", "size", "railnet GB/s", "raw TCP GB/s", "bw ratio",
           "railnet lat us", "raw lat us", "lat ratio");
  } else {
    printf("baseline: railnet device \"%s\", measured in the same run; streams %d per NIC, window %d, %.2g s per "
           "measurement\n\n", run.baseline.c_str(), run.streams, run.window, run.seconds);
    printf("%10s | %12s | %12s | %8s | %14s | %10s | %9s\n", "size", "device GB/s", "base GB/s", "bw ratio",
           "device lat us", "base lat us", "lat ratio");
  }
  printf("-----------+--------------+--------------+----------+----------------+------------+----------\n");
  fflush(stdout);
}

void printRow(const Row& row) {
  printf("%10s | %12.4g | %12.4g | %8.2f | %14.1f | %10.1f | %9.2f\n", sizeText(row.size).c_str(), row.railnet.gbps,
         row.raw.gbps, bwRatio(row), row.railnet.latencyUs, row.raw.latencyUs, latRatio(row));
  fflush(stdout);
}

void printSummary(const std::vector<Row>& rows, bool baselineIsRaw) {
  const Row* worst = nullptr;
  std::vector<double> ratios;
  for (const Row& row : rows) {
    if (row.size < kGoalFromSize) continue;
    ratios.push_back(bwRatio(row));
    if (!worst || bwRatio(row) < bwRatio(*worst)) worst = &row;
  }
  if (!worst) {
    printf("\nsummary: no size >= %s in this sweep; %s\n", sizeText(kGoalFromSize).c_str(),
           baselineIsRaw ? "goal not evaluated" : "no ratio to summarize");
  } else if (baselineIsRaw) {
    printf("\nsummary: min bw ratio at >= %s = %.2f (at %s): %s (goal >= %.1f)\n", sizeText(kGoalFromSize).c_str(),
           bwRatio(*worst), sizeText(worst->size).c_str(), bwRatio(*worst) >= kGoalRatio ? "PASS" : "MISS",
           kGoalRatio);
  } else {
    printf("\nsummary: bw ratio at >= %s: min %.2f (at %s), median %.2f\n", sizeText(kGoalFromSize).c_str(),
           bwRatio(*worst), sizeText(worst->size).c_str(), median(ratios));
  }
  fflush(stdout);
}

CsvFile::CsvFile(const std::string& path, bool baselineIsRaw) {
  if (path.empty()) return;
  file_.reset(fopen(path.c_str(), "w"));
  if (!file_) fail("cannot write %s: %s", path.c_str(), strerror(errno));
  fprintf(file_.get(), baselineIsRaw ? "size_bytes,railnet_gbps,raw_tcp_gbps,bw_ratio,railnet_lat_us,raw_lat_us,lat_ratio\n"
                                     : "size_bytes,railnet_gbps,baseline_gbps,bw_ratio,railnet_lat_us,baseline_lat_us,"
                                       "lat_ratio\n");
  fflush(file_.get());
}

void CsvFile::write(const Row& row) {
  if (!file_) return;
  fprintf(file_.get(), "%zu,%.6g,%.6g,%.4f,%.3f,%.3f,%.4f\n", row.size, row.railnet.gbps, row.raw.gbps, bwRatio(row),
          row.railnet.latencyUs, row.raw.latencyUs, latRatio(row));
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
