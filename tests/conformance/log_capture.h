// Captures what the plugin logs through the ncclDebugLogger_t the harness passes to init, so tests can assert
// that a failure was reported with a WARN (and what the WARN named).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "railnet/nccl/common.h"

namespace conformance {

struct LogRecord {
  uint64_t seq;  // position in the process-wide log, for "since mark" queries
  int level;
  std::string text;
  // When it was logged, on the system-wide monotonic clock: comparable across the parent and its children.
  std::chrono::steady_clock::time_point at;
};

// The logger NCCL would pass: thread-safe, records every message (bounded), echoes to stderr when verbose.
ncclDebugLogger_t captureLogger();

// The profiler callback NCCL would pass (v10+). railnet may ignore it; it accepts every event.
ncclProfilerCallback_t captureProfiler();

void setLogEcho(bool echoAll);

// A position in the log; records logged afterwards have seq >= mark.
uint64_t logMark();

// WARN-level records logged since `mark`.
std::vector<LogRecord> warningsSince(uint64_t mark);
// Records of `level` (NCCL_LOG_INFO, ...) logged since `mark`.
std::vector<LogRecord> recordsSince(uint64_t mark, int level);

// How long a test waits for a WARN the plugin may log from one of its own threads after the call returned.
inline constexpr std::chrono::milliseconds kWarnGrace{1000};

// True once a WARN logged since `mark` contains every string in `needles`; waits up to `timeout` because
// the plugin may log from one of its own threads a little after the failing call returned.
bool waitForWarning(uint64_t mark, const std::vector<std::string>& needles, std::chrono::milliseconds timeout);

// Every WARN since `mark`, one per line, for failure reports.
std::string describeWarnings(uint64_t mark);

}  // namespace conformance
