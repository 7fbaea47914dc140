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

void HopServers::serveCurrentGpu() {
  std::string why;
  const cuda::DriverApi* cuda = cuda::initDriver(&why);
  cuda::CUdevice device = -1;
  if (cuda == nullptr || cuda->cuCtxGetDevice(&device) != cuda::CUDA_SUCCESS) return;  // no GPU here: nothing to serve
  std::lock_guard<std::mutex> lock(mutex_);
  if (servers_.count(device) != 0) return;
  char busId[32] = {};
  if (cuda->cuDeviceGetPCIBusId(busId, sizeof(busId), device) != cuda::CUDA_SUCCESS) return;
  servers_[device] = std::make_unique<staging::HopExchangeServer>(*cuda, device, busId);
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
  if (!prepareGpu(data)) return connection_.registerMemory(data, size, NCCL_PTR_CUDA);
  return std::make_unique<HopSourceRegion>(data, size);
}

std::unique_ptr<MemoryRegion> NvlinkHop::regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) {
  if (type == NCCL_PTR_HOST || mode_ == Mode::kHostTest) return connection_.registerDmabuf(data, size, type, offset, fd);
  // NCCL's DMA-BUF names the comm's GPU memory for a NIC to read; the hop copies it instead and leaves it unused.
  if (!prepareGpu(data)) return connection_.registerDmabuf(data, size, type, offset, fd);
  return std::make_unique<HopSourceRegion>(data, size);
}

bool NvlinkHop::prepareGpu(void* source) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (direct_) return false;
  if (gpu_ != nullptr) {
    if (!gpu_->fromSourceGpu(source)) {
      fail(ncclInvalidArgument, "NET/railnet: send comm to %s hops from GPU %d; %p is memory of another GPU",
           connection_.control().peerName().c_str(), gpu_->sourceDevice(), source);
    }
    return true;
  }
  std::string why;
  const cuda::DriverApi* cuda = cuda::initDriver(&why);
  try {
    if (cuda == nullptr) fail(ncclSystemError, "NET/railnet: NVLink hop without CUDA: %s", why.c_str());
    auto gpu = std::make_unique<staging::NvlinkStaging>(*cuda, source, railGpuBusId_, slots_, pieceBytes_);
    // The routed port reads the staging as it reads its own GPU's buffers: GPUDirect (DMA-BUF or peermem).
    region_ = gpu->dmabufFd() >= 0
                  ? connection_.registerDmabuf(gpu->base(), gpu->bytes(), NCCL_PTR_CUDA, 0, gpu->dmabufFd())
                  : connection_.registerMemory(gpu->base(), gpu->bytes(), NCCL_PTR_CUDA);
    route_ = "GPU " + std::to_string(gpu->sourceDevice()) + " -> " +
             (gpu->railDevice() >= 0 ? "GPU " + std::to_string(gpu->railDevice()) + " (" + railGpuBusId_ + ")"
                                     : "GPU " + railGpuBusId_ + " of another process");
    gpu_ = std::move(gpu);
  } catch (const Error& error) {
    // connect chose this port for the hop (the GPU was reachable as far as it could tell); without the hop the
    // routed NIC reads the comm's GPU itself, across the PCIe fabric: slower, but the job goes on.
    region_.reset();
    direct_ = true;
    RN_WARN("NET/railnet: send comm to %s on %s: no NVLink hop (%s); the NIC reads GPU memory across the PCIe "
            "fabric instead", connection_.control().peerName().c_str(), connection_.device(0).port().info.name.c_str(),
            error.what());
    return false;
  }
  RN_INFO(NCCL_NET, "NET/railnet: send comm to %s leaves from %s with an NVLink hop, %s, %d x %lu KiB staging",
          connection_.control().peerName().c_str(), connection_.device(0).port().info.name.c_str(), route_.c_str(),
          slots_, static_cast<unsigned long>(pieceBytes_ >> 10));
  ready_.store(true, std::memory_order_release);
  return true;
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
