// The process-wide pool of helper threads that move data-stream bytes. Each data stream (one TCP socket) is
// served by one worker; a worker serves streams of many connections through one epoll set, busy-polls for a
// while after work (RAILNET_TCP_SPIN_US) and sleeps in epoll_wait otherwise.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/tcp/socket.h"
#include "proxy/tcp/wire.h"

namespace railnet::tcp {

class Worker;

// Implemented by the comm that owns the streams. Called on worker threads.
class StreamOwner {
 public:
  // Where the payload of `header` goes; nullptr rejects the chunk (the owner records why).
  virtual char* resolveChunk(const ChunkHeader& header) noexcept = 0;
  virtual void chunkReceived(const ChunkHeader& header) noexcept = 0;
  // The stream hit end-of-stream (endOfStream) or an error; no more callbacks follow for it.
  virtual void streamFailed(int streamIndex, const char* why, bool endOfStream) noexcept = 0;

 protected:
  ~StreamOwner() = default;
};

// One piece of a message to write: header, then `header.length` bytes at `data`.
struct SendOp {
  ChunkHeader header;
  const char* data;
  std::atomic<int>* pending;  // the request's chunks left; decremented once this chunk is in the kernel
};

class Stream {
 public:
  // counters: the NIC this stream's socket uses (payload bytes are added as chunks complete), or nullptr.
  Stream(Fd fd, StreamOwner* owner, int index, NicCounters* counters = nullptr);
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  int fd() const { return fd_.get(); }
  int index() const { return index_; }
  uint64_t queuedBytes() const { return queuedBytes_.load(std::memory_order_relaxed); }
  // Sender side, any thread: queue a chunk and wake the worker.
  void enqueue(const SendOp& op);

 private:
  friend class Worker;
  friend class Engine;
  // Worker thread only: move bytes until the socket would block. Return the bytes moved.
  uint64_t progress();
  uint64_t progressSend();
  uint64_t progressReceive();
  void failWith(const char* why, bool endOfStream);

  Fd fd_;
  StreamOwner* owner_;
  int index_;
  NicCounters* counters_;
  Worker* worker_ = nullptr;

  std::mutex queueMutex_;
  std::deque<SendOp> queue_;  // guarded by queueMutex_
  std::atomic<uint64_t> queuedBytes_{0};

  // Worker-only state.
  std::deque<SendOp> sending_;
  uint64_t sentOfFront_ = 0;
  ChunkHeader incoming_{};
  uint64_t headerBytes_ = 0;
  char* destination_ = nullptr;
  uint64_t payloadLeft_ = 0;
  bool inPayload_ = false;
  bool readable_ = true;
  bool writable_ = true;
  std::atomic<bool> dead_{false};
};

class Engine {
 public:
  // The shared pool, started on first use and stopped when its last user releases it (so no railnet thread
  // outlives the last comm, which matters when NCCL dlcloses the plugin).
  static std::shared_ptr<Engine> acquire();
  ~Engine();

  void attach(Stream* stream);
  // Synchronous: once it returns, no worker touches `stream` again.
  void detach(Stream* stream);

 private:
  Engine();
  std::vector<std::unique_ptr<Worker>> workers_;
  std::atomic<uint32_t> nextWorker_{0};
};

}  // namespace railnet::tcp
