#include "topo/hwloc_api.h"

#include <dlfcn.h>

#include <mutex>

namespace railnet::topo {
namespace {

constexpr const char* kLibrary = "libhwloc.so.15";

template <class Function>
bool resolve(void* handle, const char* symbol, Function* out, std::string* why) {
  *out = reinterpret_cast<Function>(dlsym(handle, symbol));
  if (*out == nullptr) *why = std::string("symbol ") + symbol + " missing from " + kLibrary;
  return *out != nullptr;
}

struct Loaded {
  HwlocApi api;
  bool ok = false;
  std::string why;
};

Loaded load() {
  Loaded loaded;
  // Never closed: hwloc keeps process-wide state (its components) once a topology has been loaded.
  void* handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* error = dlerror();
    loaded.why = std::string(kLibrary) + " not found: " + (error != nullptr ? error : "dlopen failed");
    return loaded;
  }
  HwlocApi& api = loaded.api;
  std::string& why = loaded.why;
  bool ok = resolve(handle, "hwloc_get_api_version", &api.getApiVersion, &why) &&
            resolve(handle, "hwloc_topology_init", &api.topologyInit, &why) &&
            resolve(handle, "hwloc_topology_destroy", &api.topologyDestroy, &why) &&
            resolve(handle, "hwloc_topology_set_xml", &api.topologySetXml, &why) &&
            resolve(handle, "hwloc_topology_set_io_types_filter", &api.topologySetIoTypesFilter, &why) &&
            resolve(handle, "hwloc_topology_load", &api.topologyLoad, &why) &&
            resolve(handle, "hwloc_get_type_depth", &api.getTypeDepth, &why) &&
            resolve(handle, "hwloc_get_obj_by_depth", &api.getObjByDepth, &why) &&
            resolve(handle, "hwloc_bitmap_iszero", &api.bitmapIsZero, &why) &&
            resolve(handle, "hwloc_bitmap_first", &api.bitmapFirst, &why) &&
            resolve(handle, "hwloc_bitmap_last", &api.bitmapLast, &why) &&
            resolve(handle, "hwloc_bitmap_weight", &api.bitmapWeight, &why) &&
            resolve(handle, "hwloc_bitmap_isincluded", &api.bitmapIsIncluded, &why) &&
            resolve(handle, "hwloc_bitmap_to_ith_ulong", &api.bitmapToIthUlong, &why);
  if (!ok) return loaded;
  // The object structs railnet reads are those of the 2.x headers it was built with.
  unsigned version = api.getApiVersion();
  if ((version >> 16) != (HWLOC_API_VERSION >> 16)) {
    why = "hwloc API " + std::to_string(version >> 16) + "." + std::to_string((version >> 8) & 0xff) +
          " at run time, " + std::to_string(HWLOC_API_VERSION >> 16) + ".x needed";
    return loaded;
  }
  loaded.ok = true;
  return loaded;
}

}  // namespace

const HwlocApi* loadHwloc(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.ok) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

}  // namespace railnet::topo
