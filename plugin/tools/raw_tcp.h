// The baseline railnet is compared with: plain loopback TCP in the same process shape as the measurement in
// test-machines.md. N connected socket pairs (N = RAILNET_TCP_STREAMS, as railnet uses), blocking sockets with
// TCP_NODELAY, one sender and one receiver thread per pair. Each message is split evenly across the pairs; a
// message smaller than N bytes uses min(N, size) pairs so every pair carries at least one byte.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plugin/tools/buffers.h"
#include "plugin/tools/harness.h"
#include "plugin/tools/peer.h"

namespace railnet::bench {

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

class RawTcpPeer final : public Peer {
 public:
  RawTcpPeer(int streams, int window, BenchBuffers& buffers, StallGuard& guard);

  std::string name() const override { return "raw TCP"; }
  int streams() const noexcept { return static_cast<int>(pairs_.size()); }
  // Pairs a message of `size` bytes is split across.
  int streamsFor(size_t size) const noexcept;

  // Sender j of each message writes bytes [j*size/m, (j+1)*size/m) on pair j; it may run at most `window`
  // messages ahead of receiver j, the window railnet gets.
  double stream(size_t size, uint64_t count) override;
  // The same on a second set of as many pairs in the other direction at the same time (echoSend -> echoRecv).
  double streamBothWays(size_t size, uint64_t count) override;
  // On pair 0 only: write `size` bytes, the peer thread reads them and writes `size` bytes back.
  double pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) override;

 private:
  struct Credit;  // how many messages receiver j has finished (raw_tcp.cc)
  struct Pair {
    Socket sender;    // the connecting end
    Socket receiver;  // the accepted end
  };

  // The 2 x streamsFor(size) sender and receiver tasks of one direction over `pairs`; `credits` keeps their
  // window state alive while they run.
  void addStreamTasks(const std::vector<Pair>& pairs, const HostBuffer& source, HostBuffer& destination, size_t size,
                      uint64_t count, std::vector<std::unique_ptr<Credit>>* credits,
                      std::vector<std::function<void()>>* tasks);
  void sendAll(int fd, const std::byte* data, size_t size, const char* what) const;
  void recvAll(int fd, std::byte* data, size_t size, const char* what) const;

  BenchBuffers& buffers_;
  StallGuard& guard_;
  const int window_;
  std::vector<Pair> pairs_;      // forward
  std::vector<Pair> backPairs_;  // the other direction, for streamBothWays
};

}  // namespace railnet::bench
