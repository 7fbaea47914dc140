#include "proxy/doorbell/context.h"

#include "proxy/doorbell/mapped_memory.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "base/cuda_driver.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/nccl/common.h"

namespace railnet::doorbell {

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

// A direct-path key as the one-sided comm announces it: the rkey in the low 32 bits of `key`, the memory kind
// (DirectKey::valid) in the high 32.
rma::WindowKey packKey(const DirectKey& key) {
  return rma::WindowKey{key.address, static_cast<uint64_t>(key.valid) << 32 | key.key};
}
DirectKey unpackKey(const rma::WindowKey& key) {
  return DirectKey{key.address, static_cast<uint32_t>(key.key), static_cast<uint32_t>(key.key >> 32)};
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

  // The mlx5 direct path, when this rank can have it; whether the context uses it is decided with every rank.
  std::string directWhy;
  try {
    direct_ = DirectPath::open(transport, dev, cudaDevice, rank, nranks, &directWhy);
  } catch (const std::exception& error) {
    directWhy = error.what();
  }

  // The one-sided mesh: every rank's listen handle (and direct-path offer), gathered through the id's bootstrap.
  std::vector<char> blob(NCCL_NET_HANDLE_MAXSIZE);
  listen_ = std::make_unique<rma::RmaListen>(transport, dev, blob.data());
  const std::vector<char> offer = direct_ != nullptr ? direct_->offer() : DirectPath::notOffered(nranks);
  blob.insert(blob.end(), offer.begin(), offer.end());
  std::vector<std::vector<char>> blobs = allGather(id, root, rank, nranks, blob, options.bootstrapTimeoutMs);
  std::vector<std::vector<char>> offers;
  std::vector<void*> handlePointers;
  for (auto& entry : blobs) {
    offers.emplace_back(entry.begin() + NCCL_NET_HANDLE_MAXSIZE, entry.end());
    handlePointers.push_back(entry.data());
  }
  connectDirect(offers, directWhy);
  comm_ = std::make_unique<rma::RmaComm>(*listen_, handlePointers.data(), nranks, rank);
  rma::WindowKey signalKey;
  if (direct_ != nullptr) signalKey = packKey(direct_->signalKey());
  signalWindow_ = comm_->registerWindow(view_.signals, options.signalCount * sizeof(uint64_t), NCCL_PTR_HOST, false,
                                        0, -1, direct_ != nullptr ? &signalKey : nullptr);
  agreeOnDirect();
  view_.direct = direct_ != nullptr ? direct_->deviceView() : nullptr;
  engine_ = std::make_unique<Engine>(*comm_, view_.slots, view_.control, view_.capacity, std::vector<void*>{},
                                     signalWindow_, options.stallNs);
  RN_INFO(NCCL_INIT, "NET/railnet: doorbell: rank %d of %d ready (%lu ring slots, %u signals, %s, %s)", rank,
          nranks, static_cast<unsigned long>(options.ringSlots), options.signalCount,
          cudaDevice >= 0 ? "mapped into the GPU" : "host memory only",
          direct_ != nullptr ? "kernels post to the NIC directly" : "kernels post to the ring");
  thread_ = std::thread([this] { run(); });
}

void Context::connectDirect(const std::vector<std::vector<char>>& offers, std::string why) {
  if (direct_ != nullptr && DirectPath::allOffered(offers, &why)) {
    try {
      direct_->connect(offers, view_.signals, view_.signalCount * sizeof(uint64_t), &view_.control->error);
      return;
    } catch (const std::exception& error) {
      why = error.what();
    }
  }
  direct_.reset();
  RN_INFO(NCCL_INIT, "NET/railnet: doorbell: rank %d's doorbells go through the descriptor ring (no mlx5 direct "
          "path: %s)", view_.rank, why.c_str());
}

int Context::peerKeys(void* window, std::vector<DirectKey>* keys) const {
  keys->assign(static_cast<size_t>(view_.nranks), DirectKey{});
  for (int peer = 0; peer < view_.nranks; ++peer) {
    rma::WindowKey key;
    if (peer == view_.rank) continue;
    if (!comm_->peerKey(peer, window, &key)) return peer;
    (*keys)[static_cast<size_t>(peer)] = unpackKey(key);
  }
  return -1;
}

void Context::agreeOnDirect() {
  if (direct_ == nullptr) return;
  // Every rank announced its signal key with the signal window only if its direct path came up; one that did not
  // makes every rank drop it, so kernels of one context never mix the two paths.
  std::vector<DirectKey> keys;
  if (const int missing = peerKeys(signalWindow_, &keys); missing >= 0) {
    RN_WARN("NET/railnet: doorbell: rank %d's mlx5 direct path did not come up, so rank %d uses the descriptor ring",
            missing, view_.rank);
    direct_.reset();
    return;
  }
  for (int peer = 0; peer < view_.nranks; ++peer) {
    if (peer != view_.rank) direct_->setRemoteSignals(peer, keys[static_cast<size_t>(peer)]);
  }
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
    if (direct_ != nullptr) moved = direct_->poll() || moved;
    if (!moved) std::this_thread::yield();
  }
}

uint32_t Context::registerWindow(void* data, size_t bytes) {
  // Collective through the comm (which the engine thread keeps progressing); the engine learns it afterwards.
  const uint32_t index = windowCount_;
  const int type = memoryTypeOf(data);
  rma::WindowKey announce;
  if (direct_ != nullptr) {
    const DirectKey key = direct_->registerWindow(index, data, bytes, type);
    announce = packKey(key);
  }
  void* handle = comm_->registerWindow(data, bytes, type, false, 0, -1, direct_ != nullptr ? &announce : nullptr);
  if (direct_ != nullptr) {
    std::vector<DirectKey> keys;
    if (const int missing = peerKeys(handle, &keys); missing >= 0) {
      fail(ncclRemoteError, "NET/railnet: doorbell: rank %d registered window %u without a direct-path key", missing,
           index);
    }
    for (int peer = 0; peer < view_.nranks; ++peer) {
      if (peer != view_.rank) direct_->setRemoteWindow(index, peer, keys[static_cast<size_t>(peer)]);
    }
  }
  std::lock_guard<std::mutex> lock(engineMutex_);
  engine_->addWindow(handle);
  return windowCount_++;
}

uint32_t Context::error() const {
  return std::atomic_ref<uint32_t>(view_.control->error).load(std::memory_order_acquire);
}

}  // namespace railnet::doorbell
