#include "base/cuda_driver.h"

#include <dlfcn.h>
#include <link.h>

#include <mutex>

#include "railnet/log.h"

namespace railnet::cuda {
namespace {

constexpr const char* kLibrary = "libcuda.so.1";

// cuGetProcAddress_v2 (CUDA >= 12.0) reports why a symbol was not found; cuGetProcAddress (11.3) does not.
using GetProcAddressV2 = CUresult (*)(const char* symbol, void** function, int cudaVersion, unsigned long long flags,
                                      int* symbolStatus);
using GetProcAddressV1 = CUresult (*)(const char* symbol, void** function, int cudaVersion, unsigned long long flags);

class Resolver {
 public:
  explicit Resolver(void* handle) : handle_(handle) {
    v2_ = reinterpret_cast<GetProcAddressV2>(dlsym(handle, "cuGetProcAddress_v2"));
    if (v2_ == nullptr) v1_ = reinterpret_cast<GetProcAddressV1>(dlsym(handle, "cuGetProcAddress"));
  }

  const char* how() const { return v2_ ? "cuGetProcAddress_v2" : v1_ ? "cuGetProcAddress" : "dlsym"; }

  // `version` is the CUDA version whose signature of `name` we declare (as in NCCL's cudawrap table).
  template <typename Fn>
  void require(Fn* slot, const char* name, int version) {
    if (!why_.empty()) return;
    void* symbol = find(name, version);
    if (symbol == nullptr) {
      why_ = std::string("symbol ") + name + " missing (looked up with " + how() + ")";
      return;
    }
    *slot = reinterpret_cast<Fn>(symbol);
  }

  template <typename Fn>
  void optional(Fn* slot, const char* name, int version) {
    *slot = reinterpret_cast<Fn>(find(name, version));
  }

  const std::string& why() const { return why_; }

 private:
  void* find(const char* name, int version) {
    void* symbol = nullptr;
    if (v2_ != nullptr) {
      int status = -1;
      if (v2_(name, &symbol, version, CU_GET_PROC_ADDRESS_DEFAULT, &status) != CUDA_SUCCESS ||
          status != CU_GET_PROC_ADDRESS_SUCCESS) {
        return nullptr;
      }
      return symbol;
    }
    if (v1_ != nullptr) {
      if (v1_(name, &symbol, version, CU_GET_PROC_ADDRESS_DEFAULT) != CUDA_SUCCESS) return nullptr;
      return symbol;
    }
    return dlsym(handle_, name);  // pre-11.3 drivers: the plain names have the signatures we declare
  }

  void* handle_;
  GetProcAddressV2 v2_ = nullptr;
  GetProcAddressV1 v1_ = nullptr;
  std::string why_;
};

std::string libraryPath(void* handle, const char* fallback) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr && map->l_name[0]) {
    return map->l_name;
  }
  return fallback;
}

struct Loaded {
  DriverApi api;
  bool ok = false;
  std::string why;
};

Loaded loadOnce() {
  Loaded loaded;
  loaded.ok = loadDriverFrom(kLibrary, &loaded.api, &loaded.why);
  if (loaded.ok) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: loaded %s (driver %d, cuMemGetHandleForAddressRange %s)",
            loaded.api.path.c_str(), loaded.api.driverVersion,
            loaded.api.cuMemGetHandleForAddressRange ? "present" : "absent");
  } else {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: CUDA driver not used: %s", loaded.why.c_str());
  }
  return loaded;
}

const Loaded& loaded() {
  static const Loaded once = loadOnce();  // C++ magic static: one load, thread-safe
  return once;
}

}  // namespace

std::string DriverApi::errorText(CUresult result) const {
  const char* text = nullptr;
  if (cuGetErrorString != nullptr && cuGetErrorString(result, &text) == CUDA_SUCCESS && text != nullptr) {
    return std::string(text) + " (" + std::to_string(result) + ")";
  }
  return "CUresult " + std::to_string(result);
}

