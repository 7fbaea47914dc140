#include "proxy/staging/nvlink_staging.h"

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::staging {
namespace {

// The device ordinal of the GPU with `busId`, or -1 with *why.
int deviceByBusId(const cuda::DriverApi& cuda, const std::string& busId, std::string* why) {
  if (cuda.cuDeviceGetByPCIBusId == nullptr) {
    *why = "the CUDA driver lacks cuDeviceGetByPCIBusId";
    return -1;
  }
  cuda::CUdevice device = -1;
  if (cuda::CUresult r = cuda.cuDeviceGetByPCIBusId(&device, busId.c_str()); r != cuda::CUDA_SUCCESS) {
    *why = "GPU " + busId + " is not visible to this process (" + cuda.errorText(r) + ")";
    return -1;
  }
  return device;
}

bool canAccessPeer(const cuda::DriverApi& cuda, int device, int peer, std::string* why) {
  if (device == peer) return true;
  int can = 0;
  if (cuda.cuDeviceCanAccessPeer == nullptr || cuda.cuMemcpyDtoDAsync == nullptr) {
    *why = "the CUDA driver lacks cuDeviceCanAccessPeer or cuMemcpyDtoDAsync";
    return false;
  }
  if (cuda::CUresult r = cuda.cuDeviceCanAccessPeer(&can, device, peer); r != cuda::CUDA_SUCCESS || can == 0) {
    *why = "GPU " + std::to_string(device) + " has no peer access to GPU " + std::to_string(peer) +
           (r != cuda::CUDA_SUCCESS ? " (" + cuda.errorText(r) + ")" : "");
    return false;
  }
  return true;
}

}  // namespace

bool peerCopyPossible(const std::string& railGpuBusId, std::string* why) {
  if (railGpuBusId.empty()) {
    *why = "the routed port has no GPU on its rail";
    return false;
  }
  const cuda::DriverApi* cuda = cuda::initDriver(why);
  if (cuda == nullptr) return false;
  cuda::CUdevice current = -1;
  if (cuda::CUresult r = cuda->cuCtxGetDevice(&current); r != cuda::CUDA_SUCCESS) {
    *why = "the connecting thread has no current GPU (" + cuda->errorText(r) + ")";
    return false;
  }
  const int rail = deviceByBusId(*cuda, railGpuBusId, why);
  if (rail < 0) {
    // Not visible here: another process of this host may serve staging on it.
    std::string visible = *why;
    if (hopExchangeServed(railGpuBusId)) return true;
    *why = visible + ", and no railnet process of this host serves it";
    return false;
  }
  return canAccessPeer(*cuda, current, rail, why);
}

NvlinkStaging::NvlinkStaging(const cuda::DriverApi& cuda, const void* source, const std::string& railGpuBusId,
                             int slots, uint64_t pieceBytes)
    : slots_(slots), pieceBytes_(pieceBytes) {
  source_ = std::make_unique<DeviceContext>(cuda, source);
  std::string why;
  railDevice_ = deviceByBusId(cuda, railGpuBusId, &why);
  if (railDevice_ < 0) {
    imported_ = ImportedStaging::request(cuda, railGpuBusId, source_->device(), bytes(), &why);
    if (imported_ == nullptr) {
      fail(ncclSystemError, "NET/railnet: NVLink hop from GPU %d to GPU %s (another process's): %s",
           source_->device(), railGpuBusId.c_str(), why.c_str());
    }
    address_ = imported_->address();
  } else {
    if (!canAccessPeer(cuda, source_->device(), railDevice_, &why)) {
      fail(ncclSystemError, "NET/railnet: NVLink hop from GPU %d: %s", source_->device(), why.c_str());
    }
    local_ = cuda::CuMemAllocation::create(cuda, railDevice_, bytes(), {{source_->device()}, true, false}, &why);
    if (local_ == nullptr) {
      fail(ncclSystemError, "NET/railnet: NVLink hop staging of %zu bytes on GPU %d: %s", bytes(), railDevice_,
           why.c_str());
    }
    address_ = local_->address();
  }
  copyContext_ = chooseCopyContext(cuda, *source_, source, settings().tcpOwnCopyContext != 0, "NVLink hop");
  copies_ = std::make_unique<CopyQueue>(cuda, copyContext_ != nullptr ? copyContext_->context() : source_->context(),
                                        slots);
}

NvlinkStaging::~NvlinkStaging() {
  copies_.reset();  // waits for the copies in flight, before the memory they write goes away
  copyContext_.reset();
  local_.reset();
  imported_.reset();
}

}  // namespace railnet::staging
