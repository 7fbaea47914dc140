// Loads a net plugin the way NCCL does (dlopen RTLD_NOW|RTLD_LOCAL, versioned data symbols newest first) and
// adapts every ABI version to one interface shaped like NCCL's internal ncclNet_t (v12), mirroring NCCL's own
// compatibility shims in src/plugin/net/net_vN.cc: v8 narrows sizes to int and clears the optional-completion
// marker, v8..v10 are initialised once per load with a reference count, v10 gets its comm config through ctx.
//
// The one loader of NCCL's net ABI: railnet-bench (plugin/tools) and the conformance harness (tests/conformance)
// both use it. It links nothing of railnet (only libdl and the ABI headers in include/), so the harness still
// drives the real .so as NCCL does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "railnet/nccl/net.h"

namespace railnet::nccl_loader {

// Newest first, as NCCL's ncclNetVersion[] lists them; the harness can drive 8..12.
inline constexpr int kSupportedVersions[] = {12, 11, 10, 9, 8};
// Versions NCCL also tries (it would pick them if nothing newer is exported).
inline constexpr int kLoaderVersions[] = {12, 11, 10, 9, 8, 7, 6};

// ncclNetProperties_t as NCCL's shims fill it from any version.
struct DeviceProps {
  const char* name = nullptr;
  const char* pciPath = nullptr;
  uint64_t guid = 0;
  int ptrSupport = 0;
  int regIsGlobal = 0;
  int forceFlush = 0;
  int speed = 0;
  int port = 0;
  float latency = 0;
  int maxComms = 0;
  int maxRecvs = 0;
  int netDeviceType = -1;
  int netDeviceVersion = 0;
  int vNdevs = 0;
  int vDevs[NCCL_NET_MAX_DEVS_PER_NIC_V12] = {};
  size_t maxP2pBytes = 0;
  size_t maxCollBytes = 0;
  int maxMultiRequestSize = 0;
  int16_t railId = NCCL_NET_ID_UNDEF;
  int16_t planeId = NCCL_NET_ID_UNDEF;
  bool reportsMaxP2pBytes = false;  // false for v8, whose shim substitutes 1 GiB
};

using DevComm = ncclNetDeviceHandle_v8_t;

// One exported ncclNetPlugin_vN, normalised to the v12 call shapes.
class NetApi {
 public:
  virtual ~NetApi() = default;
  virtual int version() const = 0;
  virtual const char* name() const = 0;
  // Entries NCCL calls unconditionally that the table leaves NULL.
  virtual std::vector<std::string> missingFunctions() const = 0;

  // Per simulated communicator, like NCCL's ncclNetPluginInit/finalize.
  virtual ncclResult_t init(void** ctx, uint64_t commId, int trafficClass) = 0;
  virtual ncclResult_t finalize(void* ctx) = 0;
  // Calls setNetAttr when the version has it and the plugin provides it (a hint; NCCL ignores the result).
  virtual void setNetAttr(void* ctx, bool p2p) = 0;

  virtual ncclResult_t devices(int* ndev) = 0;
  virtual ncclResult_t getProperties(int dev, DeviceProps* props) = 0;
  virtual ncclResult_t listen(void* ctx, int dev, void* handle, void** listenComm) = 0;
  virtual ncclResult_t connect(void* ctx, int dev, void* handle, void** sendComm, DevComm** devComm) = 0;
  virtual ncclResult_t accept(void* listenComm, void** recvComm, DevComm** devComm) = 0;
  virtual ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) = 0;
  virtual ncclResult_t deregMr(void* comm, void* mhandle) = 0;
  virtual ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) = 0;
  virtual ncclResult_t irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                             void** request) = 0;
  virtual ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) = 0;
  virtual ncclResult_t test(void* request, int* done, int* sizes) = 0;
  virtual ncclResult_t closeSend(void* sendComm) = 0;
  virtual ncclResult_t closeRecv(void* recvComm) = 0;
  virtual ncclResult_t closeListen(void* listenComm) = 0;

  // NIC fusion (v9+): how many children a virtual device may have (the size of the version's vProps.devs), 0
  // when the version or the plugin has no makeVDevice.
  virtual int vDeviceRoom() const = 0;
  // makeVDevice over `children` (1..vDeviceRoom()); ncclInvalidUsage, without calling the plugin, outside that.
  virtual ncclResult_t makeVDevice(int* dev, const std::vector<int>& children) = 0;
};

// A dlopen'ed plugin; dlclose on destruction.
class PluginLibrary {
 public:
  // Throws std::runtime_error ("cannot dlopen <path>: <dlerror()>") when the library cannot be opened.
  explicit PluginLibrary(const std::string& path);
  ~PluginLibrary();  // dlclose, unless close() already ran
  PluginLibrary(const PluginLibrary&) = delete;
  PluginLibrary& operator=(const PluginLibrary&) = delete;

  const std::string& path() const { return path_; }
  void* symbol(const char* name) const;
  bool exports(int version) const;
  // The version NCCL's loader would pick (first of kLoaderVersions found), 0 if none.
  int newestVersion() const;
  // The adapter for `version`, or nullptr when that symbol is not exported (or the version is not one of
  // kSupportedVersions). `logger` and `profiler` are what init passes the plugin, as NCCL passes its own.
  std::unique_ptr<NetApi> api(int version, ncclDebugLogger_t logger, ncclProfilerCallback_t profiler) const;
  // dlclose now; "" on success, else dlerror(). Every NetApi of this library must be gone.
  std::string close();

 private:
  std::string path_;
  void* handle_ = nullptr;
};

// "ncclNetPlugin_v<version>".
std::string symbolName(int version);

}  // namespace railnet::nccl_loader
