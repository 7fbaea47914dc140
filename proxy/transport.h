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
#include <cstring>
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

// The common first base of every object railnet hands to NCCL as `void*` (listen/send/recv comms, requests,
// memory registrations). plugin/net_core hands NCCL the AbiObject* of each object and converts it back only
// after checking the tag, so a handle of the wrong kind is refused instead of being cast blindly. Being the
// polymorphic first base, the AbiObject sits at the start of each object: the tag is bytes 8..15.
// The destructor overwrites the tag, so a destroyed object that still sits in memory reads as dead (reading
// freed memory is itself undefined, which is why net_core checks comms against its live set first).
class AbiObject {
 public:
  enum class Kind : uint32_t {
    ListenComm = 1,
    SendComm = 2,
    RecvComm = 3,
    Request = 4,
    MemoryRegion = 5,
  };

  virtual ~AbiObject() { *static_cast<volatile uint64_t*>(&tag_) = kDeadTag; }  // volatile: never elided

  // True when `handle` points at a live object of `kind`. `handle` must be non-null and at least 16 bytes
  // of readable memory (a live railnet object, or a foreign pointer the caller accepts to read from).
  static bool holds(const void* handle, Kind kind) noexcept { return readTag(handle) == tagOf(kind); }
  // The kind a live railnet object at `handle` carries; false when the tag is none of ours.
  static bool kindAt(const void* handle, Kind* kind) noexcept {
    const uint64_t tag = readTag(handle);
    const auto low = static_cast<uint32_t>(tag);
    if (tag >> 32 != kMagic || low < 1 || low > 5) return false;
    *kind = static_cast<Kind>(low);
    return true;
  }
  static const char* kindName(Kind kind) noexcept {
    switch (kind) {
      case Kind::ListenComm: return "listen comm";
      case Kind::SendComm: return "send comm";
      case Kind::RecvComm: return "receive comm";
      case Kind::Request: return "request";
      case Kind::MemoryRegion: return "memory handle";
    }
    return "railnet object";
  }

 protected:
  explicit AbiObject(Kind kind) noexcept : tag_(tagOf(kind)) {}
  AbiObject(const AbiObject& other) noexcept = default;
  AbiObject& operator=(const AbiObject& other) noexcept = default;

 private:
  static constexpr uint64_t kMagic = 0x7261696cU;  // "rail"
  static constexpr uint64_t kDeadTag = 0xdeadfa11deadfa11U;
  static constexpr uint64_t tagOf(Kind kind) noexcept { return kMagic << 32 | static_cast<uint32_t>(kind); }
  // Raw bytes, no member access: `handle` may not be an object at all (UBSan's vptr check would stop there).
  static uint64_t readTag(const void* handle) noexcept {
    uint64_t tag;
    std::memcpy(&tag, static_cast<const unsigned char*>(handle) + kTagOffset, sizeof tag);
    return tag;
  }
  static constexpr size_t kTagOffset = sizeof(void*);  // after the vptr (Itanium C++ ABI)

  uint64_t tag_;
};

// A vptr and the tag, nothing else, so the tag lies right after the vptr (readTag relies on it).
static_assert(sizeof(AbiObject) == sizeof(void*) + sizeof(uint64_t));

// A request handed back to NCCL as `void*`. Requests live in their comm's pools until the comm closes; as in
// NCCL, a request of a closed comm is not valid (its tag is not checked against anything but itself).
class Request : public AbiObject {
 public:
  Request() noexcept : AbiObject(Kind::Request) {}
  ~Request() override = default;
  // sizes: NULL, or room for one int per buffer of the request. Once *done is set, the request is the
  // transport's again and must not be used by the caller.
  virtual ncclResult_t test(int* done, int* sizes) noexcept = 0;
};

class MemoryRegion : public AbiObject {
 public:
  MemoryRegion() noexcept : AbiObject(Kind::MemoryRegion) {}
  ~MemoryRegion() override = default;
};

// How a transport registers memory for its comms (one registrar serves both directions of a connection).
class MemoryRegistrar {
 public:
  virtual ~MemoryRegistrar() = default;
  virtual std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) = 0;
  virtual std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) = 0;
};

class Comm : public AbiObject {
 public:
  ~Comm() override = default;
  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) { return registrar().regMr(data, size, type); }
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) {
    return registrar().regMrDmaBuf(data, size, type, offset, fd);
  }

 protected:
  explicit Comm(Kind kind) noexcept : AbiObject(kind) {}
  virtual MemoryRegistrar& registrar() noexcept = 0;
};

class SendComm : public Comm {
 public:
  SendComm() noexcept : Comm(Kind::SendComm) {}
  virtual ncclResult_t isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept = 0;
};

class RecvComm : public Comm {
 public:
  RecvComm() noexcept : Comm(Kind::RecvComm) {}
  virtual ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                             Request** request) noexcept = 0;
  virtual ncclResult_t iflush(int n, void** data, const int* sizes, MemoryRegion** mrs,
                              Request** request) noexcept = 0;
  // Receives on this comm may be posted long before anything is sent (proxy/rma keeps receives for its control
  // records posted while a GIN context idles): a receive with no byte in yet is then not reported as stalled.
  virtual void expectIdleReceives() noexcept {}
};

class ListenComm : public AbiObject {
 public:
  ListenComm() noexcept : AbiObject(Kind::ListenComm) {}
  ~ListenComm() override = default;
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
  // the transport then reports and carries in its handshakes, and the bus id of its rail's GPU (empty: none).
  virtual void place(int dev, const std::string& pciPath, int16_t railId, const std::string& railGpu) = 0;
  // True when the transport takes GPU memory without the NIC ever touching it (the TCP transport's copy-engine
  // staging): NCCL's GPU-to-NIC distance rule for GPUDirect then protects nothing (plugin/net_core.cc).
  virtual bool stagesGpuMemoryInHost() const noexcept { return false; }
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
