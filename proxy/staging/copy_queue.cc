#include "proxy/staging/copy_queue.h"

#include <map>
#include <mutex>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::staging {

using cuda::CUDA_ERROR_NOT_READY;
using cuda::CUDA_SUCCESS;
using cuda::CUresult;

// ---- DeviceContext ------------------------------------------------------------------------------------------

DeviceContext::DeviceContext(const cuda::DriverApi& cuda, const void* pointer) : cuda_(cuda) {
  const auto address = reinterpret_cast<cuda::CUdeviceptr>(pointer);
  unsigned memoryType = 0;
  CUresult result = cuda_.cuPointerGetAttribute(&memoryType, cuda::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address);
  if (result != CUDA_SUCCESS || memoryType != cuda::CU_MEMORYTYPE_DEVICE) {
    fail(ncclInvalidArgument, "NET/railnet: %p registered as CUDA memory is not device memory (%s)", pointer,
         result != CUDA_SUCCESS ? cuda_.errorText(result).c_str() : "memory type is not DEVICE");
  }
  cuda::CUcontext owner = nullptr;
  result = cuda_.cuPointerGetAttribute(&owner, cuda::CU_POINTER_ATTRIBUTE_CONTEXT, address);
  if (result == CUDA_SUCCESS) result = cuda_.cuPointerGetAttribute(&device_, cuda::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address);
  if (result != CUDA_SUCCESS) {
    fail(ncclInvalidArgument, "NET/railnet: cannot tell the context of CUDA memory %p: %s", pointer,
         cuda_.errorText(result).c_str());
  }
  cuda::CUcontext primary = nullptr;
  if (cuda_.cuDevicePrimaryCtxRetain(&primary, device_) == CUDA_SUCCESS) {
    if (owner == nullptr || owner == primary) {
      context_ = primary;
      retainedPrimary_ = true;
      return;
    }
    cuda_.cuDevicePrimaryCtxRelease(device_);
  }
  if (owner == nullptr) fail(ncclInvalidArgument, "NET/railnet: CUDA memory %p has no context", pointer);
  context_ = owner;  // an application-made context: it lives as long as the buffers in it
}

DeviceContext::~DeviceContext() {
  if (retainedPrimary_) cuda_.cuDevicePrimaryCtxRelease(device_);
}

std::string DeviceContext::pciBusId() const {
  char busId[32] = {};
  cuda::CUdevice device = 0;
  if (cuda_.cuDeviceGet(&device, device_) != CUDA_SUCCESS ||
      cuda_.cuDeviceGetPCIBusId(busId, sizeof(busId), device) != CUDA_SUCCESS) {
    return {};
  }
  return busId;
}

bool DeviceContext::owns(const void* pointer) const {
  const auto address = reinterpret_cast<cuda::CUdeviceptr>(pointer);
  unsigned memoryType = 0;
  int device = -1;
  return cuda_.cuPointerGetAttribute(&memoryType, cuda::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) == CUDA_SUCCESS &&
         memoryType == cuda::CU_MEMORYTYPE_DEVICE &&
         cuda_.cuPointerGetAttribute(&device, cuda::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address) == CUDA_SUCCESS &&
         device == device_;
}

// ---- CopyContext --------------------------------------------------------------------------------------------

std::shared_ptr<CopyContext> CopyContext::forDevice(const cuda::DriverApi& cuda, int device, std::string* why) {
  static std::mutex mutex;
  static std::map<int, std::weak_ptr<CopyContext>> made;  // guarded by mutex
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<CopyContext> existing = made[device].lock()) return existing;
  cuda::CUdevice handle = 0;
  cuda::CUcontext context = nullptr;
  CUresult result = cuda.cuDeviceGet(&handle, device);
  if (result == CUDA_SUCCESS) result = cuda.cuCtxCreate(&context, 0, handle);
  if (result != CUDA_SUCCESS) {
    *why = "cuCtxCreate: " + cuda.errorText(result);
    return nullptr;
  }
  cuda::CUcontext popped = nullptr;
  cuda.cuCtxPopCurrent(&popped);  // cuCtxCreate made it current; the calling thread keeps its own
  std::shared_ptr<CopyContext> created(new CopyContext(cuda, context));
  made[device] = created;
  return created;
}

CopyContext::~CopyContext() { cuda_.cuCtxDestroy(context_); }

bool CopyContext::canRead(const void* pointer) const {
  ContextScope scope(cuda_, context_);
  unsigned char byte = 0;
  return scope.ok() && cuda_.cuMemcpyDtoH(&byte, reinterpret_cast<cuda::CUdeviceptr>(pointer), 1) == CUDA_SUCCESS;
}

bool isCuMemAllocation(const cuda::DriverApi& cuda, const void* pointer) {
  if (cuda.cuMemRetainAllocationHandle == nullptr || cuda.cuMemRelease == nullptr) return false;
  cuda::CUmemGenericAllocationHandle handle = 0;
  if (cuda.cuMemRetainAllocationHandle(&handle, const_cast<void*>(pointer)) != CUDA_SUCCESS) return false;
  cuda.cuMemRelease(handle);  // the retain took a reference
  return true;
}

