// ABI v8 (NCCL 2.20-2.23): int sizes on isend/irecv; NCCL caps those transfers at 1 GiB itself.
#include "plugin/net_core.h"

#include "railnet/log.h"

namespace railnet::net {
namespace {

ncclResult_t initV8(ncclDebugLogger_t logger) { return init(8, logger, nullptr, 0, NCCL_NET_TRAFFIC_CLASS_UNDEF); }

ncclResult_t isendV8(void* comm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) {
    RN_WARN("NET/railnet: isend of a negative size (%d)", size);
    return ncclInvalidArgument;
  }
  return isend(comm, data, static_cast<size_t>(size), tag, mhandle, request);
}

ncclResult_t irecvV8(void* comm, int n, void** data, int* sizes, int* tags, void** mhandles, void** request) {
  if (n < 1 || n > NCCL_NET_MAX_DEVS_PER_NIC_V12) {
    RN_WARN("NET/railnet: irecv of %d buffers; railnet takes 1 to 8", n);
    return ncclInvalidUsage;
  }
  size_t wide[NCCL_NET_MAX_DEVS_PER_NIC_V12];
  for (int i = 0; i < n; ++i) {
    if (sizes[i] < 0) {
      RN_WARN("NET/railnet: irecv buffer %d has a negative size (%d)", i, sizes[i]);
      return ncclInvalidArgument;
    }
    wide[i] = static_cast<size_t>(sizes[i]);
  }
  return irecv(comm, n, data, wide, tags, mhandles, request);
}

}  // namespace
}  // namespace railnet::net

using namespace railnet::net;

extern "C" {
__attribute__((visibility("default"))) ncclNet_v8_t ncclNetPlugin_v8 = {
    "railnet", initV8, devices, getProperties<ncclNetProperties_v8_t>, listen, connect, accept, regMr,
    regMrDmaBuf, deregMr, isendV8, irecvV8, iflush, test, closeSend, closeRecv, closeListen,
    /*getDeviceMr=*/nullptr, /*irecvConsumed=*/nullptr,
};
}  // extern "C"
