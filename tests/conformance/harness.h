// The test framework: options, test registry, failure reporting, deadlines, helper threads, the watchdog.
#pragma once

#include <sys/resource.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "plugin/tools/nccl_loader.h"

namespace conformance {

// The net ABI loader, shared with railnet-bench (plugin/tools/nccl_loader.h).
using railnet::nccl_loader::DevComm;
using railnet::nccl_loader::DeviceProps;
using railnet::nccl_loader::kSupportedVersions;
using railnet::nccl_loader::NetApi;
using railnet::nccl_loader::PluginLibrary;
using railnet::nccl_loader::symbolName;

// library.api(version) with the logger and profiler NCCL would pass: log_capture's, so tests can see WARNs.
std::unique_ptr<NetApi> openApi(const PluginLibrary& library, int version);

// Sets an environment variable for the scope of a test, restoring the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) {
      had_ = true;
      old_ = old;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string old_;
};

// The plugin loaded for one Scope::PerVersionOwnLoad test (the shared load is released first), with one setting of
// its own in the environment while it initializes: settings are read once, at init.
struct OwnLoad {
  OwnLoad(const std::string& pluginPath, int version, const char* setting, const char* value)
      : scoped(setting, value), library(pluginPath), net(openApi(library, version)) {}
  ScopedEnv scoped;
  PluginLibrary library;
  std::unique_ptr<NetApi> net;
};

// A stray timeout short enough to test (RAILNET_STRAY_TIMEOUT_MS). Only the tests of stray connections use it, each
// in a load of its own: everything else runs with the production default (10 s), because on a loaded machine a live
// peer's hello can come later than half a second after its connect (the hour soak saw it, stop 33).
inline constexpr const char* kShortStrayTimeoutMs = "500";

// True while a library whose path ends like `path` is still mapped in this process (after dlclose: it was
// not unloaded, e.g. because of STB_GNU_UNIQUE symbols).
bool isMapped(const std::string& path);

struct Options {
  std::string plugin;
  std::vector<int> versions;  // empty: every exported version
  bool versionGiven = false;  // --version N: that version also runs the largest sizes
  std::string group;
  std::string filter;
  std::vector<std::string> skip;  // --skip: a test whose name contains any of these does not run
  size_t maxSize = size_t{1} << 30;
  bool list = false;
  bool verbose = false;
  int waitTimeoutSec = 30;   // any single wait loop
  int testTimeoutSec = 120;  // the watchdog, per test case
};

const Options& options();
// Threads of this process (entries in /proc/self/task), and that count before the plugin was first loaded.
int threadCount();
// File descriptors this process has open (/proc/self/fd).
size_t openFileCount();

// RLIMIT_NOFILE for one test: setSoft() changes the soft limit, the destructor puts the old one back.
class FileLimit {
 public:
  FileLimit();
  ~FileLimit();
  FileLimit(const FileLimit&) = delete;
  FileLimit& operator=(const FileLimit&) = delete;
  rlim_t hard() const { return saved_.rlim_max; }
  bool setSoft(rlim_t soft);

 private:
  rlimit saved_{};
};
int startupThreadCount();
// The names (/proc/self/task/*/comm) of this process's threads.
std::vector<std::string> threadNames();

__attribute__((format(printf, 1, 2))) std::string strf(const char* fmt, ...);
// A measurement worth keeping in the run's output: printed as "NOTE <test>: text".
void note(const std::string& text);

// Thrown by REQUIRE and friends; the runner prints it as FAIL.
class TestFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void fail(const char* file, int line, const std::string& message);

// Thrown by SKIP: the runner prints "SKIP name: reason" and counts the case neither passed nor failed.
class TestSkipped : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

#define SKIP(reason) throw ::conformance::TestSkipped(reason)

