#include "plugin/net_core.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "plugin/guard.h"
#include "proxy/nic_counters.h"
#include "proxy/tcp/tcp_transport.h"
#include "proxy/verbs/verbs_transport.h"
#include "railnet/settings.h"
#include "railnet/version.h"
#include "topo/placement.h"

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

// Each device's PCI path and rail from the topology, and an NCCL topology file for rail devices without a PCI
// function (topo/placement.h, docs/topology.md). Transports hand out DeviceInfo by const reference; this is its
// one writer, at init under the plugin mutex before NCCL has seen a device (the objects are not const).
void placeDevices(Transport& chosen) {
  std::vector<topo::NetDevice> devices;
  for (int dev = 0; dev < chosen.deviceCount(); ++dev) {
    const DeviceInfo& info = chosen.device(dev);
    devices.push_back({info.name, info.pciPath, info.railId, -1});
  }
  topo::Placement placement = topo::placeNetDevices(devices);
  for (int dev = 0; dev < chosen.deviceCount() && static_cast<size_t>(dev) < placement.devices.size(); ++dev) {
    const topo::NetDevice& placed = placement.devices[static_cast<size_t>(dev)];
    chosen.place(dev, placed.pciPath, placed.railId, placed.railGpu);
  }
}

// NCCL takes its GPU path (GPU buffers handed to the plugin) only for a NIC within NCCL_NET_GDR_LEVEL of the GPU
// (PXB by default): a rule for NICs that DMA into GPU memory across PCIe. The TCP transport's copy engines move
// GPU memory to pinned host memory on the GPU's own node whatever the NIC's distance, so unless the user chose a
// level, railnet lifts the rule for its devices (docs/decisions.md D64). NCCL reads the variable once, when it
// first checks a GPU-NIC pair, which is after the net plugin's init.
void openGpuPathForStagingTransport(const Transport& chosen) {
  if (!chosen.stagesGpuMemoryInHost()) return;
  if (const char* user = getenv("NCCL_NET_GDR_LEVEL"); user != nullptr) {
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: NCCL_NET_GDR_LEVEL=%s is the user's; NCCL hands GPU buffers to railnet "
            "only for NICs within it", user);
    return;
  }
  setenv("NCCL_NET_GDR_LEVEL", "SYS", 0);
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: NCCL_NET_GDR_LEVEL=SYS: GPU buffers go to the TCP transport's "
          "copy-engine staging for every NIC (RAILNET_TCP_GPU=0 keeps NCCL's host staging)");
}

void logStartup(int abiVersion, const Transport& chosen) {
  std::string names;
  for (int dev = 0; dev < chosen.deviceCount(); ++dev) {
    const DeviceInfo& info = chosen.device(dev);
    names += (dev > 0 ? ", " : "") + info.name + " (" + std::to_string(info.speedMbps / 1000) + " Gb/s)";
  }
  const std::string abi = abiVersion > 0 ? "net ABI v" + std::to_string(abiVersion) : std::string("GIN first");
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: railnet %s, %s, %s transport, %d device(s): %s", kVersion, abi.c_str(),
          chosen.name(), chosen.deviceCount(), names.c_str());
}

// One WARN per bad RAILNET_* value, then init fails: a job must not run with settings the user did not choose
// (docs/decisions.md D59).
void checkSettings() {
  const std::vector<std::string>& errors = settingsErrors();
  if (errors.empty()) return;
  for (const std::string& error : errors) RN_WARN("NET/railnet: %s", error.c_str());
  fail(ncclInvalidUsage, "NET/railnet: %zu invalid RAILNET_* setting(s); see the warnings above", errors.size());
}

// Which variable decided each setting the environment set (NCCL's names included, issue 16), once per process.
void logSettingSources() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const std::string& warning : settingsWarnings()) RN_WARN("NET/railnet: %s", warning.c_str());
    std::string decided;
    for (const SettingSource& source : settingsSources()) {
      decided += (decided.empty() ? "" : ", ") + source.setting + "=" + source.value;
      if (source.variable != source.setting) decided += " (from " + source.variable + ")";
    }
    if (!decided.empty()) RN_INFO(NCCL_INIT | NCCL_ENV, "NET/railnet: settings from the environment: %s", decided.c_str());
  });
}

