// The NVLink hop's node-local rendezvous (docs/design.md "Routes", decisions D85): when the routed port's GPU is
// not visible to this process (each rank sees its own GPU only), the railnet instance of a process that runs on
// that GPU hands out staging on it. The asker imports it, maps it for its own GPU, and its copy engine writes it
// over NVLink as if the staging were its own. Keyed by NCCL's host id, so fake hosts on one machine
// (NCCL_HOSTID) do not meet. Only processes of the same user are served.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <thread>

#include "base/cuda_driver.h"
#include "proxy/protocol/socket.h"

namespace railnet::staging {

// The rendezvous of GPU `busId` on this host: an abstract Unix socket named "railnet-hop/<host>/<busId>", where
// <host> is NCCL_HOSTID when set, else the host name and boot id (as NCCL's host hash uses them).
std::string hopExchangeName(const std::string& busId);

// Whether a process on this host serves GPU `busId` (its rendezvous accepts a connection).
bool hopExchangeServed(const std::string& busId);

// Serves staging on this process's GPU `device` (bus id `busId`): each request gets a shareable cuMem allocation
// of the asked size (at most kMaxBytes), marked for GPUDirect RDMA, as a file descriptor, and the same memory as
// a DMA-BUF for the asker's NIC registration; the allocation is released when the asker hangs up. One thread, stopped by the destructor. When another process serves the GPU
// already, this one does nothing (serving() false).
class HopExchangeServer {
 public:
  static constexpr size_t kMaxBytes = size_t{1} << 30;
  HopExchangeServer(const cuda::DriverApi& cuda, int device, std::string busId);
  ~HopExchangeServer();
  HopExchangeServer(const HopExchangeServer&) = delete;
  HopExchangeServer& operator=(const HopExchangeServer&) = delete;
  bool serving() const { return listener_.valid(); }
  const std::string& busId() const { return busId_; }

 private:
  void run();
  const cuda::DriverApi& cuda_;
  int device_;
  cuda::CUcontext primary_ = nullptr;  // retained while the thread runs: DMA-BUF exports need a current context
  std::string busId_;
  protocol::Fd listener_;
  protocol::Fd wake_;  // eventfd: the destructor's stop signal
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Staging on another process's GPU, imported into this one and writable by this process's GPU `device`.
class ImportedStaging {
 public:
  // nullptr with *why when no process serves GPU `railGpuBusId` here or a step fails (named).
  static std::unique_ptr<ImportedStaging> request(const cuda::DriverApi& cuda, const std::string& railGpuBusId,
                                                  int device, size_t bytes, std::string* why);
  ~ImportedStaging();
  ImportedStaging(const ImportedStaging&) = delete;
  ImportedStaging& operator=(const ImportedStaging&) = delete;
  cuda::CUdeviceptr address() const { return address_; }
  size_t bytes() const { return bytes_; }
  // The staging as a DMA-BUF exported by the serving process, for the NIC registration (this process cannot
  // export memory of a GPU it does not see); -1 when that process could not export it.
  int dmabufFd() const { return dmabuf_.get(); }
  const std::string& dmabufWhy() const { return dmabufWhy_; }  // why there is none

 private:
  explicit ImportedStaging(const cuda::DriverApi& cuda) : cuda_(cuda) {}
  const cuda::DriverApi& cuda_;
  protocol::Fd connection_;  // open while the staging is used: the server releases its allocation on hang-up
  protocol::Fd dmabuf_;
  std::string dmabufWhy_;
  cuda::CUmemGenericAllocationHandle handle_ = 0;
  bool imported_ = false;
  cuda::CUdeviceptr address_ = 0;
  size_t bytes_ = 0;
  bool mapped_ = false;
};

}  // namespace railnet::staging
