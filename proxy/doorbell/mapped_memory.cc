#include "proxy/doorbell/mapped_memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "proxy/staging/copy_queue.h"
#include "railnet/error.h"
#include "railnet/nccl/common.h"

namespace railnet::doorbell {

PrimaryContext::PrimaryContext(int cudaDevice) : device_(cudaDevice) {
  std::string why;
  cuda_ = cuda::initDriver(&why);
  if (cuda_ == nullptr) fail(ncclSystemError, "NET/railnet: doorbell: CUDA is unusable: %s", why.c_str());
  if (cuda_->cuDeviceGet(&handle_, cudaDevice) != cuda::CUDA_SUCCESS ||
      cuda_->cuDevicePrimaryCtxRetain(&context_, handle_) != cuda::CUDA_SUCCESS) {
    fail(ncclSystemError, "NET/railnet: doorbell: no CUDA device %d", cudaDevice);
  }
}

PrimaryContext::~PrimaryContext() { cuda_->cuDevicePrimaryCtxRelease(handle_); }

MappedMemory::MappedMemory(int cudaDevice, size_t bytes) {
  if (cudaDevice >= 0) {
    gpu_ = std::make_unique<PrimaryContext>(cudaDevice);
    const cuda::DriverApi& cuda = gpu_->cuda();
    cuda::CUresult result = cuda::CUDA_ERROR_INVALID_CONTEXT;
    {
      staging::ContextScope scope(cuda, gpu_->context());
      if (scope.ok()) result = cuda.cuMemHostAlloc(&data_, bytes, kPortable | kDeviceMap);
    }
    if (result != cuda::CUDA_SUCCESS) {
      fail(ncclSystemError, "NET/railnet: doorbell: cuMemHostAlloc of %zu bytes: %s", bytes,
           cuda.errorText(result).c_str());
    }
  } else {
    data_ = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (data_ == nullptr) fail(ncclSystemError, "NET/railnet: doorbell: no memory for %zu bytes", bytes);
  }
  std::memset(data_, 0, bytes);
}

MappedMemory::~MappedMemory() {
  if (gpu_ != nullptr) {
    gpu_->cuda().cuMemFreeHost(data_);
  } else {
    std::free(data_);
  }
}

}  // namespace railnet::doorbell