// RAILNET_TRANSPORT=auto takes verbs when an RDMA port is active and says why not otherwise.
std::unique_ptr<Transport> chooseTransport() {
  const TransportChoice wanted = settings().transport;
  if (wanted != TransportChoice::kTcp) {
    std::string why;
    if (std::unique_ptr<Transport> verbs = verbs::createVerbsTransport(&why)) return verbs;
    if (wanted == TransportChoice::kVerbs) {
      fail(ncclSystemError, "NET/railnet: RAILNET_TRANSPORT=verbs, but %s", why.c_str());
    }
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: verbs transport unavailable (%s); using TCP", why.c_str());
  }
  return tcp::createTcpTransport();
}

using Kind = AbiObject::Kind;

// The comms and listen comms railnet has handed to NCCL and not yet closed (docs/decisions.md D60). Every entry
// point that takes one looks it up here before touching it, so a freed or foreign pointer is refused without
// being read. Comms are few and NCCL calls each from one thread, so one uncontended lock and a hash lookup per
// call is the whole cost.
class LiveComms {
 public:
  // Call before handing `object` to NCCL (may throw std::bad_alloc: the caller still owns it then).
  void add(const AbiObject* object, Kind kind) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(object);
    if (kind != Kind::ListenComm) ++openComms_;
  }
  bool contains(const void* handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    return live_.count(handle) != 0;
  }
  // Removes `handle` when it is live and of `kind`, so only one of two racing closes deletes it. *lastComm: it
  // was the last send or receive comm still open.
  bool take(const void* handle, Kind kind, bool* lastComm) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = live_.find(handle);
    if (found == live_.end() || !AbiObject::holds(handle, kind)) return false;
    live_.erase(found);
    *lastComm = false;
    if (kind != Kind::ListenComm) *lastComm = --openComms_ == 0;
    return true;
  }

 private:
  std::mutex mutex_;
  std::unordered_set<const void*> live_;
  size_t openComms_ = 0;  // send and receive comms in live_
};

LiveComms& liveComms() {
  static LiveComms instance;
  return instance;
}

// Refuses `handle` (ncclInvalidUsage, naming the entry point) unless it is a live railnet object of `wanted`
// (or of `alsoOk`). The caller has checked it is live, or it is a request/mhandle that is only tag-checked.
[[noreturn]] void refuse(const char* entryPoint, const void* handle, Kind wanted, bool live) {
  Kind actual = wanted;
  if (live && AbiObject::kindAt(handle, &actual)) {
    fail(ncclInvalidUsage, "NET/railnet: %s: %p is a %s, not a %s", entryPoint, handle, AbiObject::kindName(actual),
         AbiObject::kindName(wanted));
  }
  fail(ncclInvalidUsage, "NET/railnet: %s: %p is not a live railnet %s", entryPoint, handle,
       AbiObject::kindName(wanted));
}

AbiObject* checkedComm(const char* entryPoint, void* handle, Kind wanted, Kind alsoOk) {
  if (handle == nullptr) fail(ncclInvalidUsage, "NET/railnet: %s: NULL %s", entryPoint, AbiObject::kindName(wanted));
  if (!liveComms().contains(handle)) refuse(entryPoint, handle, wanted, false);
  auto* object = static_cast<AbiObject*>(handle);
  if (!AbiObject::holds(object, wanted) && !AbiObject::holds(object, alsoOk)) refuse(entryPoint, handle, wanted, true);
  return object;
}

SendComm* sendCommOf(const char* entryPoint, void* handle) {
  return static_cast<SendComm*>(checkedComm(entryPoint, handle, Kind::SendComm, Kind::SendComm));
}

RecvComm* recvCommOf(const char* entryPoint, void* handle) {
  return static_cast<RecvComm*>(checkedComm(entryPoint, handle, Kind::RecvComm, Kind::RecvComm));
}

