#include "proxy/verbs/ibverbs_api.h"

#include <dlfcn.h>
#include <link.h>

#include <cerrno>
#include <cstddef>

#include "railnet/log.h"

namespace railnet::verbs {
namespace {

constexpr const char* kLibrary = "libibverbs.so.1";
// Every verb we use has had this ABI since rdma-core's first release; asking for the version explicitly (as
// NCCL does) keeps us on the signatures in verbs.h even if a future libibverbs adds a new default version.
constexpr const char* kBaseVersion = "IBVERBS_1.1";
constexpr const char* kDmabufVersion = "IBVERBS_1.12";

struct Loaded {
  IbvApi api;
  bool ok = false;
  std::string why;
};

// Resolves symbols into typed slots; the first missing required symbol is remembered and stops the rest.
class Resolver {
 public:
  explicit Resolver(void* handle) : handle_(handle) {}

  template <typename Fn>
  void require(Fn* slot, const char* name) {
    if (!why_.empty()) return;
    dlerror();  // clear a stale error so the text below belongs to this lookup
    void* symbol = dlvsym(handle_, name, kBaseVersion);
    if (symbol == nullptr) {
      const char* error = dlerror();
      why_ = std::string("symbol ") + name + "@" + kBaseVersion + " missing" + (error ? std::string(": ") + error : "");
      return;
    }
    *slot = reinterpret_cast<Fn>(symbol);
  }

  template <typename Fn>
  void optional(Fn* slot, const char* name, const char* version) {
    void* symbol = dlvsym(handle_, name, version);
    *slot = symbol != nullptr ? reinterpret_cast<Fn>(symbol) : nullptr;
  }

  const std::string& why() const { return why_; }

 private:
  void* handle_;
  std::string why_;
};

std::string libraryPath(void* handle) {
  link_map* map = nullptr;
  if (dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr) return map->l_name;
  return kLibrary;
}

Loaded load() {
  Loaded loaded;
  dlerror();
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    loaded.why = std::string(kLibrary) + " not found: " + (error ? error : "dlopen failed");
    return loaded;
  }
  IbvApi& api = loaded.api;
  Resolver resolve(handle);
  resolve.require(&api.getDeviceList, "ibv_get_device_list");
  resolve.require(&api.freeDeviceList, "ibv_free_device_list");
  resolve.require(&api.getDeviceName, "ibv_get_device_name");
  resolve.require(&api.openDevice, "ibv_open_device");
  resolve.require(&api.closeDevice, "ibv_close_device");
  resolve.require(&api.queryDevice, "ibv_query_device");
  resolve.require(&api.queryPortCompat, "ibv_query_port");
  resolve.require(&api.queryGid, "ibv_query_gid");
  resolve.require(&api.allocPd, "ibv_alloc_pd");
  resolve.require(&api.deallocPd, "ibv_dealloc_pd");
  resolve.require(&api.regMr, "ibv_reg_mr");
  resolve.require(&api.deregMr, "ibv_dereg_mr");
  resolve.require(&api.createCq, "ibv_create_cq");
  resolve.require(&api.destroyCq, "ibv_destroy_cq");
  resolve.require(&api.createQp, "ibv_create_qp");
  resolve.require(&api.modifyQp, "ibv_modify_qp");
  resolve.require(&api.destroyQp, "ibv_destroy_qp");
  resolve.require(&api.queryQp, "ibv_query_qp");
  resolve.require(&api.getAsyncEvent, "ibv_get_async_event");
  resolve.require(&api.ackAsyncEvent, "ibv_ack_async_event");
  resolve.require(&api.eventTypeStr, "ibv_event_type_str");
  resolve.require(&api.wcStatusStr, "ibv_wc_status_str");
  resolve.require(&api.forkInit, "ibv_fork_init");
  resolve.optional(&api.regDmabufMr, "ibv_reg_dmabuf_mr", kDmabufVersion);
  if (!resolve.why().empty()) {
    loaded.why = resolve.why();  // dlerror's text already names the library file
    loaded.api = IbvApi{};
    dlclose(handle);  // nothing was opened through it yet
    return loaded;
  }
  // The handle is deliberately never closed: providers are loaded into it and contexts point into them.
  loaded.ok = true;
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: loaded %s (ibv_reg_dmabuf_mr %s)", libraryPath(handle).c_str(),
          api.dmabufSupported() ? "present" : "absent");
  return loaded;
}

}  // namespace

int IbvApi::queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const {
  *attr = ibv_port_attr{};
  // Same test as verbs.h's verbs_get_ctx_op(context, query_port), written without a statement expression.
  verbs_context* extended = verbs_get_ctx(context);
  if (extended != nullptr && extended->sz >= sizeof(*extended) - offsetof(verbs_context, query_port) &&
      extended->query_port != nullptr) {
    return extended->query_port(context, port, attr, sizeof(*attr));
  }
  if (queryPortCompat == nullptr) return ENOSYS;
  return queryPortCompat(context, port, reinterpret_cast<_compat_ibv_port_attr*>(attr));
}

const IbvApi* loadIbverbs(std::string* why) {
  static const Loaded loaded = load();  // C++ magic static: one load, thread-safe
  if (!loaded.ok) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace railnet::verbs
