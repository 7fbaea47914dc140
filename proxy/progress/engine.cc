#include "proxy/progress/engine.h"

#include <sys/epoll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "base/clock.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::progress {

// The pool's own descriptors (epoll set, wake-up eventfd), closed with it. The pool knows nothing of what its
// sources carry, so it stands below the protocol and the transports.
class OwnedFd {
 public:
  OwnedFd() = default;
  ~OwnedFd() { reset(); }
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

class Worker {
 public:
  Worker(int id, int spinUs);
  ~Worker();
  void stop();
  void add(EventSource* source);
  void remove(EventSource* source);
  // A source of this worker has new work (data to send).
  void notify();
  // Valid once the worker has stopped (the destructor joined it).
  uint64_t bytesMoved() const { return bytesMoved_; }
  double cpuSeconds() const { return cpuSeconds_; }
  // Telemetry, valid once stopped: passes over the sources, passes that moved nothing, and sleeps in epoll_wait.
  uint64_t passes() const { return passes_; }
  uint64_t idlePasses() const { return idlePasses_; }
  uint64_t sleeps() const { return sleeps_; }

 private:
  void run();
  void applyCommands();
  void wakeUp();
  void waitForEvents(int timeoutMs);

  int id_;
  std::chrono::microseconds spin_;
  OwnedFd epoll_;
  OwnedFd wakeFd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> submissions_{0};  // bumped by notify(); tells a worker about to sleep that work came

  std::mutex mutex_;
  std::condition_variable removed_;
  std::vector<EventSource*> toAdd_;     // guarded by mutex_
  std::vector<EventSource*> toRemove_;  // guarded by mutex_
  uint64_t removalsDone_ = 0;      // guarded by mutex_
  uint64_t removalsAsked_ = 0;     // guarded by mutex_

  std::vector<EventSource*> sources_;  // worker thread only
  uint64_t bytesMoved_ = 0;       // worker thread only until joined
  uint64_t passes_ = 0;           // likewise
  uint64_t idlePasses_ = 0;       // likewise
  uint64_t sleeps_ = 0;           // likewise
  double cpuSeconds_ = 0;         // written by the worker as it exits
};

// ---- Worker -------------------------------------------------------------------------------------------------

Worker::Worker(int id, int spinUs) : id_(id), spin_(spinUs) {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  wakeFd_.reset(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!epoll_.valid() || !wakeFd_.valid()) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: cannot create helper thread %d's epoll/eventfd: %s", id,
         errnoText(err).c_str());
  }
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.ptr = nullptr;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wakeFd_.get(), &event) != 0) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: epoll_ctl failed: %s", errnoText(err).c_str());
  }
  thread_ = std::thread([this] { run(); });
}

Worker::~Worker() { stop(); }

void Worker::stop() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  wakeUp();
  thread_.join();
}

void Worker::wakeUp() {
  uint64_t one = 1;
  ssize_t ignored = write(wakeFd_.get(), &one, sizeof(one));
  (void)ignored;  // a full counter still wakes the reader
}

void Worker::add(EventSource* source) {
  source->worker_ = this;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    toAdd_.push_back(source);
  }
  wakeUp();
}

void Worker::remove(EventSource* source) {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t ticket = ++removalsAsked_;
  toRemove_.push_back(source);
  wakeUp();
  removed_.wait(lock, [&] { return removalsDone_ >= ticket; });
}

void Worker::notify() {
  // Pairs with run(): either the worker sees the new submission count, or we see it sleeping and wake it.
  submissions_.fetch_add(1, std::memory_order_seq_cst);
  if (sleeping_.load(std::memory_order_seq_cst)) wakeUp();
}

void Worker::applyCommands() {
  std::lock_guard<std::mutex> lock(mutex_);
  for (EventSource* source : toAdd_) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
    event.data.ptr = source;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, source->fd(), &event) != 0) {
      int err = errno;
      source->failWith(errnoText(err).c_str(), err);
    }
    sources_.push_back(source);
  }
  toAdd_.clear();
  if (!toRemove_.empty()) {
    for (EventSource* source : toRemove_) {
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, source->fd(), nullptr);
      sources_.erase(std::remove(sources_.begin(), sources_.end(), source), sources_.end());
    }
    removalsDone_ += toRemove_.size();
    toRemove_.clear();
    removed_.notify_all();
  }
}

