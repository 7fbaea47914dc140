#include "plugin/tools/plugin_loader.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <type_traits>

#include "plugin/tools/harness.h"

#ifndef RAILNET_BENCH_LIBDIR
#define RAILNET_BENCH_LIBDIR "lib"
#endif

namespace railnet::bench {
namespace {

constexpr const char* kPluginFile = "libnccl-net-railnet.so";

std::atomic<bool> gVerbose{false};

// The logger handed to init(): the plugin's WARN lines (and INFO with --verbose) go to stderr, never stdout,
// which carries the bench's table.
void logToStderr(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) {
  (void)flags;
  bool wanted = level == NCCL_LOG_WARN || level == NCCL_LOG_ABORT ||
                (gVerbose.load(std::memory_order_relaxed) && level != NCCL_LOG_NONE);
  if (!wanted) return;
  char message[2048];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  const char* label = level == NCCL_LOG_WARN ? "WARN" : level == NCCL_LOG_ABORT ? "ABORT" : "INFO";
  fprintf(stderr, "railnet-bench: plugin %s %s:%d %s\n", label, file ? file : "?", line, message);
}


std::string executableDir() {
  char path[4096];
  ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return ".";
  std::string exe(path, static_cast<size_t>(length));
  size_t slash = exe.rfind('/');
  return slash == std::string::npos ? std::string(".") : exe.substr(0, slash);
}

// Fails when a function the bench (or NCCL) calls unconditionally is missing from the table.
template <class Net>
void requireCalls(const Net& net, const std::string& path) {
  const std::pair<const void*, const char*> calls[] = {
      {reinterpret_cast<const void*>(net.init), "init"},
      {reinterpret_cast<const void*>(net.devices), "devices"},
      {reinterpret_cast<const void*>(net.getProperties), "getProperties"},
      {reinterpret_cast<const void*>(net.listen), "listen"},
      {reinterpret_cast<const void*>(net.connect), "connect"},
      {reinterpret_cast<const void*>(net.accept), "accept"},
      {reinterpret_cast<const void*>(net.regMr), "regMr"},
      {reinterpret_cast<const void*>(net.deregMr), "deregMr"},
      {reinterpret_cast<const void*>(net.isend), "isend"},
      {reinterpret_cast<const void*>(net.irecv), "irecv"},
      {reinterpret_cast<const void*>(net.test), "test"},
      {reinterpret_cast<const void*>(net.closeSend), "closeSend"},
      {reinterpret_cast<const void*>(net.closeRecv), "closeRecv"},
      {reinterpret_cast<const void*>(net.closeListen), "closeListen"},
  };
  for (const auto& [pointer, call] : calls) {
    if (pointer == nullptr) fail("%s: the plugin's %s is NULL", path.c_str(), call);
  }
}

}  // namespace

std::vector<std::string> NetPlugin::defaultCandidates() {
  std::string dir = executableDir();
  std::string libdir = RAILNET_BENCH_LIBDIR;
  std::string installed = libdir.starts_with('/') ? libdir : dir + "/../" + libdir;
  return {
      dir + "/../" + kPluginFile,     // next to the executable's directory
      dir + "/" + kPluginFile,        // next to the executable
      dir + "/../../" + kPluginFile,  // Meson build tree: <build>/plugin/tools/railnet-bench
      installed + "/" + kPluginFile,  // installed: <prefix>/bin and <prefix>/<libdir>
      kPluginFile,                    // the dynamic loader's search path
  };
}

void NetPlugin::setVerbose(bool verbose) noexcept { gVerbose.store(verbose, std::memory_order_relaxed); }

NetPlugin::NetPlugin(const std::string& path) : path_(path) {
  library_ = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) fail("cannot dlopen %s: %s", path.c_str(), dlerror());
  v12_ = static_cast<const ncclNet_v12_t*>(dlsym(library_, "ncclNetPlugin_v12"));
  if (v12_ == nullptr) v11_ = static_cast<const ncclNet_v11_t*>(dlsym(library_, "ncclNetPlugin_v11"));
  try {
    if (v12_ == nullptr && v11_ == nullptr) fail("%s exports neither ncclNetPlugin_v12 nor ncclNetPlugin_v11", path.c_str());
    if (v12_) requireCalls(*v12_, path_);
    else requireCalls(*v11_, path_);
  } catch (...) {
    dlclose(library_);
    throw;
  }
}

NetPlugin::~NetPlugin() {
  if (dlclose(library_) != 0) fprintf(stderr, "railnet-bench: dlclose(%s): %s\n", path_.c_str(), dlerror());
}

const char* NetPlugin::name() const noexcept {
  const char* name = v12_ ? v12_->name : v11_->name;
  return name ? name : "(null)";
}

void NetPlugin::check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) fail("plugin %s returned %s (%d)", call, ncclResultName(result), static_cast<int>(result));
}

