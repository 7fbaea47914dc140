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
#include "plugin/tools/socket_pairs.h"

namespace railnet::bench {

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
  // The 2 x streamsFor(size) sender and receiver tasks of one direction over `pairs`; `credits` keeps their
  // window state alive while they run.
  void addStreamTasks(const std::vector<SocketPair>& pairs, const HostBuffer& source, HostBuffer& destination,
                      size_t size, uint64_t count, std::vector<std::unique_ptr<MessageCredit>>* credits,
                      std::vector<std::function<void()>>* tasks);

  BenchBuffers& buffers_;
  StallGuard& guard_;
  const int window_;
  std::vector<SocketPair> pairs_;      // forward
  std::vector<SocketPair> backPairs_;  // the other direction, for streamBothWays
};

}  // namespace railnet::bench
