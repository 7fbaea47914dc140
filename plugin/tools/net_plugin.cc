#include "plugin/tools/net_plugin.h"

#include <unistd.h>

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <stdexcept>

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

}  // namespace

std::vector<std::string> NetPlugin::defaultCandidates() {
  std::string dir = executableDir();
  std::string libdir = RAILNET_BENCH_LIBDIR;
  std::string installed = libdir.starts_with('/') ? libdir : dir + "/../" + libdir;
  return {
      dir + "/../" + kPluginFile,     // next to the executable's directory
      dir + "/../lib/" + kPluginFile,  // the release tarball (scripts/package.sh): bin/ and lib/
      dir + "/" + kPluginFile,        // next to the executable
      dir + "/../../" + kPluginFile,  // Meson build tree: <build>/plugin/tools/railnet-bench
      installed + "/" + kPluginFile,  // installed: <prefix>/bin and <prefix>/<libdir>
      kPluginFile,                    // the dynamic loader's search path
  };
}

const ncclGin_v11_t& NetPlugin::gin() const {
  const auto* table = static_cast<const ncclGin_v11_t*>(library_->symbol("ncclGinPlugin_v11"));
  if (table == nullptr) fail("%s exports no ncclGinPlugin_v11 (GIN)", path_.c_str());
  return *table;
}

ncclResult_t NetPlugin::ginInit(void** ctx, uint64_t commId) const { return gin().init(ctx, commId, logToStderr); }

void NetPlugin::setVerbose(bool verbose) noexcept { gVerbose.store(verbose, std::memory_order_relaxed); }

NetPlugin::NetPlugin(const std::string& path) : path_(path) {
  try {
    library_ = std::make_unique<nccl_loader::PluginLibrary>(path);
  } catch (const std::runtime_error& error) {
    fail("%s", error.what());
  }
  // NCCL's choice: the newest version exported (of those the loader drives).
  for (int version : nccl_loader::kSupportedVersions) {
    net_ = library_->api(version, logToStderr, nullptr);
    if (net_ != nullptr) break;
  }
  if (net_ == nullptr) fail("%s exports no ncclNetPlugin_v12 .. _v8", path.c_str());
  symbol_ = nccl_loader::symbolName(net_->version());
  // A function NCCL (or the bench) calls unconditionally is missing from the table.
  std::vector<std::string> missing = net_->missingFunctions();
  if (!missing.empty()) fail("%s: the plugin's %s is NULL", path.c_str(), missing.front().c_str());
}

NetPlugin::~NetPlugin() {
  net_.reset();
  std::string error = library_->close();
  if (!error.empty()) fprintf(stderr, "railnet-bench: dlclose(%s): %s\n", path_.c_str(), error.c_str());
}

const char* NetPlugin::name() const noexcept {
  const char* name = net_->name();
  return name ? name : "(null)";
}

void NetPlugin::check(ncclResult_t result, const char* call) {
  if (result != ncclSuccess) fail("plugin %s returned %s (%d)", call, ncclResultName(result), static_cast<int>(result));
}

ncclResult_t NetPlugin::init(void** ctx, uint64_t commId) const {
  return net_->init(ctx, commId, NCCL_NET_TRAFFIC_CLASS_UNDEF);
}

ncclResult_t NetPlugin::finalize(void* ctx) const { return net_->finalize(ctx); }

ncclResult_t NetPlugin::devices(int* count) const { return net_->devices(count); }

ncclResult_t NetPlugin::properties(int dev, DeviceProps* props) const {
  nccl_loader::DeviceProps raw;
  ncclResult_t result = net_->getProperties(dev, &raw);
  if (result == ncclSuccess) {
    props->name = raw.name ? raw.name : "";
    props->speedMbps = raw.speed;
    props->ptrSupport = raw.ptrSupport;
    props->maxRecvs = raw.maxRecvs;
    props->maxP2pBytes = raw.maxP2pBytes;
  }
  return result;
}

ncclResult_t NetPlugin::makeVDevice(int* dev, const std::vector<int>& children) const {
  const size_t room = static_cast<size_t>(net_->vDeviceRoom());
  if (room == 0) fail("%s: the plugin's %s has no makeVDevice (NIC fusion)", path_.c_str(), symbol_.c_str());
  if (children.empty() || children.size() > room) {
    fail("cannot fuse %zu device(s): %s's makeVDevice takes 1..%zu", children.size(), symbol_.c_str(), room);
  }
  return net_->makeVDevice(dev, children);
}

ncclResult_t NetPlugin::listen(void* ctx, int dev, void* handle, void** listenComm) const {
  return net_->listen(ctx, dev, handle, listenComm);
}

ncclResult_t NetPlugin::connect(void* ctx, int dev, void* handle, void** sendComm) const {
  // A NULL device handle: host (non-offload) connection, as NCCL asks for a HOST-type device.
  nccl_loader::DevComm* deviceHandle = nullptr;
  return net_->connect(ctx, dev, handle, sendComm, &deviceHandle);
}

ncclResult_t NetPlugin::accept(void* listenComm, void** recvComm) const {
  nccl_loader::DevComm* deviceHandle = nullptr;
  return net_->accept(listenComm, recvComm, &deviceHandle);
}

ncclResult_t NetPlugin::regMr(void* comm, void* data, size_t size, int type, void** mhandle) const {
  return net_->regMr(comm, data, size, type, mhandle);
}

ncclResult_t NetPlugin::deregMr(void* comm, void* mhandle) const { return net_->deregMr(comm, mhandle); }

ncclResult_t NetPlugin::isend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                              void** request) const {
  return net_->isend(sendComm, data, size, tag, mhandle, request);
}

ncclResult_t NetPlugin::irecv(void* recvComm, void* data, size_t size, int tag, void* mhandle,
                              void** request) const {
  // One buffer per request (n = 1), as NCCL's non-shared connections post.
  void* datas[1] = {data};
  size_t sizes[1] = {size};
  int tags[1] = {tag};
  void* mhandles[1] = {mhandle};
  return net_->irecv(recvComm, 1, datas, sizes, tags, mhandles, request);
}

ncclResult_t NetPlugin::irecvGroup(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                                   void** request) const {
  return net_->irecv(recvComm, n, data, sizes, tags, mhandles, request);
}

ncclResult_t NetPlugin::test(void* request, int* done, int* size) const { return net_->test(request, done, size); }

ncclResult_t NetPlugin::closeSend(void* sendComm) const { return net_->closeSend(sendComm); }

ncclResult_t NetPlugin::closeRecv(void* recvComm) const { return net_->closeRecv(recvComm); }

ncclResult_t NetPlugin::closeListen(void* listenComm) const { return net_->closeListen(listenComm); }

}  // namespace railnet::bench
