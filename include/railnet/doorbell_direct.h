// The mlx5 direct path of railnet's GPU doorbells (issue 15, "IBGDA"): what kernels and railnet's host side share
// when a doorbell context runs on an mlx5 NIC. Kernels build the NIC's own work queue entries
// (railnet/mlx5_wqe.h) in each peer's send queue and ring its doorbell themselves; the host only brings the queues
// up, maps them into the GPU, and polls the completion queues into `completed`. Without an mlx5 NIC (or when a
// mapping fails) a context has no direct view and kernels use the descriptor ring (railnet/doorbell_layout.h).
//
// NOT RUN ON HARDWARE: no mlx5 NIC is reachable from railnet's test machines. The WQE bytes, CQE parsing and the
// producer protocol are unit-tested on the host against rdma-core's mlx5dv.h; the queue setup is not run.
//
// Producer protocol for one peer's queue (units are WQEBBs, 64-byte send-queue slots; counters never wrap):
//   1. start = fetch_add(&queue->reserved, n)              device-scope atomic (D72: one GPU produces)
//   2. wait until start + n - queue->completed <= depth    the host's CQ poller frees slots
//   3. write the WQE(s) into slots start .. start + n - 1  (mlx5_wqe.h builders; every WQE asks for a CQE)
//   4. wait until queue->rung == start                     doorbells are rung in slot order
//   5. __threadfence_system(); doorbellRecord[1] = big-endian (start + n) & 0xffff; fence.sys;
//      one 8-byte store of the last WQE's first 8 ctrl bytes to *doorbellRegister; queue->rung = start + n
// Completion: every WQE is signalled; the poller sets `completed` to the slot after the last completed WQE (in
// order on an RC QP). An error completion sets `error` (RAILNET_DOORBELL_PEER_FAILED), which every wait reads.
#pragma once

#include <stdint.h>

#include "railnet/host_device.h"

namespace railnet::doorbell {

// One peer's RC send queue, in mapped host memory (kernels and the host's poller both touch it).
struct alignas(64) DirectQueue {
  void* wqes;                  // the SQ: `depth` WQEBBs (the provider's host memory, registered with CUDA)
  uint32_t* doorbellRecord;    // the QP's doorbell record (mapped); [1] is the send counter (MLX5_SND_DBR)
  uint64_t* doorbellRegister;  // the UAR's doorbell register (mapped as I/O memory)
  uint32_t depth;              // WQEBBs, a power of two
  uint32_t qpn;                // the QP number the ctrl segments carry
  alignas(64) uint64_t reserved;   // WQEBBs reserved by producers
  alignas(64) uint64_t rung;       // WQEBBs whose doorbell has been rung, advanced in order
  alignas(64) uint64_t completed;  // WQEBBs completed, written by the host's poller
  alignas(64) uint32_t error;      // 0, or RAILNET_DOORBELL_PEER_FAILED after an error completion
};

// A registered region as the NIC names it: the address its WQEs carry and the key (lkey locally, rkey remotely).
struct DirectKey {
  uint64_t address;
  uint32_t key;
  uint32_t valid;  // 0: not registered (a kernel naming it gets RAILNET_DOORBELL_BAD_DESCRIPTOR), else kKey*Memory
};
inline constexpr uint32_t kKeyHostMemory = 1;
// GPU memory: a put_signal into it reads the written bytes back before its atomic (the data and the signal word,
// in host memory, reach different PCIe devices; the READ's response pushes the data ahead of it).
inline constexpr uint32_t kKeyGpuMemory = 2;

// What a kernel needs for the direct path; railnet_doorbell_device_t.direct points at one (mapped host memory).
struct DirectView {
  DirectQueue* queues;        // [nranks]: the queue to each peer (this rank's own entry unused)
  DirectKey* localWindows;    // [maxWindows]: this rank's windows (lkey and base address)
  DirectKey* remoteWindows;   // [nranks * maxWindows]: peer r's window w at [r * maxWindows + w] (rkey, base)
  DirectKey* remoteSignals;   // [nranks]: peer r's signal words (rkey, base); a signal is a fetch-and-add there
  DirectKey atomicSink;       // 8 bytes of this rank's registered memory the fetch-and-add results land in
  uint32_t maxWindows;
  uint32_t reserved;
};

}  // namespace railnet::doorbell