// A send or receive comm (registration takes either).
Comm* anyCommOf(const char* entryPoint, void* handle) {
  return static_cast<Comm*>(checkedComm(entryPoint, handle, Kind::SendComm, Kind::RecvComm));
}

// A memory handle: NULL stays NULL (allowed wherever it was before); anything else must carry the
// MemoryRegion tag. Not looked up in a set: registrations may be many, and a deregistered one is invalid.
MemoryRegion* regionOf(const char* entryPoint, void* mhandle) {
  if (mhandle == nullptr) return nullptr;
  if (!AbiObject::holds(mhandle, Kind::MemoryRegion)) refuse(entryPoint, mhandle, Kind::MemoryRegion, true);
  return static_cast<MemoryRegion*>(static_cast<AbiObject*>(mhandle));
}

// The mhandles of an irecv/iflush as MemoryRegion*, each checked. `regions` has room for kInline; more (an n
// the transport refuses anyway) spill to `spill`.
constexpr int kInlineRegions = 8;
MemoryRegion** regionsOf(const char* entryPoint, int n, void** mhandles, MemoryRegion* (&regions)[kInlineRegions],
                         std::vector<MemoryRegion*>* spill) {
  if (mhandles == nullptr || n < 1) return nullptr;
  MemoryRegion** out = regions;
  if (n > kInlineRegions) {
    spill->resize(static_cast<size_t>(n));
    out = spill->data();
  }
  for (int i = 0; i < n; ++i) out[i] = regionOf(entryPoint, mhandles[i]);
  return out;
}

// Hands a new comm to NCCL: registered as live first, so a failure to register still closes it.
template <class Object>
void* handOut(std::unique_ptr<Object> object, Kind kind) {
  liveComms().add(object.get(), kind);
  return static_cast<AbiObject*>(object.release());
}

// Closes a live comm of `kind`: taken out of the live set, then destroyed. A handle of another kind, or one
// that is not live, is refused untouched (and a comm of another kind stays usable). When the last send or
// receive comm closes (end of a job, or of a communicator), logs the per-NIC traffic since the process started
// (payload bytes; docs/fusion.md), one line per NIC that carried any.
template <class Object>
void closeComm(const char* entryPoint, void* handle, Kind kind) {
  if (handle == nullptr) fail(ncclInvalidUsage, "NET/railnet: %s: NULL %s", entryPoint, AbiObject::kindName(kind));
  bool lastComm = false;
  if (!liveComms().take(handle, kind, &lastComm)) refuse(entryPoint, handle, kind, liveComms().contains(handle));
  delete static_cast<Object*>(static_cast<AbiObject*>(handle));
  if (lastComm) {
    for (const std::string& line : nicCounterLines()) RN_INFO(NCCL_NET, "NET/railnet: NIC %s", line.c_str());
  }
}

}  // namespace

