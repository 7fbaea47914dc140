#include "gin_api.h"

#include <stdexcept>
#include <type_traits>

#include "log_capture.h"

namespace conformance {
namespace {

template <typename Props>
void copyProps(const Props& p, GinProps* out) {
  *out = GinProps{};
  out->name = p.name;
  out->ptrSupport = p.ptrSupport;
  out->maxRecvs = p.maxRecvs;
  out->netDeviceType = p.netDeviceType;
  out->netDeviceVersion = p.netDeviceVersion;
}

// The functions every version's PROXY path calls; `t` is any of the three tables.
template <typename Table>
std::vector<std::string> commonMissing(const Table* t) {
  std::vector<std::string> missing;
  auto need = [&](const void* fn, const char* fnName) {
    if (!fn) missing.push_back(fnName);
  };
#define GIN_NEED(field) need(reinterpret_cast<const void*>(t->field), #field)
  GIN_NEED(init);
  GIN_NEED(devices);
  GIN_NEED(getProperties);
  GIN_NEED(listen);
  GIN_NEED(connect);
  GIN_NEED(regMrSym);
  GIN_NEED(deregMrSym);
  GIN_NEED(closeColl);
  GIN_NEED(closeListen);
  GIN_NEED(iput);
  GIN_NEED(iputSignal);
  GIN_NEED(test);
  GIN_NEED(finalize);
#undef GIN_NEED
  return missing;
}

// What every table does alike: the calls whose signature is the same in v11, v13 and v14.
template <typename Table>
class TableApi : public GinApi {
 public:
  explicit TableApi(const Table* t) : t_(t) {}
  const char* name() const override { return t_->name; }
  bool hasDmaBufRegistration() const override { return t_->regMrSymDmaBuf != nullptr; }

  ncclResult_t init(void** ctx, uint64_t commId) override { return t_->init(ctx, commId, captureLogger()); }
  ncclResult_t finalize(void* ctx) override { return t_->finalize(ctx); }
  ncclResult_t devices(int* ndev) override { return t_->devices(ndev); }
  ncclResult_t getProperties(int dev, GinProps* out) override {
    // v11 reports ncclNetProperties_v11_t, v13 and v14 ncclNetProperties_v12_t.
    std::conditional_t<std::is_same_v<Table, ncclGin_v11_t>, ncclNetProperties_v11_t, ncclNetProperties_v12_t> p{};
    const ncclResult_t rc = t_->getProperties(dev, &p);
    if (rc == ncclSuccess) copyProps(p, out);
    return rc;
  }
  ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) override {
    return t_->listen(ctx, dev, handle, listenComm);
  }
  ncclResult_t connect(void* ctx, void* handles[], int nranks, int rank, void* listenComm, void** collComm) override {
    return t_->connect(ctx, handles, nranks, rank, listenComm, collComm);
  }
  ncclResult_t closeListen(void* listenComm) override { return t_->closeListen(listenComm); }
  ncclResult_t closeColl(void* collComm) override { return t_->closeColl(collComm); }
  ncclResult_t deregMrSym(void* collComm, void* mhandle) override { return t_->deregMrSym(collComm, mhandle); }
  ncclResult_t test(void* collComm, void* request, int* done) override { return t_->test(collComm, request, done); }

 protected:
  const Table* t_;
};

class GinV11 final : public TableApi<ncclGin_v11_t> {
 public:
  using TableApi::TableApi;
  const char* symbol() const override { return "ncclGinPlugin_v11"; }
  int version() const override { return 11; }
  bool hasContexts() const override { return false; }
  std::vector<std::string> missingFunctions() const override { return commonMissing(t_); }

  ncclResult_t createContext(void*, int, void** ginCtx) override {
    *ginCtx = nullptr;
    return ncclSuccess;
  }
  ncclResult_t destroyContext(void*) override { return ncclSuccess; }
  ncclResult_t regMrSym(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                        void** putHandle) override {
    return t_->regMrSym(collComm, data, size, type, mrFlags, mhandle, putHandle);
  }
  ncclResult_t iput(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size, uint64_t dstOff,
                    void* dstHandle, uint32_t rank, void** request) override {
    if (context != 0) return ncclInvalidUsage;
    return t_->iput(ep.collComm, srcOff, srcHandle, size, dstOff, dstHandle, rank, request);
  }
  ncclResult_t iputSignal(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size,
                          uint64_t dstOff, void* dstHandle, uint32_t rank, uint64_t signalOff, void* signalHandle,
                          uint64_t signalValue, uint32_t signalOp, void** request) override {
    if (context != 0) return ncclInvalidUsage;
    return t_->iputSignal(ep.collComm, srcOff, srcHandle, size, dstOff, dstHandle, rank, signalOff, signalHandle,
                          signalValue, signalOp, request);
  }
  ncclResult_t progress(const GinEndpoint& ep) override {
    return t_->ginProgress ? t_->ginProgress(ep.collComm) : ncclSuccess;
  }

};

class GinV13 final : public TableApi<ncclGin_v13_t> {
 public:
  using TableApi::TableApi;
  const char* symbol() const override { return "ncclGinPlugin_v13"; }
  int version() const override { return 13; }
  bool hasContexts() const override { return true; }
  std::vector<std::string> missingFunctions() const override {
    std::vector<std::string> missing = commonMissing(t_);
    if (!t_->createContext) missing.push_back("createContext");
    if (!t_->destroyContext) missing.push_back("destroyContext");
    return missing;
  }

