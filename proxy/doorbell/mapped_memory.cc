#include "proxy/doorbell/mapped_memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "railnet/error.h"
#include "railnet/nccl/common.h"

namespace railnet::doorbell {

MappedMemory::MappedMemory(int cudaDevice, size_t bytes) {
  if (cudaDevice >= 0) {
    std::string why;
    cuda_ = cuda::initDriver(&why);
    if (cuda_ == nullptr) fail(ncclSystemError, "NET/railnet: doorbell: CUDA is unusable: %s", why.c_str());
    cuda::CUdevice device = 0;
    if (cuda_->cuDeviceGet(&device, cudaDevice) != cuda::CUDA_SUCCESS ||
        cuda_->cuDevicePrimaryCtxRetain(&context_, device) != cuda::CUDA_SUCCESS) {
      fail(ncclSystemError, "NET/railnet: doorbell: no CUDA device %d", cudaDevice);
    }
    device_ = device;
    cuda_->cuCtxPushCurrent(context_);
    const cuda::CUresult result = cuda_->cuMemHostAlloc(&data_, bytes, kPortable | kDeviceMap);
    cuda::CUcontext popped = nullptr;
    cuda_->cuCtxPopCurrent(&popped);
    if (result != cuda::CUDA_SUCCESS) {
      cuda_->cuDevicePrimaryCtxRelease(device_);
      fail(ncclSystemError, "NET/railnet: doorbell: cuMemHostAlloc of %zu bytes: %s", bytes,
           cuda_->errorText(result).c_str());
    }
  } else {
    data_ = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
    if (data_ == nullptr) fail(ncclSystemError, "NET/railnet: doorbell: no memory for %zu bytes", bytes);
  }
  std::memset(data_, 0, bytes);
}
MappedMemory::~MappedMemory() {
  if (cuda_ != nullptr) {
    cuda_->cuMemFreeHost(data_);
    cuda_->cuDevicePrimaryCtxRelease(device_);
  } else {
    std::free(data_);
  }
}

}  // namespace railnet::doorbell
