#include "memory.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "base/cuda_allocation.h"
#include "base/cuda_driver.h"

namespace conformance {
namespace {

namespace cu = railnet::cuda;

struct Gpu {
  const cu::DriverApi* api = nullptr;
  cu::CUcontext context = nullptr;
  std::string why;  // empty when usable
};

Gpu probeGpu() {
  Gpu gpu;
  std::string why;
  const cu::DriverApi* api = cu::initDriver(&why);
  if (api == nullptr) {
    gpu.why = why;
    return gpu;
  }
  auto failed = [&](const char* call, cu::CUresult rc) {
    gpu.why = std::string(call) + ": " + api->errorText(rc) + " (driver " + api->path + ")";
    return gpu;
  };
  int count = 0;
  if (cu::CUresult rc = api->cuDeviceGetCount(&count); rc != cu::CUDA_SUCCESS) return failed("cuDeviceGetCount", rc);
  if (count == 0) {
    gpu.why = "no CUDA device (cuDeviceGetCount returned 0; driver " + api->path + ")";
    return gpu;
  }
  cu::CUdevice device = 0;
  if (cu::CUresult rc = api->cuDeviceGet(&device, 0); rc != cu::CUDA_SUCCESS) return failed("cuDeviceGet(0)", rc);
  cu::CUcontext context = nullptr;
  if (cu::CUresult rc = api->cuDevicePrimaryCtxRetain(&context, device); rc != cu::CUDA_SUCCESS) {
    return failed("cuDevicePrimaryCtxRetain(device 0)", rc);
  }
  if (cu::CUresult rc = api->cuCtxSetCurrent(context); rc != cu::CUDA_SUCCESS) return failed("cuCtxSetCurrent", rc);
  cu::CUdeviceptr probe = 0;
  if (cu::CUresult rc = api->cuMemAlloc(&probe, 4096); rc != cu::CUDA_SUCCESS) return failed("cuMemAlloc(4096)", rc);
  (void)api->cuMemFree(probe);
  // The primary context stays retained for the life of the process, as NCCL's does.
  gpu.api = api;
  gpu.context = context;
  return gpu;
}

const Gpu& gpu() {
  static const Gpu once = probeGpu();  // magic static: one probe, thread-safe
  return once;
}

const cu::DriverApi& api() {
  const Gpu& g = gpu();
  if (g.api == nullptr) throw TestFailure("GPU memory used although no GPU is usable: " + g.why);
  return *g.api;
}

void check(cu::CUresult rc, const std::string& what) {
  if (rc != cu::CUDA_SUCCESS) throw TestFailure(what + " failed: " + api().errorText(rc));
}

cu::CUdeviceptr devicePointer(const uint8_t* data, size_t offset) {
  return static_cast<cu::CUdeviceptr>(reinterpret_cast<uintptr_t>(data) + offset);
}

class HostMemory final : public Memory {
 public:
  HostMemory(HostBuffer buffer, size_t size) : Memory(MemKind::Host, buffer.data(), size), buffer_(std::move(buffer)) {}
  uint8_t* hostData() const override { return data(); }
  void write(size_t offset, const void* source, size_t bytes) override {
    std::memcpy(data() + offset, source, bytes);
  }
  void read(size_t offset, void* destination, size_t bytes) const override {
    std::memcpy(destination, data() + offset, bytes);
  }
  void fill(size_t offset, uint8_t value, size_t bytes) override { std::memset(data() + offset, value, bytes); }

