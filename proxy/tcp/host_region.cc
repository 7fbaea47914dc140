#include "proxy/tcp/host_region.h"

#include "railnet/error.h"

namespace railnet::tcp {

std::unique_ptr<MemoryRegion> HostRegistrar::regMr(void* data, size_t size, int type) {
  if (type != NCCL_PTR_HOST) {
    fail(ncclInvalidArgument, "NET/railnet: the TCP transport registers host memory only (type %d asked)", type);
  }
  return std::make_unique<HostRegion>(data, size);
}

std::unique_ptr<MemoryRegion> HostRegistrar::regMrDmaBuf(void*, size_t, int, uint64_t, int) {
  return regMr(nullptr, 0, NCCL_PTR_DMABUF);  // refused with its reason
}

MemoryRegistrar& hostRegistrar() noexcept {
  static HostRegistrar registrar;
  return registrar;
}

}  // namespace railnet::tcp
