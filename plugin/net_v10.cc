// ABI v10 (NCCL 2.26-2.27): one global init with a profiler callback; connect carries the comm config.
#include "plugin/net_core.h"

namespace railnet::net {
namespace {

ncclResult_t initV10(ncclDebugLogger_t logger, ncclProfilerCallback_t) {
  return init(10, logger, nullptr, 0, NCCL_NET_TRAFFIC_CLASS_UNDEF);
}
ncclResult_t connectV10(int dev, ncclNetCommConfig_v10_t*, void* handle, void** sendComm,
                        ncclNetDeviceHandle_v10_t** devComm) {
  return connect(dev, handle, sendComm, devComm);
}
ncclResult_t isendV10(void* comm, void* data, size_t size, int tag, void* mhandle, void*, void** request) {
  return isend(comm, data, size, tag, mhandle, request);
}
ncclResult_t irecvV10(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                      void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, request);
}

}  // namespace
}  // namespace railnet::net

using namespace railnet::net;

extern "C" {
__attribute__((visibility("default"))) ncclNet_v10_t ncclNetPlugin_v10 = {
    "railnet", initV10, devices, getProperties<ncclNetProperties_v10_t>, listen, connectV10, accept, regMr,
    regMrDmaBuf, deregMr, isendV10, irecvV10, iflush, test, closeSend, closeRecv, closeListen,
    /*getDeviceMr=*/nullptr, /*irecvConsumed=*/nullptr, makeVDeviceFor<ncclNetVDeviceProps_v10_t>,
};
}  // extern "C"
