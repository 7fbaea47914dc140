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
  // epoll reported readiness; the next progress() runs until EAGAIN.
  virtual void markReady(bool readable, bool writable) noexcept = 0;
  // The engine could not watch the fd (err: errno); no progress() follows.
  virtual void failWith(const char* why, int err) noexcept = 0;

 protected:
  // Any thread: the source has new work; wakes its helper if it sleeps. Valid once attached.
  void wake();

 private:
  friend class Worker;
  friend class Engine;
  Worker* worker_ = nullptr;
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
  std::atomic<uint32_t> nextWorker_{0};
};

}  // namespace railnet::progress
