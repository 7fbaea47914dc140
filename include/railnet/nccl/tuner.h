// railnet's own declaration of NCCL's tuner plugin ABI, versions v3..v6. Field order and C types follow
// NVIDIA/nccl src/include/plugin/tuner/tuner_v3.h .. tuner_v6.h and src/include/nccl_common.h (2.28.9 and
// 2.30.7 agree); static_asserts pin the layouts we rely on.
#pragma once

#include "railnet/nccl/common.h"

extern "C" {

// src/include/nccl_common.h. The tuner only ever sees the first five (NCCL_NUM_FUNCTIONS).
typedef enum {
  ncclFuncBroadcast = 0,
  ncclFuncReduce = 1,
  ncclFuncAllGather = 2,
  ncclFuncReduceScatter = 3,
  ncclFuncAllReduce = 4,
  ncclFuncSendRecv = 5,
  ncclFuncSend = 6,
  ncclFuncRecv = 7,
  ncclFuncAlltoAll = 8,
  ncclFuncScatter = 9,
  ncclFuncGather = 10,
  ncclNumFuncs = 11
} ncclFunc_t;

typedef struct {
  int nNvlDomains;
  int minRanksPerNvlDomain;
  int maxRanksPerNvlDomain;
} ncclNvlDomainInfo_v5_t;
typedef ncclNvlDomainInfo_v5_t ncclNvlDomainInfo_v6_t;

#define NCCL_NUM_ALGORITHMS_V5 7
#define NCCL_NUM_PROTOCOLS_V5 3
#define NCCL_NUM_HW_LINKS_V5 3
#define NCCL_NUM_COMPCAPS_V5 4
#define NCCL_NUM_TUNING_SCALES_V5 3

typedef struct {
  double baseLatencies[NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double hwLatencies[NCCL_NUM_HW_LINKS_V5][NCCL_NUM_ALGORITHMS_V5][NCCL_NUM_PROTOCOLS_V5];
  double llMaxBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxRingLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeLL128Bws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
  double perChMaxNVLSTreeBws[NCCL_NUM_COMPCAPS_V5][NCCL_NUM_TUNING_SCALES_V5];
} ncclTunerConstants_v5_t;
typedef ncclTunerConstants_v5_t ncclTunerConstants_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v6_t* nvlDomainInfo, ncclTunerConstants_v6_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
  // Optional (NULL allowed); NCCL clamps what it returns.
  ncclResult_t (*getChunkSize)(void* context, ncclFunc_t collType, size_t nBytes, int algo, int proto,
                               int nChannels, size_t* chunkSize);
} ncclTuner_v6_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction,
                       ncclNvlDomainInfo_v5_t* nvlDomainInfo, ncclTunerConstants_v5_t* constants);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*finalize)(void* context);
} ncclTuner_v5_t;

typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int regBuff, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v4_t;

// v3: like v4, but getCollInfo has no regBuff.
typedef struct {
  const char* name;
  ncclResult_t (*init)(size_t nRanks, size_t nNodes, ncclDebugLogger_t logFunction, void** context);
  ncclResult_t (*getCollInfo)(void* context, ncclFunc_t collType, size_t nBytes, int numPipeOps,
                              float** collCostTable, int numAlgo, int numProto, int* nChannels);
  ncclResult_t (*destroy)(void* context);
} ncclTuner_v3_t;

}  // extern "C"

// Indices into the cost table (src/include/nccl_common.h / device.h).
#define NCCL_ALGO_UNDEF (-1)
#define NCCL_ALGO_TREE 0
#define NCCL_ALGO_RING 1
#define NCCL_ALGO_COLLNET_DIRECT 2
#define NCCL_ALGO_COLLNET_CHAIN 3
#define NCCL_ALGO_NVLS 4
#define NCCL_ALGO_NVLS_TREE 5
#define NCCL_ALGO_PAT 6
#define NCCL_NUM_ALGORITHMS 7
#define NCCL_PROTO_UNDEF (-1)
#define NCCL_PROTO_LL 0
#define NCCL_PROTO_LL128 1
#define NCCL_PROTO_SIMPLE 2
#define NCCL_NUM_PROTOCOLS 3
// The value NCCL writes into entries it does not offer; the tuner must leave such entries alone.
#define NCCL_ALGO_PROTO_IGNORE (-1.0f)

static_assert(sizeof(ncclFunc_t) == 4);
static_assert(sizeof(ncclNvlDomainInfo_v5_t) == 12);
static_assert(sizeof(ncclTunerConstants_v5_t) == sizeof(double) * (7 * 3 + 3 * 7 * 3 + 5 * 4 * 3));
static_assert(offsetof(ncclTunerConstants_v5_t, hwLatencies) == sizeof(double) * 21);
static_assert(offsetof(ncclTunerConstants_v5_t, llMaxBws) == sizeof(double) * (21 + 63));
static_assert(offsetof(ncclTunerConstants_v5_t, perChMaxNVLSTreeBws) == sizeof(double) * (21 + 63 + 48));
static_assert(sizeof(ncclTuner_v6_t) == 5 * sizeof(void*));
static_assert(offsetof(ncclTuner_v6_t, getChunkSize) == 4 * sizeof(void*));
static_assert(sizeof(ncclTuner_v5_t) == 4 * sizeof(void*));
static_assert(sizeof(ncclTuner_v4_t) == 4 * sizeof(void*));
static_assert(offsetof(ncclTuner_v4_t, destroy) == 3 * sizeof(void*));
static_assert(sizeof(ncclTuner_v3_t) == 4 * sizeof(void*));
