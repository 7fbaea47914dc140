#include "harness.h"

#include <dirent.h>
#include <execinfo.h>
#include <signal.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <thread>

#include "log_capture.h"

namespace conformance {
namespace {

Options gOptions;
int gStartupThreads = -1;
std::vector<std::string> gSkippedGroups;  // groups whose requirement is unmet on this machine

// Read by signal handlers: fixed storage and lock-free atomics only.
char gCurrentTest[256] = "(startup)";
std::atomic<int> gPassed{0};
std::atomic<int> gFailed{0};

void writeStr(const char* s) {
  size_t left = std::strlen(s);
  while (left > 0) {
    const ssize_t n = write(STDOUT_FILENO, s, left);
    if (n <= 0) return;
    s += n;
    left -= static_cast<size_t>(n);
  }
}

void writeInt(long value) {
  char digits[24];
  int n = 0;
  const bool negative = value < 0;
  unsigned long v = negative ? static_cast<unsigned long>(-value) : static_cast<unsigned long>(value);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v && n < 22);
  if (negative) digits[n++] = '-';
  char out[24];
  for (int i = 0; i < n; ++i) out[i] = digits[n - 1 - i];
  out[n] = '\0';
  writeStr(out);
}

// The last words of a run that cannot continue: the current test fails, then the summary line.
void writeFatal(const char* reason) {
  writeStr("\nFAIL ");
  writeStr(gCurrentTest);
  writeStr(": ");
  writeStr(reason);
  writeStr("\n");
  writeInt(gPassed.load());
  writeStr(" passed, ");
  writeInt(gFailed.load() + 1);
  writeStr(" failed\n");
}

void onAlarm(int) {
  writeFatal("watchdog: the test did not finish in time (hung)");
  _exit(3);
}

void onSigpipe(int) {
  writeFatal("SIGPIPE: the plugin wrote to a closed socket without MSG_NOSIGNAL (NCCL does not ignore SIGPIPE)");
  _exit(3);
}

void onCrash(int sig) {
  writeFatal(sig == SIGSEGV ? "crashed (SIGSEGV)" : sig == SIGABRT ? "crashed (SIGABRT)" : "crashed (signal)");
  // Which thread, and where: a plugin thread still running after dlclose shows as frames in no mapped object.
  char thread[17] = {};
  prctl(PR_GET_NAME, thread);
  writeStr("crash in thread \"");
  writeStr(thread);
  writeStr("\", backtrace:\n");
  void* frames[64];
  backtrace_symbols_fd(frames, backtrace(frames, 64), STDOUT_FILENO);
  signal(sig, SIG_DFL);
  raise(sig);
}

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || RAILNET_SANITIZED
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

void installSignalHandlers() {
  signal(SIGALRM, onAlarm);
  signal(SIGPIPE, onSigpipe);
  // Sanitizers print better crash reports than we can; keep theirs.
  if (!kSanitized) {
    // backtrace() loads libgcc on its first call, which a signal handler must not: call it once now.
    void* frame[1];
    (void)backtrace(frame, 1);
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, onCrash);
  }
}

[[noreturn]] void usage(const char* error) {
  std::fprintf(stderr,
               "%s\nusage: railnet-conformance --plugin PATH [--version all|V[,V...]] [--group NAME[,NAME...]]\n"
               "         [--filter SUBSTRING] [--skip SUBSTRING[,SUBSTRING...]] [--max-size BYTES[K|M|G]] [--list]\n"
               "         [--verbose] [--wait-timeout SEC] [--test-timeout SEC]\n",
               error);
  std::exit(2);
}

size_t parseSize(const std::string& text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (end == text.c_str()) usage("--max-size: not a number");
  const std::string suffix(end);
  if (suffix.empty()) return value;
  if (suffix == "K" || suffix == "k") return value << 10;
  if (suffix == "M" || suffix == "m") return value << 20;
  if (suffix == "G" || suffix == "g") return value << 30;
  usage("--max-size: unknown suffix");
}

