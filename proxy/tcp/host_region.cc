#include "proxy/tcp/host_region.h"

#include "railnet/error.h"

namespace railnet::tcp {

std::unique_ptr<MemoryRegion> registerHostMemory(void* data, size_t size, int type) {
  if (type != NCCL_PTR_HOST) {
    fail(ncclInvalidArgument, "NET/railnet: the TCP transport registers host memory only (type %d asked)", type);
  }
  return std::make_unique<HostRegion>(data, size);
}

}  // namespace railnet::tcp
