// The CUDA driver API (libcuda.so.1), resolved at run time. railnet never links libcuda and never includes a
// CUDA header: the plugin must load on hosts without a GPU driver, where "CUDA absent" is a normal state
// with a reason string, not an error.
//
// Loading follows NCCL's cudawrap: dlopen("libcuda.so.1"), find cuGetProcAddress_v2 (CUDA >= 12) or
// cuGetProcAddress (11.3+) with dlsym, then ask it for each entry point by its base name and the CUDA
// version that introduced the signature we declare, so the driver hands back the matching versioned
// implementation. Drivers older than 11.3 (no cuGetProcAddress) fall back to dlsym of the plain names.
//
// The types and enum values below are copied from cuda.h (CUDA 13.0); tests/unit/test_cuda_driver.cc checks
// them against /usr/local/cuda/include/cuda.h when that header exists on the build machine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace railnet::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;  // CUdeviceptr_v2 on 64-bit hosts
using CUcontext = struct CUctx_st*;
using CUstream = struct CUstream_st*;
using CUevent = struct CUevent_st*;

constexpr CUresult CUDA_SUCCESS = 0;
constexpr CUresult CUDA_ERROR_INVALID_VALUE = 1;
constexpr CUresult CUDA_ERROR_NOT_INITIALIZED = 3;
constexpr CUresult CUDA_ERROR_DEINITIALIZED = 4;
constexpr CUresult CUDA_ERROR_NO_DEVICE = 100;
constexpr CUresult CUDA_ERROR_INVALID_CONTEXT = 201;
constexpr CUresult CUDA_ERROR_NOT_READY = 600;
constexpr CUresult CUDA_ERROR_NOT_SUPPORTED = 801;

// Flags of cuStreamCreate, cuEventCreate, cuMemHostRegister, cuMemHostAlloc
constexpr unsigned CU_STREAM_NON_BLOCKING = 0x1;
constexpr unsigned CU_EVENT_DISABLE_TIMING = 0x2;
constexpr unsigned CU_MEMHOSTREGISTER_PORTABLE = 0x01;
constexpr unsigned CU_MEMHOSTREGISTER_DEVICEMAP = 0x02;
constexpr unsigned CU_MEMHOSTREGISTER_IOMEMORY = 0x04;  // MMIO, e.g. a NIC's doorbell page
constexpr unsigned CU_MEMHOSTALLOC_PORTABLE = 0x01;

// CUdevice_attribute
constexpr int CU_DEVICE_ATTRIBUTE_PCI_BUS_ID = 33;
constexpr int CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID = 34;
constexpr int CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID = 50;
constexpr int CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED = 116;
constexpr int CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED = 124;
constexpr int CU_DEVICE_ATTRIBUTE_MPS_ENABLED = 133;  // contexts on this device are shared through MPS

// CUpointer_attribute
constexpr int CU_POINTER_ATTRIBUTE_CONTEXT = 1;
constexpr int CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2;
constexpr int CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL = 9;

// CUmemorytype
constexpr unsigned CU_MEMORYTYPE_HOST = 0x01;
constexpr unsigned CU_MEMORYTYPE_DEVICE = 0x02;
constexpr unsigned CU_MEMORYTYPE_ARRAY = 0x03;
constexpr unsigned CU_MEMORYTYPE_UNIFIED = 0x04;

// The virtual memory management API (cuMem*, what NCCL allocates its buffers with, NCCL_CUMEM_ENABLE=1): the
// structures as cuda.h lays them out, reduced to what railnet sets.
using CUmemGenericAllocationHandle = unsigned long long;
constexpr int CU_MEM_ALLOCATION_TYPE_PINNED = 0x1;
constexpr int CU_MEM_LOCATION_TYPE_DEVICE = 0x1;
constexpr int CU_MEM_ACCESS_FLAGS_PROT_READWRITE = 0x3;
constexpr int CU_MEM_ALLOC_GRANULARITY_MINIMUM = 0x0;
struct CUmemLocation {
  int type;
  int id;
};
struct CUmemAllocationProp {
  int type;
  int requestedHandleTypes;
  CUmemLocation location;
  void* win32HandleMetaData;
  struct {
    unsigned char compressionType;
    unsigned char gpuDirectRDMACapable;
    unsigned short usage;
    unsigned char reserved[4];
  } allocFlags;
};
struct CUmemAccessDesc {
  CUmemLocation location;
  int flags;
};