ncclResult_t init(int abiVersion, ncclDebugLogger_t logger, void** ctx, uint64_t commId, int trafficClass) {
  if (logger != nullptr) log::setLogger(logger);
  return guarded("init", [&] {
    PluginState& plugin = state();
    std::lock_guard<std::mutex> lock(plugin.mutex);
    if (!plugin.transport) {
      // First, so a log of any failure below says which build it came from.
      if (abiVersion > 0) {
        RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: railnet %s (revision %s), net ABI v%d", kVersion, revision(),
                abiVersion);
      } else {
        RN_INFO(NCCL_INIT | NCCL_NET,
                "NET/railnet: railnet %s (revision %s), first initialised by its GIN table or doorbell API", kVersion,
                revision());
      }
      checkSettings();  // RAILNET_* are parsed once; a bad value fails init (and every retry of it)
      logSettingSources();
      std::unique_ptr<Transport> chosen = chooseTransport();
      placeDevices(*chosen);  // may throw (bad RAILNET_RAILS / RAILNET_TOPO_XML): init fails, and a retry redoes it
      openGpuPathForStagingTransport(*chosen);
      plugin.transport = std::move(chosen);
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

Transport& sharedTransport() { return transport(); }

bool deviceSummary(int* count, int* totalSpeedMbps) noexcept {
  PluginState& plugin = state();
  std::lock_guard<std::mutex> lock(plugin.mutex);
  if (!plugin.transport) return false;
  *count = plugin.transport->deviceCount();
  *totalSpeedMbps = 0;
  for (int dev = 0; dev < *count; ++dev) *totalSpeedMbps += plugin.transport->device(dev).speedMbps;
  return true;
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
    *listenComm = handOut(transport().listen(dev, handle), Kind::ListenComm);
    return ncclSuccess;
  });
}

ncclResult_t connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** /*sendDevComm*/) {
  return guarded("connect", [&] {
    if (handle == nullptr || sendComm == nullptr) fail(ncclInvalidUsage, "NET/railnet: connect with NULL arguments");
    *sendComm = nullptr;
    std::unique_ptr<SendComm> comm;
    transport().connect(dev, handle, &comm);
    if (comm) *sendComm = handOut(std::move(comm), Kind::SendComm);
    return ncclSuccess;
  });
}

ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** /*recvDevComm*/) {
  return guarded("accept", [&] {
    if (recvComm == nullptr) fail(ncclInvalidUsage, "NET/railnet: accept with NULL arguments");
    *recvComm = nullptr;
    std::unique_ptr<RecvComm> comm;
    static_cast<ListenComm*>(checkedComm("accept", listenComm, Kind::ListenComm, Kind::ListenComm))->accept(&comm);
    if (comm) *recvComm = handOut(std::move(comm), Kind::RecvComm);
    return ncclSuccess;
  });
}

// NCCL registers only memory types a device offered; anything else is a caller's mistake (or a test's), refused
// before the transport, which itself may take more (GPU memory for GIN windows on TCP, D70).
namespace {
void requireOffered(const char* call, int type) {
  if (type == NCCL_PTR_HOST) return;
  Transport& chosen = transport();
  for (int dev = 0; dev < chosen.deviceCount(); ++dev) {
    if ((chosen.device(dev).ptrSupport & type) != 0) return;
  }
  fail(ncclInvalidArgument, "NET/railnet: %s of memory type %d, which no device offered (GPU memory on TCP needs "
       "RAILNET_TCP_GPU=1)", call, type);
}
}  // namespace

ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  return guarded("regMr", [&] {
    requireOffered("regMr", type);
    *mhandle = static_cast<AbiObject*>(anyCommOf("regMr", comm)->regMr(data, size, type).release());
    return ncclSuccess;
  });
}

ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle) {
  return guarded("regMrDmaBuf", [&] {
    requireOffered("regMrDmaBuf", type);
    *mhandle =
        static_cast<AbiObject*>(anyCommOf("regMrDmaBuf", comm)->regMrDmaBuf(data, size, type, offset, fd).release());
    return ncclSuccess;
  });
}

ncclResult_t deregMr(void* comm, void* mhandle) {
  return guarded("deregMr", [&] {
    anyCommOf("deregMr", comm);
    delete regionOf("deregMr", mhandle);
    return ncclSuccess;
  });
}

ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request) {
  return guarded("isend", [&] {
    SendComm* comm = sendCommOf("isend", sendComm);
    Request* posted = nullptr;
    ncclResult_t result = comm->isend(data, size, tag, regionOf("isend", mhandle), &posted);
    *request = static_cast<AbiObject*>(posted);
    return result;
  });
}

ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                   void** request) {
  return guarded("irecv", [&] {
    RecvComm* comm = recvCommOf("irecv", recvComm);
    MemoryRegion* regions[kInlineRegions];
    std::vector<MemoryRegion*> spill;
    MemoryRegion** mrs = regionsOf("irecv", n, mhandles, regions, &spill);
    // *request may arrive as NCCL_NET_OPTIONAL_RECV_COMPLETION; we always complete receives, so it is a hint.
    Request* posted = nullptr;
    ncclResult_t result = comm->irecv(n, data, sizes, tags, mrs, &posted);
    *request = static_cast<AbiObject*>(posted);
    return result;
  });
}

ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request) {
  return guarded("iflush", [&] {
    RecvComm* comm = recvCommOf("iflush", recvComm);
    MemoryRegion* regions[kInlineRegions];
    std::vector<MemoryRegion*> spill;
    MemoryRegion** mrs = regionsOf("iflush", n, mhandles, regions, &spill);
    Request* posted = nullptr;
    ncclResult_t result = comm->iflush(n, data, sizes, mrs, &posted);
    *request = static_cast<AbiObject*>(posted);
    return result;
  });
}

