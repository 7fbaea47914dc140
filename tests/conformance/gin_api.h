// Loads the plugin's GPU-initiated networking tables the way NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, then dlsym of
// the data symbols ncclGinPlugin_v11 (NCCL 2.28), ncclGinPlugin_v13 (2.30.3) and ncclRmaPlugin_v14 (2.30.7+)) and
// puts one interface over the three, so a test runs unchanged on each. Layouts: include/railnet/nccl/gin.h.
//
// The differences the adapters hide, as NCCL's callers meet them:
// - v11 has no context in PROXY mode (createContext is never called): iput/iputSignal/ginProgress take the
//   collComm; v13/v14 call createContext(collComm, config) and key iput/iputSignal/progress by (ginCtx, index).
// - v11/v13 regMrSym returns a ginHandle next to the mhandle and NCCL hands the ginHandle to iput (it travels in
//   the GPU's descriptors); v14 has no ginHandle and iput gets the mhandle. deregMrSym always takes the mhandle.
// - v14 iputSignal carries isStrongSignal (the harness passes true).
// - test(collComm, request, &done) is the same everywhere.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "harness.h"
#include "railnet/nccl/gin.h"

namespace conformance {

// The GIN/RMA tables the plugin must export, in the order the harness drives them.
inline constexpr const char* kGinSymbols[] = {"ncclGinPlugin_v11", "ncclGinPlugin_v13", "ncclRmaPlugin_v14"};

// What the GIN getProperties reports (v11 and v12 property structs, the fields NCCL's GIN code reads).
struct GinProps {
  const char* name = nullptr;
  int ptrSupport = 0;
  int maxRecvs = 0;
  int netDeviceType = -1;
  int netDeviceVersion = 0;
};

// What a put is issued on: the collComm, and for v13/v14 the context object createContext returned.
struct GinEndpoint {
  void* collComm = nullptr;
  void* ginCtx = nullptr;  // nullptr for v11
};

class GinApi {
 public:
  virtual ~GinApi() = default;
  virtual const char* symbol() const = 0;  // "ncclGinPlugin_v11", ...
  virtual int version() const = 0;         // 11, 13 or 14
  virtual const char* name() const = 0;    // the table's name field
  // True when NCCL calls createContext in PROXY mode and puts name a context index (v13, v14).
  virtual bool hasContexts() const = 0;
  // Entries NCCL calls (for this table's version, in PROXY mode) that the table leaves NULL.
  virtual std::vector<std::string> missingFunctions() const = 0;
  virtual bool hasDmaBufRegistration() const = 0;

  // init passes the harness's capturing logger (log_capture.h), as NCCL passes its own.
  virtual ncclResult_t init(void** ctx, uint64_t commId) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;
  virtual ncclResult_t devices(int* ndev) = 0;
  virtual ncclResult_t getProperties(int dev, GinProps* props) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) = 0;
  virtual ncclResult_t connect(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm) = 0;
  virtual ncclResult_t closeListen(void* listenComm) = 0;
  virtual ncclResult_t closeColl(void* collComm) = 0;
  // v13: createContext(collComm, {nSignals 0, nCounters 0, nContexts, queueDepth 0, trafficClass -1}, &ctx,
  // NULL); v14: createContext(collComm, {nContexts, trafficClass -1, rankStride 1}, &ctx). v11: sets *ginCtx to
  // nullptr and returns ncclSuccess without calling the plugin (NCCL 2.28 never does in PROXY mode).
  virtual ncclResult_t createContext(void* collComm, int nContexts, void** ginCtx) = 0;
  // v11: no call (ncclSuccess).
  virtual ncclResult_t destroyContext(void* ginCtx) = 0;
  // *putHandle is what iput/iputSignal are to receive for this window: the ginHandle (v11, v13), the mhandle
  // (v14).
  virtual ncclResult_t regMrSym(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                                void** putHandle) = 0;
  virtual ncclResult_t deregMrSym(void* collComm, void* mhandle) = 0;
  // `context` must be 0 for v11 (ncclInvalidUsage without calling the plugin otherwise).
  virtual ncclResult_t iput(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size,
                            uint64_t dstOff, void* dstHandle, uint32_t rank, void** request) = 0;
  virtual ncclResult_t iputSignal(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size,
                                  uint64_t dstOff, void* dstHandle, uint32_t rank, uint64_t signalOff,
                                  void* signalHandle, uint64_t signalValue, uint32_t signalOp, void** request) = 0;
  virtual ncclResult_t test(void* collComm, void* request, int* done) = 0;
  // ginProgress(collComm) (v11), ginProgress(ginCtx) (v13), rmaProgress(rmaCtx) (v14); ncclSuccess when NULL.
  virtual ncclResult_t progress(const GinEndpoint& ep) = 0;
};

// The plugin dlopen'ed once, with an adapter for each GIN/RMA table it exports.
class GinLibrary {
 public:
  // Throws TestFailure when the library cannot be opened.
  explicit GinLibrary(const std::string& path);
  ~GinLibrary();
  GinLibrary(const GinLibrary&) = delete;
  GinLibrary& operator=(const GinLibrary&) = delete;

  // The exported tables, in kGinSymbols order.
  const std::vector<GinApi*>& tables() const { return tables_; }
  // The symbols of kGinSymbols that are not exported.
  const std::vector<std::string>& missing() const { return missing_; }
  // The loaded library itself (for the net tables).
  const PluginLibrary& library() const { return *library_; }

 private:
  std::unique_ptr<PluginLibrary> library_;
  std::vector<std::unique_ptr<GinApi>> owned_;
  std::vector<GinApi*> tables_;
  std::vector<std::string> missing_;
};

const char* signalOpName(uint32_t op);

}  // namespace conformance
