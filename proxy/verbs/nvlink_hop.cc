#include "proxy/verbs/nvlink_hop.h"

#include <cstring>

#include "proxy/staging/landing_ring.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {

RouteWay routeWay(int hopSetting, bool localTakesGpu, bool candidateTakesGpu, bool peerCopyReachable) {
  if (!localTakesGpu) {
    if (candidateTakesGpu) return RouteWay::kNone;  // keep host-memory ports among themselves, as before
    return hopSetting == 2 ? RouteWay::kHop : RouteWay::kDirect;
  }
  if (hopSetting == 0 || !candidateTakesGpu || !peerCopyReachable) return RouteWay::kNone;
  return RouteWay::kHop;
}

NvlinkHop::NvlinkHop(VerbsConnection& connection, Mode mode, std::string railGpuBusId)
    : connection_(connection),
      mode_(mode),
      railGpuBusId_(std::move(railGpuBusId)),
      slots_(static_cast<int>(settings().ibHopSlots)),
      pieceBytes_(staging::powerOfTwoFloor(static_cast<uint64_t>(settings().ibHopPieceBytes))) {
  if (mode_ != Mode::kHostTest) return;
  host_.resize(static_cast<size_t>(slots_) * pieceBytes_);
  region_ = connection_.registerMemory(host_.data(), host_.size(), NCCL_PTR_HOST);
  route_ = "host staging (RAILNET_IB_NVLINK_HOP=2)";
  ready_.store(true, std::memory_order_release);
}

NvlinkHop::~NvlinkHop() {
  region_.reset();  // the NIC lets go of the staging before it is freed
  gpu_.reset();
}

std::unique_ptr<MemoryRegion> NvlinkHop::regMr(void* data, size_t size, int type) {
  if (type == NCCL_PTR_HOST || mode_ == Mode::kHostTest) return connection_.registerMemory(data, size, type);
  if (type != NCCL_PTR_CUDA) {
    fail(ncclInvalidArgument, "NET/railnet: verbs registration of memory type %d: only NCCL_PTR_HOST (%d) and "
         "NCCL_PTR_CUDA (%d) exist", type, NCCL_PTR_HOST, NCCL_PTR_CUDA);
  }
  prepareGpu(data);
  return std::make_unique<HopSourceRegion>(data, size);
}

std::unique_ptr<MemoryRegion> NvlinkHop::regMrDmaBuf(void* data, size_t size, int type, uint64_t, int) {
  // NCCL's DMA-BUF names the comm's GPU memory for a NIC to read; the hop copies it instead, so the fd is unused.
  return regMr(data, size, type == NCCL_PTR_DMABUF ? NCCL_PTR_CUDA : type);
}

void NvlinkHop::prepareGpu(void* source) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (gpu_ != nullptr) {
    if (!gpu_->fromSourceGpu(source)) {
      fail(ncclInvalidArgument, "NET/railnet: send comm to %s hops from GPU %d; %p is memory of another GPU",
           connection_.control().peerName().c_str(), gpu_->sourceDevice(), source);
    }
    return;
  }
  std::string why;
  const cuda::DriverApi* cuda = cuda::initDriver(&why);
  if (cuda == nullptr) fail(ncclSystemError, "NET/railnet: NVLink hop without CUDA: %s", why.c_str());
  auto gpu = std::make_unique<staging::NvlinkStaging>(*cuda, source, railGpuBusId_, slots_, pieceBytes_);
  // The routed port reads the staging as it reads its own GPU's buffers: GPUDirect (DMA-BUF or peermem).
  region_ = connection_.registerMemory(gpu->base(), gpu->bytes(), NCCL_PTR_CUDA);
  route_ = "GPU " + std::to_string(gpu->sourceDevice()) + " -> GPU " + std::to_string(gpu->railDevice()) + " (" +
           railGpuBusId_ + ")";
  RN_INFO(NCCL_NET, "NET/railnet: send comm to %s leaves from %s with an NVLink hop, %s, %d x %lu KiB staging",
          connection_.control().peerName().c_str(), connection_.device(0).port().info.name.c_str(), route_.c_str(),
          slots_, static_cast<unsigned long>(pieceBytes_ >> 10));
  gpu_ = std::move(gpu);
  ready_.store(true, std::memory_order_release);
}

bool NvlinkHop::carries(const MemoryRegion* mr) const {
  if (!ready_.load(std::memory_order_acquire)) return false;
  if (mode_ == Mode::kHostTest) return mr != nullptr;
  return dynamic_cast<const HopSourceRegion*>(mr) != nullptr;
}

uint64_t NvlinkHop::slotAddress(int slot) const {
  if (mode_ == Mode::kHostTest) return reinterpret_cast<uint64_t>(host_.data()) + static_cast<uint64_t>(slot) * pieceBytes_;
  return gpu_->slot(slot);
}

bool NvlinkHop::copyQueueFull() const { return mode_ == Mode::kGpu && gpu_->copies().full(); }

bool NvlinkHop::copy(int slot, uint64_t source, uint64_t bytes, std::string* why) {
  if (mode_ == Mode::kHostTest) {
    memcpy(reinterpret_cast<void*>(slotAddress(slot)), reinterpret_cast<const void*>(source), bytes);
    hostDone_.push_back(static_cast<uint64_t>(slot));
    return true;
  }
  return gpu_->copies().submitDeviceToDevice(gpu_->slot(slot), source, bytes, static_cast<uint64_t>(slot), why);
}

bool NvlinkHop::finished(std::vector<uint64_t>* slots, std::string* why) {
  if (mode_ == Mode::kHostTest) {
    slots->insert(slots->end(), hostDone_.begin(), hostDone_.end());
    hostDone_.clear();
    return true;
  }
  return gpu_->copies().poll(slots, why);
}

}  // namespace railnet::verbs
