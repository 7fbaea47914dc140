// The progress engine: a process-wide pool of helper threads, each waiting on one epoll set and serving the
// event sources attached to it (busy-polling for RAILNET_TCP_SPIN_US after work, sleeping in epoll_wait
// otherwise). Sources today are the TCP transport's data streams (proxy/tcp/stream.h). The seams for what comes
// next (docs/design.md, "Where the next capabilities plug in"): a verbs completion channel or an eventfd that a
// CUDA host callback or a doorbell-ring poller signals is one more fd-backed EventSource; nothing in the pool
// knows what a source moves.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace railnet::progress {

class Worker;

// Something a helper thread serves: one non-blocking fd (edge-triggered readiness) and the work to do on it.
class EventSource {
 public:
  virtual ~EventSource() = default;
  virtual int fd() const noexcept = 0;
  // Moves what can be moved until the fd would block; returns the bytes moved (0: nothing to do).
  virtual uint64_t progress() noexcept = 0;
  // epoll reported readiness; the next progress() runs until EAGAIN. peerClosed: the event also carried
  // EPOLLRDHUP, EPOLLHUP or EPOLLERR, the state of the socket when it was collected (no later edge follows for it).
  virtual void markReady(bool readable, bool writable, bool peerClosed) noexcept = 0;
  // When a source that moved nothing must be served again without a readiness event (CLOCK_MONOTONIC ns; 0:
  // never): a shaped stream waiting for its bucket (proxy/shaping/). The helper then sleeps no longer than that.
  virtual int64_t retryAtNs() const noexcept { return 0; }
  // The engine could not watch the fd (err: errno); no progress() follows.
  virtual void failWith(const char* why, int err) noexcept = 0;
  // Sources with the same non-zero key are served by one helper: both ends of a connection within one process,
  // so the helper that writes a chunk reads it back from its own cache, with no wake-up between; 0: none.
  virtual uint64_t affinityKey() const noexcept { return 0; }
  // The helper serving this source (-1 before attach); any thread may ask.
  int helper() const noexcept { return workerIndex_.load(std::memory_order_relaxed); }

 protected:
  // Any thread: the source has new work; wakes its helper if it sleeps. Valid once attached.
  void wake();

 private:
  friend class Worker;
  friend class Engine;
  Worker* worker_ = nullptr;
  std::atomic<int> workerIndex_{-1};
};

class Engine {
 public:
  // The shared pool, started on first use and stopped when its last user releases it (so no railnet thread
  // outlives the last comm, which matters when NCCL dlcloses the plugin).
  static std::shared_ptr<Engine> acquire();
  ~Engine();

  void attach(EventSource* source);
  // Synchronous: once it returns, no helper touches `source` again.
  void detach(EventSource* source);

 private:
  Engine();
  std::vector<std::unique_ptr<Worker>> workers_;
  std::mutex placementMutex_;
  std::vector<int> sourcesOf_;                                 // guarded by placementMutex_; per worker
  std::unordered_map<uint64_t, std::pair<int, int>> keyed_;   // guarded; key -> (worker, sources)
};

}  // namespace railnet::progress
