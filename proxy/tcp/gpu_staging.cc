#include "proxy/tcp/gpu_staging.h"

#include "proxy/staging/landing_ring.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::tcp {

bool tcpGpuUsable(std::string* why) {
  static const std::string reason = [] {
    std::string cudaWhy;
    const cuda::DriverApi* api = cuda::initDriver(&cudaWhy);
    if (api == nullptr) return cudaWhy;
    int count = 0;
    if (api->cuDeviceGetCount(&count) != cuda::CUDA_SUCCESS || count == 0) return std::string("no GPU");
    return std::string();
  }();
  if (why != nullptr) *why = reason;
  return reason.empty();
}

uint64_t stagingPieceBytes() {
  return staging::powerOfTwoFloor(static_cast<uint64_t>(settings().tcpStagingPieceBytes));  // >= 64 KiB (table)
}

int stagingSlots() { return static_cast<int>(staging::powerOfTwoFloor(static_cast<uint64_t>(settings().tcpStagingSlots))); }

CommStaging::~CommStaging() {
  copies_.reset();  // waits for copies in flight, before the slots they use go away
  memory_.reset();
  context_.reset();
}

std::unique_ptr<MemoryRegion> CommStaging::regMr(void* data, size_t size, int type) {
  if (type == NCCL_PTR_HOST) return std::make_unique<TcpRegion>(data, size, false);
  std::string why;
  if (type != NCCL_PTR_CUDA || !tcpGpuUsable(&why)) {
    fail(ncclInvalidArgument, "NET/railnet: the TCP transport cannot register memory of type %d here%s%s", type,
         why.empty() ? "" : ": ", why.c_str());
  }
  prepare(data);
  return std::make_unique<TcpRegion>(data, size, true);
}

std::unique_ptr<MemoryRegion> CommStaging::regMrDmaBuf(void* data, size_t size, int type, uint64_t, int) {
  // The TCP transport does not offer NCCL_PTR_DMABUF: its copy engines take the device pointer itself.
  if (type == NCCL_PTR_CUDA) return regMr(data, size, type);
  fail(ncclInvalidArgument, "NET/railnet: the TCP transport takes no DMA-BUF registration (type %d)", type);
}

void CommStaging::prepare(void* gpuMemory) {
  std::lock_guard<std::mutex> lock(mutex_);
  const cuda::DriverApi& cuda = *cuda::initDriver(nullptr);  // tcpGpuUsable() said it loads
  if (context_ != nullptr) {
    if (!context_->owns(gpuMemory)) {
      fail(ncclInvalidArgument, "NET/railnet: %s comm stages through GPU %d; %p is not memory of that GPU",
           role_.c_str(), context_->device(), gpuMemory);
    }
    if (copyContext_ != nullptr && !copyContext_->canRead(gpuMemory)) {
      // Refused, not copied wrongly: NCCL then keeps such a buffer (a user buffer) out of the network path.
      fail(ncclInvalidArgument, "NET/railnet: %s comm's copy context cannot read %p (not a cuMem allocation)",
           role_.c_str(), gpuMemory);
    }
    return;
  }
  auto context = std::make_unique<staging::DeviceContext>(cuda, gpuMemory);
  pieceBytes_ = stagingPieceBytes();
  slots_ = stagingSlots();
  const int node = staging::numaNodeOfPci(context->pciBusId());
  auto memory = std::make_unique<staging::PinnedMemory>(cuda, pieceBytes_ * static_cast<uint64_t>(slots_), node);
  std::shared_ptr<staging::CopyContext> copyContext =
      staging::chooseCopyContext(cuda, *context, gpuMemory, settings().tcpOwnCopyContext != 0, role_ + " comm");
  auto copies = std::make_unique<staging::CopyQueue>(cuda, copyContext != nullptr ? copyContext->context()
                                                                                  : context->context(), slots_);
  RN_INFO(NCCL_NET, "NET/railnet: %s comm stages GPU %d memory through %d x %lu KiB pinned on NUMA node %d",
          role_.c_str(), context->device(), slots_, static_cast<unsigned long>(pieceBytes_ >> 10), node);
  context_ = std::move(context);
  copyContext_ = std::move(copyContext);
  memory_ = std::move(memory);
  copies_ = std::move(copies);
  ready_.store(true, std::memory_order_release);
}

}  // namespace railnet::tcp
