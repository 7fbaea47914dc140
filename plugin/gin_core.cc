#include "plugin/gin_core.h"

#include <memory>

#include "plugin/guard.h"
#include "plugin/live_set.h"
#include "proxy/rma/rma_comm.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::gin {
namespace {

struct GinContext {
  uint64_t commId;
};

LiveSet<GinContext>& contexts() {
  static LiveSet<GinContext> instance("GIN");
  return instance;
}
LiveSet<rma::RmaListen>& listens() {
  static LiveSet<rma::RmaListen> instance("GIN");
  return instance;
}
LiveSet<rma::RmaComm>& comms() {
  static LiveSet<rma::RmaComm> instance("GIN");
  return instance;
}
LiveSet<rma::RmaContext>& rmaContexts() {
  static LiveSet<rma::RmaContext> instance("GIN");
  return instance;
}

rma::RmaComm& commOf(const char* entryPoint, void* collComm) {
  return *comms().find(entryPoint, "GIN collective comm", collComm);
}

rma::SignalOp signalOpOf(uint32_t signalOp) {
  switch (signalOp) {
    case 0: return rma::SignalOp::kNone;
    case NCCL_NET_SIGNAL_OP_INC: return rma::SignalOp::kInc;
    case NCCL_NET_SIGNAL_OP_ADD: return rma::SignalOp::kAdd;
  }
  fail(ncclInvalidArgument, "NET/railnet: GIN: unknown signal op %u (INC = 1, ADD = 2)", signalOp);
}

}  // namespace

