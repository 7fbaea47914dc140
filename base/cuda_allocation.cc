#include "base/cuda_allocation.h"

#include <algorithm>

namespace railnet::cuda {

std::unique_ptr<CuMemAllocation> CuMemAllocation::create(const DriverApi& api, CUdevice device, size_t bytes,
                                                         std::string* why) {
  return create(api, device, bytes, Options{}, why);
}

std::unique_ptr<CuMemAllocation> CuMemAllocation::create(const DriverApi& api, CUdevice device, size_t bytes,
                                                         const Options& options, std::string* why) {
  if (api.cuMemCreate == nullptr || api.cuMemGetAllocationGranularity == nullptr || api.cuMemAddressReserve == nullptr ||
      api.cuMemAddressFree == nullptr || api.cuMemMap == nullptr || api.cuMemUnmap == nullptr ||
      api.cuMemSetAccess == nullptr || api.cuMemRelease == nullptr) {
    *why = "the CUDA driver lacks the cuMem API (CUDA >= 10.2)";
    return nullptr;
  }
  auto failed = [&](const char* call, CUresult result) {
    *why = std::string(call) + ": " + api.errorText(result);
    return nullptr;
  };
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.allocFlags.gpuDirectRDMACapable = options.gpuDirectRdma ? 1 : 0;
  if (options.shareable) {
    if (api.cuMemExportToShareableHandle == nullptr) {
      *why = "the CUDA driver lacks cuMemExportToShareableHandle";
      return nullptr;
    }
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  }
  size_t granularity = 0;
  if (CUresult r = api.cuMemGetAllocationGranularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS || granularity == 0) {
    return failed("cuMemGetAllocationGranularity", r);
  }
  const size_t rounded = (std::max<size_t>(bytes, 1) + granularity - 1) / granularity * granularity;
  std::unique_ptr<CuMemAllocation> allocation(new CuMemAllocation(api));
  if (CUresult r = api.cuMemCreate(&allocation->handle_, rounded, &prop, 0); r != CUDA_SUCCESS) {
    return failed("cuMemCreate", r);
  }
  allocation->created_ = true;
  if (CUresult r = api.cuMemAddressReserve(&allocation->address_, rounded, granularity, 0, 0); r != CUDA_SUCCESS) {
    allocation->address_ = 0;
    return failed("cuMemAddressReserve", r);
  }
  allocation->mapped_ = rounded;
  if (CUresult r = api.cuMemMap(allocation->address_, rounded, 0, allocation->handle_, 0); r != CUDA_SUCCESS) {
    return failed("cuMemMap", r);
  }
  allocation->mappedOk_ = true;
  std::vector<CUmemAccessDesc> access(1);
  access[0].location = prop.location;
  access[0].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (CUdevice peer : options.peers) {
    if (peer == device) continue;
    CUmemAccessDesc& grant = access.emplace_back();
    grant.location = {CU_MEM_LOCATION_TYPE_DEVICE, peer};
    grant.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  if (CUresult r = api.cuMemSetAccess(allocation->address_, rounded, access.data(), access.size()); r != CUDA_SUCCESS) {
    return failed("cuMemSetAccess", r);
  }
  return allocation;
}

int CuMemAllocation::exportFd(std::string* why) const {
  if (api_.cuMemExportToShareableHandle == nullptr) {
    *why = "the CUDA driver lacks cuMemExportToShareableHandle";
    return -1;
  }
  int fd = -1;
  if (CUresult r = api_.cuMemExportToShareableHandle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    *why = "cuMemExportToShareableHandle: " + api_.errorText(r);
    return -1;
  }
  return fd;
}

CuMemAllocation::~CuMemAllocation() {
  if (mappedOk_) api_.cuMemUnmap(address_, mapped_);
  if (address_ != 0) api_.cuMemAddressFree(address_, mapped_);
  if (created_) api_.cuMemRelease(handle_);
}

int exportDmabuf(const DriverApi& driver, uintptr_t begin, size_t length, std::string* why) {
  if (driver.cuMemGetHandleForAddressRange == nullptr) {
    if (why) *why = "libcuda lacks cuMemGetHandleForAddressRange";
    return -1;
  }
  int fd = -1;
  CUresult rc = driver.cuMemGetHandleForAddressRange(&fd, static_cast<CUdeviceptr>(begin), length,
                                                     CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (rc != CUDA_SUCCESS || fd < 0) {
    if (why) *why = "cuMemGetHandleForAddressRange: " + driver.errorText(rc);
    return -1;
  }
  return fd;
}

}  // namespace railnet::cuda
