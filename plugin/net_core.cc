#include "plugin/net_core.h"

#include <mutex>

#include "plugin/guard.h"
#include "proxy/tcp/tcp_transport.h"
#include "proxy/verbs/verbs_transport.h"
#include "railnet/settings.h"

namespace railnet::net {
namespace {

// Per-communicator context for ABI v11+.
struct Context {
  uint64_t commId;
  int trafficClass;
};

// Process-wide plugin state. It lives as long as the .so is loaded; NCCL dlcloses and reopens the plugin
// when its last communicator goes, which simply builds it again.
struct PluginState {
  std::mutex mutex;
  std::unique_ptr<Transport> transport;  // guarded by mutex until set, then read-only
  int abiVersion = 0;
  int contexts = 0;
};

PluginState& state() {
  static PluginState instance;
  return instance;
}

Transport& transport() {
  Transport* current = state().transport.get();
  if (current == nullptr) fail(ncclInvalidUsage, "NET/railnet: called before init");
  return *current;
}

void logStartup(int abiVersion, const Transport& chosen) {
  std::string names;
  for (int dev = 0; dev < chosen.deviceCount(); ++dev) {
    const DeviceInfo& info = chosen.device(dev);
    names += (dev > 0 ? ", " : "") + info.name + " (" + std::to_string(info.speedMbps / 1000) + " Gb/s)";
  }
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: railnet %s, net ABI v%d, %s transport, %d device(s): %s",
          RAILNET_VERSION, abiVersion, chosen.name(), chosen.deviceCount(), names.c_str());
}

// RAILNET_TRANSPORT=auto takes verbs when an RDMA port is active and says why not otherwise.
std::unique_ptr<Transport> chooseTransport() {
  const std::string& wanted = settings().transport;
  if (wanted != "auto" && wanted != "tcp" && wanted != "verbs") {
    fail(ncclInvalidUsage, "NET/railnet: RAILNET_TRANSPORT=%s; use auto, tcp or verbs", wanted.c_str());
  }
  if (wanted != "tcp") {
    std::string why;
    if (std::unique_ptr<Transport> verbs = verbs::createVerbsTransport(&why)) return verbs;
    if (wanted == "verbs") fail(ncclSystemError, "NET/railnet: RAILNET_TRANSPORT=verbs, but %s", why.c_str());
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: verbs transport unavailable (%s); using TCP", why.c_str());
  }
  return tcp::createTcpTransport();
}

Comm* asComm(void* comm) {
  if (comm == nullptr) fail(ncclInvalidUsage, "NET/railnet: NULL comm");
  return static_cast<Comm*>(comm);
}

}  // namespace

ncclResult_t init(int abiVersion, ncclDebugLogger_t logger, void** ctx, uint64_t commId, int trafficClass) {
  if (logger != nullptr) log::setLogger(logger);
  return guarded("init", [&] {
    PluginState& plugin = state();
    std::lock_guard<std::mutex> lock(plugin.mutex);
    if (!plugin.transport) {
      settings();  // read and validate RAILNET_* once, logging bad values now
      plugin.transport = chooseTransport();
      plugin.abiVersion = abiVersion;
      logStartup(abiVersion, *plugin.transport);
    }
    if (ctx != nullptr) {
      *ctx = new Context{commId, trafficClass};
      ++plugin.contexts;
    }
    return ncclSuccess;
  });
}

ncclResult_t finalize(void* ctx) {
  return guarded("finalize", [&] {
    if (ctx == nullptr) fail(ncclInvalidUsage, "NET/railnet: finalize with a NULL context");
    delete static_cast<Context*>(ctx);
    std::lock_guard<std::mutex> lock(state().mutex);
    --state().contexts;
    return ncclSuccess;
  });
}

ncclResult_t devices(int* ndev) {
  return guarded("devices", [&] {
    *ndev = transport().deviceCount();
    return ncclSuccess;
  });
}

ncclResult_t deviceInfo(int dev, const DeviceInfo** info) {
  return guarded("getProperties", [&] {
    *info = &transport().device(dev);
    return ncclSuccess;
  });
}

