// RAII wrappers and the NCCL-style connection dance: per-communicator contexts, comms, registrations, host
// buffers, and listen/connect/accept driven the way NCCL's proxy service thread drives them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "harness.h"

namespace conformance {

// Page-aligned host memory (what NCCL registers for host buffers). Zero-filled.
class HostBuffer {
 public:
  explicit HostBuffer(size_t size);
  uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct Free {
    size_t bytes;
    void operator()(uint8_t* p) const;
  };
  size_t size_;
  std::unique_ptr<uint8_t, Free> data_;
};

// One simulated NCCL communicator: init(&ctx, commId, ...) now, finalize(ctx) on destruction.
class NetContext {
 public:
  NetContext(NetApi& net, uint64_t commId);
  ~NetContext();
  NetContext(const NetContext&) = delete;
  NetContext& operator=(const NetContext&) = delete;
  void* get() const { return ctx_; }
  // Finalizes now and requires success (the destructor only finalizes, it cannot report).
  void finalize();

 private:
  NetApi& net_;
  void* ctx_ = nullptr;
  bool live_ = false;
};

// A listen, send or recv comm; closed on destruction unless closed or released before.
class Comm {
 public:
  enum class Kind { Listen, Send, Recv };
  Comm() = default;
  Comm(NetApi* net, Kind kind, void* comm) : net_(net), kind_(kind), comm_(comm) {}
  ~Comm() { (void)close(); }
  Comm(Comm&& other) noexcept;
  Comm& operator=(Comm&& other) noexcept;
  void* get() const { return comm_; }
  explicit operator bool() const { return comm_ != nullptr; }
  ncclResult_t close();

 private:
  NetApi* net_ = nullptr;
  Kind kind_ = Kind::Send;
  void* comm_ = nullptr;
};

// regMr now (host memory unless `type` says NCCL_PTR_CUDA), deregMr on destruction.
class Registration {
 public:
  Registration(NetApi& net, void* comm, void* data, size_t size, int type = NCCL_PTR_HOST);
  ~Registration();
  Registration(const Registration&) = delete;
  Registration& operator=(const Registration&) = delete;
  void* handle() const { return mhandle_; }
  // deregMr now; returns its result (the destructor cannot report one).
  ncclResult_t release();
  // Forget the mhandle without deregMr: its comm was closed (which releases what it registered).
  void abandon() { mhandle_ = nullptr; }

 private:
  NetApi& net_;
  void* comm_;
  void* mhandle_ = nullptr;
};

struct ConnHandle {
  alignas(8) uint8_t bytes[NCCL_NET_HANDLE_MAXSIZE] = {};
};

struct Connection {
  Comm send;
  Comm recv;
};

// Two simulated communicators (a sending and a receiving rank) joined by one connection.
class LinkedPair {
 public:
  LinkedPair(NetApi& net, int dev);
  NetApi& net() const { return net_; }
  void* sendCtx() const { return sendCtx_.get(); }
  void* recvCtx() const { return recvCtx_.get(); }

 private:
  NetApi& net_;
  NetContext sendCtx_;  // declared before conn: finalized only after the comms are closed
  NetContext recvCtx_;

 public:
  Connection conn;
};

// A fresh commId per simulated communicator (NCCL uses the comm hash).
uint64_t nextCommId();

// listen(), which must return promptly with a non-NULL comm.
Comm listenOn(NetApi& net, void* ctx, int dev, ConnHandle* handle);
// connect() again and again with the same handle buffer until it yields a comm; checks the device handle
// NCCL passes (pointer to NULL) is left NULL for a HOST device.
Comm connectLoop(NetApi& net, void* ctx, int dev, ConnHandle& handle, const Deadline& deadline);
// accept() until it yields a comm.
Comm acceptLoop(NetApi& net, void* listenComm, const Deadline& deadline);
// listen on the receiver's context, then connect and accept from two threads; closeListen right after the
// accept succeeded, as NCCL does.
Connection connectPair(NetApi& net, void* sendCtx, void* recvCtx, int dev);

// The address inside a railnet listen handle (sockaddr at byte 8), as "ip" and port.
struct HandleAddress {
  std::string ip;
  int port = 0;
  int family = 0;
};
HandleAddress handleAddress(const ConnHandle& handle);

std::string toHex(const uint8_t* bytes, size_t n);
bool fromHex(const std::string& hex, uint8_t* bytes, size_t n);

}  // namespace conformance