// "a,b,c" -> {"a", "b", "c"}; empty items are dropped (--group and --version take lists).
std::vector<std::string> splitList(const std::string& list) {
  std::vector<std::string> items;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    if (comma > start) items.push_back(list.substr(start, comma - start));
    start = comma + 1;
  }
  return items;
}

void parseOptions(int argc, char** argv) {
  Options& o = gOptions;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage(("missing value for " + arg).c_str());
      return argv[++i];
    };
    if (arg == "--plugin")
      o.plugin = value();
    else if (arg == "--version") {
      const std::string v = value();
      if (v != "all") {
        // One version or a comma-separated list, run in the order given.
        o.versions.clear();
        for (const std::string& item : splitList(v)) {
          const int n = std::atoi(item.c_str());
          bool known = false;
          for (int s : kSupportedVersions) known |= s == n;
          if (!known) usage("--version: expected all, or 8, 9, 10, 11, 12 (one or a comma-separated list)");
          o.versions.push_back(n);
        }
        if (o.versions.empty()) usage("--version: empty list");
        o.versionGiven = true;
      }
    } else if (arg == "--group")
      o.group = value();
    else if (arg == "--filter")
      o.filter = value();
    else if (arg == "--skip")
      o.skip = splitList(value());
    else if (arg == "--max-size")
      o.maxSize = parseSize(value());
    else if (arg == "--list")
      o.list = true;
    else if (arg == "--verbose")
      o.verbose = true;
    else if (arg == "--wait-timeout")
      o.waitTimeoutSec = std::max(1, std::atoi(value().c_str()));
    else if (arg == "--test-timeout")
      o.testTimeoutSec = std::max(1, std::atoi(value().c_str()));
    else
      usage(("unknown option " + arg).c_str());
  }
  if (o.plugin.empty() && !o.list) usage("--plugin is required");
}

bool groupSelected(const char* group) {
  for (const std::string& wanted : splitList(gOptions.group)) {
    if (wanted == group) return true;
  }
  return false;
}

std::string testName(const TestCase& test, int version) {
  const std::string base = std::string(test.group) + "." + test.name;
  return version ? "v" + std::to_string(version) + "/" + base : base;
}

bool selected(const TestCase& test, const std::string& name) {
  if (!gOptions.group.empty() && !groupSelected(test.group)) return false;
  if (std::find(gSkippedGroups.begin(), gSkippedGroups.end(), test.group) != gSkippedGroups.end()) return false;
  for (const std::string& skipped : gOptions.skip) {
    if (name.find(skipped) != std::string::npos) return false;
  }
  return gOptions.filter.empty() || name.find(gOptions.filter) != std::string::npos;
}

// Whether any test of the run (any version) is selected; of `group` only when one is given.
bool anySelected(const std::vector<int>& versions, const char* group = nullptr) {
  for (const TestCase& test : registry()) {
    if (group != nullptr && std::strcmp(test.group, group) != 0) continue;
    if (test.scope == Scope::Once) {
      if (selected(test, testName(test, 0))) return true;
      continue;
    }
    for (int v : versions) {
      if (selected(test, testName(test, v))) return true;
    }
  }
  return false;
}

// Asks each group requirement whose group has selected tests; an unmet one is reported and its group dropped.
void applyGroupRequirements(const std::vector<int>& versions) {
  for (const GroupRequirement& requirement : groupRequirements()) {
    if (!anySelected(versions, requirement.group)) continue;
    const std::string why = requirement.unmet();
    if (why.empty()) continue;
    std::printf("SKIP %s: %s\n", requirement.group, why.c_str());
    std::fflush(stdout);
    gSkippedGroups.push_back(requirement.group);
  }
}

std::string oneLine(std::string text) {
  for (char& c : text) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return text;
}

