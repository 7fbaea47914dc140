#include "plugin/tools/harness.h"

#include <ctime>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <latch>

namespace railnet::bench {
namespace {

std::string vformat(const char* fmt, va_list args) {
  va_list copy;
  va_copy(copy, args);
  int length = vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string text(length > 0 ? static_cast<size_t>(length) : 0, '\0');
  vsnprintf(text.data(), text.size() + 1, fmt, args);
  return text;
}

// How long after the timeout the backstop waits before ending the process: long enough for check() to report
// the stall itself with its more precise message.
constexpr double kBackstopGraceSeconds = 5.0;

}  // namespace

void fail(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string text = vformat(fmt, args);
  va_end(args);
  throw BenchError(text);
}

std::string format(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  std::string text = vformat(fmt, args);
  va_end(args);
  return text;
}

double now() noexcept {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

StallGuard::StallGuard(double timeoutSeconds) : timeout_(timeoutSeconds), lastProgress_(now()) {
  backstopThread_ = std::thread([this] { backstop(); });
}

StallGuard::~StallGuard() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  backstopThread_.join();
}

void StallGuard::setPhase(std::string phase) {
  {
    std::lock_guard lock(mutex_);
    phase_ = std::move(phase);
  }
  progressed();
}

std::string StallGuard::phase() const {
  std::lock_guard lock(mutex_);
  return phase_;
}

void StallGuard::stalled(const std::string& detail) const {
  fail("%s: stalled, no progress for %.0f s: %s", phase().c_str(), timeout_, detail.c_str());
}

void StallGuard::backstop() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    wake_.wait_for(lock, std::chrono::milliseconds(500));
    double idle = now() - lastProgress_.load(std::memory_order_relaxed);
    if (!stopping_ && idle > timeout_ + kBackstopGraceSeconds) {
      // A call into the plugin has not returned (or a thread is stuck where it cannot check): nothing else can
      // report this, and unwinding would wait on that same call.
      fprintf(stderr, "\nrailnet-bench: error: %s: stalled for %.0f s inside a call that never returned\n",
              phase_.c_str(), idle);
      fflush(stdout);
      fflush(stderr);
      std::_Exit(1);
    }
  }
}

double runTogether(StallGuard& guard, const std::vector<std::function<void()>>& tasks,
                   const std::function<void()>& prepareThread) {
  std::latch start(static_cast<std::ptrdiff_t>(tasks.size() + 1));
  std::mutex errorMutex;
  std::string cause;                // the first real failure
  std::vector<std::string> others;  // later failures and where the aborted threads stood

  std::vector<std::thread> threads;
  threads.reserve(tasks.size());
  for (const auto& task : tasks) {
    threads.emplace_back([&, task] {
      // A failed preparation still arrives at the latch (the others wait for every thread), then reports.
      std::exception_ptr preparationFailure;
      try {
        if (prepareThread) prepareThread();
      } catch (...) {
        preparationFailure = std::current_exception();
      }
      start.arrive_and_wait();
      std::string message;
      bool aborted = false;
      try {
        if (preparationFailure) std::rethrow_exception(preparationFailure);
        task();
        return;
      } catch (const Aborted& error) {
        message = error.what();
        aborted = true;
      } catch (const std::exception& error) {
        message = error.what();
      } catch (...) {
        message = "unknown exception";
      }
      if (!aborted) guard.abort();
      std::lock_guard lock(errorMutex);
      if (!aborted && cause.empty()) cause = std::move(message);
      else others.push_back(std::move(message));
    });
  }
  start.arrive_and_wait();
  double begin = now();
  for (auto& thread : threads) thread.join();
  double elapsed = now() - begin;
  guard.clearAbort();
  if (cause.empty() && !others.empty()) cause = others.front();  // not expected: Aborted follows a real failure
  if (!cause.empty()) {
    for (const std::string& other : others) cause += "; meanwhile " + other;
    throw BenchError(cause);
  }
  return elapsed;
}

TimedRun runCalibrated(const std::function<double(uint64_t)>& run, uint64_t firstCount, uint64_t minCount,
                       uint64_t maxCount, double warmupSeconds, double targetSeconds) {
  uint64_t count = std::clamp<uint64_t>(firstCount, 1, maxCount);
  double seconds = run(count);
  while (seconds < warmupSeconds && count < maxCount) {
    count = std::min(count * 4, maxCount);
    seconds = run(count);
  }
  double perOperation = seconds / static_cast<double>(count);
  double scaled = perOperation > 0 ? std::ceil(targetSeconds / perOperation) : static_cast<double>(maxCount);
  uint64_t timedCount = std::clamp<uint64_t>(static_cast<uint64_t>(std::min(scaled, 1e15)), minCount, maxCount);
  return {timedCount, run(timedCount)};
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  auto middle = values.begin() + static_cast<std::ptrdiff_t>(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  if (values.size() % 2 == 1) return *middle;
  double upper = *middle;
  double lower = *std::max_element(values.begin(), middle);
  return (lower + upper) / 2;
}

double processCpuSeconds() noexcept {
  timespec cpu{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &cpu);
  return static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) * 1e-9;
}

}  // namespace railnet::bench