  ncclResult_t createContext(void* collComm, int nContexts, void** ginCtx) override {
    // What NCCL 2.30.3's proxy layer passes (src/gin/gin_host_proxy.cc): no device handle in PROXY mode.
    ncclGinConfig_v13_t config{};
    config.nSignals = 0;
    config.nCounters = 0;
    config.nContexts = nContexts;
    config.queueDepth = 0;
    config.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
    return t_->createContext(collComm, &config, ginCtx, nullptr);
  }
  ncclResult_t destroyContext(void* ginCtx) override { return t_->destroyContext(ginCtx); }
  ncclResult_t regMrSym(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                        void** putHandle) override {
    return t_->regMrSym(collComm, data, size, type, mrFlags, mhandle, putHandle);
  }
  ncclResult_t iput(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size, uint64_t dstOff,
                    void* dstHandle, uint32_t rank, void** request) override {
    return t_->iput(ep.ginCtx, context, srcOff, srcHandle, size, dstOff, dstHandle, rank, request);
  }
  ncclResult_t iputSignal(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size,
                          uint64_t dstOff, void* dstHandle, uint32_t rank, uint64_t signalOff, void* signalHandle,
                          uint64_t signalValue, uint32_t signalOp, void** request) override {
    return t_->iputSignal(ep.ginCtx, context, srcOff, srcHandle, size, dstOff, dstHandle, rank, signalOff, signalHandle,
                          signalValue, signalOp, request);
  }
  ncclResult_t progress(const GinEndpoint& ep) override {
    return t_->ginProgress ? t_->ginProgress(ep.ginCtx) : ncclSuccess;
  }

};

class RmaV14 final : public TableApi<ncclRma_v14_t> {
 public:
  using TableApi::TableApi;
  const char* symbol() const override { return "ncclRmaPlugin_v14"; }
  int version() const override { return 14; }
  bool hasContexts() const override { return true; }
  std::vector<std::string> missingFunctions() const override {
    std::vector<std::string> missing = commonMissing(t_);
    if (!t_->createContext) missing.push_back("createContext");
    if (!t_->destroyContext) missing.push_back("destroyContext");
    return missing;
  }

  ncclResult_t createContext(void* collComm, int nContexts, void** ginCtx) override {
    ncclRmaConfig_v14_t config{};
    config.nContexts = nContexts;
    config.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
    config.rankStride = 1;
    return t_->createContext(collComm, &config, ginCtx);
  }
  ncclResult_t destroyContext(void* ginCtx) override { return t_->destroyContext(ginCtx); }
  ncclResult_t regMrSym(void* collComm, void* data, size_t size, int type, uint64_t mrFlags, void** mhandle,
                        void** putHandle) override {
    const ncclResult_t rc = t_->regMrSym(collComm, data, size, type, mrFlags, mhandle);
    *putHandle = rc == ncclSuccess ? *mhandle : nullptr;
    return rc;
  }
  ncclResult_t iput(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size, uint64_t dstOff,
                    void* dstHandle, uint32_t rank, void** request) override {
    return t_->iput(ep.ginCtx, context, srcOff, srcHandle, size, dstOff, dstHandle, rank, request);
  }
  ncclResult_t iputSignal(const GinEndpoint& ep, int context, uint64_t srcOff, void* srcHandle, size_t size,
                          uint64_t dstOff, void* dstHandle, uint32_t rank, uint64_t signalOff, void* signalHandle,
                          uint64_t signalValue, uint32_t signalOp, void** request) override {
    return t_->iputSignal(ep.ginCtx, context, srcOff, srcHandle, size, dstOff, dstHandle, rank, signalOff, signalHandle,
                          signalValue, signalOp, /*isStrongSignal=*/true, request);
  }
  ncclResult_t progress(const GinEndpoint& ep) override {
    return t_->rmaProgress ? t_->rmaProgress(ep.ginCtx) : ncclSuccess;
  }

};

}  // namespace

GinLibrary::GinLibrary(const std::string& path) {
  try {
    library_ = std::make_unique<PluginLibrary>(path);
  } catch (const std::exception& e) {
    throw TestFailure(e.what());
  }
  for (const char* symbol : kGinSymbols) {
    void* table = library_->symbol(symbol);
    if (!table) {
      missing_.push_back(symbol);
      continue;
    }
    const std::string s = symbol;
    if (s == "ncclGinPlugin_v11")
      owned_.push_back(std::make_unique<GinV11>(static_cast<const ncclGin_v11_t*>(table)));
    else if (s == "ncclGinPlugin_v13")
      owned_.push_back(std::make_unique<GinV13>(static_cast<const ncclGin_v13_t*>(table)));
    else
      owned_.push_back(std::make_unique<RmaV14>(static_cast<const ncclRma_v14_t*>(table)));
    tables_.push_back(owned_.back().get());
  }
}

GinLibrary::~GinLibrary() {
  tables_.clear();
  owned_.clear();
  library_.reset();
}

const char* signalOpName(uint32_t op) {
  switch (op) {
    case NCCL_NET_SIGNAL_OP_INC: return "INC";
    case NCCL_NET_SIGNAL_OP_ADD: return "ADD";
    default: return "(unknown op)";
  }
}

}  // namespace conformance
