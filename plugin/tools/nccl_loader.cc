#include "plugin/tools/nccl_loader.h"

#include <dlfcn.h>

#include <stdexcept>
#include <tuple>
#include <type_traits>

namespace railnet::nccl_loader {
namespace {

// ncclNetPlugin_vN's table; the structs it takes follow from its calls (PointeeOf).
template <int V>
struct Abi;
template <> struct Abi<8> { using Table = ncclNet_v8_t; };
template <> struct Abi<9> { using Table = ncclNet_v9_t; };
template <> struct Abi<10> { using Table = ncclNet_v10_t; };
template <> struct Abi<11> { using Table = ncclNet_v11_t; };
template <> struct Abi<12> { using Table = ncclNet_v12_t; };

// What argument I of the function pointer type F points to.
template <class F, size_t I>
struct PointeeOf;
template <class R, class... Args, size_t I>
struct PointeeOf<R (*)(Args...), I> {
  using type = std::remove_pointer_t<std::tuple_element_t<I, std::tuple<Args...>>>;
};

// What NCCL's v8 shim allows through its int-sized calls (MAX_NET_SIZE).
constexpr size_t kV8MaxNetSize = NCCL_V8_MAX_NET_SIZE;
constexpr int kMaxRecvBuffers = 8;  // NCCL_PROXY_MAX_SUBS bounds n in the shims

template <int V>
class Adapter final : public NetApi {
  using Table = typename Abi<V>::Table;
  using Props = typename PointeeOf<decltype(Table::getProperties), 1>::type;
  static constexpr bool kPerCommInit = V >= 11;

 public:
  Adapter(const Table* table, ncclDebugLogger_t logger, ncclProfilerCallback_t profiler)
      : t_(table), logger_(logger), profiler_(profiler) {}

  int version() const override { return V; }
  const char* name() const override { return t_->name; }

  std::vector<std::string> missingFunctions() const override {
    std::vector<std::string> missing;
    auto need = [&](const void* fn, const char* fnName) {
      if (!fn) missing.push_back(fnName);
    };
#define LOADER_NEED(field) need(reinterpret_cast<const void*>(t_->field), #field)
    LOADER_NEED(init);
    LOADER_NEED(devices);
    LOADER_NEED(getProperties);
    LOADER_NEED(listen);
    LOADER_NEED(connect);
    LOADER_NEED(accept);
    LOADER_NEED(regMr);
    LOADER_NEED(deregMr);
    LOADER_NEED(isend);
    LOADER_NEED(irecv);
    LOADER_NEED(iflush);
    LOADER_NEED(test);
    LOADER_NEED(closeSend);
    LOADER_NEED(closeRecv);
    LOADER_NEED(closeListen);
    if constexpr (kPerCommInit) LOADER_NEED(finalize);
#undef LOADER_NEED
    return missing;
  }

  ncclResult_t init(void** ctx, uint64_t commId, int trafficClass) override {
    *ctx = nullptr;
    if constexpr (kPerCommInit) {
      typename PointeeOf<decltype(Table::init), 2>::type config{trafficClass};  // ncclNetCommConfig_vN_t
      return t_->init(ctx, commId, &config, logger_, profiler_);
    } else {
      // NCCL's shims init a pre-v11 plugin only when their reference count is 0, and (v10) keep the comm
      // config in ctx for connect.
      std::lock_guard<std::mutex> lock(mutex_);
      if (refCount_ == 0) {
        ncclResult_t rc;
        if constexpr (V == 10) {
          rc = t_->init(logger_, profiler_);
        } else {
          rc = t_->init(logger_);
        }
        if (rc != ncclSuccess) return rc;
      }
      ++refCount_;
      if constexpr (V == 10) *ctx = new ncclNetCommConfig_v10_t{trafficClass};
      return ncclSuccess;
    }
  }

  ncclResult_t finalize(void* ctx) override {
    if constexpr (kPerCommInit) {
      return t_->finalize(ctx);
    } else {
      std::lock_guard<std::mutex> lock(mutex_);
      --refCount_;
      if constexpr (V == 10) delete static_cast<ncclNetCommConfig_v10_t*>(ctx);
      return ncclSuccess;
    }
  }

