// Plumbing shared by every measurement of railnet-bench: the error type, the stall guard that keeps the bench
// from hanging, running a group of threads together, and calibrated (warm-up, then timed) runs.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace railnet::bench {

// Any failure the bench reports; main prints what() on stderr and exits 1.
class BenchError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What this run cannot measure here (no GPU for --gpu, a device without GPU memory support): main prints what()
// on stderr and exits 2, so a script never takes it for a pass or for a failed measurement.
class Unsupported : public BenchError {
 public:
  using BenchError::BenchError;
};

// Thrown in the threads of a group after another thread of the group failed; its message (where that thread
// stood) is appended to the real error.
class Aborted : public BenchError {
 public:
  using BenchError::BenchError;
};

[[noreturn]] void fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// Monotonic time in seconds.
double now() noexcept;

// Every wait in the bench polls check(); every step forward calls progressed(). When nothing moved for
// `timeout` seconds, check() throws with the current phase and the caller's description of what it waits for.
// A backstop thread covers calls into the plugin that never return (check() cannot run then): it prints the
// phase and ends the process with status 1 a few seconds after the timeout.
class StallGuard {
 public:
  explicit StallGuard(double timeoutSeconds);
  ~StallGuard();
  StallGuard(const StallGuard&) = delete;
  StallGuard& operator=(const StallGuard&) = delete;

  // Names what runs now (for messages); counts as progress.
  void setPhase(std::string phase);
  std::string phase() const;

  void progressed() noexcept { lastProgress_.store(now(), std::memory_order_relaxed); }

  // `detail()` builds the description only when a message is needed.
  template <class Detail>
  void check(Detail&& detail) const {
    // After another thread's failure, say where this one stood: with both sides of a transfer the stall is clear.
    if (aborted_.load(std::memory_order_relaxed)) throw Aborted(detail());
    if (now() - lastProgress_.load(std::memory_order_relaxed) > timeout_) stalled(detail());
  }

  // Makes every check() throw Aborted, so the other threads of a failed group stop quickly.
  void abort() noexcept { aborted_.store(true, std::memory_order_relaxed); }
  void clearAbort() noexcept { aborted_.store(false, std::memory_order_relaxed); }

 private:
  [[noreturn]] void stalled(const std::string& detail) const;
  void backstop();

  const double timeout_;
  std::atomic<double> lastProgress_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::string phase_;
  std::thread backstopThread_;
};

// Runs each task on its own thread, releases them together, and returns the seconds from that release until
// the last one returned. The first failure aborts the others through `guard` and is rethrown here, with what
// the other threads were doing at that moment appended. `prepareThread`, when given, runs first on each thread,
// before the release (e.g. making a CUDA context current), so it stays out of the time.
double runTogether(StallGuard& guard, const std::vector<std::function<void()>>& tasks,
                   const std::function<void()>& prepareThread = {});

// Result of a calibrated measurement: the count of the timed run and how long it took.
struct TimedRun {
  uint64_t count;
  double seconds;
};

// `run(count)` performs `count` operations and returns the seconds they took. Warm-up: runs with counts
// growing x4 from `firstCount` until one lasts `warmupSeconds` (connection set-up, page faults and thread
// start-up stay out of the result). Then one timed run with the count scaled to last about `targetSeconds`,
// clamped to [minCount, maxCount]. Both ends agree on the count up front, so no run ever has to be cut short.
TimedRun runCalibrated(const std::function<double(uint64_t)>& run, uint64_t firstCount, uint64_t minCount,
                       uint64_t maxCount, double warmupSeconds, double targetSeconds);

double median(std::vector<double> values);

// CPU seconds this process has used so far, all threads (the plugin's helpers and the bench's own).
double processCpuSeconds() noexcept;

}  // namespace railnet::bench
