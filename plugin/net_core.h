// railnet's one implementation of the NCCL net plugin, in the v12 shape with size_t sizes. The per-version
// files (net_v8.cc .. net_v12.cc) are thin adapters over these functions.
#pragma once

#include <cstring>

#include "proxy/transport.h"
#include "railnet/nccl/net.h"

namespace railnet::net {

// abiVersion is the version whose table NCCL loaded. ctx is NULL for versions before v11.
ncclResult_t init(int abiVersion, ncclDebugLogger_t logger, void** ctx, uint64_t commId, int trafficClass);
ncclResult_t finalize(void* ctx);
ncclResult_t devices(int* ndev);
ncclResult_t deviceInfo(int dev, const DeviceInfo** info);
ncclResult_t listen(int dev, void* handle, void** listenComm);
ncclResult_t connect(int dev, void* handle, void** sendComm, ncclNetDeviceHandle_v8_t** sendDevComm);
ncclResult_t accept(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
ncclResult_t regMr(void* comm, void* data, size_t size, int type, void** mhandle);
ncclResult_t regMrDmaBuf(void* comm, void* data, size_t size, int type, uint64_t offset, int fd, void** mhandle);
ncclResult_t deregMr(void* comm, void* mhandle);
ncclResult_t isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void** request);
ncclResult_t irecv(void* recvComm, int n, void** data, const size_t* sizes, int* tags, void** mhandles,
                   void** request);
ncclResult_t iflush(void* recvComm, int n, void** data, int* sizes, void** mhandles, void** request);
ncclResult_t test(void* request, int* done, int* sizes);
ncclResult_t closeSend(void* sendComm);
ncclResult_t closeRecv(void* recvComm);
ncclResult_t closeListen(void* listenComm);
ncclResult_t setNetAttr(void* ctx, const ncclNetAttr_v12_t* attr);
// NIC fusion: a virtual device over devs[0..ndevs) (physical, distinct, 1..maxDevs, maxDevs being the ABI's
// vProps capacity: 4 before v12, 8 in v12). Sets *d to its index, after every existing device.
ncclResult_t makeVDevice(int* d, int ndevs, const int* devs, int maxDevs);

// Any version's makeVDevice entry point; the props struct's devs[] size is the ABI's limit.
template <class VProps>
ncclResult_t makeVDeviceFor(int* d, VProps* props) {
  if (props == nullptr) return makeVDevice(d, -1, nullptr, 0);
  constexpr int kMax = static_cast<int>(sizeof(props->devs) / sizeof(props->devs[0]));
  return makeVDevice(d, props->ndevs, props->devs, kMax);
}

// The transport init chose, for the GIN/RMA tables of the same .so (plugin/gin_core.cc); throws railnet::Error
// before the first init.
Transport& sharedTransport();

// Read-only, for the tuner in the same .so: how many devices the transport has and their summed speed.
// false (and no log) before the first init.
bool deviceSummary(int* count, int* totalSpeedMbps) noexcept;

// Fills any version's property struct from a device; fields a version lacks are skipped.
template <class Properties>
ncclResult_t getProperties(int dev, Properties* props) {
  const DeviceInfo* info = nullptr;
  ncclResult_t result = deviceInfo(dev, &info);
  if (result != ncclSuccess) return result;
  memset(static_cast<void*>(props), 0, sizeof(*props));
  props->name = const_cast<char*>(info->name.c_str());
  props->pciPath = info->pciPath.empty() ? nullptr : const_cast<char*>(info->pciPath.c_str());
  props->guid = info->guid;
  props->ptrSupport = info->ptrSupport;
  props->regIsGlobal = info->regIsGlobal ? 1 : 0;
  props->speed = info->speedMbps;
  props->port = info->port;
  props->latency = info->latencyUs;
  props->maxComms = info->maxComms;
  props->maxRecvs = info->maxRecvs;
  props->netDeviceType = NCCL_NET_DEVICE_HOST;
  props->netDeviceVersion = 0;
  if constexpr (requires { props->forceFlush; }) props->forceFlush = info->forceFlush ? 1 : 0;
  if constexpr (requires { props->vProps; }) {
    constexpr size_t kMax = sizeof(props->vProps.devs) / sizeof(props->vProps.devs[0]);
    if (info->children.empty()) {
      props->vProps.ndevs = 1;
      props->vProps.devs[0] = dev;
    } else {
      // makeVDevice of this ABI version never accepts more children than its vProps holds.
      const size_t n = info->children.size() < kMax ? info->children.size() : kMax;
      props->vProps.ndevs = static_cast<int>(n);
      for (size_t i = 0; i < n; ++i) props->vProps.devs[i] = info->children[i];
    }
  }
  if constexpr (requires { props->maxP2pBytes; }) {
    props->maxP2pBytes = info->maxP2pBytes;
    props->maxCollBytes = info->maxP2pBytes;
  }
  if constexpr (requires { props->maxMultiRequestSize; }) props->maxMultiRequestSize = 1;
  if constexpr (requires { props->railId; }) {
    props->railId = info->railId;
    props->planeId = info->planeId;
  }
  return ncclSuccess;
}

}  // namespace railnet::net