  void setNetAttr(void* ctx, bool p2p) override {
    if constexpr (kPerCommInit) {
      if (!t_->setNetAttr) return;
      // What NCCL's setupNetAttrs/setXferNetAttrs pass for a 2-rank communicator.
      typename PointeeOf<decltype(Table::setNetAttr), 1>::type attr{};  // ncclNetAttr_vN_t
      attr.sendCommAttr = {1, 1, p2p ? 2 : 4, 1};
      attr.recvCommAttr = attr.sendCommAttr;
      attr.op = p2p ? 0x3u : ~0u;
      attr.algo = ~0u;
      attr.proto = ~0u;
      (void)t_->setNetAttr(ctx, &attr);
    } else {
      (void)ctx;
      (void)p2p;
    }
  }

  ncclResult_t devices(int* ndev) override { return t_->devices(ndev); }

  ncclResult_t getProperties(int dev, DeviceProps* out) override {
    Props p{};
    ncclResult_t rc = t_->getProperties(dev, &p);
    if (rc != ncclSuccess) return rc;
    *out = DeviceProps{};
    out->name = p.name;
    out->pciPath = p.pciPath;
    out->guid = p.guid;
    out->ptrSupport = p.ptrSupport;
    out->regIsGlobal = p.regIsGlobal;
    out->speed = p.speed;
    out->port = p.port;
    out->latency = p.latency;
    out->maxComms = p.maxComms;
    out->maxRecvs = p.maxRecvs;
    out->netDeviceType = p.netDeviceType;
    out->netDeviceVersion = p.netDeviceVersion;
    out->maxMultiRequestSize = 1;
    if constexpr (V == 8) {
      out->vNdevs = 1;
      out->vDevs[0] = dev;
      out->maxP2pBytes = kV8MaxNetSize;
      out->reportsMaxP2pBytes = false;
    } else {
      out->forceFlush = p.forceFlush;
      out->vNdevs = p.vProps.ndevs;
      constexpr int kDevs = sizeof(p.vProps.devs) / sizeof(p.vProps.devs[0]);
      for (int i = 0; i < kDevs; ++i) out->vDevs[i] = p.vProps.devs[i];
      out->maxP2pBytes = p.maxP2pBytes;
      out->maxCollBytes = p.maxCollBytes;
      out->reportsMaxP2pBytes = true;
    }
    if constexpr (V >= 11) out->maxMultiRequestSize = p.maxMultiRequestSize;
    if constexpr (V >= 12) {
      out->railId = p.railId;
      out->planeId = p.planeId;
    }
    return ncclSuccess;
  }

  ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) override {
    if constexpr (kPerCommInit) {
      return t_->listen(ctx, dev, handle, listenComm);
    } else {
      (void)ctx;
      return t_->listen(dev, handle, listenComm);
    }
  }

  ncclResult_t connect(void* ctx, int dev, void* handle, void** sendComm, DevComm** devComm) override {
    if constexpr (kPerCommInit) {
      return t_->connect(ctx, dev, handle, sendComm, devComm);
    } else if constexpr (V == 10) {
      return t_->connect(dev, static_cast<ncclNetCommConfig_v10_t*>(ctx), handle, sendComm, devComm);
    } else {
      (void)ctx;
      return t_->connect(dev, handle, sendComm, devComm);
    }
  }

  ncclResult_t accept(void* listenComm, void** recvComm, DevComm** devComm) override {
    return t_->accept(listenComm, recvComm, devComm);
  }

  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) override {
    return t_->regMr(comm, data, size, type, mhandle);
  }

