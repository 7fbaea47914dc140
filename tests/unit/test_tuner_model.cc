// railnet's latency/bandwidth model: shape of the curves, not absolute numbers.
#include <catch2/catch.hpp>

#include "plugin/tuner/model.h"
#include "railnet/nccl/tuner.h"

using namespace railnet::tuner;

TEST_CASE("the model grows with size and is latency-bound when small", "[tuner][model]") {
  Shape shape;
  shape.nRanks = 16;
  shape.nNodes = 2;
  shape.nicsPerNode = 8;
  shape.nicGbps = 400;
  ModelParams params;
  double previous = 0;
  for (size_t bytes = 8; bytes <= (size_t{1} << 30); bytes *= 4) {
    double time = modelTimeUs(shape, params, ncclFuncAllReduce, bytes, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE);
    CHECK(time > previous);
    previous = time;
  }
  // Small: LL is faster than Simple; large: Simple is faster than LL.
  CHECK(modelTimeUs(shape, params, ncclFuncAllReduce, 8, NCCL_ALGO_RING, NCCL_PROTO_LL) <
        modelTimeUs(shape, params, ncclFuncAllReduce, 8, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE));
  CHECK(modelTimeUs(shape, params, ncclFuncAllReduce, size_t{1} << 30, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE) <
        modelTimeUs(shape, params, ncclFuncAllReduce, size_t{1} << 30, NCCL_ALGO_RING, NCCL_PROTO_LL));
  // Tree has fewer latency steps than a 16-rank ring for a tiny allreduce.
  CHECK(modelTimeUs(shape, params, ncclFuncAllReduce, 8, NCCL_ALGO_TREE, NCCL_PROTO_LL) <
        modelTimeUs(shape, params, ncclFuncAllReduce, 8, NCCL_ALGO_RING, NCCL_PROTO_LL));
  // 8 x 400 Gb/s is more than NVLink's share: NVLink bounds it, and faster NICs change nothing.
  Shape faster = shape;
  faster.nicGbps = 800;
  const size_t big = size_t{1} << 30;
  CHECK(modelTimeUs(faster, params, ncclFuncAllGather, big, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE) ==
        Approx(modelTimeUs(shape, params, ncclFuncAllGather, big, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE)));
  // One 100 Gb/s NIC is the bottleneck: twice the speed halves a large message's time.
  Shape thin = shape;
  thin.nicsPerNode = 1;
  thin.nicGbps = 100;
  Shape thin2 = thin;
  thin2.nicGbps = 200;
  double slow = modelTimeUs(thin, params, ncclFuncAllGather, big, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE);
  double fast = modelTimeUs(thin2, params, ncclFuncAllGather, big, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE);
  CHECK(fast == Approx(slow / 2).epsilon(0.02));
}

TEST_CASE("the model declines combinations NCCL does not run", "[tuner][model]") {
  Shape shape;
  shape.nRanks = 2;
  shape.nNodes = 2;
  ModelParams params;
  CHECK(modelTimeUs(shape, params, ncclFuncAllGather, 1024, NCCL_ALGO_TREE, NCCL_PROTO_SIMPLE) < 0);
  CHECK(modelTimeUs(shape, params, ncclFuncAllReduce, 1024, NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE) < 0);
  CHECK(modelTimeUs(shape, params, ncclFuncAllGather, 1024, NCCL_ALGO_PAT, NCCL_PROTO_LL) < 0);
  CHECK(modelTimeUs(shape, params, ncclFuncAllReduce, 1024, NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE) < 0);
  CHECK(modelTimeUs(shape, params, ncclFuncSendRecv, 1024, NCCL_ALGO_RING, NCCL_PROTO_SIMPLE) < 0);
  CHECK(modelTimeUs(shape, params, ncclFuncAllGather, 1024, NCCL_ALGO_PAT, NCCL_PROTO_SIMPLE) > 0);
}
