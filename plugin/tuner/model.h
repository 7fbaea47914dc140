// railnet's latency/bandwidth model of one collective, used where the calibration file has no measurement.
// An alpha-beta model: steps x (per-step latency of the slowest hop + protocol latency) + bytes moved over the
// bottleneck bandwidth x protocol efficiency. Its inputs come from the topology: NIC count and speed per node
// (the net plugin's devices), GPUs per node (nRanks / nNodes), NVLink domains (tuner init).
#pragma once

#include <cstddef>

namespace railnet::tuner {

struct Shape {
  int nRanks = 1;
  int nNodes = 1;
  int nicsPerNode = 1;
  double nicGbps = 100;  // per NIC
  int nvlDomains = 0;    // 0: unknown (v3/v4 init has no NVLink info)
  int maxRanksPerNvlDomain = 0;

  int gpusPerNode() const noexcept { return nNodes > 0 && nRanks >= nNodes ? nRanks / nNodes : 1; }
};

struct ModelParams {
  double netStepUs = 8.0;         // one inter-node hop's latency (TCP; about 3 over RDMA)
  double intraStepUs = 1.0;       // one hop inside a node (NVLink / PCIe)
  double protoStepUs[3] = {2.0, 6.0, 12.0};  // LL, LL128, Simple: added to every step
  double protoNetEff[3] = {0.12, 0.6, 1.0};  // share of the link each protocol gets over the network
  double protoIntraEff[3] = {0.3, 0.9, 1.0}; // ... and over NVLink
  double netEff = 0.9;            // achievable share of the NIC line rate
  double intraGBs = 300;          // NVLink bandwidth per GPU that a ring gets (PCIe: ~20)
  double treeEff = 0.9;           // tree's bandwidth relative to ring
  double patEff = 0.7;            // PAT's bandwidth relative to ring (measured 0.65 on TCP)
};

// Estimated time in microseconds of `coll` (ncclFunc_t 0..4) on `bytes` with algorithm/protocol (NCCL indices),
// or -1 where the model has nothing to say (CollNet, NVLS, or a combination NCCL does not run).
double modelTimeUs(const Shape& shape, const ModelParams& params, int coll, size_t bytes, int algo, int proto);

}  // namespace railnet::tuner
