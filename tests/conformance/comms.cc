#include "comms.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <new>
#include <utility>

namespace conformance {

HostBuffer::HostBuffer(size_t size) : size_(size), data_(nullptr, Free{size}) {
  // mmap: page-aligned, zero-filled, and large buffers do not count against malloc arenas.
  const size_t bytes = size ? size : 1;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw TestFailure(strf("cannot allocate %zu bytes of host memory", size));
  data_ = std::unique_ptr<uint8_t, Free>(static_cast<uint8_t*>(p), Free{bytes});
}

void HostBuffer::Free::operator()(uint8_t* p) const { munmap(p, bytes); }

NetContext::NetContext(NetApi& net, uint64_t commId) : net_(net) {
  REQUIRE_OK(net_.init(&ctx_, commId, NCCL_NET_TRAFFIC_CLASS_UNDEF));
  live_ = true;
  if (net_.version() >= 11) REQUIRE(ctx_ != nullptr, "v11+ init must return a context");
}

NetContext::~NetContext() {
  if (live_) (void)net_.finalize(ctx_);
}

void NetContext::finalize() {
  live_ = false;
  REQUIRE_OK(net_.finalize(ctx_));
}

Comm::Comm(Comm&& other) noexcept : net_(other.net_), kind_(other.kind_), comm_(std::exchange(other.comm_, nullptr)) {}

Comm& Comm::operator=(Comm&& other) noexcept {
  if (this != &other) {
    (void)close();
    net_ = other.net_;
    kind_ = other.kind_;
    comm_ = std::exchange(other.comm_, nullptr);
  }
  return *this;
}

ncclResult_t Comm::close() {
  void* comm = std::exchange(comm_, nullptr);
  if (!comm) return ncclSuccess;
  switch (kind_) {
    case Kind::Listen: return net_->closeListen(comm);
    case Kind::Send: return net_->closeSend(comm);
    case Kind::Recv: return net_->closeRecv(comm);
  }
  return ncclInternalError;
}

Registration::Registration(NetApi& net, void* comm, void* data, size_t size, int type) : net_(net), comm_(comm) {
  const ncclResult_t rc = net_.regMr(comm_, data, size, type, &mhandle_);
  if (rc != ncclSuccess) mhandle_ = nullptr;
  REQUIRE(rc == ncclSuccess, strf("regMr(%p, %zu bytes, %s) returned %s", data, size,
                                  type == NCCL_PTR_CUDA ? "NCCL_PTR_CUDA" : "NCCL_PTR_HOST", ncclResultName(rc)));
  REQUIRE(mhandle_ != nullptr, "regMr returned success without an mhandle");
}

Registration::~Registration() { (void)release(); }

ncclResult_t Registration::release() {
  void* mhandle = std::exchange(mhandle_, nullptr);
  return mhandle ? net_.deregMr(comm_, mhandle) : ncclSuccess;
}

uint64_t nextCommId() {
  static std::atomic<uint64_t> next{0x7a11e7000001ull};
  return next.fetch_add(1);
}

LinkedPair::LinkedPair(NetApi& net, int dev)
    : net_(net),
      sendCtx_(net, nextCommId()),
      recvCtx_(net, nextCommId()),
      conn(connectPair(net, sendCtx_.get(), recvCtx_.get(), dev)) {}

Comm listenOn(NetApi& net, void* ctx, int dev, ConnHandle* handle) {
  void* listenComm = nullptr;
  const auto start = std::chrono::steady_clock::now();
  REQUIRE_OK(net.listen(ctx, dev, handle->bytes, &listenComm));
  const auto took = std::chrono::steady_clock::now() - start;
  Comm comm(&net, Comm::Kind::Listen, listenComm);
  REQUIRE(listenComm != nullptr, "listen returned success without a comm");
  REQUIRE(took < std::chrono::seconds(1), "listen must not block");
  return comm;
}

Comm connectLoop(NetApi& net, void* ctx, int dev, ConnHandle& handle, const Deadline& deadline) {
  DevComm* devComm = nullptr;
  void* sendComm = nullptr;
  Backoff backoff;
  for (;;) {
    deadline.check("connect() to yield a send comm");
    REQUIRE_OK(net.connect(ctx, dev, handle.bytes, &sendComm, &devComm));
    if (sendComm) break;
    backoff.idle();
  }
  Comm comm(&net, Comm::Kind::Send, sendComm);
  REQUIRE(devComm == nullptr, "connect set a device handle for a HOST device");
  return comm;
}

Comm acceptLoop(NetApi& net, void* listenComm, const Deadline& deadline) {
  DevComm* devComm = nullptr;
  void* recvComm = nullptr;
  Backoff backoff;
  for (;;) {
    deadline.check("accept() to yield a recv comm");
    REQUIRE_OK(net.accept(listenComm, &recvComm, &devComm));
    if (recvComm) break;
    backoff.idle();
  }
  Comm comm(&net, Comm::Kind::Recv, recvComm);
  REQUIRE(devComm == nullptr, "accept set a device handle for a HOST device");
  return comm;
}

Connection connectPair(NetApi& net, void* sendCtx, void* recvCtx, int dev) {
  ConnHandle handle;
  net.setNetAttr(recvCtx, true);
  Comm listener = listenOn(net, recvCtx, dev, &handle);
  Connection conn;
  ThreadGroup threads;
  const Deadline deadline(threads.abortFlag());
  // The handle travels to the "remote" side as a copy, as NCCL's bootstrap would carry it.
  ConnHandle remoteHandle = handle;
  threads.spawn([&] {
    net.setNetAttr(sendCtx, true);
    conn.send = connectLoop(net, sendCtx, dev, remoteHandle, deadline);
  });
  threads.spawn([&] {
    conn.recv = acceptLoop(net, listener.get(), deadline);
    REQUIRE_OK(listener.close());
  });
  threads.join();
  return conn;
}

HandleAddress handleAddress(const ConnHandle& handle) {
  HandleAddress out;
  sockaddr_storage storage{};
  std::memcpy(&storage, handle.bytes + 8, 28);
  out.family = storage.ss_family;
  char text[INET6_ADDRSTRLEN] = {};
  if (storage.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&storage);
    inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    out.port = ntohs(in->sin_port);
  } else if (storage.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &in6->sin6_addr, text, sizeof(text));
    out.port = ntohs(in6->sin6_port);
  }
  out.ip = text;
  return out;
}

std::string toHex(const uint8_t* bytes, size_t n) {
  static const char digits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out += digits[bytes[i] >> 4];
    out += digits[bytes[i] & 15];
  }
  return out;
}

bool fromHex(const std::string& hex, uint8_t* bytes, size_t n) {
  if (hex.size() != 2 * n) return false;
  auto nibble = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  for (size_t i = 0; i < n; ++i) {
    const int hi = nibble(hex[2 * i]);
    const int lo = nibble(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace conformance
