#include "proxy/tcp/engine.h"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::tcp {

class Worker {
 public:
  Worker(int id, int spinUs);
  ~Worker();
  void stop();
  void add(Stream* stream);
  void remove(Stream* stream);
  // A stream of this worker has new data to send.
  void notify();
  // Valid once the worker has stopped (the destructor joined it).
  uint64_t bytesMoved() const { return bytesMoved_; }
  double cpuSeconds() const { return cpuSeconds_; }

 private:
  void run();
  void applyCommands();
  void wakeUp();
  void waitForEvents(int timeoutMs);

  int id_;
  std::chrono::microseconds spin_;
  Fd epoll_;
  Fd wakeFd_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> sleeping_{false};
  std::atomic<uint64_t> submissions_{0};  // bumped by notify(); tells a worker about to sleep that work came

  std::mutex mutex_;
  std::condition_variable removed_;
  std::vector<Stream*> toAdd_;     // guarded by mutex_
  std::vector<Stream*> toRemove_;  // guarded by mutex_
  uint64_t removalsDone_ = 0;      // guarded by mutex_
  uint64_t removalsAsked_ = 0;     // guarded by mutex_

  std::vector<Stream*> streams_;  // worker thread only
  uint64_t bytesMoved_ = 0;       // worker thread only until joined
  double cpuSeconds_ = 0;         // written by the worker as it exits
};

// ---- Stream -------------------------------------------------------------------------------------------------

Stream::Stream(Fd fd, StreamOwner* owner, int index, NicCounters* counters)
    : fd_(std::move(fd)), owner_(owner), index_(index), counters_(counters) {}

void Stream::enqueue(const SendOp& op) {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    queue_.push_back(op);
  }
  queuedBytes_.fetch_add(op.header.length, std::memory_order_relaxed);
  worker_->notify();
}

void Stream::failWith(const char* why, bool endOfStream) {
  if (!dead_.exchange(true)) owner_->streamFailed(index_, why, endOfStream);
}

uint64_t Stream::progress() {
  if (dead_.load(std::memory_order_relaxed)) return 0;
  uint64_t moved = progressReceive();
  if (!dead_.load(std::memory_order_relaxed)) moved += progressSend();
  return moved;
}

uint64_t Stream::progressSend() {
  uint64_t moved = 0;
  while (writable_) {
    if (sending_.empty()) {
      std::lock_guard<std::mutex> lock(queueMutex_);
      if (queue_.empty()) break;
      sending_.swap(queue_);
    }
    // Gather the head of the queue into one sendmsg: fewer syscalls for runs of chunks.
    constexpr int kMaxIov = 16;
    iovec iov[kMaxIov];
    int count = 0;
    uint64_t done = sentOfFront_;  // only the front op can be partly written
    for (const SendOp& op : sending_) {
      if (count + 2 > kMaxIov) break;
      auto* header = reinterpret_cast<char*>(const_cast<ChunkHeader*>(&op.header));
      if (done < sizeof(ChunkHeader)) {
        iov[count++] = {header + done, sizeof(ChunkHeader) - done};
        done = 0;
      } else {
        done -= sizeof(ChunkHeader);
      }
      if (op.header.length > done) iov[count++] = {const_cast<char*>(op.data) + done, op.header.length - done};
      done = 0;
    }
    ssize_t sent = writeVector(fd_.get(), iov, count);
    if (sent == 0) {
      writable_ = false;
      break;
    }
    if (sent < 0) {
      failWith(errnoText(static_cast<int>(-sent)).c_str(), false);
      return moved;
    }
    moved += static_cast<uint64_t>(sent);
    for (uint64_t left = static_cast<uint64_t>(sent); left > 0;) {
      SendOp& front = sending_.front();
      uint64_t total = sizeof(ChunkHeader) + front.header.length;
      uint64_t take = std::min(left, total - sentOfFront_);
      sentOfFront_ += take;
      left -= take;
      if (sentOfFront_ < total) break;
      queuedBytes_.fetch_sub(front.header.length, std::memory_order_relaxed);
      if (counters_ != nullptr) counters_->addSent(front.header.length);
      front.pending->fetch_sub(1, std::memory_order_release);
      sending_.pop_front();
      sentOfFront_ = 0;
    }
  }
  return moved;
}