void report(const std::string& line) {
  std::fputs(line.c_str(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

}  // namespace

void note(const std::string& text) { report(std::string("NOTE ") + gCurrentTest + ": " + text); }

namespace {

void runOne(const std::string& name, void (*fn)(TestEnv&), TestEnv& env) {
  std::snprintf(gCurrentTest, sizeof(gCurrentTest), "%s", name.c_str());
  const uint64_t mark = logMark();
  const auto start = std::chrono::steady_clock::now();
  alarm(static_cast<unsigned>(gOptions.testTimeoutSec));
  std::string error;
  try {
    fn(env);
  } catch (const TestSkipped& e) {
    alarm(0);
    report("SKIP " + name + ": " + oneLine(e.what()));
    return;
  } catch (const TestFailure& e) {
    error = e.what();
  } catch (const std::exception& e) {
    error = std::string("unexpected exception: ") + e.what();
  }
  alarm(0);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (error.empty()) {
    gPassed.fetch_add(1);
    report(strf("PASS %s (%.2f s)", name.c_str(), seconds));
  } else {
    gFailed.fetch_add(1);
    report("FAIL " + name + ": " + oneLine(error));
    std::fprintf(stderr, "--- plugin warnings during %s:\n%s", name.c_str(), describeWarnings(mark).c_str());
  }
}

void recordFailure(const std::string& name, const std::string& reason) {
  gFailed.fetch_add(1);
  report("FAIL " + name + ": " + oneLine(reason));
}

// Groups run in this order; lifecycle last because its tests unload and reload the plugin.
int groupRank(const char* group) {
  static const char* const order[] = {"basic", "data", "grouped", "failure", "lifecycle"};
  for (int i = 0; i < static_cast<int>(std::size(order)); ++i) {
    if (std::strcmp(order[i], group) == 0) return i;
  }
  return static_cast<int>(std::size(order));
}

}  // namespace

std::unique_ptr<NetApi> openApi(const PluginLibrary& library, int version) {
  return library.api(version, captureLogger(), captureProfiler());
}

bool isMapped(const std::string& path) {
  char resolved[PATH_MAX];
  const std::string wanted = realpath(path.c_str(), resolved) ? std::string(resolved) : path;
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    if (line.size() >= wanted.size() && line.compare(line.size() - wanted.size(), wanted.size(), wanted) == 0) {
      return true;
    }
  }
  return false;
}

const Options& options() { return gOptions; }

int startupThreadCount() { return gStartupThreads; }

int threadCount() { return static_cast<int>(threadNames().size()); }

FileLimit::FileLimit() { getrlimit(RLIMIT_NOFILE, &saved_); }
FileLimit::~FileLimit() { setrlimit(RLIMIT_NOFILE, &saved_); }
bool FileLimit::setSoft(rlim_t soft) {
  rlimit wanted = saved_;
  wanted.rlim_cur = soft;
  return setrlimit(RLIMIT_NOFILE, &wanted) == 0;
}

size_t openFileCount() {
  size_t count = 0;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (const dirent* entry = readdir(dir)) count += entry->d_name[0] != '.';
    closedir(dir);
  }
  return count > 0 ? count - 1 : 0;  // opendir's own descriptor
}

namespace {

// The kernel's own count of this process's threads (the Threads: line of /proc/self/status); -1 if unreadable.
int kernelThreadCount() {
  int count = -1;
  if (FILE* status = std::fopen("/proc/self/status", "r")) {
    char line[256];
    while (std::fgets(line, sizeof(line), status)) {
      if (std::sscanf(line, "Threads: %d", &count) == 1) break;
    }
    std::fclose(status);
  }
  return count;
}

// One listing of /proc/self/task: each thread's name ("?" if it went before its name was read).
std::vector<std::string> listThreadNames() {
  std::vector<std::string> names;
  DIR* dir = opendir("/proc/self/task");
  if (!dir) return names;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    std::string name = "?";
    if (FILE* comm = std::fopen(strf("/proc/self/task/%s/comm", entry->d_name).c_str(), "r")) {
      char buffer[64] = {};
      if (std::fgets(buffer, sizeof(buffer), comm)) name = buffer;
      std::fclose(comm);
      if (!name.empty() && name.back() == '\n') name.pop_back();
    }
    names.push_back(name);
  }
  closedir(dir);
  return names;
}

}  // namespace

