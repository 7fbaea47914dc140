// railnet's one implementation of NCCL's GIN proxy backend and RMA plugin (proxy/rma/ does the work). The
// per-version files (gin_v11.cc, gin_v13.cc, rma_v14.cc) are thin adapters over these functions. Every handle NCCL
// passes back (listen comm, collective comm, context) is looked up among the live ones before it is touched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "plugin/net_core.h"
#include "proxy/rma/control_record.h"
#include "railnet/nccl/gin.h"

namespace railnet::gin {

ncclResult_t init(void** ctx, uint64_t commId, ncclDebugLogger_t logger);
ncclResult_t finalize(void* ctx);
// 0 devices when RAILNET_GIN=0 (NCCL then has no GIN from railnet).
ncclResult_t devices(int* ndev);
ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm);
ncclResult_t connect(void* ctx, void** handles, int nranks, int rank, void* listenComm, void** collComm);
ncclResult_t closeListen(void* listenComm);
ncclResult_t closeColl(void* collComm);
ncclResult_t regMrSym(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                      void** ginHandle);
ncclResult_t regMrSymDmaBuf(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                            uint64_t mrFlags, void** mhandle, void** ginHandle);
ncclResult_t deregMrSym(void* collComm, void* mhandle);
// NCCL 2.30 contexts: ginCtx stands for a comm and its context count.
ncclResult_t createContext(void* collComm, int contexts, void** ginCtx);
ncclResult_t destroyContext(void* ginCtx);
// handle: a collective comm (v11) or a context (v13, v14); `context` < the context's count.
ncclResult_t put(void* handle, bool isContext, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                 uint64_t dstOff, void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                 uint64_t signalValue, uint32_t signalOp, void** request);
ncclResult_t get(void* ginCtx, uint32_t rank, void** request);
ncclResult_t flush(void* ginCtx, int context, void** request);
ncclResult_t test(void* collComm, void* request, int* done);
ncclResult_t progress(void* handle, bool isContext);
ncclResult_t queryLastError(void* ginCtx, bool* hasError);

// The net device's properties with the GIN proxy device type (the net table keeps reporting HOST).
template <class Properties>
ncclResult_t getProperties(int dev, Properties* props) {
  ncclResult_t result = net::getProperties(dev, props);
  if (result != ncclSuccess) return result;
  props->netDeviceType = NCCL_NET_DEVICE_GIN_PROXY;
  props->netDeviceVersion = 0;  // NCCL sets the proxy's version itself
  return ncclSuccess;
}

}  // namespace railnet::gin
