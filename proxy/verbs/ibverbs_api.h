// libibverbs, resolved at run time. railnet never links libibverbs: hosts without rdma-core must still load the
// plugin (and fall back to TCP), so every verbs entry point is looked up with dlopen("libibverbs.so.1") + dlvsym.
//
// Only real exported functions live here. The data-path verbs (ibv_post_send, ibv_post_recv, ibv_poll_cq,
// ibv_req_notify_cq) are inline in verbs.h and dispatch through context->ops: call them directly.
// Do NOT call the verbs.h macros ibv_query_port() or ibv_reg_mr() directly: they expand to inlines that
// reference libibverbs symbols, and the plugin links with -z defs. Use IbvApi::queryPort() and IbvApi::regMr.
//
// Field names are camelCase rather than ibv_xxx because `api.ibv_reg_mr(...)` would be expanded by the
// function-like macro of the same name.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace railnet::verbs {

struct IbvApi {
  decltype(&::ibv_get_device_list) getDeviceList = nullptr;
  decltype(&::ibv_free_device_list) freeDeviceList = nullptr;
  decltype(&::ibv_get_device_name) getDeviceName = nullptr;
  decltype(&::ibv_open_device) openDevice = nullptr;
  decltype(&::ibv_close_device) closeDevice = nullptr;
  decltype(&::ibv_query_device) queryDevice = nullptr;
  // The exported ibv_query_port: it takes the short "compat" attribute struct. Call queryPort() instead.
  decltype(&::ibv_query_port) queryPortCompat = nullptr;
  decltype(&::ibv_query_gid) queryGid = nullptr;
  decltype(&::ibv_alloc_pd) allocPd = nullptr;
  decltype(&::ibv_dealloc_pd) deallocPd = nullptr;
  decltype(&::ibv_reg_mr) regMr = nullptr;  // the exported IBVERBS_1.1 ibv_reg_mr(pd, addr, length, access)
  decltype(&::ibv_reg_dmabuf_mr) regDmabufMr = nullptr;  // optional: null when libibverbs predates 1.12
  decltype(&::ibv_dereg_mr) deregMr = nullptr;
  decltype(&::ibv_create_cq) createCq = nullptr;
  decltype(&::ibv_destroy_cq) destroyCq = nullptr;
  decltype(&::ibv_create_qp) createQp = nullptr;
  decltype(&::ibv_modify_qp) modifyQp = nullptr;
  decltype(&::ibv_destroy_qp) destroyQp = nullptr;
  decltype(&::ibv_query_qp) queryQp = nullptr;
  decltype(&::ibv_get_async_event) getAsyncEvent = nullptr;
  decltype(&::ibv_ack_async_event) ackAsyncEvent = nullptr;
  decltype(&::ibv_event_type_str) eventTypeStr = nullptr;
  decltype(&::ibv_wc_status_str) wcStatusStr = nullptr;
  decltype(&::ibv_fork_init) forkInit = nullptr;

  // What verbs.h's ibv_query_port() does, without a link-time symbol: the provider's extended query_port op
  // with our struct size when the context has one, else the exported function on a zeroed struct (it fills
  // only the compat prefix, so it can never write past our struct). Returns 0 or an errno-style value.
  int queryPort(ibv_context* context, uint8_t port, ibv_port_attr* attr) const;

  // The library can register DMA-BUFs; the kernel and device may still refuse (NCCL probes with fd -1 and
  // treats EOPNOTSUPP / EPROTONOSUPPORT as "no").
  bool dmabufSupported() const { return regDmabufMr != nullptr; }
};

// Loads libibverbs.so.1 once per process (thread-safe) and resolves every symbol above; the library stays
// open for the life of the process (providers and open contexts live in it). Returns nullptr and sets *why
// ("libibverbs.so.1 not found: ..." / "symbol ibv_xxx missing: ...") when verbs cannot be used; `why` may be
// null. Later calls return the same answer.
const IbvApi* loadIbverbs(std::string* why);

}  // namespace railnet::verbs