 private:
  HostBuffer buffer_;
};

// The driver's synchronous copies and memset may return before the device finished (pageable host -> device
// copies return once the source is staged; cuMemsetD8 is asynchronous): each write ends by synchronizing the
// legacy default stream, so the plugin's copies on its own non-blocking streams see the bytes.
class GpuMemory final : public Memory {
 public:
  // `cuMem` holds the memory when it is a cuMem allocation; otherwise `data` was cuMemAlloc'd.
  GpuMemory(uint8_t* data, size_t size, std::unique_ptr<railnet::cuda::CuMemAllocation> cuMem)
      : Memory(MemKind::Gpu, data, size), cuMem_(std::move(cuMem)) {}
  ~GpuMemory() override {
    if (cuMem_ != nullptr) return;  // unmaps and frees itself
    // Only constructed with a usable GPU; a destructor must not throw, so failures are only printed.
    const Gpu& g = gpu();
    cu::CUresult rc = g.api->cuCtxSetCurrent(g.context);
    if (rc == cu::CUDA_SUCCESS) rc = g.api->cuMemFree(devicePointer(data(), 0));
    if (rc != cu::CUDA_SUCCESS) {
      std::fprintf(stderr, "cuMemFree(%p) failed: %s\n", static_cast<void*>(data()), g.api->errorText(rc).c_str());
    }
  }
  uint8_t* hostData() const override { return nullptr; }
  void write(size_t offset, const void* source, size_t bytes) override {
    if (bytes == 0) return;
    bindGpuContext();
    check(api().cuMemcpyHtoD(devicePointer(data(), offset), source, bytes),
          strf("cuMemcpyHtoD(%zu bytes to GPU offset %zu)", bytes, offset));
    check(api().cuStreamSynchronize(nullptr), "cuStreamSynchronize after cuMemcpyHtoD");
  }
  void read(size_t offset, void* destination, size_t bytes) const override {
    if (bytes == 0) return;
    bindGpuContext();
    check(api().cuMemcpyDtoH(destination, devicePointer(data(), offset), bytes),
          strf("cuMemcpyDtoH(%zu bytes from GPU offset %zu)", bytes, offset));
  }
  void fill(size_t offset, uint8_t value, size_t bytes) override {
    if (bytes == 0) return;
    bindGpuContext();
    check(api().cuMemsetD8(devicePointer(data(), offset), value, bytes),
          strf("cuMemsetD8(%zu bytes at GPU offset %zu)", bytes, offset));
    check(api().cuStreamSynchronize(nullptr), "cuStreamSynchronize after cuMemsetD8");
  }
  void attachThread() const override { bindGpuContext(); }

 private:
  std::unique_ptr<railnet::cuda::CuMemAllocation> cuMem_;
};

// CONFORMANCE_GPU_MEMORY=cumalloc: GPU buffers from cuMemAlloc (what a cudaMalloc'd user buffer is) instead of
// cuMem allocations (what NCCL hands the plugin by default). Children inherit it with the environment.
bool legacyGpuAllocations() {
  const char* value = std::getenv("CONFORMANCE_GPU_MEMORY");
  return value != nullptr && std::strcmp(value, "cumalloc") == 0;
}

}  // namespace

const char* kindName(MemKind kind) { return kind == MemKind::Gpu ? "GPU" : "host"; }

int ptrType(MemKind kind) { return kind == MemKind::Gpu ? NCCL_PTR_CUDA : NCCL_PTR_HOST; }

std::unique_ptr<Memory> allocateMemory(MemKind kind, size_t size) {
  if (kind == MemKind::Host) return std::make_unique<HostMemory>(HostBuffer(size), size);
  bindGpuContext();
  cu::CUdeviceptr pointer = 0;
  std::unique_ptr<railnet::cuda::CuMemAllocation> cuMem;
  if (legacyGpuAllocations()) {
    check(api().cuMemAlloc(&pointer, size ? size : 1), strf("cuMemAlloc(%zu bytes)", size));
  } else {
    std::string why;
    cuMem = railnet::cuda::CuMemAllocation::create(api(), 0, size, &why);
    if (cuMem == nullptr) throw TestFailure(strf("cuMem allocation of %zu bytes on device 0: %s", size, why.c_str()));
    pointer = cuMem->address();
  }
  auto memory = std::make_unique<GpuMemory>(reinterpret_cast<uint8_t*>(static_cast<uintptr_t>(pointer)), size,
                                            std::move(cuMem));
  memory->fill(0, 0, size);  // as zero-filled as host memory
  return memory;
}

const std::string& gpuUnavailableReason() { return gpu().why; }

void bindGpuContext() { check(api().cuCtxSetCurrent(gpu().context), "cuCtxSetCurrent(device 0's primary context)"); }

bool gpuContextCurrent() {
  cu::CUcontext current = nullptr;
  check(api().cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  return current != nullptr && current == gpu().context;
}

void unbindGpuContext() { check(api().cuCtxSetCurrent(nullptr), "cuCtxSetCurrent(NULL)"); }

}  // namespace conformance