uint64_t Stream::progressReceive() {
  uint64_t moved = 0;
  while (readable_) {
    ssize_t got;
    if (!inPayload_) {
      char* header = reinterpret_cast<char*>(&incoming_);
      got = readSome(fd_.get(), header + headerBytes_, sizeof(ChunkHeader) - headerBytes_);
    } else {
      got = readSome(fd_.get(), destination_ + (incoming_.length - payloadLeft_), payloadLeft_);
    }
    if (got == 0) {
      readable_ = false;
      break;
    }
    if (got == kEndOfStream) {
      bool clean = !inPayload_ && headerBytes_ == 0;
      failWith(clean ? "peer closed the stream" : "peer closed the stream in the middle of a chunk", clean);
      return moved;
    }
    if (got < 0) {
      failWith(errnoText(static_cast<int>(-got)).c_str(), false);
      return moved;
    }
    moved += static_cast<uint64_t>(got);
    if (!inPayload_) {
      headerBytes_ += static_cast<uint64_t>(got);
      if (headerBytes_ < sizeof(ChunkHeader)) continue;
      headerBytes_ = 0;
      destination_ = owner_->resolveChunk(incoming_);
      if (destination_ == nullptr) {
        failWith("received a chunk that matches no posted receive", false);
        return moved;
      }
      payloadLeft_ = incoming_.length;
      inPayload_ = payloadLeft_ > 0;
      if (counters_ != nullptr) counters_->addReceived(incoming_.length);
      if (!inPayload_) owner_->chunkReceived(incoming_);
    } else {
      payloadLeft_ -= static_cast<uint64_t>(got);
      if (payloadLeft_ == 0) {
        inPayload_ = false;
        owner_->chunkReceived(incoming_);
      }
    }
  }
  return moved;
}

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

void Worker::add(Stream* stream) {
  stream->worker_ = this;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    toAdd_.push_back(stream);
  }
  wakeUp();
}

void Worker::remove(Stream* stream) {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t ticket = ++removalsAsked_;
  toRemove_.push_back(stream);
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
  for (Stream* stream : toAdd_) {
    epoll_event event{};
    event.events = EPOLLIN | EPOLLOUT | EPOLLET | EPOLLRDHUP;
    event.data.ptr = stream;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, stream->fd(), &event) != 0) {
      int err = errno;
      stream->failWith(errnoText(err).c_str(), false);
    }
    streams_.push_back(stream);
  }
  toAdd_.clear();
  if (!toRemove_.empty()) {
    for (Stream* stream : toRemove_) {
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, stream->fd(), nullptr);
      streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
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
    auto* stream = static_cast<Stream*>(events[i].data.ptr);
    if (stream == nullptr) {
      uint64_t drained;
      ssize_t ignored = read(wakeFd_.get(), &drained, sizeof(drained));
      (void)ignored;
      continue;
    }
    // Events only set flags; progress() runs to EAGAIN before clearing them (edge-triggered).
    if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) stream->readable_ = true;
    if (events[i].events & (EPOLLOUT | EPOLLHUP | EPOLLERR)) stream->writable_ = true;
  }
}

void Worker::run() {
  auto lastWork = std::chrono::steady_clock::now();
  while (!stop_.load(std::memory_order_acquire)) {
    uint64_t seen = submissions_.load(std::memory_order_seq_cst);
    applyCommands();
    uint64_t moved = 0;
    for (Stream* stream : streams_) moved += stream->progress();
    bytesMoved_ += moved;
    auto now = std::chrono::steady_clock::now();
    if (moved > 0) {
      lastWork = now;
      continue;
    }
    if (now - lastWork < spin_) {
      waitForEvents(0);
      continue;
    }
    sleeping_.store(true, std::memory_order_seq_cst);
    bool pending;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      pending = !toAdd_.empty() || !toRemove_.empty();
    }
    pending = pending || submissions_.load(std::memory_order_seq_cst) != seen;
    if (!pending) waitForEvents(1000);
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
    threads = std::min<int>({static_cast<int>(config.tcpStreams), std::max(cores, 1), 16});
  }
  const int spinUs = static_cast<int>(config.tcpSpinUs);  // ranges: include/railnet/settings.h
  for (int i = 0; i < threads; ++i) workers_.push_back(std::make_unique<Worker>(i, spinUs));
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: started %d TCP helper threads (spin %d us)", threads, spinUs);
}

Engine::~Engine() {
  uint64_t bytes = 0;
  double cpu = 0;
  for (auto& worker : workers_) {
    worker->stop();
    bytes += worker->bytesMoved();
    cpu += worker->cpuSeconds();
  }
  // The helpers' cost, for the benchmarks' "CPU time per GB" (NCCL's own proxy threads not included).
  double gigabytes = static_cast<double>(bytes) * 1e-9;
  RN_INFO(NCCL_NET, "NET/railnet: TCP helper threads moved %.3f GB using %.3f s of CPU (%.3f s/GB)", gigabytes, cpu,
          gigabytes > 0 ? cpu / gigabytes : 0.0);
  // Per-NIC traffic since the process started (payload bytes; docs/fusion.md), one line per NIC that carried any.
  for (const std::string& line : nicCounterLines()) RN_INFO(NCCL_NET, "NET/railnet: NIC %s", line.c_str());
}

void Engine::attach(Stream* stream) {
  uint32_t pick = nextWorker_.fetch_add(1, std::memory_order_relaxed) % workers_.size();
  workers_[pick]->add(stream);
}

void Engine::detach(Stream* stream) { stream->worker_->remove(stream); }

}  // namespace railnet::tcp