// CUmemAllocationHandleType: a cuMem allocation shared with another process as a file descriptor (the NVLink
// hop's staging when the rail GPU belongs to another process, proxy/staging/hop_exchange.h).
constexpr int CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR = 0x1;

// CUmemRangeHandleType and the cuMemGetHandleForAddressRange flags
constexpr int CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD = 0x1;
constexpr unsigned long long CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE = 0x1;

// CUdriverProcAddressQueryResult / CUdriverProcAddress_flags
constexpr int CU_GET_PROC_ADDRESS_SUCCESS = 0;
constexpr unsigned long long CU_GET_PROC_ADDRESS_DEFAULT = 0;

struct DriverApi {
  CUresult (*cuInit)(unsigned int flags) = nullptr;
  CUresult (*cuDriverGetVersion)(int* version) = nullptr;
  CUresult (*cuDeviceGetCount)(int* count) = nullptr;
  CUresult (*cuDeviceGet)(CUdevice* device, int ordinal) = nullptr;
  CUresult (*cuDeviceGetPCIBusId)(char* busId, int length, CUdevice device) = nullptr;
  CUresult (*cuDeviceGetAttribute)(int* value, int attribute, CUdevice device) = nullptr;
  CUresult (*cuPointerGetAttribute)(void* data, int attribute, CUdeviceptr pointer) = nullptr;
  CUresult (*cuCtxGetDevice)(CUdevice* device) = nullptr;
  // Contexts, streams, events and copies: the TCP transport's copy-engine staging (proxy/staging/).
  CUresult (*cuCtxPushCurrent)(CUcontext context) = nullptr;
  CUresult (*cuCtxPopCurrent)(CUcontext* context) = nullptr;
  CUresult (*cuCtxGetCurrent)(CUcontext* context) = nullptr;
  CUresult (*cuCtxSetCurrent)(CUcontext context) = nullptr;
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext* context, CUdevice device) = nullptr;
  CUresult (*cuCtxCreate)(CUcontext* context, unsigned int flags, CUdevice device) = nullptr;  // cuCtxCreate_v2
  CUresult (*cuCtxDestroy)(CUcontext context) = nullptr;
  CUresult (*cuDevicePrimaryCtxRelease)(CUdevice device) = nullptr;
  CUresult (*cuStreamCreate)(CUstream* stream, unsigned int flags) = nullptr;
  CUresult (*cuStreamDestroy)(CUstream stream) = nullptr;
  CUresult (*cuStreamSynchronize)(CUstream stream) = nullptr;
  CUresult (*cuEventCreate)(CUevent* event, unsigned int flags) = nullptr;
  CUresult (*cuEventDestroy)(CUevent event) = nullptr;
  CUresult (*cuEventRecord)(CUevent event, CUstream stream) = nullptr;
  CUresult (*cuEventQuery)(CUevent event) = nullptr;
  CUresult (*cuEventSynchronize)(CUevent event) = nullptr;
  CUresult (*cuMemcpyDtoHAsync)(void* destination, CUdeviceptr source, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuMemcpyHtoDAsync)(CUdeviceptr destination, const void* source, size_t bytes, CUstream stream) = nullptr;
  CUresult (*cuMemcpyDtoH)(void* destination, CUdeviceptr source, size_t bytes) = nullptr;
  CUresult (*cuMemcpyHtoD)(CUdeviceptr destination, const void* source, size_t bytes) = nullptr;
  CUresult (*cuMemHostRegister)(void* pointer, size_t bytes, unsigned int flags) = nullptr;
  CUresult (*cuMemHostUnregister)(void* pointer) = nullptr;
  CUresult (*cuMemHostGetDevicePointer)(CUdeviceptr* device, void* host, unsigned int flags) = nullptr;  // optional
  CUresult (*cuMemHostAlloc)(void** pointer, size_t bytes, unsigned int flags) = nullptr;
  CUresult (*cuMemFreeHost)(void* pointer) = nullptr;
  CUresult (*cuMemAlloc)(CUdeviceptr* pointer, size_t bytes) = nullptr;
  CUresult (*cuMemFree)(CUdeviceptr pointer) = nullptr;
  CUresult (*cuMemsetD8)(CUdeviceptr pointer, unsigned char value, size_t count) = nullptr;
  // Optional (CUDA >= 11.7): null on older drivers, which then cannot export DMA-BUFs.
  CUresult (*cuMemGetHandleForAddressRange)(void* handle, CUdeviceptr pointer, size_t size, int handleType,
                                            unsigned long long flags) = nullptr;
  // Optional (CUDA >= 10.2): the cuMem API. cuMemRetainAllocationHandle tells a cuMem allocation, which any
  // context on its GPU copies at full speed, from a legacy one (cuMemAlloc), which another context copies through
  // a slower path (copy_queue.h); the rest allocate the way NCCL does (railnet-bench, the conformance gpu group).
  CUresult (*cuMemRetainAllocationHandle)(CUmemGenericAllocationHandle* handle, void* address) = nullptr;
  CUresult (*cuMemRelease)(CUmemGenericAllocationHandle handle) = nullptr;
  CUresult (*cuMemCreate)(CUmemGenericAllocationHandle* handle, size_t size, const CUmemAllocationProp* prop,
                          unsigned long long flags) = nullptr;
  CUresult (*cuMemGetAllocationGranularity)(size_t* granularity, const CUmemAllocationProp* prop, int option) = nullptr;
  CUresult (*cuMemAddressReserve)(CUdeviceptr* pointer, size_t size, size_t alignment, CUdeviceptr address,
                                  unsigned long long flags) = nullptr;
  CUresult (*cuMemAddressFree)(CUdeviceptr pointer, size_t size) = nullptr;
  CUresult (*cuMemMap)(CUdeviceptr pointer, size_t size, size_t offset, CUmemGenericAllocationHandle handle,
                       unsigned long long flags) = nullptr;
  CUresult (*cuMemUnmap)(CUdeviceptr pointer, size_t size) = nullptr;
  CUresult (*cuMemSetAccess)(CUdeviceptr pointer, size_t size, const CUmemAccessDesc* desc, size_t count) = nullptr;
  CUresult (*cuMemExportToShareableHandle)(void* shareable, CUmemGenericAllocationHandle handle, int handleType,
                                           unsigned long long flags) = nullptr;
  CUresult (*cuMemImportFromShareableHandle)(CUmemGenericAllocationHandle* handle, void* osHandle,
                                             int handleType) = nullptr;
  // Optional: the verbs transport's NVLink hop (proxy/staging/nvlink_staging.h) finds the rail's GPU by bus id,
  // checks peer access to it and copies into it; without them the hop is off and GPUDirect ports are not routed.
  CUresult (*cuDeviceGetByPCIBusId)(CUdevice* device, const char* busId) = nullptr;
  CUresult (*cuDeviceCanAccessPeer)(int* canAccess, CUdevice device, CUdevice peer) = nullptr;
  CUresult (*cuMemcpyDtoDAsync)(CUdeviceptr destination, CUdeviceptr source, size_t bytes, CUstream stream) = nullptr;
  // Optional: error names for log lines.
  CUresult (*cuGetErrorString)(CUresult error, const char** text) = nullptr;

  int driverVersion = 0;  // cuDriverGetVersion, e.g. 12040; 0 when it failed
  std::string path;       // the file dlopen found

  // "CUDA_ERROR_xxx (n)" when the driver names it, else "CUresult n".
  std::string errorText(CUresult result) const;
};

// Loads libcuda.so.1 once per process (thread-safe, lazy) and resolves the symbols above. Returns nullptr and
// sets *why ("libcuda.so.1 not found: ..." / "symbol cuXxx missing ...") when the driver cannot be used; `why`
// may be null. Later calls return the same answer. Does not call cuInit: see initDriver().
const DriverApi* loadDriver(std::string* why);

// loadDriver() plus cuInit(0) once per process. Returns nullptr with *why set when the driver is absent or
// cuInit fails (e.g. "cuInit: CUDA_ERROR_NO_DEVICE (100)").
const DriverApi* initDriver(std::string* why);

// Uncached load of a specific library file, for tests (a library without the CUDA symbols must give a clear
// "missing" reason). The handle of a successful load is leaked on purpose, as loadDriver's is.
bool loadDriverFrom(const char* library, DriverApi* api, std::string* why);

}  // namespace railnet::cuda
