// The verbs transport's NVLink hop (issue 13; docs/design.md, "Routes"): a connection of a GPUDirect port routed
// to this host's port on the peer's rail sends its GPU bytes from staging on that port's own GPU, copied there over
// NVLink (proxy/staging/nvlink_staging.h), so the routed NIC reads a GPU beside it instead of the comm's GPU across
// the PCIe fabric. Host memory needs no hop: any NIC reads it. RAILNET_IB_NVLINK_HOP=2, a test feature, sends
// routed host-memory connections through host staging slots too, so everything but the CUDA copy runs on
// soft-RoCE. The GPU path is not run on hardware (no machine here has GPUs and RDMA NICs together).
#pragma once

#include <atomic>
#include <map>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/staging/nvlink_staging.h"
#include "proxy/verbs/verbs_connection.h"

namespace railnet::verbs {

// How a connection from a local port may be routed to a candidate port on the peer's rail (routeFor).
enum class RouteWay { kNone, kDirect, kHop };

// Pure. hopSetting: RAILNET_IB_NVLINK_HOP. A host-memory port routes to a host-memory port directly (or, with the
// test setting 2, through host staging). A GPUDirect port routes only to a GPUDirect port whose GPU the comm's GPU
// can copy into (peerCopyPossible), with the hop; never when the hop is off.
RouteWay routeWay(int hopSetting, bool localTakesGpu, bool candidateTakesGpu, bool peerCopyReachable);

// What regMr of GPU memory returns on a hopping send comm: the buffer is never registered with the NIC, the hop
// copies from it.
class HopSourceRegion final : public MemoryRegion {
 public:
  HopSourceRegion(void* data, size_t size) : data_(data), size_(size) {}
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_;
  size_t size_;
};

// The hop's servers of this process (hop_exchange.h): one per GPU that this process's comms run on, so that railnet
// in other processes of the host, which do not see that GPU, can stage on it. Started from listen and connect
// (NCCL's proxy thread, its comm's GPU current) when a port takes GPU memory and RAILNET_IB_NVLINK_HOP=1.
class HopServers {
 public:
  void serveCurrentGpu();

 private:
  std::mutex mutex_;
  std::map<int, std::unique_ptr<staging::HopExchangeServer>> servers_;  // guarded, by CUDA device ordinal
};

class NvlinkHop final : public MemoryRegistrar {
 public:
  enum class Mode { kGpu, kHostTest };
  // kGpu: staging is made on the first GPU registration, on the GPU with bus id `railGpuBusId`.
  // kHostTest: host staging slots now, registered with the connection's NIC.
  NvlinkHop(VerbsConnection& connection, Mode mode, std::string railGpuBusId);
  ~NvlinkHop() override;

  // MemoryRegistrar (NCCL's service thread): GPU memory gives a HopSourceRegion (or, when the staging cannot be
  // made, a registration with the NIC as without the hop), host memory goes to the NIC.
  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) override;
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) override;

  // Whether an isend with this registration goes through the hop (the data path; staging is ready for it).
  bool carries(const MemoryRegion* mr) const;
  int slots() const { return slots_; }
  uint64_t pieceBytes() const { return pieceBytes_; }
  uint64_t slotAddress(int slot) const;
  uint32_t slotKey() const { return region_->nic(0).lkey(); }  // routed connections are never fused: one NIC
  const std::string& route() const { return route_; }           // "GPU 0 -> GPU 3 (0000:c1:00.0)" for log lines

  // Copy engine, from the comm's driving thread: copy `bytes` at `source` into `slot`; finished slots in order.
  bool copyQueueFull() const;
  bool copy(int slot, uint64_t source, uint64_t bytes, std::string* why);
  bool finished(std::vector<uint64_t>* slots, std::string* why);

 private:
  // Makes the staging on the first GPU registration. False when it cannot (WARNed once): the comm then registers
  // GPU memory with the NIC directly, as without the hop.
  bool prepareGpu(void* source);

  VerbsConnection& connection_;
  const Mode mode_;
  const std::string railGpuBusId_;
  const int slots_;
  const uint64_t pieceBytes_;
  std::mutex mutex_;                 // regMr calls against each other
  std::atomic<bool> ready_{false};   // staging exists (GPU mode: after the first GPU regMr)
  bool direct_ = false;              // guarded by mutex_: the staging failed, GPU memory goes to the NIC
  std::unique_ptr<staging::NvlinkStaging> gpu_;
  std::vector<char> host_;           // kHostTest staging
  std::vector<uint64_t> hostDone_;   // kHostTest: copies done, not yet reported
  std::unique_ptr<LinkRegion> region_;  // the staging, registered with the NIC; released before the memory
  std::string route_;
};

}  // namespace railnet::verbs
