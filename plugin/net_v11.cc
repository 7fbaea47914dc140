// ABI v11 (NCCL 2.28-2.29): v12's table with the v11 property struct (no railId/planeId, 4 vProps devices).
#include "plugin/net_core.h"

namespace railnet::net {
namespace {

ncclResult_t initV11(void** ctx, uint64_t commId, ncclNetCommConfig_v11_t* config, ncclDebugLogger_t logger,
                     ncclProfilerCallback_t) {
  return init(11, logger, ctx, commId, config != nullptr ? config->trafficClass : NCCL_NET_TRAFFIC_CLASS_UNDEF);
}
ncclResult_t listenV11(void*, int dev, void* handle, void** listenComm) { return listen(dev, handle, listenComm); }
ncclResult_t connectV11(void*, int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v11_t** devComm) {
  return connect(dev, handle, sendComm, devComm);
}
ncclResult_t isendV11(void* comm, void* data, size_t size, int tag, void* mhandle, void*, void** request) {
  return isend(comm, data, size, tag, mhandle, request);
}
ncclResult_t irecvV11(void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles, void**,
                      void** request) {
  return irecv(comm, n, data, sizes, tags, mhandles, request);
}
ncclResult_t setNetAttrV11(void* ctx, ncclNetAttr_v11_t* attr) {
  // Same layout as v12's attribute struct.
  static_assert(sizeof(ncclNetAttr_v11_t) == sizeof(ncclNetAttr_v12_t));
  return setNetAttr(ctx, reinterpret_cast<const ncclNetAttr_v12_t*>(attr));
}

}  // namespace
}  // namespace railnet::net

using namespace railnet::net;

extern "C" {
__attribute__((visibility("default"))) ncclNet_v11_t ncclNetPlugin_v11 = {
    "railnet", initV11, devices, getProperties<ncclNetProperties_v11_t>, listenV11, connectV11, accept, regMr,
    regMrDmaBuf, deregMr, isendV11, irecvV11, iflush, test, closeSend, closeRecv, closeListen,
    /*getDeviceMr=*/nullptr, /*irecvConsumed=*/nullptr, makeVDeviceFor<ncclNetVDeviceProps_v11_t>, finalize,
    setNetAttrV11,
};
}  // extern "C"