bool loadDriverFrom(const char* library, DriverApi* api, std::string* why) {
  *api = DriverApi{};
  dlerror();
  void* handle = dlopen(library, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    if (why != nullptr) *why = std::string(library) + " not found: " + (error ? error : "dlopen failed");
    return false;
  }
  Resolver resolve(handle);
  resolve.require(&api->cuInit, "cuInit", 2000);
  resolve.require(&api->cuDriverGetVersion, "cuDriverGetVersion", 2020);
  resolve.require(&api->cuDeviceGetCount, "cuDeviceGetCount", 2000);
  resolve.require(&api->cuDeviceGet, "cuDeviceGet", 2000);
  resolve.require(&api->cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", 4010);
  resolve.require(&api->cuDeviceGetAttribute, "cuDeviceGetAttribute", 2000);
  resolve.require(&api->cuPointerGetAttribute, "cuPointerGetAttribute", 4000);
  resolve.require(&api->cuCtxGetDevice, "cuCtxGetDevice", 2000);
  resolve.require(&api->cuCtxPushCurrent, "cuCtxPushCurrent", 4000);
  resolve.require(&api->cuCtxPopCurrent, "cuCtxPopCurrent", 4000);
  resolve.require(&api->cuCtxGetCurrent, "cuCtxGetCurrent", 4000);
  resolve.require(&api->cuCtxSetCurrent, "cuCtxSetCurrent", 4000);
  resolve.require(&api->cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", 7000);
  resolve.require(&api->cuCtxCreate, "cuCtxCreate", 3020);
  resolve.require(&api->cuCtxDestroy, "cuCtxDestroy", 4000);
  resolve.require(&api->cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", 11000);
  resolve.require(&api->cuStreamCreate, "cuStreamCreate", 2000);
  resolve.require(&api->cuStreamDestroy, "cuStreamDestroy", 4000);
  resolve.require(&api->cuStreamSynchronize, "cuStreamSynchronize", 2000);
  resolve.require(&api->cuEventCreate, "cuEventCreate", 2000);
  resolve.require(&api->cuEventDestroy, "cuEventDestroy", 4000);
  resolve.require(&api->cuEventRecord, "cuEventRecord", 2000);
  resolve.require(&api->cuEventQuery, "cuEventQuery", 2000);
  resolve.require(&api->cuEventSynchronize, "cuEventSynchronize", 2000);
  resolve.require(&api->cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync", 3020);
  resolve.require(&api->cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync", 3020);
  resolve.require(&api->cuMemcpyDtoH, "cuMemcpyDtoH", 3020);
  resolve.require(&api->cuMemcpyHtoD, "cuMemcpyHtoD", 3020);
  resolve.require(&api->cuMemHostRegister, "cuMemHostRegister", 6050);
  resolve.require(&api->cuMemHostUnregister, "cuMemHostUnregister", 4000);
  resolve.optional(&api->cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer", 3020);
  resolve.require(&api->cuMemHostAlloc, "cuMemHostAlloc", 2020);
  resolve.require(&api->cuMemFreeHost, "cuMemFreeHost", 2000);
  resolve.require(&api->cuMemAlloc, "cuMemAlloc", 3020);
  resolve.require(&api->cuMemFree, "cuMemFree", 3020);
  resolve.require(&api->cuMemsetD8, "cuMemsetD8", 3020);
  resolve.optional(&api->cuMemGetHandleForAddressRange, "cuMemGetHandleForAddressRange", 11070);
  resolve.optional(&api->cuMemRetainAllocationHandle, "cuMemRetainAllocationHandle", 11000);
  resolve.optional(&api->cuMemRelease, "cuMemRelease", 10020);
  resolve.optional(&api->cuMemCreate, "cuMemCreate", 10020);
  resolve.optional(&api->cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity", 10020);
  resolve.optional(&api->cuMemAddressReserve, "cuMemAddressReserve", 10020);
  resolve.optional(&api->cuMemAddressFree, "cuMemAddressFree", 10020);
  resolve.optional(&api->cuMemMap, "cuMemMap", 10020);
  resolve.optional(&api->cuMemUnmap, "cuMemUnmap", 10020);
  resolve.optional(&api->cuMemSetAccess, "cuMemSetAccess", 10020);
  resolve.optional(&api->cuMemExportToShareableHandle, "cuMemExportToShareableHandle", 10020);
  resolve.optional(&api->cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle", 10020);
  resolve.optional(&api->cuDeviceGetByPCIBusId, "cuDeviceGetByPCIBusId", 4010);
  resolve.optional(&api->cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", 4000);
  resolve.optional(&api->cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync", 3020);
  resolve.optional(&api->cuGetErrorString, "cuGetErrorString", 6000);
  if (!resolve.why().empty()) {
    if (why != nullptr) *why = libraryPath(handle, library) + ": " + resolve.why();
    *api = DriverApi{};
    dlclose(handle);  // nothing was called through it
    return false;
  }
  // The handle is deliberately never closed: NCCL and the application share the driver in this process.
  api->path = libraryPath(handle, library);
  int version = 0;
  if (api->cuDriverGetVersion(&version) == CUDA_SUCCESS) api->driverVersion = version;
  return true;
}

const DriverApi* loadDriver(std::string* why) {
  const Loaded& once = loaded();
  if (!once.ok) {
    if (why != nullptr) *why = once.why;
    return nullptr;
  }
  return &once.api;
}

const DriverApi* initDriver(std::string* why) {
  const DriverApi* api = loadDriver(why);
  if (api == nullptr) return nullptr;
  static std::once_flag flag;
  static CUresult result = CUDA_SUCCESS;
  std::call_once(flag, [api] {
    result = api->cuInit(0);
    if (result != CUDA_SUCCESS) {
      RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: cuInit failed: %s", api->errorText(result).c_str());
    }
  });
  if (result != CUDA_SUCCESS) {
    if (why != nullptr) *why = "cuInit: " + api->errorText(result);
    return nullptr;
  }
  return api;
}

}  // namespace railnet::cuda
