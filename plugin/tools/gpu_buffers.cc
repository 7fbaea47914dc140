#include "plugin/tools/gpu_buffers.h"

#include <cstdio>

#include "plugin/tools/harness.h"

namespace railnet::bench {
namespace {

// The device the bench measures: NCCL's first rank on a host uses GPU 0 too, and one is all a loopback run needs.
constexpr int kDeviceOrdinal = 0;

}  // namespace

std::unique_ptr<GpuDevice> GpuDevice::open(std::string* why) {
  const cuda::DriverApi* api = cuda::initDriver(why);
  if (api == nullptr) return nullptr;
  auto reason = [&](const char* call, cuda::CUresult result) {
    *why = std::string(call) + ": " + api->errorText(result);
    return nullptr;
  };
  int count = 0;
  if (cuda::CUresult result = api->cuDeviceGetCount(&count); result != cuda::CUDA_SUCCESS) {
    return reason("cuDeviceGetCount", result);
  }
  if (count <= kDeviceOrdinal) {
    *why = "no GPU (cuDeviceGetCount reports 0 devices)";
    return nullptr;
  }
  cuda::CUdevice device = 0;
  if (cuda::CUresult result = api->cuDeviceGet(&device, kDeviceOrdinal); result != cuda::CUDA_SUCCESS) {
    return reason("cuDeviceGet(0)", result);
  }
  cuda::CUcontext context = nullptr;
  if (cuda::CUresult result = api->cuDevicePrimaryCtxRetain(&context, device); result != cuda::CUDA_SUCCESS) {
    return reason("cuDevicePrimaryCtxRetain(device 0)", result);
  }
  if (cuda::CUresult result = api->cuCtxSetCurrent(context); result != cuda::CUDA_SUCCESS) {
    api->cuDevicePrimaryCtxRelease(device);
    return reason("cuCtxSetCurrent", result);
  }
  return std::unique_ptr<GpuDevice>(new GpuDevice(*api, device, context));
}

GpuDevice::GpuDevice(const cuda::DriverApi& api, cuda::CUdevice device, cuda::CUcontext context)
    : api_(api), device_(device), context_(context) {
  char busId[32] = {};
  if (api_.cuDeviceGetPCIBusId(busId, sizeof(busId), device_) == cuda::CUDA_SUCCESS) pciBusId_ = busId;
}

GpuDevice::~GpuDevice() {
  api_.cuCtxSetCurrent(nullptr);
  if (cuda::CUresult result = api_.cuDevicePrimaryCtxRelease(device_); result != cuda::CUDA_SUCCESS) {
    fprintf(stderr, "railnet-bench: cuDevicePrimaryCtxRelease: %s\n", api_.errorText(result).c_str());
  }
}

void GpuDevice::makeCurrent() const { check(api_.cuCtxSetCurrent(context_), "cuCtxSetCurrent"); }

void GpuDevice::check(cuda::CUresult result, const char* what) const {
  if (result != cuda::CUDA_SUCCESS) fail("CUDA %s: %s", what, api_.errorText(result).c_str());
}

DeviceMemory::DeviceMemory(const GpuDevice& gpu, size_t bytes) : gpu_(gpu), size_(bytes) {
  std::string why;
  cuMem_ = cuda::CuMemAllocation::create(gpu.api(), gpu.device(), bytes, &why);
  if (cuMem_ != nullptr) {
    address_ = cuMem_->address();
  } else if (gpu.api().cuMemCreate != nullptr) {
    fail("cannot allocate %zu bytes of GPU memory: %s", bytes, why.c_str());
  } else if (cuda::CUresult result = gpu.api().cuMemAlloc(&address_, bytes); result != cuda::CUDA_SUCCESS) {
    fail("cannot allocate %zu bytes of GPU memory: %s", bytes, gpu.api().errorText(result).c_str());
  }
  try {
    clear(bytes);
  } catch (...) {
    if (cuMem_ == nullptr) gpu.api().cuMemFree(address_);
    throw;
  }
}

DeviceMemory::~DeviceMemory() {
  if (cuMem_ != nullptr) return;  // cuMem_ unmaps and frees itself
  if (cuda::CUresult result = gpu_.api().cuMemFree(address_); result != cuda::CUDA_SUCCESS) {
    fprintf(stderr, "railnet-bench: cuMemFree: %s\n", gpu_.api().errorText(result).c_str());
  }
}

void DeviceMemory::upload(const std::byte* from, size_t bytes) {
  gpu_.check(gpu_.api().cuMemcpyHtoD(address_, from, bytes), "cuMemcpyHtoD");
  // From pageable memory the call may return once the bytes are staged, before they reach the GPU.
  gpu_.check(gpu_.api().cuStreamSynchronize(nullptr), "cuStreamSynchronize after cuMemcpyHtoD");
}

void DeviceMemory::download(std::byte* to, size_t bytes) const {
  // Returns once the bytes are in host memory. The transports' own copies run on their own streams, which the
  // legacy stream does not wait for: callers download only after every receive completed.
  gpu_.check(gpu_.api().cuMemcpyDtoH(to, address_, bytes), "cuMemcpyDtoH");
}

void DeviceMemory::clear(size_t bytes) {
  gpu_.check(gpu_.api().cuMemsetD8(address_, 0, bytes), "cuMemsetD8");
  // A memset of device memory may return before it ran; the transports' copies (other streams) must not race it.
  gpu_.check(gpu_.api().cuStreamSynchronize(nullptr), "cuStreamSynchronize after cuMemsetD8");
}

PinnedMemory::PinnedMemory(const GpuDevice& gpu, size_t bytes) : gpu_(gpu), size_(bytes) {
  void* memory = nullptr;
  if (cuda::CUresult result = gpu.api().cuMemHostAlloc(&memory, bytes, cuda::CU_MEMHOSTALLOC_PORTABLE);
      result != cuda::CUDA_SUCCESS) {
    fail("cannot allocate %zu bytes of pinned host memory: %s", bytes, gpu.api().errorText(result).c_str());
  }
  data_ = static_cast<std::byte*>(memory);
}

PinnedMemory::~PinnedMemory() {
  if (cuda::CUresult result = gpu_.api().cuMemFreeHost(data_); result != cuda::CUDA_SUCCESS) {
    fprintf(stderr, "railnet-bench: cuMemFreeHost: %s\n", gpu_.api().errorText(result).c_str());
  }
}

}  // namespace railnet::bench