ncclResult_t NetPlugin::init(void** ctx, uint64_t commId) const {
  return dispatch([&](const auto& net) {
    using Net = std::decay_t<decltype(net)>;
    std::conditional_t<std::is_same_v<Net, ncclNet_v12_t>, ncclNetCommConfig_v12_t, ncclNetCommConfig_v11_t> config{};
    config.trafficClass = NCCL_NET_TRAFFIC_CLASS_UNDEF;
    return net.init(ctx, commId, &config, logToStderr, nullptr);
  });
}

ncclResult_t NetPlugin::finalize(void* ctx) const {
  return dispatch([&](const auto& net) { return net.finalize ? net.finalize(ctx) : ncclSuccess; });
}

ncclResult_t NetPlugin::devices(int* count) const {
  return dispatch([&](const auto& net) { return net.devices(count); });
}

ncclResult_t NetPlugin::properties(int dev, DeviceProps* props) const {
  return dispatch([&](const auto& net) {
    using Net = std::decay_t<decltype(net)>;
    std::conditional_t<std::is_same_v<Net, ncclNet_v12_t>, ncclNetProperties_v12_t, ncclNetProperties_v11_t> raw{};
    ncclResult_t result = net.getProperties(dev, &raw);
    if (result == ncclSuccess) {
      props->name = raw.name ? raw.name : "";
      props->speedMbps = raw.speed;
      props->ptrSupport = raw.ptrSupport;
      props->maxRecvs = raw.maxRecvs;
      props->maxP2pBytes = raw.maxP2pBytes;
    }
    return result;
  });
}

ncclResult_t NetPlugin::makeVDevice(int* dev, const std::vector<int>& children) const {
  return dispatch([&](const auto& net) {
    using Net = std::decay_t<decltype(net)>;
    std::conditional_t<std::is_same_v<Net, ncclNet_v12_t>, ncclNetVDeviceProps_v12_t, ncclNetVDeviceProps_v11_t> props{};
    constexpr size_t kRoom = sizeof(props.devs) / sizeof(props.devs[0]);
    if (net.makeVDevice == nullptr) fail("%s: the plugin's %s has no makeVDevice (NIC fusion)", path_.c_str(), symbol());
    if (children.empty() || children.size() > kRoom) {
      fail("cannot fuse %zu device(s): %s's makeVDevice takes 1..%zu", children.size(), symbol(), kRoom);
    }
    props.ndevs = static_cast<int>(children.size());
    for (size_t i = 0; i < children.size(); ++i) props.devs[i] = children[i];
    return net.makeVDevice(dev, &props);
  });
}

ncclResult_t NetPlugin::listen(void* ctx, int dev, void* handle, void** listenComm) const {
  return dispatch([&](const auto& net) { return net.listen(ctx, dev, handle, listenComm); });
}

ncclResult_t NetPlugin::connect(void* ctx, int dev, void* handle, void** sendComm) const {
  // A NULL device handle: host (non-offload) connection, as NCCL asks for a HOST-type device.
  return dispatch([&](const auto& net) {
    ncclNetDeviceHandle_v12_t* deviceHandle = nullptr;
    return net.connect(ctx, dev, handle, sendComm, &deviceHandle);
  });
}

ncclResult_t NetPlugin::accept(void* listenComm, void** recvComm) const {
  return dispatch([&](const auto& net) {
    ncclNetDeviceHandle_v12_t* deviceHandle = nullptr;
    return net.accept(listenComm, recvComm, &deviceHandle);
  });
}

ncclResult_t NetPlugin::regMr(void* comm, void* data, size_t size, void** mhandle) const {
  return dispatch([&](const auto& net) { return net.regMr(comm, data, size, NCCL_PTR_HOST, mhandle); });
}

ncclResult_t NetPlugin::deregMr(void* comm, void* mhandle) const {
  return dispatch([&](const auto& net) { return net.deregMr(comm, mhandle); });
}

ncclResult_t NetPlugin::isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                              void** request) const {
  return dispatch([&](const auto& net) { return net.isend(sendComm, data, size, tag, mhandle, nullptr, request); });
}

ncclResult_t NetPlugin::irecv(void* recvComm, void* data, size_t size, int tag, void* mhandle,
                              void** request) const {
  // One buffer per request (n = 1), as NCCL's non-shared connections post.
  return dispatch([&](const auto& net) {
    void* datas[1] = {data};
    size_t sizes[1] = {size};
    int tags[1] = {tag};
    void* mhandles[1] = {mhandle};
    void* phandles[1] = {nullptr};
    return net.irecv(recvComm, 1, datas, sizes, tags, mhandles, phandles, request);
  });
}

ncclResult_t NetPlugin::test(void* request, int* done, int* size) const {
  return dispatch([&](const auto& net) { return net.test(request, done, size); });
}

ncclResult_t NetPlugin::closeSend(void* sendComm) const {
  return dispatch([&](const auto& net) { return net.closeSend(sendComm); });
}

ncclResult_t NetPlugin::closeRecv(void* recvComm) const {
  return dispatch([&](const auto& net) { return net.closeRecv(recvComm); });
}

ncclResult_t NetPlugin::closeListen(void* listenComm) const {
  return dispatch([&](const auto& net) { return net.closeListen(listenComm); });
}

}  // namespace railnet::bench