ncclResult_t listen(int dev, void* handle, void** listenComm) {
  return guarded("listen", [&] {
    if (handle == nullptr || listenComm == nullptr) fail(ncclInvalidUsage, "NET/railnet: listen with NULL arguments");
    *listenComm = transport().listen(dev, handle).release();
    return ncclSuccess;
  });
}

ncclResult_t connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** /*sendDevComm*/) {
  return guarded("connect", [&] {
    if (handle == nullptr || sendComm == nullptr) fail(ncclInvalidUsage, "NET/railnet: connect with NULL arguments");
    *sendComm = nullptr;
    std::unique_ptr<SendComm> comm;
    transport().connect(dev, handle, &comm);
    *sendComm = static_cast<Comm*>(comm.release());
    return ncclSuccess;
  });
}

ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** /*recvDevComm*/) {
  return guarded("accept", [&] {
    if (listenComm == nullptr || recvComm == nullptr) fail(ncclInvalidUsage, "NET/railnet: accept with NULL arguments");
    *recvComm = nullptr;
    std::unique_ptr<RecvComm> comm;
    static_cast<ListenComm*>(listenComm)->accept(&comm);
    *recvComm = static_cast<Comm*>(comm.release());
    return ncclSuccess;
  });
}

ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded("regMr", [&] {
    *mhandle = asComm(comm)->regMr(data, size, type).release();
    return ncclSuccess;
  });
}

ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  return guarded("regMrDmaBuf", [&] {
    *mhandle = asComm(comm)->regMrDmaBuf(data, size, type, offset, fd).release();
    return ncclSuccess;
  });
}

ncclResult_t deregMr(void* comm, void* mhandle) {
  return guarded("deregMr", [&] {
    asComm(comm);
    delete static_cast<MemoryRegion*>(mhandle);
    return ncclSuccess;
  });
}

ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return guarded("isend", [&] {
    auto* comm = static_cast<SendComm*>(asComm(sendComm));
    Request* posted = nullptr;
    ncclResult_t result = comm->isend(data, size, tag, static_cast<MemoryRegion*>(mhandle), &posted);
    *request = posted;
    return result;
  });
}

ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                   void** request) {
  return guarded("irecv", [&] {
    auto* comm = static_cast<RecvComm*>(asComm(recvComm));
    // *request may arrive as NCCL_NET_OPTIONAL_RECV_COMPLETION; we always complete receives, so it is a hint.
    Request* posted = nullptr;
    ncclResult_t result = comm->irecv(n, data, sizes, tags, reinterpret_cast<MemoryRegion**>(mhandles), &posted);
    *request = posted;
    return result;
  });
}

ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  return guarded("iflush", [&] {
    auto* comm = static_cast<RecvComm*>(asComm(recvComm));
    Request* posted = nullptr;
    ncclResult_t result = comm->iflush(n, data, sizes, reinterpret_cast<MemoryRegion**>(mhandles), &posted);
    *request = posted;
    return result;
  });
}

ncclResult_t test(void* request, int* done, int* sizes) {
  return guarded("test", [&] {
    if (request == nullptr) fail(ncclInvalidUsage, "NET/railnet: test of a NULL request");
    return static_cast<Request*>(request)->test(done, sizes);
  });
}

ncclResult_t closeSend(void* sendComm) {
  return guarded("closeSend", [&] {
    delete static_cast<SendComm*>(asComm(sendComm));
    return ncclSuccess;
  });
}

ncclResult_t closeRecv(void* recvComm) {
  return guarded("closeRecv", [&] {
    delete static_cast<RecvComm*>(asComm(recvComm));
    return ncclSuccess;
  });
}

ncclResult_t closeListen(void* listenComm) {
  return guarded("closeListen", [&] {
    delete static_cast<ListenComm*>(listenComm);
    return ncclSuccess;
  });
}

ncclResult_t setNetAttr(void* /*ctx*/, const ncclNetAttr_v12_t* attr) {
  return guarded("setNetAttr", [&] {
    // A hint about the traffic mix; the TCP transport balances chunks dynamically and has no use for it yet.
    if (attr != nullptr) {
      RN_TRACE(NCCL_NET, "NET/railnet: setNetAttr op 0x%x algo 0x%x proto 0x%x", attr->op, attr->algo, attr->proto);
    }
    return ncclSuccess;
  });
}

}  // namespace railnet::net