std::vector<std::string> threadNames() {
  // A listing of /proc/self/task is not atomic: when the thread it has reached leaves the thread list meanwhile, the
  // listing ends there (fs/proc/base.c, next_tid: a task no longer alive has no next), and every newer thread is
  // missing from it. A thread that pthread_join has just returned for may still be leaving in the kernel. So the
  // listing counts only when the kernel's thread count is the same before and after it and equals its length.
  std::vector<std::string> names;
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int before = kernelThreadCount();
    names = listThreadNames();
    if (before >= 0 && before == kernelThreadCount() && static_cast<size_t>(before) == names.size()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return names;
}

std::string strf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}


void fail(const char* file, int line, const std::string& message) {
  const char* base = std::strrchr(file, '/');
  throw TestFailure(strf("%s (%s:%d)", message.c_str(), base ? base + 1 : file, line));
}

Deadline::Deadline(std::chrono::milliseconds budget, const std::atomic<bool>* abort)
    : end_(std::chrono::steady_clock::now() + budget), abort_(abort) {}

Deadline::Deadline(const std::atomic<bool>* abort) : Deadline(std::chrono::seconds(options().waitTimeoutSec), abort) {}

bool Deadline::expired() const {
  return (abort_ && abort_->load(std::memory_order_relaxed)) || std::chrono::steady_clock::now() >= end_;
}

void Deadline::check(const char* what) const {
  if (abort_ && abort_->load(std::memory_order_relaxed))
    throw TestFailure("aborted: another thread of the test failed");
  if (std::chrono::steady_clock::now() >= end_) throw TestFailure(std::string("timed out waiting for ") + what);
}

ProgressDeadline::ProgressDeadline(const std::atomic<bool>* abort)
    : abort_(abort),
      budget_(std::chrono::seconds(options().waitTimeoutSec)),
      lastProgress_(Clock::now().time_since_epoch().count()) {}

ProgressDeadline::Clock::duration ProgressDeadline::quietFor() const {
  return Clock::now() - Clock::time_point(Clock::duration(lastProgress_.load(std::memory_order_relaxed)));
}

bool ProgressDeadline::expired() const {
  return (abort_ && abort_->load(std::memory_order_relaxed)) || quietFor() >= budget_;
}

void ProgressDeadline::check(const char* what) const {
  if (abort_ && abort_->load(std::memory_order_relaxed)) throw TestFailure("aborted: another thread of the test failed");
  if (quietFor() >= budget_) {
    throw TestFailure(strf("timed out waiting for %s (no progress for %lld s)", what,
                           static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(budget_).count())));
  }
}

void Backoff::idle() {
  if (++idleRounds_ < 64) {
    std::this_thread::yield();
  } else {
    std::this_thread::sleep_for(std::chrono::microseconds(idleRounds_ < 2048 ? 20 : 200));
  }
}

ThreadGroup::~ThreadGroup() {
  abort_.store(true);
  for (auto& t : threads_) {
    if (t->thread.joinable()) t->thread.join();
  }
}

void ThreadGroup::spawn(std::function<void()> fn) {
  auto worker = std::make_unique<Worker>();
  Worker* raw = worker.get();
  threads_.push_back(std::move(worker));
  raw->thread = std::thread([this, raw, fn = std::move(fn)] {
    try {
      fn();
    } catch (...) {
      raw->error = std::current_exception();
      abort_.store(true);
    }
  });
}

void ThreadGroup::join() {
  for (auto& t : threads_) {
    if (t->thread.joinable()) t->thread.join();
  }
  // Report the first real failure, not a sibling's "aborted" echo of it.
  std::exception_ptr first;
  for (auto& t : threads_) {
    if (!t->error) continue;
    if (!first) first = t->error;
    try {
      std::rethrow_exception(t->error);
    } catch (const TestFailure& e) {
      if (std::strncmp(e.what(), "aborted:", 8) != 0) {
        first = t->error;
        break;
      }
    } catch (...) {
      first = t->error;
      break;
    }
  }
  threads_.clear();
  if (first) std::rethrow_exception(first);
}

std::vector<TestCase>& registry() {
  static std::vector<TestCase> tests;
  return tests;
}

std::vector<GroupRequirement>& groupRequirements() {
  static std::vector<GroupRequirement> requirements;
  return requirements;
}

