// ABI v9 (NCCL 2.24-2.25): size_t sizes, no profiler handles, one global init.
#include "plugin/net_core.h"

namespace railnet::net {
namespace {

ncclResult_t initV9(ncclDebugLogger_t logger) { return init(9, logger, nullptr, 0, NCCL_NET_TRAFFIC_CLASS_UNDEF); }
ncclResult_t irecvV9(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, request);
}

}  // namespace
}  // namespace railnet::net

using namespace railnet::net;

extern "C" {
__attribute__((visibility("default"))) ncclNet_v9_t ncclNetPlugin_v9 = {
    "railnet", initV9, devices, getProperties<ncclNetProperties_v9_t>, listen, connect, accept, regMr,
    regMrDmaBuf, deregMr, isend, irecvV9, iflush, test, closeSend, closeRecv, closeListen,
    /*getDeviceMr=*/nullptr, /*irecvConsumed=*/nullptr, makeVDeviceFor<ncclNetVDeviceProps_v9_t>,
};
}  // extern "C"