  ncclResult_t deregMr(void* comm, void* mhandle) override { return t_->deregMr(comm, mhandle); }

  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) override {
    if constexpr (V == 8) {
      if (size > kV8MaxNetSize) return ncclInternalError;
      return t_->isend(sendComm, data, static_cast<int>(size), tag, mhandle, request);
    } else if constexpr (V == 9) {
      return t_->isend(sendComm, data, size, tag, mhandle, request);
    } else {
      // NCCL passes a pointer to its per-step profiler handle slot.
      void* phandle = &profilerSlot_;
      return t_->isend(sendComm, data, size, tag, mhandle, phandle, request);
    }
  }

  ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                     void** request) override {
    if (n < 0 || n > kMaxRecvBuffers) return ncclInternalError;
    if constexpr (V == 8) {
      if (*request == reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION)) *request = nullptr;
      int intSizes[kMaxRecvBuffers];
      for (int i = 0; i < n; ++i) {
        if (sizes[i] > kV8MaxNetSize) return ncclInternalError;
        intSizes[i] = static_cast<int>(sizes[i]);
      }
      return t_->irecv(recvComm, n, data, intSizes, tags, mhandles, request);
    } else if constexpr (V == 9) {
      return t_->irecv(recvComm, n, data, sizes, tags, mhandles, request);
    } else {
      void* phandles[kMaxRecvBuffers];
      for (int i = 0; i < n; ++i) phandles[i] = &profilerSlot_;
      return t_->irecv(recvComm, n, data, sizes, tags, mhandles, phandles, request);
    }
  }

  ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) override {
    return t_->iflush(recvComm, n, data, sizes, mhandles, request);
  }

  ncclResult_t test(void* request, int* done, int* sizes) override { return t_->test(request, done, sizes); }
  ncclResult_t closeSend(void* sendComm) override { return t_->closeSend(sendComm); }
  ncclResult_t closeRecv(void* recvComm) override { return t_->closeRecv(recvComm); }
  ncclResult_t closeListen(void* listenComm) override { return t_->closeListen(listenComm); }

  int vDeviceRoom() const override {
    if constexpr (V >= 9) {
      constexpr int kRoom = sizeof(Props::vProps.devs) / sizeof(int);
      return t_->makeVDevice != nullptr ? kRoom : 0;
    } else {
      return 0;
    }
  }

  ncclResult_t makeVDevice(int* dev, const std::vector<int>& children) override {
    if (children.empty() || children.size() > static_cast<size_t>(vDeviceRoom())) return ncclInvalidUsage;
    if constexpr (V >= 9) {
      decltype(Props::vProps) props{};
      props.ndevs = static_cast<int>(children.size());
      for (size_t i = 0; i < children.size(); ++i) props.devs[i] = children[i];
      return t_->makeVDevice(dev, &props);
    } else {
      (void)dev;
      return ncclInvalidUsage;
    }
  }

 private:
  const Table* t_;
  ncclDebugLogger_t logger_;
  ncclProfilerCallback_t profiler_;
  std::mutex mutex_;
  int refCount_ = 0;
  void* profilerSlot_ = nullptr;  // never written by the harness; plugins may store an event handle in it
};

template <int V>
std::unique_ptr<NetApi> makeAdapter(void* symbol, ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) {
  return std::make_unique<Adapter<V>>(static_cast<const typename Abi<V>::Table*>(symbol), logger, profiler);
}

}  // namespace

std::string symbolName(int version) { return "ncclNetPlugin_v" + std::to_string(version); }

PluginLibrary::PluginLibrary(const std::string& path) : path_(path) {
  handle_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle_) {
    const char* err = dlerror();
    throw std::runtime_error("cannot dlopen " + path + ": " + (err ? err : "unknown error"));
  }
}

PluginLibrary::~PluginLibrary() {
  if (handle_) dlclose(handle_);
}

std::string PluginLibrary::close() {
  if (!handle_) return "";
  void* handle = handle_;
  handle_ = nullptr;
  if (dlclose(handle) == 0) return "";
  const char* err = dlerror();
  return err ? err : "unknown error";
}

void* PluginLibrary::symbol(const char* name) const { return dlsym(handle_, name); }

bool PluginLibrary::exports(int version) const { return symbol(symbolName(version).c_str()) != nullptr; }

int PluginLibrary::newestVersion() const {
  for (int v : kLoaderVersions) {
    if (exports(v)) return v;
  }
  return 0;
}

std::unique_ptr<NetApi> PluginLibrary::api(int version, ncclDebugLogger_t logger,
                                           ncclProfilerCallback_t profiler) const {
  void* table = symbol(symbolName(version).c_str());
  if (!table) return nullptr;
  switch (version) {
    case 8: return makeAdapter<8>(table, logger, profiler);
    case 9: return makeAdapter<9>(table, logger, profiler);
    case 10: return makeAdapter<10>(table, logger, profiler);
    case 11: return makeAdapter<11>(table, logger, profiler);
    case 12: return makeAdapter<12>(table, logger, profiler);
    default: return nullptr;
  }
}

}  // namespace railnet::nccl_loader
