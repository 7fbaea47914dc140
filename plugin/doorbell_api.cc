// railnet's doorbell C API (include/railnet/doorbell.h) over proxy/doorbell/context: unique ids, contexts and
// their windows. Every entry point is guarded (no exception crosses the C ABI) and checks its handles.
#include "railnet/doorbell.h"

#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "plugin/guard.h"
#include "plugin/live_set.h"
#include "plugin/net_core.h"
#include "proxy/doorbell/bootstrap.h"
#include "proxy/doorbell/context.h"
#include "railnet/settings.h"
#include "topo/netif.h"

namespace railnet::doorbell {
namespace {

static_assert(sizeof(railnet_doorbell_unique_id_t) == sizeof(UniqueId), "the C id is the C++ id");
static_assert(sizeof(railnet_doorbell_device_t) == sizeof(DeviceView), "the C view is the C++ view");
static_assert(offsetof(railnet_doorbell_device_t, signals) == offsetof(DeviceView, signals), "same layout");
static_assert(offsetof(railnet_doorbell_device_t, nranks) == offsetof(DeviceView, nranks), "same layout");
static_assert(offsetof(railnet_doorbell_device_t, direct) == offsetof(DeviceView, direct), "same layout");

LiveSet<Context>& contexts() {
  static LiveSet<Context> instance("doorbell");
  return instance;
}

// Roots made by get_unique_id, until rank 0's init takes its own (by the id's bytes).
std::mutex rootsMutex;
std::map<std::string, std::unique_ptr<BootstrapRoot>>& roots() {
  static std::map<std::string, std::unique_ptr<BootstrapRoot>> instance;
  return instance;
}

std::string keyOf(const railnet_doorbell_unique_id_t& id) { return std::string(id.internal, sizeof(id.internal)); }

// The transport NCCL's net side uses (initialised here when the application has not loaded NCCL).
Transport& transport() {
  if (const ncclResult_t result = net::init(0, nullptr, nullptr, 0, NCCL_NET_TRAFFIC_CLASS_UNDEF);
      result != ncclSuccess) {
    fail(result, "NET/railnet: doorbell: the transport did not initialise");
  }
  return net::sharedTransport();
}

// Where rank 0's bootstrap listens: the first interface the TCP transport's rule picks (RAILNET_IFNAME).
protocol::SocketAddress bootstrapAddress() {
  const Settings& config = settings();
  std::vector<topo::NetInterface> interfaces = topo::discoverInterfaces(config.ifname, config.socketFamily);
  if (interfaces.empty()) {
    fail(ncclSystemError, "NET/railnet: doorbell: no network interface for the bootstrap (RAILNET_IFNAME=\"%s\")",
         config.ifname.c_str());
  }
  protocol::SocketAddress address;
  address.storage = interfaces.front().address;
  address.length = interfaces.front().addressLength;
  return address;
}

}  // namespace
}  // namespace railnet::doorbell

using railnet::guarded;
using namespace railnet::doorbell;  // NOLINT: the C entry points below

extern "C" {

int railnet_doorbell_get_unique_id(railnet_doorbell_unique_id_t* id) {
  return guarded("railnet_doorbell_get_unique_id", [&] {
    if (id == nullptr) railnet::fail(ncclInvalidArgument, "NET/railnet: doorbell: get_unique_id with a NULL id");
    transport();  // settings and logging as for every other entry
    UniqueId made{};
    std::unique_ptr<BootstrapRoot> root = makeUniqueId(bootstrapAddress(), &made);
    std::memcpy(id->internal, made.bytes, sizeof(made.bytes));
    std::lock_guard<std::mutex> lock(rootsMutex);
    roots()[keyOf(*id)] = std::move(root);
    return ncclSuccess;
  });
}

int railnet_doorbell_init(const railnet_doorbell_unique_id_t* id, int rank, int nranks, int cuda_device,
                          railnet_doorbell_ctx_t** ctx) {
  return guarded("railnet_doorbell_init", [&] {
    if (id == nullptr || ctx == nullptr) railnet::fail(ncclInvalidArgument, "NET/railnet: doorbell: init with NULL");
    *ctx = nullptr;
    railnet::Transport& chosen = transport();
    std::unique_ptr<BootstrapRoot> root;
    if (rank == 0) {
      std::lock_guard<std::mutex> lock(rootsMutex);
      auto found = roots().find(keyOf(*id));
      if (found == roots().end()) {
        railnet::fail(ncclInvalidUsage, "NET/railnet: doorbell: rank 0 must init in the process that made the id");
      }
      root = std::move(found->second);
      roots().erase(found);
    }
    UniqueId internal{};
    std::memcpy(internal.bytes, id->internal, sizeof(internal.bytes));
    auto context = std::make_unique<Context>(chosen, 0, internal, root.get(), rank, nranks, cuda_device,
                                             ContextOptions{});
    *ctx = reinterpret_cast<railnet_doorbell_ctx_t*>(contexts().add(std::move(context)));
    return ncclSuccess;
  });
}

int railnet_doorbell_register(railnet_doorbell_ctx_t* ctx, void* buffer, size_t bytes, uint32_t* window) {
  return guarded("railnet_doorbell_register", [&] {
    if (window == nullptr) railnet::fail(ncclInvalidArgument, "NET/railnet: doorbell: register with a NULL window");
    *window = contexts().find("register", "doorbell context", ctx)->registerWindow(buffer, bytes);
    return ncclSuccess;
  });
}

int railnet_doorbell_device(railnet_doorbell_ctx_t* ctx, railnet_doorbell_device_t* device) {
  return guarded("railnet_doorbell_device", [&] {
    if (device == nullptr) railnet::fail(ncclInvalidArgument, "NET/railnet: doorbell: device with a NULL pointer");
    const DeviceView view = contexts().find("device", "doorbell context", ctx)->deviceView();
    std::memcpy(device, &view, sizeof(view));
    return ncclSuccess;
  });
}

int railnet_doorbell_error(railnet_doorbell_ctx_t* ctx, uint32_t* error) {
  return guarded("railnet_doorbell_error", [&] {
    if (error == nullptr) railnet::fail(ncclInvalidArgument, "NET/railnet: doorbell: error with a NULL pointer");
    *error = contexts().find("error", "doorbell context", ctx)->error();
    return ncclSuccess;
  });
}

int railnet_doorbell_finalize(railnet_doorbell_ctx_t* ctx) {
  return guarded("railnet_doorbell_finalize", [&] {
    contexts().take("finalize", "doorbell context", ctx);
    return ncclSuccess;
  });
}

}  // extern "C"