ncclResult_t init(void** ctx, uint64_t commId, ncclDebugLogger_t logger) {
  // The transport is the net side's: NCCL initialises the net table first, but a GIN-first caller gets it too.
  ncclResult_t result = net::init(0, logger, nullptr, commId, NCCL_NET_TRAFFIC_CLASS_UNDEF);
  if (result != ncclSuccess) return result;
  return guarded("GIN init", [&] {
    if (ctx == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN init with a NULL context pointer");
    *ctx = contexts().add(std::make_unique<GinContext>(GinContext{commId}));
    return ncclSuccess;
  });
}

ncclResult_t finalize(void* ctx) {
  return guarded("GIN finalize", [&] {
    contexts().take("finalize", "GIN context", ctx);
    return ncclSuccess;
  });
}

ncclResult_t devices(int* ndev) {
  return guarded("GIN devices", [&] {
    if (ndev == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN devices with a NULL pointer");
    *ndev = settings().gin != 0 ? net::sharedTransport().deviceCount() : 0;
    return ncclSuccess;
  });
}

ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) {
  return guarded("GIN listen", [&] {
    contexts().find("listen", "GIN context", ctx);
    if (handle == nullptr || listenComm == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN listen with NULL arguments");
    Transport& transport = net::sharedTransport();
    if (dev < 0 || dev >= transport.deviceCount()) {
      fail(ncclInvalidArgument, "NET/railnet: GIN listen on device %d; railnet has %d", dev, transport.deviceCount());
    }
    *listenComm = listens().add(std::make_unique<rma::RmaListen>(transport, dev, handle));
    return ncclSuccess;
  });
}

ncclResult_t connect(void* ctx, void** handles, int nranks, int rank, void* listenComm, void** collComm) {
  return guarded("GIN connect", [&] {
    contexts().find("connect", "GIN context", ctx);
    if (collComm == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN connect with a NULL collComm pointer");
    rma::RmaListen* listen = listens().find("connect", "GIN listen comm", listenComm);
    *collComm = comms().add(std::make_unique<rma::RmaComm>(*listen, handles, nranks, rank));
    return ncclSuccess;
  });
}

ncclResult_t closeListen(void* listenComm) {
  return guarded("GIN closeListen", [&] {
    listens().take("closeListen", "GIN listen comm", listenComm);
    return ncclSuccess;
  });
}

ncclResult_t closeColl(void* collComm) {
  return guarded("GIN closeColl", [&] {
    comms().take("closeColl", "GIN collective comm", collComm);
    return ncclSuccess;
  });
}

ncclResult_t regMrSym(void* collComm, void* data, size_t size, int type, uint64_t /*mrFlags*/, void** mhandle,
                      void** ginHandle) {
  // mrFlags: FORCE_SO asks for strongly ordered PCIe writes to the signal array; railnet writes a signal only after
  // the payloads before it have landed, so every signal is strongly ordered.
  return guarded("GIN regMrSym", [&] {
    if (mhandle == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN regMrSym with a NULL mhandle pointer");
    *mhandle = commOf("regMrSym", collComm).registerWindow(data, size, type, false, 0, -1);
    if (ginHandle != nullptr) *ginHandle = *mhandle;
    return ncclSuccess;
  });
}

ncclResult_t regMrSymDmaBuf(void* collComm, void* data, size_t size, int type, uint64_t offset, int fd,
                            uint64_t /*mrFlags*/, void** mhandle, void** ginHandle) {
  return guarded("GIN regMrSymDmaBuf", [&] {
    if (mhandle == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN regMrSymDmaBuf with a NULL mhandle pointer");
    *mhandle = commOf("regMrSymDmaBuf", collComm).registerWindow(data, size, type, true, offset, fd);
    if (ginHandle != nullptr) *ginHandle = *mhandle;
    return ncclSuccess;
  });
}

ncclResult_t deregMrSym(void* collComm, void* mhandle) {
  return guarded("GIN deregMrSym", [&] {
    commOf("deregMrSym", collComm).deregisterWindow(mhandle);
    return ncclSuccess;
  });
}

ncclResult_t createContext(void* collComm, int contextCount, void** ginCtx) {
  return guarded("GIN createContext", [&] {
    if (ginCtx == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN createContext with a NULL context pointer");
    rma::RmaComm& comm = commOf("createContext", collComm);
    const int count = contextCount > 0 ? contextCount : 1;
    *ginCtx = rmaContexts().add(std::make_unique<rma::RmaContext>(rma::RmaContext{&comm, count}));
    return ncclSuccess;
  });
}

ncclResult_t destroyContext(void* ginCtx) {
  return guarded("GIN destroyContext", [&] {
    rmaContexts().take("destroyContext", "GIN context object", ginCtx);
    return ncclSuccess;
  });
}

namespace {

rma::RmaComm& commOfHandle(const char* entryPoint, void* handle, bool isContext, int context) {
  if (!isContext) return commOf(entryPoint, handle);
  rma::RmaContext* found = rmaContexts().find(entryPoint, "GIN context object", handle);
  if (context < 0 || context >= found->contexts) {
    fail(ncclInvalidArgument, "NET/railnet: GIN %s on context %d; createContext made %d", entryPoint, context,
         found->contexts);
  }
  return *found->comm;
}

}  // namespace

ncclResult_t put(void* handle, bool isContext, int context, uint64_t srcOff, void* srcMhandle, size_t size,
                 uint64_t dstOff, void* dstMhandle, uint32_t rank, uint64_t signalOff, void* signalMhandle,
                 uint64_t signalValue, uint32_t signalOp, void** request) {
  return guarded("GIN iput", [&] {
    if (request == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN iput with a NULL request pointer");
    rma::RmaComm& comm = commOfHandle("iput", handle, isContext, context);
    rma::PutArguments arguments;
    arguments.context = context;
    arguments.srcOffset = srcOff;
    arguments.srcHandle = srcMhandle;
    arguments.size = size;
    arguments.dstOffset = dstOff;
    arguments.dstHandle = dstMhandle;
    arguments.rank = rank;
    arguments.signalOp = signalOpOf(signalOp);
    arguments.signalOffset = signalOff;
    arguments.signalHandle = signalMhandle;
    arguments.signalValue = signalValue;
    return comm.put(arguments, request);
  });
}

ncclResult_t get(void* ginCtx, uint32_t rank, void** request) {
  return guarded("GIN iget", [&] {
    if (request != nullptr) *request = nullptr;
    rmaContexts().find("iget", "GIN context object", ginCtx);
    fail(ncclInvalidUsage, "NET/railnet: GIN iget from rank %u: railnet does not implement one-sided gets "
         "(NCCL's device API puts only; docs/design.md, One-sided puts)", rank);
    return ncclSuccess;
  });
}

ncclResult_t flush(void* ginCtx, int context, void** request) {
  return guarded("GIN iflush", [&] {
    if (request == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN iflush with a NULL request pointer");
    return commOfHandle("iflush", ginCtx, true, context).completedRequest(request);
  });
}

ncclResult_t test(void* collComm, void* request, int* done) {
  return guarded("GIN test", [&] {
    if (done == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN test with a NULL done pointer");
    *done = 0;
    return commOf("test", collComm).test(request, done);
  });
}

ncclResult_t progress(void* handle, bool isContext) {
  return guarded("GIN progress", [&] { return commOfHandle("progress", handle, isContext, 0).progress(); });
}

ncclResult_t queryLastError(void* ginCtx, bool* hasError) {
  return guarded("GIN queryLastError", [&] {
    if (hasError == nullptr) fail(ncclInvalidArgument, "NET/railnet: GIN queryLastError with a NULL pointer");
    *hasError = commOfHandle("queryLastError", ginCtx, true, 0).failed();
    return ncclSuccess;
  });
}

}  // namespace railnet::gin