ncclResult_t test(void* request, int* done, int* sizes) {
  return guarded("test", [&] {
    if (request == nullptr) fail(ncclInvalidUsage, "NET/railnet: test of a NULL request");
    // Only the tag: requests are many and live in their comm's pools (D60); one of a closed comm is invalid.
    if (!AbiObject::holds(request, Kind::Request)) refuse("test", request, Kind::Request, true);
    return static_cast<Request*>(static_cast<AbiObject*>(request))->test(done, sizes);
  });
}

ncclResult_t closeSend(void* sendComm) {
  return guarded("closeSend", [&] {
    closeComm<SendComm>("closeSend", sendComm, Kind::SendComm);
    return ncclSuccess;
  });
}

ncclResult_t closeRecv(void* recvComm) {
  return guarded("closeRecv", [&] {
    closeComm<RecvComm>("closeRecv", recvComm, Kind::RecvComm);
    return ncclSuccess;
  });
}

ncclResult_t closeListen(void* listenComm) {
  return guarded("closeListen", [&] {
    if (listenComm == nullptr) return ncclSuccess;  // as before: closing nothing is no error
    closeComm<ListenComm>("closeListen", listenComm, Kind::ListenComm);
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

ncclResult_t makeVDevice(int* d, int ndevs, const int* devs, int maxDevs) {
  return guarded("makeVDevice", [&] {
    if (d == nullptr || devs == nullptr) fail(ncclInvalidArgument, "NET/railnet: makeVDevice with NULL arguments");
    if (ndevs < 1 || ndevs > maxDevs) {
      fail(ncclInvalidArgument, "NET/railnet: makeVDevice of %d devices; this ABI version fuses 1 to %d", ndevs,
           maxDevs);
    }
    Transport& chosen = transport();
    std::lock_guard<std::mutex> lock(state().mutex);  // one fusion at a time; device() stays valid meanwhile
    std::vector<int> children(devs, devs + ndevs);
    std::string names;
    for (size_t i = 0; i < children.size(); ++i) {
      const int child = children[i];
      if (child < 0 || child >= chosen.deviceCount()) {
        fail(ncclInvalidArgument, "NET/railnet: makeVDevice: device %d does not exist (railnet %s has %d)", child,
             chosen.name(), chosen.deviceCount());
      }
      if (!chosen.device(child).children.empty()) {
        fail(ncclInvalidArgument, "NET/railnet: makeVDevice: device %d (%s) is itself virtual; fuse physical devices",
             child, chosen.device(child).name.c_str());
      }
      if (std::find(children.begin(), children.begin() + static_cast<long>(i), child) !=
          children.begin() + static_cast<long>(i)) {
        fail(ncclInvalidArgument, "NET/railnet: makeVDevice: device %d listed twice", child);
      }
      if (chosen.device(child).speedMbps != chosen.device(children[0]).speedMbps) {
        RN_WARN("NET/railnet: makeVDevice: fusing devices of different speeds (%s %d Mb/s, %s %d Mb/s); the "
                "stripes are equal, so the slower one paces large messages",
                chosen.device(children[0]).name.c_str(), chosen.device(children[0]).speedMbps,
                chosen.device(child).name.c_str(), chosen.device(child).speedMbps);
      }
    }
    const int index = chosen.makeVirtualDevice(children);
    const DeviceInfo& fused = chosen.device(index);
    RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: virtual device %d = %s (%d children, %d Gb/s)", index,
            fused.name.c_str(), ndevs, fused.speedMbps / 1000);
    *d = index;
    return ncclSuccess;
  });
}

}  // namespace railnet::net