#define REQUIRE(cond, message)                                                                   \
  do {                                                                                           \
    if (!(cond)) ::conformance::fail(__FILE__, __LINE__, std::string(#cond) + ": " + (message)); \
  } while (0)

// The call must return ncclSuccess.
#define REQUIRE_OK(call)                                                                                           \
  do {                                                                                                             \
    ncclResult_t rc_ = (call);                                                                                     \
    if (rc_ != ncclSuccess)                                                                                        \
      ::conformance::fail(__FILE__, __LINE__, std::string(#call) + " returned " + ncclResultName(rc_)); \
  } while (0)

// Stops every wait loop of a test when time runs out or when a sibling thread already failed, so one
// failure does not leave the other side spinning until its own deadline.
class Deadline {
 public:
  Deadline(std::chrono::milliseconds budget, const std::atomic<bool>* abort = nullptr);
  // Uses options().waitTimeoutSec.
  explicit Deadline(const std::atomic<bool>* abort = nullptr);
  bool expired() const;
  // Throws TestFailure naming `what` when expired or aborted.
  void check(const char* what) const;
  std::chrono::steady_clock::time_point end() const { return end_; }

 private:
  std::chrono::steady_clock::time_point end_;
  const std::atomic<bool>* abort_;
};

// A hang deadline for work of any length: expires after options().waitTimeoutSec without progress() (from any
// thread), not after a fixed total.
class ProgressDeadline {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ProgressDeadline(const std::atomic<bool>* abort = nullptr);
  void progressed() const { lastProgress_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed); }
  bool expired() const;
  // Throws TestFailure naming `what` when expired or aborted.
  void check(const char* what) const;

 private:
  Clock::duration quietFor() const;
  const std::atomic<bool>* abort_;
  Clock::duration budget_;
  mutable std::atomic<Clock::rep> lastProgress_;
};

// Back-off for "not yet, call again" loops: spins briefly, then sleeps so that on a 2-core machine the
// plugin's own threads get the CPU.
class Backoff {
 public:
  void idle();
  void progressed() { idleRounds_ = 0; }

 private:
  int idleRounds_ = 0;
};

// Runs functions on their own threads; join() waits for all and rethrows the first failure. The shared
// abort flag is raised as soon as one fails so the others' Deadlines stop them.
class ThreadGroup {
 public:
  ThreadGroup() = default;
  ~ThreadGroup();
  ThreadGroup(const ThreadGroup&) = delete;
  ThreadGroup& operator=(const ThreadGroup&) = delete;

  void spawn(std::function<void()> fn);
  void join();
  const std::atomic<bool>* abortFlag() const { return &abort_; }

 private:
  struct Worker {
    std::thread thread;
    std::exception_ptr error;
  };
  std::vector<std::unique_ptr<Worker>> threads_;  // stable addresses: each thread writes its own error
  std::atomic<bool> abort_{false};
};

inline constexpr size_t KiB = size_t{1} << 10;
inline constexpr size_t MiB = size_t{1} << 20;

// What a test case runs against.
struct TestEnv {
  NetApi* net = nullptr;  // the version under test, from the shared load (nullptr for Once tests)
  int version = 0;        // 0 for Once tests
  bool heavy = false;     // this pass runs the largest sizes
  int dev = 0;            // the device tests use
  const std::string* pluginPath = nullptr;
};

enum class Scope {
  PerVersion,         // runs once per ABI version on the shared load
  PerVersionOwnLoad,  // per version, but with the shared load released first (it opens its own)
  Once,               // once per run, independent of the version
};

struct TestCase {
  const char* group;
  const char* name;
  Scope scope;
  void (*fn)(TestEnv&);
};

std::vector<TestCase>& registry();

// True in ASan, UBSan and TSan builds (they keep freed memory and slow everything down).
bool sanitizedBuild();

// True when the plugin under test runs its verbs transport (RAILNET_TRANSPORT=verbs: the soft-RoCE guest).
bool verbsTransport();

// For cases that cost seconds of waiting and do not depend on the ABI version: they run in the pass that carries
// the largest sizes (the newest version, or the one --version names) and SKIP in the others.
void skipUnlessHeavy(const TestEnv& env);

struct Registrar {
  Registrar(const char* group, const char* name, Scope scope, void (*fn)(TestEnv&));
};

#define CONFORMANCE_CONCAT2(a, b) a##b
#define CONFORMANCE_CONCAT(a, b) CONFORMANCE_CONCAT2(a, b)
// TEST_CASE("group", "name", Scope::X) { ... env ... }. Names come from __COUNTER__, not __LINE__: the harness is
// a unity build, where two files' tests may sit on the same line number of one translation unit.
#define TEST_CASE(group, name, scope) CONFORMANCE_TEST_CASE(group, name, scope, __COUNTER__)
#define CONFORMANCE_TEST_CASE(group, name, scope, id)                                                         \
  static void CONFORMANCE_CONCAT(testFn_, id)(::conformance::TestEnv & env);                                  \
  static const ::conformance::Registrar CONFORMANCE_CONCAT(testReg_, id)(group, name, scope,                  \
                                                                          CONFORMANCE_CONCAT(testFn_, id)); \
  static void CONFORMANCE_CONCAT(testFn_, id)([[maybe_unused]] ::conformance::TestEnv & env)

// What a whole group needs of the machine (e.g. a GPU): `unmet` returns "" when its tests can run, else why
// not. The runner asks before running anything; when unmet it prints "SKIP <group>: <why>" once and drops the
// group's tests, and a run whose every selected test was dropped this way exits 77 (meson's SKIP).
struct GroupRequirement {
  const char* group;
  std::string (*unmet)();
};

std::vector<GroupRequirement>& groupRequirements();

struct RequirementRegistrar {
  RequirementRegistrar(const char* group, std::string (*unmet)());
};

// GROUP_REQUIRES("group", function returning "" or the reason to skip the group);
#define GROUP_REQUIRES(group, unmet) \
  static const ::conformance::RequirementRegistrar CONFORMANCE_CONCAT(groupRequirement_, __COUNTER__)(group, unmet)

// The exit status of a run in which nothing ran because every selected group's requirement was unmet.
inline constexpr int kExitSkipped = 77;

// Parses the command line (exits on usage errors), runs the selected tests, returns the exit code.
int runHarness(int argc, char** argv);

}  // namespace conformance
