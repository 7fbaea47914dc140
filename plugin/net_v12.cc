// ABI v12 (NCCL 2.30+): the core's own shape.
#include "plugin/net_core.h"

namespace railnet::net {
namespace {

ncclResult_t initV12(void** ctx, uint64_t commId, ncclNetCommConfig_v12_t* config, ncclDebugLogger_t logger,
                     ncclProfilerCallback_t) {
  return init(12, logger, ctx, commId, config != nullptr ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF);
}
ncclResult_t listenV12(void*, int dev, void* handle, void** listenComm) { return listen(dev, handle, listenComm); }
ncclResult_t connectV12(void*, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v12_t** devComm) {
  return connect(dev, handle, sendComm, devComm);
}
ncclResult_t isendV12(void* comm, void* data, size_t size, int tag, void* mhandle, void*, void** request) {
  return isend(comm, data, size, tag, mhandle, request);
}
ncclResult_t irecvV12(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                      void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, request);
}
ncclResult_t setNetAttrV12(void* ctx, ncclNetAttr_v12_t* attr) { return setNetAttr(ctx, attr); }

}  // namespace
}  // namespace railnet::net

using namespace railnet::net;

extern "C" {
__attribute__((visibility("default"))) ncclNet_v12_t ncclNetPlugin_v12 = {
    "railnet", initV12, devices, getProperties<ncclNetProperties_v12_t>, listenV12, connectV12, accept, regMr,
    regMrDmaBuf, deregMr, isendV12, irecvV12, iflush, test, closeSend, closeRecv, closeListen,
    /*getDeviceMr=*/nullptr, /*irecvConsumed=*/nullptr, makeVDeviceFor<ncclNetVDeviceProps_v12_t>, finalize,
    setNetAttrV12,
};
}  // extern "C"
