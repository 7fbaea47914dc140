// The baseline railnet's GPU path is compared with (--gpu): what the copy engines and plain loopback TCP do
// without the plugin, in the shape of the raw TCP peer (raw_tcp.h). N socket pairs (N = RAILNET_TCP_STREAMS, as
// railnet uses), one sender and one receiver thread per pair, each message split evenly over min(N, size) pairs,
// the same window. Each thread has its own CUDA stream and kSlots pinned slots of one piece each (the plugin's
// RAILNET_TCP_STAGING_PIECE_BYTES): the sender copies its slice down (cuMemcpyDtoHAsync) a piece at a time, up to
// kSlots pieces ahead, so the copy of the next piece overlaps the send() of the one before; the receiver recv()s a
// piece into a slot and copies it up (cuMemcpyHtoDAsync). A message counts as received when its last copy up has
// finished. Copies are waited for with blocking-sync events, so waiting threads sleep instead of taking the cores
// TCP needs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plugin/tools/buffers.h"
#include "plugin/tools/gpu_buffers.h"
#include "plugin/tools/harness.h"
#include "plugin/tools/peer.h"
#include "plugin/tools/socket_pairs.h"

namespace railnet::bench {

class StagingLane;  // one thread's CUDA stream, pinned slots and their events (raw_ce_tcp.cc)

class RawCeTcpPeer final : public Peer {
 public:
  // Pinned slots per thread: a copy in flight, the piece on the socket, and room to run ahead.
  static constexpr int kSlots = 4;

  // `buffers` must be on `gpu`; `maxMessage` bounds the slots (a slot never exceeds what one thread moves).
  RawCeTcpPeer(int streams, int window, size_t maxMessage, BenchBuffers& buffers, StallGuard& guard,
               const GpuDevice& gpu);
  ~RawCeTcpPeer() override;

  std::string name() const override { return "raw CE+TCP"; }
  int streams() const noexcept { return static_cast<int>(pairs_.size()); }
  // Pairs a message of `size` bytes is split across.
  int streamsFor(size_t size) const noexcept;
  size_t pieceBytes() const noexcept { return pieceBytes_; }

  // Sender j of each message moves bytes [j*size/m, (j+1)*size/m) over pair j; it may run at most `window`
  // messages ahead of receiver j's last finished copy up.
  double stream(size_t size, uint64_t count) override;
  // The same on a second set of pairs in the other direction at the same time (echoSend -> echoRecv).
  double streamBothWays(size_t size, uint64_t count) override;
  // On pair 0 only: copy down, send, receive, copy up; then the same way back.
  double pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) override;

 private:
  struct PairLanes {
    std::unique_ptr<StagingLane> sender;
    std::unique_ptr<StagingLane> receiver;
  };

  // The 2 x streamsFor(size) sender and receiver tasks of one direction; `credits` keeps their window state alive
  // while they run.
  void addStreamTasks(const std::vector<SocketPair>& pairs, const std::vector<PairLanes>& lanes,
                      const BenchBuffer& source, const BenchBuffer& destination, size_t size, uint64_t count,
                      std::vector<std::unique_ptr<MessageCredit>>* credits, std::vector<std::function<void()>>* tasks);
  double runThreads(const std::vector<std::function<void()>>& tasks);

  BenchBuffers& buffers_;
  StallGuard& guard_;
  const int window_;
  size_t pieceBytes_;
  std::vector<SocketPair> pairs_;      // forward
  std::vector<SocketPair> backPairs_;  // the other direction, for streamBothWays
  std::vector<PairLanes> lanes_;       // per forward pair
  std::vector<PairLanes> backLanes_;   // per back pair
};

}  // namespace railnet::bench
