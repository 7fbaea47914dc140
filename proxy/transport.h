// The interface every railnet transport implements: NCCL's net semantics (ABI v12) in C++ form.
// plugin/ adapts each NCCL ABI version onto it; transports live below it in proxy/.
//
// Conventions:
//  - Setup calls (listen/connect/accept/regMr/deregMr/close) may throw railnet::Error.
//  - Data-path calls (isend/irecv/iflush/test) never throw: they return ncclResult_t and log their reason.
//  - A null *request / *comm with ncclSuccess means "not yet, call again" exactly as in NCCL.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "railnet/error.h"
#include "railnet/nccl/common.h"

namespace railnet {

struct DeviceInfo {
  std::string name;     // unique across the transport's devices
  std::string pciPath;  // empty when the device has no PCI function
  uint64_t guid = 0;
  int ptrSupport = NCCL_PTR_HOST;
  bool regIsGlobal = false;
  bool forceFlush = false;
  int speedMbps = 0;
  int port = 1;
  float latencyUs = 0;
  int maxComms = 65536;
  int maxRecvs = 1;
  size_t maxP2pBytes = NCCL_MAX_NET_SIZE_BYTES;
  int16_t railId = NCCL_NET_ID_UNDEF;
  int16_t planeId = NCCL_NET_ID_UNDEF;
  // A virtual (fused) device lists its physical children here (NCCL's vProps); empty for a physical device.
  std::vector<int> children;
};

// The DeviceInfo of a virtual device over `children` (physical devices, 1..8): name "a+b+...", speed the sum,
// the first child's PCI path and properties, railId the children's common rail (undefined when they differ),
// maxComms/maxRecvs the smallest.
inline DeviceInfo fusedDeviceInfo(const std::vector<const DeviceInfo*>& children, const std::vector<int>& indices) {
  DeviceInfo fused = *children.front();
  fused.name.clear();
  fused.speedMbps = 0;
  for (const DeviceInfo* child : children) {
    fused.name += (fused.name.empty() ? "" : "+") + child->name;
    fused.speedMbps += child->speedMbps;
    if (child->railId != fused.railId) fused.railId = NCCL_NET_ID_UNDEF;
    if (child->planeId != fused.planeId) fused.planeId = NCCL_NET_ID_UNDEF;
    fused.maxComms = child->maxComms < fused.maxComms ? child->maxComms : fused.maxComms;
    fused.maxRecvs = child->maxRecvs < fused.maxRecvs ? child->maxRecvs : fused.maxRecvs;
    fused.forceFlush = fused.forceFlush || child->forceFlush;
    fused.latencyUs = child->latencyUs > fused.latencyUs ? child->latencyUs : fused.latencyUs;
  }
  fused.children = indices;
  return fused;
}

// A request handed back to NCCL as `void*`.
class Request {
 public:
  virtual ~Request() = default;
  // sizes: NULL, or room for one int per buffer of the request. Once *done is set, the request is the
  // transport's again and must not be used by the caller.
  virtual ncclResult_t test(int* done, int* sizes) noexcept = 0;
};

class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
};

// How a transport registers memory for its comms (one registrar serves both directions of a connection).
class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  virtual std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) = 0;
  virtual std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) = 0;
};

class Comm {
 public:
  virtual ~Comm() = default;
  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) { return registrar().regMr(data, size, type); }
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) {
    return registrar().regMrDmaBuf(data, size, type, offset, fd);
  }

 protected:
  virtual MemoryRegistrar& registrar() noexcept = 0;
};

class SendComm : public Comm {
 public:
  virtual ncclResult_t isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept = 0;
};

class RecvComm : public Comm {
 public:
  virtual ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                             Request** request) noexcept = 0;
  virtual ncclResult_t iflush(int n, void** data, const int* sizes, MemoryRegion** mrs,
                              Request** request) noexcept = 0;
};

class ListenComm {
 public:
  virtual ~ListenComm() = default;
  // Leaves *comm empty while the connection is still being established.
  virtual void accept(std::unique_ptr<RecvComm>* comm) = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const noexcept = 0;
  virtual int deviceCount() const noexcept = 0;
  virtual const DeviceInfo& device(int dev) const = 0;
  // Where topology placed physical device `dev` (plugin init, before any comm): its PCI path and rail, which
  // the transport then reports and carries in its handshakes.
  virtual void place(int dev, const std::string& pciPath, int16_t railId) = 0;
  // handle: NCCL_NET_HANDLE_MAXSIZE bytes that NCCL carries to the connecting peer.
  virtual std::unique_ptr<ListenComm> listen(int dev, void* handle) = 0;
  // Called again with the same handle buffer until *comm is set.
  virtual void connect(int dev, void* handle, std::unique_ptr<SendComm>* comm) = 0;
  // NIC fusion (ABI v9+ makeVDevice). `children` are distinct physical devices of this transport (plugin/
  // net_core checks count, range and duplicates before calling). Appends one virtual device, indexed after
  // every device so far, and returns its index; listen/connect on it spread a connection over the children
  // (docs/fusion.md). Throws railnet::Error when the transport cannot fuse them, which makes NCCL mark the
  // devices unmergeable and retry. Default: fusion not supported.
  virtual int makeVirtualDevice(const std::vector<int>& children);
};

inline int Transport::makeVirtualDevice(const std::vector<int>& /*children*/) {
  throw Error(ncclInvalidUsage, std::string("NET/railnet: the ") + name() +
                                    " transport does not support NIC fusion (makeVDevice) yet");
}

}  // namespace railnet
