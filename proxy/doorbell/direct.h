// The host side of the doorbells' mlx5 direct path (issue 15, IBGDA; layout and protocol in
// include/railnet/doorbell_direct.h): one RC queue pair per peer on the context's mlx5 port, its send queue, doorbell
// record and the UAR's doorbell register mapped into the GPU so kernels post WQEs and ring doorbells themselves;
// windows registered with the NIC and their keys learned from every peer; and the completion queues polled into
// each queue's `completed` counter by the context's engine thread.
//
// The queues live where the mlx5 provider puts them (host memory) and are mapped into the GPU with
// cuMemHostRegister, rather than created in GPU memory through DEVX: standard verbs bring the QPs up, and each WQE
// a kernel writes crosses PCIe once, as a ring descriptor does (D73).
//
// NOT RUN ON HARDWARE: no mlx5 NIC is reachable from railnet's machines. Only the reasons it declines are tested
// (the TCP transport; soft-RoCE's rxe in the CI guest).
//
// Thread safety: construction, offer, connect and the registrations on the application's thread (the context
// serializes them with the engine); poll on the engine thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "proxy/transport.h"
#include "railnet/doorbell_direct.h"

namespace railnet::doorbell {

class DirectPath {
 public:
  // The path for `transport`'s device `dev` and GPU `cudaDevice`, with one queue pair per peer created, or nullptr
  // with *why when it cannot be had: RAILNET_DOORBELL_DIRECT=0, not the verbs transport, a fused device, not an
  // mlx5 device, no libmlx5, no GPU. Throws railnet::Error when a step that should work fails.
  // Why a device of `transportName` cannot have the path, from what is known without opening it; empty: it may.
  static std::string unavailable(const char* transportName, const DeviceInfo& info, bool enabled);
  static std::unique_ptr<DirectPath> open(const Transport& transport, int dev, int cudaDevice, int rank, int nranks,
                                          std::string* why);
  ~DirectPath();
  DirectPath(const DirectPath&) = delete;
  DirectPath& operator=(const DirectPath&) = delete;

  // What this rank all-gathers, offerBytes(nranks) long: a header and the record of its queue pair to each rank.
  // A rank without the path contributes notOffered(nranks).
  static size_t offerBytes(int nranks);
  static std::vector<char> notOffered(int nranks);
  std::vector<char> offer() const;
  // Whether every rank offered the path (offers[r]: rank r's offer); false with *why naming the first that did not.
  static bool allOffered(const std::vector<std::vector<char>>& offers, std::string* why);

  // Connects the queue pair to each peer from the gathered offers, registers the signal words for remote atomics,
  // and maps the queues and doorbells into the GPU. `contextError`: the ring's error word, which an error
  // completion also sets (kernels' waits read it). Throws railnet::Error.
  void connect(const std::vector<std::vector<char>>& offers, uint64_t* signals, size_t signalBytes,
               uint32_t* contextError);
  // This rank's key of its signal words, to announce; setRemoteSignals records a peer's.
  DirectKey signalKey() const;
  void setRemoteSignals(int rank, const DirectKey& key);
  // Registers a doorbell window with the NIC (GPU memory through DMA-BUF or peer memory, as the verbs transport
  // does) and returns its key to announce; setRemoteWindow records a peer's. Throws railnet::Error.
  DirectKey registerWindow(uint32_t window, void* data, size_t bytes, int type);
  void setRemoteWindow(uint32_t window, int rank, const DirectKey& key);

  // The engine thread's part: completions into the queues' `completed`, an error completion into the queue's
  // `error` (with a WARN naming the peer). True when anything completed.
  bool poll() noexcept;
  // What railnet_doorbell_device_t.direct carries: the view as the GPU addresses it.
  void* deviceView() const { return deviceView_; }

  struct State;  // verbs, mlx5 and CUDA objects (direct.cc)

 private:
  DirectPath(std::unique_ptr<State> state);
  std::unique_ptr<State> state_;
  void* deviceView_ = nullptr;
};

}  // namespace railnet::doorbell