void Worker::waitForEvents(int timeoutMs) {
  epoll_event events[64];
  int count = epoll_wait(epoll_.get(), events, 64, timeoutMs);
  for (int i = 0; i < count; ++i) {
    auto* source = static_cast<EventSource*>(events[i].data.ptr);
    if (source == nullptr) {
      uint64_t drained;
      ssize_t ignored = read(wakeFd_.get(), &drained, sizeof(drained));
      (void)ignored;
      continue;
    }
    // Events only set flags; progress() runs to EAGAIN before clearing them (edge-triggered).
    source->markReady((events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0,
                      (events[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) != 0,
                      (events[i].events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) != 0);
  }
}

void Worker::run() {
  auto lastWork = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    uint64_t seen = submissions_.load(std::memory_order_seq_cst);
    applyCommands();
    uint64_t moved = 0;
    for (EventSource* source : sources_) moved += source->progress();
    bytesMoved_ += moved;
    ++passes_;
    if (moved == 0) ++idlePasses_;
    auto now = std::chrono::steady_clock::now();
    if (moved > 0) {
      lastWork = now;
      // Collect readiness that arrived meanwhile: a socket read empty earlier in this busy run may have data again.
      waitForEvents(0);
      continue;
    }
    // A shaped source waiting for its bucket (retryAtNs): spin when it is due within a millisecond (epoll_wait
    // counts whole milliseconds), else sleep no longer than until it is due.
    int64_t retryAt = 0;
    for (EventSource* source : sources_) {
      const int64_t at = source->retryAtNs();
      if (at != 0 && (retryAt == 0 || at < retryAt)) retryAt = at;
    }
    const int64_t untilRetryNs = retryAt == 0 ? INT64_MAX : retryAt - monotonicNs();
    if (now - lastWork < spin_ || untilRetryNs < 1000000) {
      waitForEvents(0);
      sched_yield();  // a core shared with other runnable threads goes to them while we poll
      continue;
    }
    sleeping_.store(true, std::memory_order_seq_cst);
    bool pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = !toAdd_.empty() || !toRemove_.empty();
    }
    pending = pending || submissions_.load(std::memory_order_seq_cst) != seen;
    if (!pending) {
      ++sleeps_;
      waitForEvents(static_cast<int>(std::min<int64_t>(1000, untilRetryNs / 1000000)));
    }
    sleeping_.store(false, std::memory_order_seq_cst);
    lastWork = std::chrono::steady_clock::now();
  }
  timespec cpu{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
  cpuSeconds_ = static_cast<double>(cpu.tv_sec) + static_cast<double>(cpu.tv_nsec) * 1e-9;
}

// ---- Engine -------------------------------------------------------------------------------------------------

namespace {
std::mutex gEngineMutex;
std::weak_ptr<Engine> gEngine;  // guarded by gEngineMutex
}  // namespace

std::shared_ptr<Engine> Engine::acquire() {
  std::lock_guard<std::mutex> lock(gEngineMutex);
  std::shared_ptr<Engine> engine = gEngine.lock();
  if (!engine) {
    engine.reset(new Engine());
    gEngine = engine;
  }
  return engine;
}

Engine::Engine() {
  const Settings& config = settings();
  int cores = static_cast<int>(std::thread::hardware_concurrency());
  int threads = static_cast<int>(config.tcpThreads);
  if (threads <= 0) {
    // A rank that sends and receives at once keeps 2 x streams socket ends busy per peer (docs/performance.md §7).
    threads = std::min<int>({2 * static_cast<int>(config.tcpStreams), std::max(cores, 1), 16});
  }
  const int spinUs = static_cast<int>(config.tcpSpinUs);  // ranges: include/railnet/settings.h
  for (int i = 0; i < threads; ++i) workers_.push_back(std::make_unique<Worker>(i, spinUs));
  sourcesOf_.assign(workers_.size(), 0);
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: started %d TCP helper threads (spin %d us)", threads, spinUs);
}

Engine::~Engine() {
  uint64_t bytes = 0;
  double cpu = 0;
  uint64_t passes = 0;
  uint64_t idle = 0;
  uint64_t sleeps = 0;
  for (auto& worker : workers_) {
    worker->stop();
    bytes += worker->bytesMoved();
    cpu += worker->cpuSeconds();
    passes += worker->passes();
    idle += worker->idlePasses();
    sleeps += worker->sleeps();
  }
  // How often the helpers went round and slept: the hand-offs behind each message (docs/performance.md §7).
  RN_INFO(NCCL_NET, "NET/railnet: TCP helper threads: %llu passes (%llu moved nothing), %llu sleeps in epoll_wait",
          static_cast<unsigned long long>(passes), static_cast<unsigned long long>(idle),
          static_cast<unsigned long long>(sleeps));
  // The helpers' cost, for the benchmarks' "CPU time per GB" (NCCL's own proxy threads not included).
  double gigabytes = static_cast<double>(bytes) * 1e-9;
  RN_INFO(NCCL_NET, "NET/railnet: TCP helper threads moved %.3f GB using %.3f s of CPU (%.3f s/GB)", gigabytes, cpu,
          gigabytes > 0 ? cpu / gigabytes : 0.0);
}

void Engine::attach(EventSource* source) {
  int pick = -1;
  {
    std::lock_guard<std::mutex> lock(placementMutex_);
    const uint64_t key = source->affinityKey();
    auto found = key != 0 ? keyed_.find(key) : keyed_.end();
    if (found != keyed_.end()) {
      pick = found->second.first;
      ++found->second.second;
    } else {
      pick = static_cast<int>(std::min_element(sourcesOf_.begin(), sourcesOf_.end()) - sourcesOf_.begin());
      if (key != 0) keyed_[key] = {pick, 1};
    }
    ++sourcesOf_[static_cast<size_t>(pick)];
    source->workerIndex_.store(pick, std::memory_order_relaxed);
  }
  workers_[static_cast<size_t>(pick)]->add(source);
}

void Engine::detach(EventSource* source) {
  source->worker_->remove(source);
  std::lock_guard<std::mutex> lock(placementMutex_);
  --sourcesOf_[static_cast<size_t>(source->helper())];
  const uint64_t key = source->affinityKey();
  auto found = key != 0 ? keyed_.find(key) : keyed_.end();
  if (found != keyed_.end() && --found->second.second == 0) keyed_.erase(found);
}

void EventSource::wake() { worker_->notify(); }

}  // namespace railnet::progress
