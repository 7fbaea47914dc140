// A doorbell context (issue 15): one rank's one-sided comm with every rank of the context (rma::RmaComm over a
// railnet transport), its ring and signal words in memory the GPU can write and read, and the engine thread that
// drains the ring. What include/railnet/doorbell.h's C API wraps.
//
// Memory the kernels touch: the ring (descriptors and counters) and the signal words live in pinned host memory
// mapped into the GPU (cuMemHostAlloc, PORTABLE | DEVICEMAP; under unified addressing the GPU uses the same
// pointers), so the engine reads descriptors and applies signals with plain CPU loads and atomics, and no copy
// into GPU memory waits for a time slice (D70). Without a usable GPU (the unit tests), plain host memory.
//
// Thread safety: registerWindow and deviceView from the application's threads; the engine thread runs alone
// otherwise. Registration is collective (same order on every rank).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "proxy/doorbell/bootstrap.h"
#include "proxy/doorbell/direct.h"
#include "proxy/doorbell/engine.h"
#include "proxy/doorbell/ring.h"
#include "proxy/rma/mesh.h"
#include "proxy/rma/rma_comm.h"
#include "proxy/transport.h"

namespace railnet::doorbell {

// What a kernel needs; mirrored field for field by railnet_doorbell_device_t (include/railnet/doorbell.h).
struct DeviceView {
  Descriptor* slots = nullptr;
  RingControl* control = nullptr;
  uint64_t capacity = 0;
  uint64_t* signals = nullptr;  // this rank's signal words (peers' signals land here)
  uint32_t signalCount = 0;
  int32_t rank = 0;
  int32_t nranks = 0;
  void* direct = nullptr;  // the mlx5 direct path's view (DirectPath::deviceView), nullptr: the ring
};

struct ContextOptions {
  uint64_t ringSlots = 1024;      // a power of two
  uint32_t signalCount = 1024;
  int bootstrapTimeoutMs = 120000;
  uint64_t stallNs = 10'000'000'000ull;
};

class MappedMemory;

class Context {
 public:
  // Collective over the id's ranks. `cudaDevice` < 0: no GPU (ring and signals in plain host memory). Throws
  // railnet::Error.
  Context(Transport& transport, int dev, const UniqueId& id, BootstrapRoot* root, int rank, int nranks,
          int cudaDevice, const ContextOptions& options);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Collective: registers [data, data + bytes) (GPU or host memory) on every rank; returns the window index that
  // descriptors name (the same on every rank). Throws railnet::Error.
  uint32_t registerWindow(void* data, size_t bytes);
  DeviceView deviceView() const { return view_; }
  // The ring's first error (RingError), 0 when none.
  uint32_t error() const;

 private:
  void run();
  // After the all-gather: brings the direct path up when every rank offered it; else drops it, saying why.
  void connectDirect(const std::vector<std::vector<char>>& offers, std::string why);
  // After the signal window's registration: keeps the direct path only if every peer announced its signal key.
  void agreeOnDirect();
  // Every peer's direct-path key of `window` (keys[rank]); the first rank that announced none, or -1.
  int peerKeys(void* window, std::vector<DirectKey>* keys) const;

  const int cudaDevice_;
  std::unique_ptr<MappedMemory> ringMemory_;
  std::unique_ptr<MappedMemory> signalMemory_;
  DeviceView view_;
  std::unique_ptr<rma::RmaListen> listen_;
  std::unique_ptr<rma::RmaComm> comm_;
  std::unique_ptr<DirectPath> direct_;  // the mlx5 direct path when every rank has it (else the ring carries all)
  void* signalWindow_ = nullptr;
  std::mutex engineMutex_;  // the engine's window list changes under registration
  std::unique_ptr<Engine> engine_;
  uint32_t windowCount_ = 0;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace railnet::doorbell
