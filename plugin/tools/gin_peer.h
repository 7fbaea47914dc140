// railnet's GIN backend (ncclGinPlugin_v11) driven without NCCL, for railnet-bench --gin: two ranks in this
// process, each with its own GIN context, mesh and progress thread (as NCCL's "GIN Progress" thread polls
// ginProgress), moving the bench's buffers with iput / iputSignal where RailnetPeer uses isend / irecv. Windows are
// the four BenchBuffers (host or GPU memory, registered collectively in the same order by both ranks). Signal words
// are host memory, polled as a GPU polls its own; with GPU buffers they are GPU memory, as NCCL's signal array is,
// and the host polls them with a copy (cuMemcpyDtoH), so each observed round trip also pays that copy.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "plugin/tools/buffers.h"
#include "plugin/tools/gpu_buffers.h"
#include "plugin/tools/harness.h"
#include "plugin/tools/net_plugin.h"
#include "plugin/tools/peer.h"

namespace railnet::bench {

class GinPeer final : public Peer {
 public:
  // `gpu`: the device of GPU buffers (signal words then live there too); null for host buffers.
  GinPeer(const NetPlugin& net, int dev, int window, BenchBuffers& buffers, StallGuard& guard, const GpuDevice* gpu);
  ~GinPeer() override;  // stops the progress threads, deregisters, closes, finalizes; failures only printed

  std::string name() const override { return "railnet GIN puts"; }
  double stream(size_t size, uint64_t count) override;
  double streamBothWays(size_t size, uint64_t count) override;
  double pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) override;

 private:
  static constexpr int kRanks = 2;
  static constexpr int kWindows = 4;  // send, recv, echoSend, echoRecv: the same ids on both ranks
  struct Rank {
    void* ctx = nullptr;
    void* listen = nullptr;
    void* comm = nullptr;
    void* windows[kWindows] = {};
    void* signalWindow = nullptr;
    // 64-bit words: [0] forward arrivals, [1] arrivals of the way back; one of the two exists.
    std::unique_ptr<HostBuffer> signals;
    std::unique_ptr<DeviceMemory> deviceSignals;
    std::thread progress;
  };
  // Runs fn(rank) for both ranks at once (connect and registration are collective) and rethrows a failure.
  template <class Fn>
  void collective(Fn&& fn);
  uint64_t signal(int rank, int word) const;
  // Streams `count` puts of `size` from rank `from` to the other, `window` in flight, the last one with an INC of
  // the target's word `word`; returns once the source side's requests are done (arrival: the signal).
  void putStream(int from, int srcWindow, int dstWindow, int word, size_t size, uint64_t count);
  void waitSignal(int rank, int word, uint64_t atLeast, const char* what);
  void waitRequest(int rank, void* request, const char* what);

  const NetPlugin& net_;
  const GpuDevice* gpu_;
  const ncclGin_v11_t& gin_;
  int window_;
  BenchBuffers& buffers_;
  StallGuard& guard_;
  Rank ranks_[kRanks];
  std::atomic<bool> stop_{false};
};

}  // namespace railnet::bench
