// libhwloc, resolved at run time. The plugin must load where hwloc is not installed (the GPU test machine has
// none; many training images neither), where the topology is simply unknown. hwloc.h is included for its
// types only; every function railnet calls goes through this table, so the plugin has no link-time hwloc
// dependency (no inline helper of hwloc/helper.h may be used: they call libhwloc directly).
#pragma once

#include <hwloc.h>

#include <string>

namespace railnet::topo {

struct HwlocApi {
  unsigned (*getApiVersion)() = nullptr;
  int (*topologyInit)(hwloc_topology_t* topology) = nullptr;
  void (*topologyDestroy)(hwloc_topology_t topology) = nullptr;
  int (*topologySetXml)(hwloc_topology_t topology, const char* path) = nullptr;
  int (*topologySetIoTypesFilter)(hwloc_topology_t topology, enum hwloc_type_filter_e filter) = nullptr;
  int (*topologyLoad)(hwloc_topology_t topology) = nullptr;
  int (*getTypeDepth)(hwloc_topology_t topology, hwloc_obj_type_t type) = nullptr;
  hwloc_obj_t (*getObjByDepth)(hwloc_topology_t topology, int depth, unsigned index) = nullptr;
  int (*bitmapIsZero)(hwloc_const_bitmap_t bitmap) = nullptr;
  int (*bitmapFirst)(hwloc_const_bitmap_t bitmap) = nullptr;
  int (*bitmapLast)(hwloc_const_bitmap_t bitmap) = nullptr;
  int (*bitmapWeight)(hwloc_const_bitmap_t bitmap) = nullptr;
  int (*bitmapIsIncluded)(hwloc_const_bitmap_t sub, hwloc_const_bitmap_t super) = nullptr;
  unsigned long (*bitmapToIthUlong)(hwloc_const_bitmap_t bitmap, unsigned index) = nullptr;
};

// dlopen("libhwloc.so.15") (hwloc 2.x's ABI) once per process and resolve the table. nullptr with *why set
// ("libhwloc.so.15 not found: ...", "hwloc API 1.11 at run time, 2.x needed") when it cannot be used.
const HwlocApi* loadHwloc(std::string* why);

}  // namespace railnet::topo
