// Copy-engine work of one comm: a CUDA stream on the context that owns the comm's GPU buffers, and a ring of
// events that tells, in submission order, which copies have finished. Polled (cuEventQuery) from the thread that
// drives the comm (NCCL's proxy thread, in isend/irecv/test): no thread ever blocks on a copy, and no CUDA call
// runs on the TCP helper threads, which hold no context. Every call enters the context and leaves the calling
// thread's own current context as it was.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/cuda_driver.h"

namespace railnet::staging {

// The context a GPU buffer lives in, kept alive for as long as the comm uses it: the device's primary context
// (retained, as the CUDA runtime and NCCL use it), or the buffer's own context when the application made another.
class DeviceContext {
 public:
  // Throws railnet::Error (ncclInvalidArgument) when `pointer` is not device memory of this process.
  DeviceContext(const cuda::DriverApi& cuda, const void* pointer);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  cuda::CUcontext context() const { return context_; }
  int device() const { return device_; }
  std::string pciBusId() const;
  // True when `pointer` is device memory in this context (what regMr of another buffer of the comm must match).
  bool owns(const void* pointer) const;

 private:
  const cuda::DriverApi& cuda_;
  cuda::CUcontext context_ = nullptr;
  int device_ = -1;
  bool retainedPrimary_ = false;
};

// A context of railnet's own on one GPU, used only for copies, shared by every comm of the process on that GPU and
// destroyed with the last. Why: CUDA maps a context's streams onto a few hardware queues in turn, and a process
// with many streams (PyTorch keeps pools of them) can put a copy stream on the same queue as the stream of an NCCL
// kernel that is waiting for that very copy, which then never runs (found in the torch check; docs/decisions.md
// D64). Streams of another context never share a queue with the application's.
class CopyContext {
 public:
  // nullptr (with *why) when the driver cannot make one.
  static std::shared_ptr<CopyContext> forDevice(const cuda::DriverApi& cuda, int device, std::string* why);
  ~CopyContext();
  CopyContext(const CopyContext&) = delete;
  CopyContext& operator=(const CopyContext&) = delete;
  cuda::CUcontext context() const { return context_; }
  // Whether a copy from this context can read `pointer` (memory of another context on the same GPU: yes for
  // NCCL's cuMem allocations, not for every cudaMalloc).
  bool canRead(const void* pointer) const;

 private:
  CopyContext(const cuda::DriverApi& cuda, cuda::CUcontext context) : cuda_(cuda), context_(context) {}
  const cuda::DriverApi& cuda_;
  cuda::CUcontext context_;
};

// Whether `pointer` lies in a cuMem (virtual memory management) allocation, as NCCL's buffers do by default
// (NCCL_CUMEM_ENABLE=1). Such memory belongs to no context, so a CopyContext copies it at full speed; memory from
// cuMemAlloc/cudaMalloc belongs to the context that made it, and copies of it from another context go through a
// slower path (measured on an H100: about 0.65x one way at 512 KiB and 0.4x with both directions at once, which
// then share one copy engine; docs/performance.md §8). False when the driver lacks the cuMem API.
bool isCuMemAllocation(const cuda::DriverApi& cuda, const void* pointer);

// The context a comm's copies of `memory` (in `owner`'s GPU) run in: railnet's own on that GPU (CopyContext says
// why) when `ownWanted` and it can read the memory, else nullptr, meaning the memory's own context, with the
// hazard logged at INFO under `who` ("send comm"). Also logs when the memory is not a cuMem allocation.
std::shared_ptr<CopyContext> chooseCopyContext(const cuda::DriverApi& cuda, const DeviceContext& owner, const void* memory,
                                               bool ownWanted, const std::string& who);

// Makes `context` current on this thread for the scope, then restores what was current.
class ContextScope {
 public:
  ContextScope(const cuda::DriverApi& cuda, cuda::CUcontext context);
  ~ContextScope();
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
  bool ok() const { return ok_; }

 private:
  const cuda::DriverApi& cuda_;
  bool ok_ = false;
};

class CopyQueue {
 public:
  enum class Direction { kDeviceToHost, kHostToDevice };

  // A non-blocking stream and `depth` events in `context`. Throws railnet::Error (ncclSystemError) on failure.
  CopyQueue(const cuda::DriverApi& cuda, cuda::CUcontext context, int depth);
  // Waits for the copies still in flight (their buffers must outlive them), then frees the stream and events.
  ~CopyQueue();
  CopyQueue(const CopyQueue&) = delete;
  CopyQueue& operator=(const CopyQueue&) = delete;

  bool full() const { return inFlight_ == static_cast<int>(events_.size()); }
  int inFlight() const { return inFlight_; }

  // Queues one copy; `cookie` is handed back by poll() once it has finished. Call only when !full(). False with
  // *why on a CUDA error (the queue is then unusable: the comm fails).
  bool submit(Direction direction, void* host, cuda::CUdeviceptr device, size_t bytes, uint64_t cookie,
              std::string* why);
  // A copy between GPU memories (the NVLink hop: from the comm's GPU into staging on the rail's GPU, which grants
  // this context's GPU access). Same contract as submit().
  bool submitDeviceToDevice(cuda::CUdeviceptr destination, cuda::CUdeviceptr source, size_t bytes, uint64_t cookie,
                            std::string* why);
  // Finished copies, oldest first, into *done (appended); false with *why on a CUDA error.
  bool poll(std::vector<uint64_t>* done, std::string* why);

 private:
  bool enqueue(const char* what, size_t bytes, uint64_t cookie, std::string* why,
               const std::function<cuda::CUresult()>& copy);

  const cuda::DriverApi& cuda_;
  cuda::CUcontext context_;
  cuda::CUstream stream_ = nullptr;
  std::vector<cuda::CUevent> events_;
  std::vector<uint64_t> cookies_;
  int head_ = 0;  // oldest copy in flight
  int inFlight_ = 0;
};

}  // namespace railnet::staging
