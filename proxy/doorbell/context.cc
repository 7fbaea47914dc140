#include "proxy/doorbell/context.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "base/cuda_driver.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/nccl/common.h"

namespace railnet::doorbell {

// Pinned host memory mapped into the GPU, zeroed; plain aligned host memory without a GPU.
class MappedMemory {
 public:
  MappedMemory(int cudaDevice, size_t bytes) : bytes_(bytes) {
    if (cudaDevice >= 0) {
      std::string why;
      cuda_ = cuda::initDriver(&why);
      if (cuda_ == nullptr) fail(ncclSystemError, "NET/railnet: doorbell: CUDA is unusable: %s", why.c_str());
      cuda::CUdevice device = 0;
      if (cuda_->cuDeviceGet(&device, cudaDevice) != cuda::CUDA_SUCCESS ||
          cuda_->cuDevicePrimaryCtxRetain(&context_, device) != cuda::CUDA_SUCCESS) {
        fail(ncclSystemError, "NET/railnet: doorbell: no CUDA device %d", cudaDevice);
      }
      device_ = device;
      cuda_->cuCtxPushCurrent(context_);
      const cuda::CUresult result = cuda_->cuMemHostAlloc(&data_, bytes, kPortable | kDeviceMap);
      cuda::CUcontext popped = nullptr;
      cuda_->cuCtxPopCurrent(&popped);
      if (result != cuda::CUDA_SUCCESS) {
        cuda_->cuDevicePrimaryCtxRelease(device_);
        fail(ncclSystemError, "NET/railnet: doorbell: cuMemHostAlloc of %zu bytes: %s", bytes,
             cuda_->errorText(result).c_str());
      }
    } else {
      data_ = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
      if (data_ == nullptr) fail(ncclSystemError, "NET/railnet: doorbell: no memory for %zu bytes", bytes);
    }
    std::memset(data_, 0, bytes);
  }
  ~MappedMemory() {
    if (cuda_ != nullptr) {
      cuda_->cuMemFreeHost(data_);
      cuda_->cuDevicePrimaryCtxRelease(device_);
    } else {
      std::free(data_);
    }
  }
  MappedMemory(const MappedMemory&) = delete;
  MappedMemory& operator=(const MappedMemory&) = delete;
  void* data() const { return data_; }

 private:
  static constexpr unsigned kPortable = 0x01;   // CU_MEMHOSTALLOC_PORTABLE
  static constexpr unsigned kDeviceMap = 0x02;  // CU_MEMHOSTALLOC_DEVICEMAP
  const cuda::DriverApi* cuda_ = nullptr;
  cuda::CUcontext context_ = nullptr;
  cuda::CUdevice device_ = 0;
  void* data_ = nullptr;
  size_t bytes_;
};

namespace {

// NCCL_PTR_CUDA for device memory of this process, NCCL_PTR_HOST otherwise.
int memoryTypeOf(const void* data) {
  const cuda::DriverApi* api = cuda::initDriver(nullptr);
  if (api == nullptr) return NCCL_PTR_HOST;
  unsigned type = 0;
  const auto address = reinterpret_cast<cuda::CUdeviceptr>(data);
  if (api->cuPointerGetAttribute(&type, cuda::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) == cuda::CUDA_SUCCESS &&
      type == cuda::CU_MEMORYTYPE_DEVICE) {
    return NCCL_PTR_CUDA;
  }
  return NCCL_PTR_HOST;
}

}  // namespace

Context::Context(Transport& transport, int dev, const UniqueId& id, BootstrapRoot* root, int rank, int nranks,
                 int cudaDevice, const ContextOptions& options)
    : cudaDevice_(cudaDevice) {
  if (!isPowerOfTwo(options.ringSlots) || options.signalCount == 0) {
    fail(ncclInvalidArgument, "NET/railnet: doorbell: %lu ring slots (a power of two) and %u signals (at least 1)",
         static_cast<unsigned long>(options.ringSlots), options.signalCount);
  }
  ringMemory_ = std::make_unique<MappedMemory>(cudaDevice, sizeof(RingControl) + options.ringSlots * sizeof(Descriptor));
  signalMemory_ = std::make_unique<MappedMemory>(cudaDevice, options.signalCount * sizeof(uint64_t));
  view_.control = static_cast<RingControl*>(ringMemory_->data());
  view_.slots = reinterpret_cast<Descriptor*>(static_cast<char*>(ringMemory_->data()) + sizeof(RingControl));
  view_.capacity = options.ringSlots;
  view_.signals = static_cast<uint64_t*>(signalMemory_->data());
  view_.signalCount = options.signalCount;
  view_.rank = rank;
  view_.nranks = nranks;

  // The one-sided mesh: every rank's listen handle, gathered through the id's bootstrap.
  std::vector<char> handle(NCCL_NET_HANDLE_MAXSIZE);
  listen_ = std::make_unique<rma::RmaListen>(transport, dev, handle.data());
  std::vector<std::vector<char>> handles = allGather(id, root, rank, nranks, handle, options.bootstrapTimeoutMs);
  std::vector<void*> handlePointers;
  for (auto& entry : handles) handlePointers.push_back(entry.data());
  comm_ = std::make_unique<rma::RmaComm>(*listen_, handlePointers.data(), nranks, rank);
  signalWindow_ = comm_->registerWindow(view_.signals, options.signalCount * sizeof(uint64_t), NCCL_PTR_HOST, false,
                                        0, -1);
  engine_ = std::make_unique<Engine>(*comm_, view_.slots, view_.control, view_.capacity, std::vector<void*>{},
                                     signalWindow_, options.stallNs);
  RN_INFO(NCCL_INIT, "NET/railnet: doorbell: rank %d of %d ready (%lu ring slots, %u signals, %s)", rank, nranks,
          static_cast<unsigned long>(options.ringSlots), options.signalCount,
          cudaDevice >= 0 ? "mapped into the GPU" : "host memory only");
  thread_ = std::thread([this] { run(); });
}

Context::~Context() {
  stop_.store(true, std::memory_order_release);
  if (thread_.joinable()) thread_.join();
  engine_.reset();
  comm_.reset();
}

void Context::run() {
  while (!stop_.load(std::memory_order_acquire)) {
    bool moved = false;
    {
      std::lock_guard<std::mutex> lock(engineMutex_);
      moved = engine_->progress();
    }
    if (!moved) std::this_thread::yield();
  }
}

uint32_t Context::registerWindow(void* data, size_t bytes) {
  // Collective through the comm (which the engine thread keeps progressing); the engine learns it afterwards.
  void* handle = comm_->registerWindow(data, bytes, memoryTypeOf(data), false, 0, -1);
  std::lock_guard<std::mutex> lock(engineMutex_);
  engine_->addWindow(handle);
  return windowCount_++;
}

uint32_t Context::error() const {
  return std::atomic_ref<uint32_t>(view_.control->error).load(std::memory_order_acquire);
}

}  // namespace railnet::doorbell
