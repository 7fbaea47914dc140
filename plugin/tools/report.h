// railnet-bench's output: the table on stdout (header, one row per size, the goal summary), the optional CSV
// file, and the progress line on stderr.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "plugin/tools/options.h"

namespace railnet::bench {

// What the bench is held to; printSummary checks it (informational: a miss is not an error). One direction:
// >= kGoalRatio of raw TCP at >= kGoalFromSize. Both directions at once (every rank of an all_reduce sends and
// receives together): >= kBothWaysGoalRatio of raw TCP both ways at kBothWaysGoalSize and at >= kGoalFromSize.
// Host memory only: GPU memory (--gpu) has no goal yet, its ratios are printed without a verdict.
constexpr double kGoalRatio = 0.85;
constexpr size_t kGoalFromSize = 4 * MiB;
constexpr double kBothWaysGoalRatio = 0.9;
constexpr size_t kBothWaysGoalSize = 512 * KiB;

struct PeerResult {
  double gbps = 0;       // 1e9 bytes per second (both ways: per direction)
  double latencyUs = 0;  // median half round trip (one-way table only)
  double cpuPerGB = 0;   // process CPU seconds per 1e9 bytes moved while streaming (all directions counted)
};

struct Row {
  size_t size;
  PeerResult railnet;
  PeerResult raw;
};

// What the second column measures.
enum class BaselineKind {
  kRawTcp,             // raw TCP over host memory: the goal is judged
  kRawCopyEnginesTcp,  // --gpu: raw copy engines + TCP (raw_ce_tcp.h)
  kRailnetDevice,      // --against DEVICE: another railnet device
};

// What the header states about the run.
struct RunDescription {
  std::string pluginPath;
  std::string pluginSymbol;
  std::string pluginName;
  int deviceIndex;
  std::string deviceName;
  int streams;
  int window;
  double seconds;
  std::string baseline = "raw TCP";  // the second column's peer: "raw TCP", "raw CE+TCP" or a railnet device name
  BaselineKind baselineKind = BaselineKind::kRawTcp;
  bool oneWayTable = true;           // the one-way table follows the header (not with --bidir)
  bool everySize = false;            // the summary covers every size (--group: small messages are the point)
  // --gpu only (empty on the host): where the buffers are ("GPU 0 (PCI 0000:19:00.0)"), what is compared ("GPU
  // memory: railnet vs raw copy engines + TCP"), and the raw CE+TCP peer's pinned slots per thread and their size.
  std::string gpu;
  std::string comparison;
  int ceTcpSlots = 0;
  size_t ceTcpPieceBytes = 0;
  bool onGpu() const { return !gpu.empty(); }
};

void printHeader(const RunDescription& run);
void printRow(const Row& row);
// The both-ways table that follows the one-way table (or stands alone with --bidir).
void printBothWaysHeader(const RunDescription& run);
void printBothWaysRow(const Row& row);
// One line per table. One way: the smallest bw ratio over sizes >= kGoalFromSize; both ways: the smallest at
// kBothWaysGoalSize and >= kGoalFromSize. PASS or MISS against raw TCP over host memory; against another railnet
// device, the min and median ratio without a verdict; with GPU memory, the comparison, min and median, "no goal".
// An empty table is left out.
void printSummary(const std::vector<Row>& oneWay, const std::vector<Row>& bothWays, const RunDescription& run);

// Rows as CSV, flushed one by one so an interrupted run keeps what it measured. Inactive without a path.
// The rows of a run in a file, as they come: CSV (a header line, then one line per row) or JSON Lines (a "run"
// object describing the run, then one object per row, keyed like the CSV columns; an unmeasured value is null).
// An empty path writes nothing.
class RowFile {
 public:
  enum class Format { kCsv, kJsonLines };
  RowFile(const std::string& path, Format format, BaselineKind baseline);
  // JSON Lines: the run's description, once, before the rows (CSV: nothing).
  void describe(const RunDescription& run);
  // `direction`: "one-way" or "both-ways" (its rows have no latency).
  void write(const Row& row, const char* direction);

 private:
  struct Closer {
    void operator()(FILE* file) const { fclose(file); }
  };
  Format format_;
  std::vector<std::string> columns_;
  std::unique_ptr<FILE, Closer> file_;
};

// One line on stderr that says what runs now; rewritten in place on a terminal, one line per point otherwise.
class Progress {
 public:
  Progress();
  void show(size_t index, size_t total, size_t size, const std::string& what);
  void finish();

 private:
  bool terminal_;
  size_t lastIndex_ = SIZE_MAX;
};

}  // namespace railnet::bench
