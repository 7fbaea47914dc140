// railnet through its NCCL ABI, driven the way NCCL's proxy thread drives a net plugin: two connections
// (forward for bandwidth and the ping, back for the pong), registered buffers, isend/irecv that may answer
// "retry later", and test() oldest request first.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "plugin/tools/buffers.h"
#include "plugin/tools/harness.h"
#include "plugin/tools/net_plugin.h"
#include "plugin/tools/peer.h"

namespace railnet::bench {

class RailnetPeer final : public Peer {
 public:
  // init() one context, pick the device, and connect both links. `deviceName` is a device's name, or names
  // joined by '+' to fuse those devices (makeVDevice); when `exact` is false a missing name falls back to
  // device 0 (the default loopback run), else it is an error. `label` names the peer in tables and messages.
  // The device must take the buffers' memory type: with GPU buffers, a device without NCCL_PTR_CUDA throws
  // Unsupported.
  struct Options {
    bool exact = false;
    std::string label = "railnet";
    // group > 1 (railnet-bench --group): streamed messages go to receivers in groups of `group` tags (0..group-1),
    // as one irecv of `group` buffers each when `groupedReceives`, else as `group` single irecvs; `window`
    // receives (grouped) or window x group receives (single) in flight, window x group sends.
    int group = 1;
    bool groupedReceives = true;
    // Non-empty (railnet-bench --to): the forward link's receiver listens on this device (by name) and its sender
    // connects from deviceName; the way back is the reverse. Two loopback rails make it a cross-rail connection.
    std::string toDevice;
  };
  RailnetPeer(const NetPlugin& net, const std::string& deviceName, int window, BenchBuffers& buffers,
              StallGuard& guard, const Options& options);
  ~RailnetPeer() override;  // closes both links, then finalize(); failures only printed

  // The same teardown, throwing on the first failure; the destructor then has nothing left to do.
  void shutdown();

  std::string name() const override { return label_; }
  const DeviceProps& device() const noexcept { return props_; }
  int deviceIndex() const noexcept { return dev_; }

  double stream(size_t size, uint64_t count) override;
  double streamBothWays(size_t size, uint64_t count) override;
  double pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) override;

 private:
  class Link;

  class Pipeline;
  // One emulated rank's proxy thread, as NCCL has one per GPU: it drives all of that rank's pipelines (a send and
  // a receive when both directions run) in turns until every one is done, yielding the core when none moved.
  void runRank(const std::vector<Pipeline*>& pipelines);
  template <class Post>
  void* postWithRetry(const char* what, Post&& post);
  void waitDone(void* request, const char* what, size_t size, bool exactSize);
  // The sender's and the receiver's pipeline that stream `count` messages over `link` from `source` into
  // `destination` slots.
  struct Direction {
    std::unique_ptr<Pipeline> sender;
    std::unique_ptr<Pipeline> receiver;
  };
  Direction streamPipelines(Link& link, const BenchBuffer& source, const BenchBuffer& destination, size_t size,
                            uint64_t count, const char* direction);
  // The same with group_ > 1: `count` rounded up to whole groups.
  Direction groupPipelines(Link& link, const BenchBuffer& source, const BenchBuffer& destination, size_t size,
                           uint64_t count, const char* direction);
  static constexpr int kMaxGroup = 8;  // NCCL_NET_MAX_RECVS
  // runTogether with each thread prepared for the buffers (the GPU's context current, as on NCCL's proxy thread).
  double runRanks(const std::vector<std::function<void()>>& ranks);

  const NetPlugin& net_;
  BenchBuffers& buffers_;
  StallGuard& guard_;
  const int window_;
  const int group_;
  const bool groupedReceives_;
  int toDev_ = -1;  // the forward link's listening device (-1: dev_)
  void* ctx_ = nullptr;
  bool open_ = false;  // init succeeded and shutdown() has not run
  int dev_ = 0;
  std::string label_;
  DeviceProps props_;
  std::unique_ptr<Link> forward_;  // send -> recv buffers
  std::unique_ptr<Link> back_;     // echoSend -> echoRecv buffers
};

}  // namespace railnet::bench