RequirementRegistrar::RequirementRegistrar(const char* group, std::string (*unmet)()) {
  groupRequirements().push_back({group, unmet});
}

Registrar::Registrar(const char* group, const char* name, Scope scope, void (*fn)(TestEnv&)) {
  registry().push_back({group, name, scope, fn});
}

int runHarness(int argc, char** argv) {
  parseOptions(argc, argv);
  std::stable_sort(registry().begin(), registry().end(),
                   [](const TestCase& a, const TestCase& b) { return groupRank(a.group) < groupRank(b.group); });
  if (!gOptions.group.empty()) {
    for (const std::string& wanted : splitList(gOptions.group)) {
      bool known = false;
      for (const TestCase& test : registry()) known |= wanted == test.group;
      if (!known) usage(("unknown group " + wanted).c_str());
    }
  }
  std::vector<int> versions = gOptions.versions;
  if (versions.empty()) versions.assign(std::begin(kSupportedVersions), std::end(kSupportedVersions));

  if (gOptions.list) {
    for (const TestCase& test : registry()) {
      if (test.scope == Scope::Once && selected(test, testName(test, 0))) report(testName(test, 0));
    }
    for (int v : versions) {
      for (const TestCase& test : registry()) {
        if (test.scope != Scope::Once && selected(test, testName(test, v))) report(testName(test, v));
      }
    }
    return 0;
  }

  // Before anything is loaded or counted: a requirement may start a driver (its threads count as startup's).
  applyGroupRequirements(versions);
  if (!gSkippedGroups.empty() && !anySelected(versions)) return kExitSkipped;

  setLogEcho(gOptions.verbose);
  installSignalHandlers();

  // Sanitizer runtimes start a helper thread at the first pthread_create; let that happen before counting.
  std::thread([] {}).join();
  gStartupThreads = threadCount();
  // Which versions the library exports decides which passes run; a requested but missing one fails.
  std::vector<int> exported;
  try {
    PluginLibrary probe(gOptions.plugin);
    for (int v : versions) {
      if (probe.exports(v))
        exported.push_back(v);
      else
        recordFailure(strf("v%d/load", v), symbolName(v) + " is not exported by " + gOptions.plugin);
    }
  } catch (const std::exception& e) {
    recordFailure("load", e.what());
  }

  TestEnv onceEnv;
  onceEnv.pluginPath = &gOptions.plugin;
  for (const TestCase& test : registry()) {
    const std::string name = testName(test, 0);
    if (test.scope == Scope::Once && selected(test, name)) runOne(name, test.fn, onceEnv);
  }

  for (int v : exported) {
    TestEnv env;
    env.version = v;
    env.pluginPath = &gOptions.plugin;
    // The largest sizes cost seconds each; one version per run carries them unless a version was chosen.
    env.heavy = gOptions.versionGiven || v == exported.front();
    std::unique_ptr<PluginLibrary> shared;
    std::unique_ptr<NetApi> api;
    for (const TestCase& test : registry()) {
      const std::string name = testName(test, v);
      if (test.scope == Scope::Once || !selected(test, name)) continue;
      if (test.scope == Scope::PerVersionOwnLoad) {
        api.reset();
        shared.reset();
      } else if (!shared) {
        try {
          shared = std::make_unique<PluginLibrary>(gOptions.plugin);
          api = openApi(*shared, v);
        } catch (const std::exception& e) {
          recordFailure(name, e.what());
          continue;
        }
      }
      env.net = api.get();
      runOne(name, test.fn, env);
    }
  }

  const int passed = gPassed.load();
  const int failed = gFailed.load();
  report(strf("%d passed, %d failed", passed, failed));
  return failed == 0 ? 0 : 1;
}

bool sanitizedBuild() { return kSanitized; }

bool verbsTransport() {
  const char* transport = std::getenv("RAILNET_TRANSPORT");
  return transport != nullptr && std::string(transport) == "verbs";
}

void skipUnlessHeavy(const TestEnv& env) {
  if (!env.heavy) SKIP("runs in the newest version's pass only (it waits for seconds; the ABI version does not matter)");
}

}  // namespace conformance
