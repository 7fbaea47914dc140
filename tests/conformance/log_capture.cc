#include "log_capture.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <deque>
#include <mutex>
#include <thread>

namespace conformance {
namespace {

// Enough history for any single test; older records are dropped so long runs do not grow without bound.
constexpr size_t kMaxRecords = 20000;

struct LogStore {
  std::mutex mutex;
  std::deque<LogRecord> records;
  uint64_t nextSeq = 0;
};

LogStore& store() {
  static LogStore instance;
  return instance;
}

std::atomic<bool> echoAll{false};

const char* levelName(int level) {
  switch (level) {
    case NCCL_LOG_WARN: return "WARN";
    case NCCL_LOG_INFO: return "INFO";
    case NCCL_LOG_ABORT: return "ABORT";
    case NCCL_LOG_TRACE: return "TRACE";
    case NCCL_LOG_VERSION: return "VERSION";
    default: return "LOG";
  }
}

__attribute__((format(printf, 5, 6))) void logger(ncclDebugLogLevel level, unsigned long /*flags*/, const char* file,
                                                  int line, const char* fmt, ...) {
  char text[2048];
  va_list args;
  va_start(args, fmt);
  std::vsnprintf(text, sizeof(text), fmt ? fmt : "(null format)", args);
  va_end(args);
  if (echoAll.load(std::memory_order_relaxed)) {
    std::fprintf(stderr, "[plugin %s %s:%d] %s\n", levelName(level), file ? file : "?", line, text);
  }
  LogStore& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.records.push_back(LogRecord{s.nextSeq++, static_cast<int>(level), text, std::chrono::steady_clock::now()});
  if (s.records.size() > kMaxRecords) s.records.pop_front();
}

ncclResult_t profiler(void** eHandle, int /*type*/, void* /*pHandle*/, int64_t /*pluginId*/, void* /*extData*/) {
  if (eHandle) *eHandle = nullptr;
  return ncclSuccess;
}

bool containsAll(const std::string& text, const std::vector<std::string>& needles) {
  for (const std::string& needle : needles) {
    if (text.find(needle) == std::string::npos) return false;
  }
  return true;
}

}  // namespace

ncclDebugLogger_t captureLogger() { return logger; }

ncclProfilerCallback_t captureProfiler() { return profiler; }

void setLogEcho(bool all) { echoAll.store(all); }

uint64_t logMark() {
  LogStore& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.nextSeq;
}

std::vector<LogRecord> warningsSince(uint64_t mark) { return recordsSince(mark, NCCL_LOG_WARN); }

std::vector<LogRecord> recordsSince(uint64_t mark, int level) {
  LogStore& s = store();
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<LogRecord> out;
  for (const LogRecord& record : s.records) {
    if (record.seq >= mark && record.level == level) out.push_back(record);
  }
  return out;
}

bool waitForWarning(uint64_t mark, const std::vector<std::string>& needles, std::chrono::milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    for (const LogRecord& record : warningsSince(mark)) {
      if (containsAll(record.text, needles)) return true;
    }
    if (std::chrono::steady_clock::now() >= end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string describeWarnings(uint64_t mark) {
  std::string out;
  for (const LogRecord& record : warningsSince(mark)) out += "  WARN: " + record.text + "\n";
  return out.empty() ? std::string("  (no WARN logged)\n") : out;
}

}  // namespace conformance
