// railnet's own declaration of the parts of NCCL's plugin ABI shared by every net version.
// Values and layouts follow NVIDIA/nccl src/include/plugin/nccl_net.h and
// src/include/nccl_device/net_device.h; static_asserts pin the layouts we rely on.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8,
} ncclResult_t;

typedef enum {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
} ncclDebugLogLevel;

typedef enum {
  NCCL_INIT = 1,
  NCCL_COLL = 2,
  NCCL_P2P = 4,
  NCCL_SHM = 8,
  NCCL_NET = 16,
  NCCL_GRAPH = 32,
  NCCL_TUNING = 64,
  NCCL_ENV = 128,
  NCCL_ALLOC = 256,
  NCCL_CALL = 512,
  NCCL_PROXY = 1024,
  NCCL_ALL = ~0,
} ncclDebugLogSubSys;

typedef void (*ncclDebugLogger_t)(ncclDebugLogLevel level, unsigned long flags, const char* file, int line,
                                  const char* fmt, ...);

typedef ncclResult_t (*ncclProfilerCallback_t)(void** eHandle, int type, void* pHandle, int64_t pluginId,
                                               void* extData);

typedef enum {
  NCCL_NET_DEVICE_HOST = 0,
  NCCL_NET_DEVICE_UNPACK = 1,
  NCCL_NET_DEVICE_GIN_PROXY = 2,
  NCCL_NET_DEVICE_GIN_GDAKI = 3,
  NCCL_NET_DEVICE_GIN_GPI = 4,
} ncclNetDeviceType;

// One layout for v7..v12 (NCCL typedefs each version to the v7 struct).
typedef struct {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
} ncclNetDeviceHandle_v8_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v9_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v10_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v11_t;
typedef ncclNetDeviceHandle_v8_t ncclNetDeviceHandle_v12_t;

}  // extern "C"

#define NCCL_NET_HANDLE_MAXSIZE 128
#define NCCL_NET_MAX_REQUESTS 32
#define NCCL_NET_OPTIONAL_RECV_COMPLETION 0x1
#define NCCL_NET_MULTI_REQUEST 0x2
#define NCCL_PTR_HOST 0x1
#define NCCL_PTR_CUDA 0x2
#define NCCL_PTR_DMABUF 0x4
#define NCCL_NET_TRAFFIC_CLASS_UNDEF (-1)
#define NCCL_NET_ATTR_UNDEF (-1)
#define NCCL_NET_ID_UNDEF (-1)
// Largest value NCCL accepts for maxP2pBytes / maxCollBytes.
#define NCCL_MAX_NET_SIZE_BYTES (1ULL << 40)
// What NCCL's v8 shim caps transfers at (int sizes).
#define NCCL_V8_MAX_NET_SIZE (1ULL << 30)

// The enumerator's name, for messages of tools and tests that call the plugin.
inline const char* ncclResultName(ncclResult_t result) {
  switch (result) {
    case ncclSuccess: return "ncclSuccess";
    case ncclUnhandledCudaError: return "ncclUnhandledCudaError";
    case ncclSystemError: return "ncclSystemError";
    case ncclInternalError: return "ncclInternalError";
    case ncclInvalidArgument: return "ncclInvalidArgument";
    case ncclInvalidUsage: return "ncclInvalidUsage";
    case ncclRemoteError: return "ncclRemoteError";
    case ncclInProgress: return "ncclInProgress";
    case ncclTimeout: return "ncclTimeout";
  }
  return "(unknown ncclResult_t)";
}

static_assert(sizeof(ncclResult_t) == 4);
static_assert(sizeof(ncclNetDeviceType) == 4);
static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32);
static_assert(offsetof(ncclNetDeviceHandle_v8_t, handle) == 8);
static_assert(offsetof(ncclNetDeviceHandle_v8_t, needsProxyProgress) == 24);
