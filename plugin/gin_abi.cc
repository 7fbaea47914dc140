// The GIN and RMA tables NCCL looks up in the net plugin .so (docs/design.md, One-sided puts):
//   ncclGinPlugin_v11  NCCL 2.28 (and the fallback of 2.29 / 2.30.3): iput/iputSignal/test/ginProgress on the
//                      collective comm, no createContext (PROXY mode).
//   ncclGinPlugin_v13  NCCL 2.30.3 (and the RMA fallback of 2.30.7): contexts from createContext.
//   ncclRmaPlugin_v14  NCCL 2.30.7+, whose own GIN proxy runs over it.
// Thin adapters over plugin/gin_core.
#include "plugin/gin_core.h"

namespace railnet::gin {
namespace {

// ---- v11 -----------------------------------------------------------------------------------------------------
ncclResult_t iputV11(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                     void* dstMhandle, uint32_t rank, void** request) {
  return put(collComm, false, 0, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, 0, nullptr, 0, 0, request);
}
ncclResult_t iputSignalV11(void* collComm, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                           void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                           uint64_t signalValue, uint32_t signalOp, void** request) {
  return put(collComm, false, 0, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, signalOff, signalMhandle,
             signalValue, signalOp, request);
}
ncclResult_t progressV11(void* collComm) { return progress(collComm, false); }

// ---- v13 and v14 ----------------------------------------------------------------------------------------------
ncclResult_t createContextV13(void* collComm, ncclGinConfig_v13_t* config, void** ginCtx,
                              ncclNetDeviceHandle_v11_t** devHandle) {
  if (devHandle != nullptr) *devHandle = nullptr;  // PROXY: NCCL builds the device side itself
  return createContext(collComm, config != nullptr ? config->nContexts : 1, ginCtx);
}
ncclResult_t createContextV14(void* collComm, ncclRmaConfig_v14_t* config, void** rmaCtx) {
  return createContext(collComm, config != nullptr ? config->nContexts : 1, rmaCtx);
}
ncclResult_t regMrSymV14(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle) {
  return regMrSym(collComm, data, size, type, mrFlags, mhandle, nullptr);
}
ncclResult_t regMrSymDmaBufV14(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                               uint64_t mrFlags, void** mhandle) {
  return regMrSymDmaBuf(collComm, data, size, type, offset, fd, mrFlags, mhandle, nullptr);
}
ncclResult_t iputV13(void* ginCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                     void* dstMhandle, uint32_t rank, void** request) {
  return put(ginCtx, true, context, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, 0, nullptr, 0, 0, request);
}
ncclResult_t iputSignalV13(void* ginCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                           void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                           uint64_t signalValue, uint32_t signalOp, void** request) {
  return put(ginCtx, true, context, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, signalOff, signalMhandle,
             signalValue, signalOp, request);
}
// isStrongSignal: every railnet signal is strong (applied after every earlier payload to that peer has landed).
ncclResult_t iputSignalV14(void* rmaCtx, int context, uint64_t srcOff, void* srcMhandle, size_t size, uint64_t dstOff,
                           void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                           uint64_t signalValue, uint32_t signalOp, bool /*isStrongSignal*/, void** request) {
  return iputSignalV13(rmaCtx, context, srcOff, srcMhandle, size, dstOff, dstMhandle, rank, signalOff, signalMhandle,
                       signalValue, signalOp, request);
}
ncclResult_t igetV13(void* ginCtx, int, uint64_t, void*, size_t, uint64_t, void*, uint32_t rank, void** request) {
  return get(ginCtx, rank, request);
}
ncclResult_t iflushV13(void* ginCtx, int context, void*, uint32_t, void** request) {
  return flush(ginCtx, context, request);
}
ncclResult_t progressV13(void* ginCtx) { return progress(ginCtx, true); }

}  // namespace
}  // namespace railnet::gin

using namespace railnet::gin;

extern "C" {
__attribute__((visibility("default"))) ncclGin_v11_t ncclGinPlugin_v11 = {
    "railnet", init, devices, getProperties<ncclNetProperties_v11_t>, listen, connect,
    /*createContext=*/nullptr, regMrSym, regMrSymDmaBuf, deregMrSym, /*destroyContext=*/nullptr, closeColl,
    closeListen, iputV11, iputSignalV11, test, progressV11, /*queryLastError=*/nullptr, finalize,
};

__attribute__((visibility("default"))) ncclGin_v13_t ncclGinPlugin_v13 = {
    "railnet", init, devices, getProperties<ncclNetProperties_v12_t>, listen, connect, createContextV13, regMrSym,
    regMrSymDmaBuf, deregMrSym, destroyContext, closeColl, closeListen, iputV13, iputSignalV13, igetV13, iflushV13,
    test, progressV13, queryLastError, finalize,
};

__attribute__((visibility("default"))) ncclRma_v14_t ncclRmaPlugin_v14 = {
    "railnet", init, devices, getProperties<ncclNetProperties_v12_t>, listen, connect, createContextV14, regMrSymV14,
    regMrSymDmaBufV14, deregMrSym, destroyContext, closeColl, closeListen, iputV13, iputSignalV14, igetV13, iflushV13,
    test, progressV13, queryLastError, finalize,
};
}  // extern "C"
