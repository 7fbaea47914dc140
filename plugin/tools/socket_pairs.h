// What both raw baselines of railnet-bench share (raw TCP, and raw copy engines + TCP for --gpu): connected
// loopback socket pairs, whole-buffer send/recv that keep the stall guard informed, and the credit that keeps a
// pair's sender within the window of its receiver.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "plugin/tools/harness.h"

namespace railnet::bench {

// Blocking calls wake up this often to look at the stall guard (stall or another thread's failure); on a moving
// stream they never time out.
constexpr int kWakeupMs = 200;

// An owned file descriptor.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) noexcept : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const noexcept { return fd_; }

 private:
  int fd_ = -1;
};

struct SocketPair {
  Socket sender;    // the connecting end
  Socket receiver;  // the accepted end
};

// Connects `count` pairs over 127.0.0.1: blocking sockets with TCP_NODELAY and kWakeupMs send/receive timeouts.
// `label` starts every error message ("raw TCP").
std::vector<SocketPair> connectLoopbackPairs(int count, const char* label);

// The bytes pair j of `used` carries of a `size`-byte message: an even split, remainders spread.
struct Slice {
  size_t begin;
  size_t length;
};
inline Slice sliceOf(size_t size, int j, int used) {
  const size_t begin = size * static_cast<size_t>(j) / static_cast<size_t>(used);
  return {begin, size * static_cast<size_t>(j + 1) / static_cast<size_t>(used) - begin};
}

// Writes all `size` bytes, looking at the guard whenever the socket cannot take more.
void sendAll(StallGuard& guard, int fd, const std::byte* data, size_t size, const char* what);

// Reads exactly `size` bytes. With `whileEmpty`, the socket is first read without blocking and, when it has
// nothing, whileEmpty() runs instead of a blocking read; it returns false when it had nothing to do (then the read
// blocks). That lets a thread finish other work (copies) while its socket is empty instead of sleeping on it.
void recvAll(StallGuard& guard, int fd, std::byte* data, size_t size, const char* what,
             const std::function<bool()>& whileEmpty = {});

// How many messages receiver j has finished: sender j waits on it to stay within the window.
class MessageCredit {
 public:
  // Blocks until message `message` may start with `window` messages in flight.
  void waitToStart(uint64_t message, int window, const StallGuard& guard, const char* who);
  // True when waitToStart would return at once.
  bool allows(uint64_t message, int window);
  // The receiver finished messages [0, completed).
  void complete(uint64_t completed);

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  uint64_t completed_ = 0;
};

}  // namespace railnet::bench