std::shared_ptr<CopyContext> chooseCopyContext(const cuda::DriverApi& cuda, const DeviceContext& owner, const void* memory,
                                               bool ownWanted, const std::string& who) {
  std::string why = "RAILNET_TCP_OWN_COPY_CONTEXT=0";
  std::shared_ptr<CopyContext> copyContext;
  if (ownWanted) copyContext = CopyContext::forDevice(cuda, owner.device(), &why);
  if (copyContext != nullptr && !copyContext->canRead(memory)) {
    why = "it cannot read this memory (not a cuMem allocation)";
    copyContext.reset();
  }
  if (copyContext == nullptr) {
    RN_INFO(NCCL_NET, "NET/railnet: %s copies in the application's context (%s): a copy may queue behind an "
            "NCCL kernel that waits for it when the process has many CUDA streams", who.c_str(), why.c_str());
  } else if (!isCuMemAllocation(cuda, memory)) {
    // Still railnet's context: a hang is worse than half the bandwidth (copy_queue.h says why on both counts).
    RN_INFO(NCCL_NET, "NET/railnet: %s: GPU memory %p is not a cuMem allocation (NCCL_CUMEM_ENABLE=0, or "
            "cudaMalloc'd and registered): its copies from railnet's copy context take a slower path", who.c_str(),
            memory);
  }
  return copyContext;
}

// ---- ContextScope -------------------------------------------------------------------------------------------

ContextScope::ContextScope(const cuda::DriverApi& cuda, cuda::CUcontext context) : cuda_(cuda) {
  ok_ = cuda_.cuCtxPushCurrent(context) == CUDA_SUCCESS;
}

ContextScope::~ContextScope() {
  if (!ok_) return;
  cuda::CUcontext popped = nullptr;
  cuda_.cuCtxPopCurrent(&popped);
}

// ---- CopyQueue ----------------------------------------------------------------------------------------------

CopyQueue::CopyQueue(const cuda::DriverApi& cuda, cuda::CUcontext context, int depth)
    : cuda_(cuda), context_(context), events_(static_cast<size_t>(depth), nullptr), cookies_(static_cast<size_t>(depth)) {
  ContextScope scope(cuda_, context_);
  CUresult result = scope.ok() ? cuda_.cuStreamCreate(&stream_, cuda::CU_STREAM_NON_BLOCKING) : cuda::CUDA_ERROR_INVALID_CONTEXT;
  for (size_t i = 0; result == CUDA_SUCCESS && i < events_.size(); ++i) {
    result = cuda_.cuEventCreate(&events_[i], cuda::CU_EVENT_DISABLE_TIMING);
  }
  if (result != CUDA_SUCCESS) {
    for (cuda::CUevent event : events_) {
      if (event != nullptr) cuda_.cuEventDestroy(event);
    }
    if (stream_ != nullptr) cuda_.cuStreamDestroy(stream_);
    fail(ncclSystemError, "NET/railnet: cannot create a copy stream and %d events: %s", depth,
         cuda_.errorText(result).c_str());
  }
}

CopyQueue::~CopyQueue() {
  ContextScope scope(cuda_, context_);
  if (!scope.ok()) return;  // the context is gone, and with it the stream and events
  cuda_.cuStreamSynchronize(stream_);
  for (cuda::CUevent event : events_) cuda_.cuEventDestroy(event);
  cuda_.cuStreamDestroy(stream_);
}

bool CopyQueue::submit(Direction direction, void* host, cuda::CUdeviceptr device, size_t bytes, uint64_t cookie,
                       std::string* why) {
  const bool down = direction == Direction::kDeviceToHost;
  return enqueue(down ? "device-to-host" : "host-to-device", bytes, cookie, why, [&] {
    return down ? cuda_.cuMemcpyDtoHAsync(host, device, bytes, stream_)
                : cuda_.cuMemcpyHtoDAsync(device, host, bytes, stream_);
  });
}

bool CopyQueue::submitDeviceToDevice(cuda::CUdeviceptr destination, cuda::CUdeviceptr source, size_t bytes,
                                     uint64_t cookie, std::string* why) {
  if (cuda_.cuMemcpyDtoDAsync == nullptr) {
    *why = "the CUDA driver lacks cuMemcpyDtoDAsync";
    return false;
  }
  return enqueue("device-to-device", bytes, cookie, why,
                 [&] { return cuda_.cuMemcpyDtoDAsync(destination, source, bytes, stream_); });
}

bool CopyQueue::enqueue(const char* what, size_t bytes, uint64_t cookie, std::string* why,
                        const std::function<cuda::CUresult()>& copy) {
  ContextScope scope(cuda_, context_);
  const size_t slot = static_cast<size_t>((head_ + inFlight_) % static_cast<int>(events_.size()));
  CUresult result = scope.ok() ? copy() : cuda::CUDA_ERROR_INVALID_CONTEXT;
  if (result == CUDA_SUCCESS) result = cuda_.cuEventRecord(events_[slot], stream_);
  if (result != CUDA_SUCCESS) {
    *why = std::string(what) + " copy of " + std::to_string(bytes) + " bytes: " + cuda_.errorText(result);
    return false;
  }
  cookies_[slot] = cookie;
  ++inFlight_;
  return true;
}

bool CopyQueue::poll(std::vector<uint64_t>* done, std::string* why) {
  if (inFlight_ == 0) return true;
  ContextScope scope(cuda_, context_);
  if (!scope.ok()) {
    *why = "cannot enter the CUDA context of the comm's GPU buffers";
    return false;
  }
  while (inFlight_ > 0) {
    const CUresult result = cuda_.cuEventQuery(events_[static_cast<size_t>(head_)]);
    if (result == CUDA_ERROR_NOT_READY) break;
    if (result != CUDA_SUCCESS) {
      *why = "copy engine: " + cuda_.errorText(result);
      return false;
    }
    done->push_back(cookies_[static_cast<size_t>(head_)]);
    head_ = (head_ + 1) % static_cast<int>(events_.size());
    --inFlight_;
  }
  return true;
}

}  // namespace railnet::staging
