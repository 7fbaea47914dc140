#include "plugin/tuner/model.h"

#include <algorithm>
#include <cmath>

#include "railnet/nccl/tuner.h"

namespace railnet::tuner {

double modelTimeUs(const Shape& shape, const ModelParams& params, int coll, size_t bytes, int algo, int proto) {
  if (proto < 0 || proto >= NCCL_NUM_PROTOCOLS || coll < 0 || coll >= ncclFuncSendRecv) return -1;
  const int n = std::max(shape.nRanks, 1);
  const int nodes = std::max(shape.nNodes, 1);
  const int gpn = shape.gpusPerNode();
  const bool multiNode = nodes > 1;
  // Bottleneck bandwidth in bytes per microsecond. A ring crossing nodes pushes busbw through every node's
  // NICs; inside the node it rides NVLink.
  const double netBytesPerUs = shape.nicsPerNode * shape.nicGbps * 1e3 / 8.0 * params.netEff;
  const double intraBytesPerUs = params.intraGBs * 1e3;
  double bw = multiNode ? std::min(netBytesPerUs * params.protoNetEff[proto], intraBytesPerUs * params.protoIntraEff[proto])
                        : intraBytesPerUs * params.protoIntraEff[proto];
  if (bw <= 0) return -1;
  const double hopUs = (multiNode ? params.netStepUs : params.intraStepUs) + params.protoStepUs[proto];
  const double intraHopUs = params.intraStepUs + params.protoStepUs[proto];
  const double b = static_cast<double>(bytes);
  const double ringShare = static_cast<double>(n - 1) / n;
  auto log2Ceil = [](int v) { return v <= 1 ? 0.0 : std::ceil(std::log2(static_cast<double>(v))); };

  switch (algo) {
    case NCCL_ALGO_RING: {
      // Steps: every one may cross a node boundary when gpn == 1; with gpn > 1 only nodes of n hops do.
      auto steps = [&](int count) {
        double netSteps = multiNode ? static_cast<double>(count) * nodes / n : 0;
        return netSteps * hopUs + (count - netSteps) * intraHopUs;
      };
      switch (coll) {
        case ncclFuncAllReduce: return steps(2 * (n - 1)) + 2 * ringShare * b / bw;
        case ncclFuncAllGather:
        case ncclFuncReduceScatter: return steps(n - 1) + ringShare * b / bw;
        case ncclFuncBroadcast:
        case ncclFuncReduce: return steps(n - 1) + b / bw;
      }
      return -1;
    }
    case NCCL_ALGO_TREE: {
      if (coll != ncclFuncAllReduce) return -1;
      // Up and down a tree of nodes (depth log2 nodes), plus a chain inside each node. Each node's NICs carry
      // the data up and down (double binary tree: about what a ring carries), so the bandwidth term is the
      // ring's at treeEff of its bandwidth.
      double latency = 2 * (log2Ceil(nodes) * hopUs + (gpn - 1) * intraHopUs);
      return latency + 2 * ringShare * b / (bw * params.treeEff);
    }
    case NCCL_ALGO_PAT: {
      if (coll != ncclFuncAllGather && coll != ncclFuncReduceScatter) return -1;
      if (proto != NCCL_PROTO_SIMPLE) return -1;
      return log2Ceil(n) * hopUs + ringShare * b / (bw * params.patEff);
    }
    default: return -1;
  }
}

}  // namespace railnet::tuner
