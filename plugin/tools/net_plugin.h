// The bench's view of a net plugin: loaded by the shared NCCL loader (plugin/tools/nccl_loader.h: dlopen as NCCL
// does, the newest exported ncclNetPlugin_vN, NCCL's per-version shims), with the bench's conveniences on top:
// BenchError on failure, its own logger, one buffer per receive.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "plugin/tools/nccl_loader.h"
#include "railnet/nccl/gin.h"
#include "railnet/nccl/net.h"

namespace railnet::bench {

// The device properties the bench reports or relies on.
struct DeviceProps {
  std::string name;
  int speedMbps = 0;
  int ptrSupport = 0;
  int maxRecvs = 0;
  size_t maxP2pBytes = 0;
};

class NetPlugin {
 public:
  explicit NetPlugin(const std::string& path);
  ~NetPlugin();  // dlclose
  NetPlugin(const NetPlugin&) = delete;
  NetPlugin& operator=(const NetPlugin&) = delete;

  // Where railnet-bench looks when --plugin is not given, in order; the last is a bare name for the loader.
  static std::vector<std::string> defaultCandidates();

  // Forward the plugin's INFO lines to stderr too (WARN always goes there; stdout is the bench's).
  static void setVerbose(bool verbose) noexcept;

  const std::string& path() const noexcept { return path_; }
  const std::string& symbol() const noexcept { return symbol_; }
  const char* name() const noexcept;

  // Throws BenchError naming the call when `result` is not ncclSuccess.
  static void check(ncclResult_t result, const char* call);

  // init/finalize are per communicator from v11 on (the loader gives v8..v10 NCCL's once-per-load shim): one ctx
  // per bench run.
  ncclResult_t init(void** ctx, uint64_t commId) const;
  ncclResult_t finalize(void* ctx) const;
  ncclResult_t devices(int* count) const;
  ncclResult_t properties(int dev, DeviceProps* props) const;
  // NIC fusion (ABI v9+): a virtual device over `children`, at most 8 (v12) or 4 (v9..v11, the size of their
  // vProps.devs). Throws BenchError when the table has no makeVDevice or the count does not fit; the plugin's own
  // refusal comes back as its result.
  ncclResult_t makeVDevice(int* dev, const std::vector<int>& children) const;

  ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) const;
  ncclResult_t connect(void* ctx, int dev, void* handle, void** sendComm) const;
  ncclResult_t accept(void* listenComm, void** recvComm) const;
  // `type`: NCCL_PTR_HOST, or NCCL_PTR_CUDA for a device address.
  ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) const;
  ncclResult_t deregMr(void* comm, void* mhandle) const;
  ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) const;
  ncclResult_t irecv(void* recvComm, void* data, size_t size, int tag, void* mhandle, void** request) const;
  // A grouped receive of n buffers (NCCL's multireceive, n <= the device's maxRecvs).
  ncclResult_t irecvGroup(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                          void** request) const;
  ncclResult_t test(void* request, int* done, int* size) const;
  ncclResult_t closeSend(void* sendComm) const;
  ncclResult_t closeRecv(void* recvComm) const;
  ncclResult_t closeListen(void* listenComm) const;

  // The GIN table NCCL 2.28 uses (ncclGinPlugin_v11), as NCCL finds it: dlsym in the same library. Throws
  // BenchError when the plugin does not export it. ginInit passes the bench's logger, as init does.
  const ncclGin_v11_t& gin() const;
  ncclResult_t ginInit(void** ctx, uint64_t commId) const;

 private:
  std::string path_;
  std::string symbol_;
  std::unique_ptr<nccl_loader::PluginLibrary> library_;
  std::unique_ptr<nccl_loader::NetApi> net_;
};

}  // namespace railnet::bench
