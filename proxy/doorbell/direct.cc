#include "proxy/doorbell/direct.h"

#include <dlfcn.h>
#include <infiniband/mlx5dv.h>

#include <atomic>
#include <cerrno>
#include <cstring>

#include "base/cuda_driver.h"
#include "proxy/doorbell/mapped_memory.h"
#include "proxy/doorbell/mlx5_cqe.h"
#include "proxy/staging/copy_queue.h"
#include "proxy/verbs/devices.h"
#include "proxy/verbs/ibverbs_api.h"
#include "proxy/verbs/queue_pairs.h"
#include "proxy/verbs/verbs_device.h"
#include "railnet/doorbell.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/mlx5_wqe.h"
#include "railnet/settings.h"

namespace railnet::doorbell {

namespace {

constexpr uint32_t kOfferMagic = 0x50444e52;  // "RNDP"
constexpr int kSendDepth = 1024;              // work requests per queue pair (the provider rounds the WQEBBs up)
constexpr uint32_t kMaxWindows = 64;
constexpr int kAtomicAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ |
                              IBV_ACCESS_REMOTE_ATOMIC;
constexpr cuda::CUresult kAlreadyRegistered = 712;  // CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED

struct OfferHeader {
  uint32_t magic;
  uint32_t offered;  // 1: the records below are this rank's queue pairs, one per rank (its own entry unused)
};

// The two mlx5dv entry points the path needs, from libmlx5 (rdma-core's mlx5 provider), loaded at run time.
struct Mlx5Api {
  decltype(&::mlx5dv_init_obj) initObj = nullptr;
  decltype(&::mlx5dv_is_supported) isSupported = nullptr;
};

const Mlx5Api* loadMlx5(std::string* why) {
  static const struct Loaded {
    Mlx5Api api;
    std::string why;
    Loaded() {
      void* handle = dlopen("libmlx5.so.1", RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) {
        const char* error = dlerror();
        why = std::string("libmlx5.so.1 not found: ") + (error != nullptr ? error : "dlopen failed");
        return;
      }
      api.initObj = reinterpret_cast<decltype(api.initObj)>(dlsym(handle, "mlx5dv_init_obj"));
      api.isSupported = reinterpret_cast<decltype(api.isSupported)>(dlsym(handle, "mlx5dv_is_supported"));
      if (api.initObj == nullptr || api.isSupported == nullptr) why = "libmlx5.so.1 lacks mlx5dv_init_obj";
    }
  } loaded;
  if (!loaded.why.empty()) {
    *why = loaded.why;
    return nullptr;
  }
  return &loaded.api;
}

// The completion queue of one peer's queue pair, read directly (its CQEs answer WQEs the provider never posted, so
// ibv_poll_cq's bookkeeping would be wrong).
struct CqReader {
  uint8_t* cqes = nullptr;
  uint32_t count = 0;  // 64-byte CQEs, a power of two (MLX5_CQE_SIZE=128 is refused at connect)
  uint32_t* doorbellRecord = nullptr;
  uint64_t consumer = 0;
};

}  // namespace

struct DirectPath::State {
  const verbs::IbvApi* api = nullptr;
  const Mlx5Api* mlx5 = nullptr;
  int rank = 0;
  int nranks = 0;
  std::unique_ptr<PrimaryContext> gpu;  // the registrations with CUDA are made in it
  std::shared_ptr<verbs::VerbsDevice> device;
  std::vector<std::unique_ptr<verbs::QueuePairs>> queuePairs;  // [nranks], none to itself
  std::vector<void*> sendQueues;  // [nranks]: the SQ's host address (the poller reads WQE sizes there)
  std::vector<CqReader> completions;
  std::vector<bool> warned;
  std::unique_ptr<MappedMemory> memory;  // the view, queues, keys and the atomic sink, mapped into the GPU
  DirectView* view = nullptr;
  DirectQueue* queues = nullptr;
  ibv_mr* signalRegion = nullptr;
  ibv_mr* sinkRegion = nullptr;
  DirectKey signals{};
  uint32_t* contextError = nullptr;  // the ring's sticky error word (RingControl::error)
  std::vector<std::unique_ptr<MemoryRegion>> windows;
  std::vector<void*> registered;  // page ranges this path registered with CUDA

  ~State() {
    if (gpu != nullptr) {
      staging::ContextScope scope(gpu->cuda(), gpu->context());
      for (void* start : registered) gpu->cuda().cuMemHostUnregister(start);
    }
    windows.clear();
    if (signalRegion != nullptr) api->deregMr(signalRegion);
    if (sinkRegion != nullptr) api->deregMr(sinkRegion);
  }

  // Registers the pages around [host, host + bytes) with CUDA (`flags` beside DEVICEMAP | PORTABLE) and returns
  // the address kernels use for `host`. Pages some other registration already covers are used as they are.
  void* mapIntoGpu(void* host, size_t bytes, unsigned flags, const char* what) {
    const cuda::DriverApi& cuda = gpu->cuda();
    const auto first = reinterpret_cast<uintptr_t>(host) & ~uintptr_t{4095};
    const auto end = (reinterpret_cast<uintptr_t>(host) + bytes + 4095) & ~uintptr_t{4095};
    auto* start = reinterpret_cast<void*>(first);
    staging::ContextScope scope(cuda, gpu->context());
    const cuda::CUresult result = cuda.cuMemHostRegister(
        start, end - first, flags | cuda::CU_MEMHOSTREGISTER_DEVICEMAP | cuda::CU_MEMHOSTREGISTER_PORTABLE);
    if (result != cuda::CUDA_SUCCESS && result != kAlreadyRegistered) {
      fail(ncclSystemError, "NET/railnet: doorbell direct path: mapping %s (%zu bytes at %p) into GPU %d: %s", what,
           bytes, host, gpu->device(), cuda.errorText(result).c_str());
    }
    if (result == cuda::CUDA_SUCCESS) registered.push_back(start);
    cuda::CUdeviceptr mapped = reinterpret_cast<cuda::CUdeviceptr>(host);
    if (cuda.cuMemHostGetDevicePointer != nullptr) {
      cuda::CUdeviceptr found = 0;
      if (cuda.cuMemHostGetDevicePointer(&found, host, 0) == cuda::CUDA_SUCCESS) mapped = found;
    }
    return reinterpret_cast<void*>(mapped);
  }
};

DirectPath::DirectPath(std::unique_ptr<State> state) : state_(std::move(state)) {}
DirectPath::~DirectPath() = default;

std::string DirectPath::unavailable(const char* transportName, const DeviceInfo& info, bool enabled) {
  if (!enabled) return "RAILNET_DOORBELL_DIRECT=0";
  if (std::strcmp(transportName, "verbs") != 0) return std::string("the transport is ") + transportName + ", not verbs";
  if (!info.children.empty()) return "device " + info.name + " is fused (one queue pair per peer needs one port)";
  // A verbs device is named after its kernel device ("mlx5_0", or "mlx5_0:1" when several ports are in use).
  if (info.name.rfind("mlx5", 0) != 0) return info.name.substr(0, info.name.find(':')) + " is not an mlx5 device";
  return {};
}

std::unique_ptr<DirectPath> DirectPath::open(const Transport& transport, int dev, int cudaDevice, int rank,
                                             int nranks, std::string* why) {
  const DeviceInfo& info = transport.device(dev);
  *why = unavailable(transport.name(), info, settings().doorbellDirect != 0);
  if (!why->empty()) return nullptr;
  auto state = std::make_unique<State>();
  state->api = verbs::loadIbverbs(why);
  if (state->api == nullptr) return nullptr;
  const verbs::VerbsPort* chosen = nullptr;
  const std::vector<verbs::VerbsPort> ports = verbs::discoverPorts(*state->api);
  for (const verbs::VerbsPort& port : ports) {
    if (port.info.name == info.name) chosen = &port;
  }
  if (chosen == nullptr) {
    *why = "port " + info.name + " is gone";
    return nullptr;
  }
  state->mlx5 = loadMlx5(why);
  if (state->mlx5 == nullptr) return nullptr;
  if (cudaDevice < 0) {
    *why = "the context has no GPU";
    return nullptr;
  }
  try {
    state->gpu = std::make_unique<PrimaryContext>(cudaDevice);
  } catch (const std::exception& error) {
    *why = error.what();
    return nullptr;
  }
  state->rank = rank;
  state->nranks = nranks;
  state->device = std::make_shared<verbs::VerbsDevice>(*state->api, *chosen);
  if (state->mlx5->isSupported(state->device->context()->device) == 0) {
    *why = chosen->device + ": mlx5dv_is_supported says no";
    return nullptr;
  }
  verbs::QpOptions options;
  options.count = 1;
  options.sendDepth = kSendDepth;
  options.recvDepth = 1;
  options.remoteAtomics = true;
  state->queuePairs.resize(static_cast<size_t>(nranks));
  for (int peer = 0; peer < nranks; ++peer) {
    if (peer != rank) state->queuePairs[static_cast<size_t>(peer)] = std::make_unique<verbs::QueuePairs>(state->device, options);
  }
  return std::unique_ptr<DirectPath>(new DirectPath(std::move(state)));
}

size_t DirectPath::offerBytes(int nranks) {
  return sizeof(OfferHeader) + static_cast<size_t>(nranks) * sizeof(verbs::QpInfo);
}

std::vector<char> DirectPath::notOffered(int nranks) {
  std::vector<char> bytes(offerBytes(nranks), 0);
  const OfferHeader header{kOfferMagic, 0};
  std::memcpy(bytes.data(), &header, sizeof(header));
  return bytes;
}

std::vector<char> DirectPath::offer() const {
  std::vector<char> bytes = notOffered(state_->nranks);
  const OfferHeader header{kOfferMagic, 1};
  std::memcpy(bytes.data(), &header, sizeof(header));
  for (int peer = 0; peer < state_->nranks; ++peer) {
    if (peer == state_->rank) continue;
    const verbs::QpInfo info = state_->queuePairs[static_cast<size_t>(peer)]->localInfo();
    std::memcpy(bytes.data() + sizeof(OfferHeader) + static_cast<size_t>(peer) * sizeof(info), &info, sizeof(info));
  }
  return bytes;
}

bool DirectPath::allOffered(const std::vector<std::vector<char>>& offers, std::string* why) {
  for (size_t rank = 0; rank < offers.size(); ++rank) {
    OfferHeader header{};
    if (offers[rank].size() != offerBytes(static_cast<int>(offers.size()))) {
      *why = "rank " + std::to_string(rank) + "'s offer is " + std::to_string(offers[rank].size()) + " bytes";
      return false;
    }
    std::memcpy(&header, offers[rank].data(), sizeof(header));
    if (header.magic != kOfferMagic || header.offered != 1) {
      *why = "rank " + std::to_string(rank) + " has no direct path";
      return false;
    }
  }
  return true;
}

void DirectPath::connect(const std::vector<std::vector<char>>& offers, uint64_t* signals, size_t signalBytes,
                         uint32_t* contextError) {
  State& s = *state_;
  s.contextError = contextError;
  const auto ranks = static_cast<size_t>(s.nranks);
  // The view, then the queues, the keys and the atomic sink, each on its own cache lines.
  const size_t queuesAt = 64;
  const size_t localAt = queuesAt + ranks * sizeof(DirectQueue);
  const size_t remoteAt = localAt + kMaxWindows * sizeof(DirectKey);
  const size_t signalsAt = remoteAt + ranks * kMaxWindows * sizeof(DirectKey);
  const size_t sinkAt = (signalsAt + ranks * sizeof(DirectKey) + 63) / 64 * 64;
  s.memory = std::make_unique<MappedMemory>(s.gpu->device(), sinkAt + 64);
  auto* base = static_cast<char*>(s.memory->data());
  s.view = reinterpret_cast<DirectView*>(base);
  s.queues = reinterpret_cast<DirectQueue*>(base + queuesAt);
  s.view->queues = s.queues;
  s.view->localWindows = reinterpret_cast<DirectKey*>(base + localAt);
  s.view->remoteWindows = reinterpret_cast<DirectKey*>(base + remoteAt);
  s.view->remoteSignals = reinterpret_cast<DirectKey*>(base + signalsAt);
  s.view->maxWindows = kMaxWindows;

  s.sendQueues.assign(ranks, nullptr);
  s.completions.assign(ranks, CqReader{});
  s.warned.assign(ranks, false);
  for (size_t peer = 0; peer < ranks; ++peer) {
    if (static_cast<int>(peer) == s.rank) continue;
    verbs::QpInfo remote{};
    std::memcpy(&remote, offers[peer].data() + sizeof(OfferHeader) + static_cast<size_t>(s.rank) * sizeof(remote),
                sizeof(remote));
    verbs::QueuePairs& pair = *s.queuePairs[peer];
    pair.connect(remote);
    mlx5dv_qp qp{};
    mlx5dv_cq cq{};
    mlx5dv_obj objects{};
    objects.qp.in = pair.qp(0);
    objects.qp.out = &qp;
    objects.cq.in = pair.cq();
    objects.cq.out = &cq;
    if (const int err = s.mlx5->initObj(&objects, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ); err != 0) {
      fail(ncclSystemError, "NET/railnet: doorbell direct path: mlx5dv_init_obj for rank %zu's queue pair: %s", peer,
           std::strerror(err));
    }
    // The producer extends 16-bit WQE indices (at most 2^15 WQEBBs), and every WQE asks for a CQE (the CQ must hold
    // a full send queue's).
    if (qp.sq.stride != 64 || qp.sq.wqe_cnt == 0 || (qp.sq.wqe_cnt & (qp.sq.wqe_cnt - 1)) != 0 ||
        qp.sq.wqe_cnt > (1u << 15) || qp.bf.reg == nullptr || cq.cqe_cnt < qp.sq.wqe_cnt ||
        (cq.cqe_cnt & (cq.cqe_cnt - 1)) != 0 || cq.cqe_size != mlx5::cqe::kBytes) {
      fail(ncclSystemError,
           "NET/railnet: doorbell direct path: rank %zu's queue pair is not as expected (SQ %u x %u bytes, doorbell "
           "register %p, CQ %u x %u bytes)",
           peer, qp.sq.wqe_cnt, qp.sq.stride, qp.bf.reg, cq.cqe_cnt, cq.cqe_size);
    }
    DirectQueue& queue = s.queues[peer];
    s.sendQueues[peer] = qp.sq.buf;
    queue.wqes = s.mapIntoGpu(qp.sq.buf, size_t{qp.sq.wqe_cnt} * 64, 0, "a send queue");
    queue.doorbellRecord = static_cast<uint32_t*>(s.mapIntoGpu(qp.dbrec, 8, 0, "a doorbell record"));
    queue.doorbellRegister =
        static_cast<uint64_t*>(s.mapIntoGpu(qp.bf.reg, 8, cuda::CU_MEMHOSTREGISTER_IOMEMORY, "a doorbell register"));
    queue.depth = qp.sq.wqe_cnt;
    queue.qpn = pair.qp(0)->qp_num;
    CqReader& reader = s.completions[peer];
    reader.cqes = static_cast<uint8_t*>(cq.buf);
    reader.count = cq.cqe_cnt;
    reader.doorbellRecord = reinterpret_cast<uint32_t*>(cq.dbrec);
  }
  s.signalRegion = s.api->regMr(s.device->pd(), signals, signalBytes, kAtomicAccess);
  s.sinkRegion = s.api->regMr(s.device->pd(), base + sinkAt, 64, IBV_ACCESS_LOCAL_WRITE);
  if (s.signalRegion == nullptr || s.sinkRegion == nullptr) {
    const int err = errno;
    fail(ncclSystemError, "NET/railnet: doorbell direct path: registering the signal words for atomics: %s",
         std::strerror(err));
  }
  s.signals = DirectKey{reinterpret_cast<uint64_t>(signals), s.signalRegion->rkey, kKeyHostMemory};
  s.view->atomicSink = DirectKey{reinterpret_cast<uint64_t>(base + sinkAt), s.sinkRegion->lkey, kKeyHostMemory};
  deviceView_ = s.view;  // cuMemHostAlloc'ed: the same address in the GPU (unified addressing)
  RN_INFO(NCCL_INIT, "NET/railnet: doorbell direct path: rank %d of %d posts to %s through %d queue pair(s), "
          "send queues mapped into GPU %d (not run on hardware)", s.rank, s.nranks, s.device->port().device.c_str(),
          s.nranks - 1, s.gpu->device());
}

DirectKey DirectPath::signalKey() const { return state_->signals; }

void DirectPath::setRemoteSignals(int rank, const DirectKey& key) { state_->view->remoteSignals[rank] = key; }

DirectKey DirectPath::registerWindow(uint32_t window, void* data, size_t bytes, int type) {
  State& s = *state_;
  if (window >= kMaxWindows) {
    fail(ncclInvalidUsage, "NET/railnet: doorbell direct path: at most %u windows", kMaxWindows);
  }
  std::unique_ptr<MemoryRegion> region = s.device->registerMemory(data, bytes, type);
  const auto* verbsRegion = static_cast<const verbs::VerbsRegion*>(region.get());
  const uint32_t memory = type == NCCL_PTR_HOST ? kKeyHostMemory : kKeyGpuMemory;
  const DirectKey local{reinterpret_cast<uint64_t>(data), verbsRegion->lkey(), memory};
  const DirectKey remote{reinterpret_cast<uint64_t>(data), verbsRegion->rkey(), memory};
  s.windows.push_back(std::move(region));
  s.view->localWindows[window] = local;
  return remote;
}

void DirectPath::setRemoteWindow(uint32_t window, int rank, const DirectKey& key) {
  state_->view->remoteWindows[static_cast<size_t>(rank) * kMaxWindows + window] = key;
}

bool DirectPath::poll() noexcept {
  State& s = *state_;
  bool moved = false;
  for (size_t peer = 0; peer < s.completions.size(); ++peer) {
    CqReader& reader = s.completions[peer];
    if (reader.cqes == nullptr) continue;
    DirectQueue& queue = s.queues[peer];
    const uint64_t before = reader.consumer;
    for (int taken = 0; taken < 64; ++taken) {
      const void* entry = mlx5::cqe::at(reader.cqes, reader.count, static_cast<uint32_t>(reader.consumer));
      if (!mlx5::cqe::ready(entry, static_cast<uint32_t>(reader.consumer), reader.count)) break;
      // The CQE's fields only after its owner byte (an acquire load of it: ready() read it plainly).
      std::atomic_ref<const uint8_t>(static_cast<const uint8_t*>(entry)[mlx5::cqe::kOpOwnOffset])
          .load(std::memory_order_acquire);
      if (!mlx5::cqe::isError(entry)) {
        const uint16_t counter = mlx5::cqe::wqeCounter(entry);
        const uint32_t wqebbs = mlx5::cqe::wqebbsOfWqe(mlx5::wqebbAt(s.sendQueues[peer], queue.depth, counter));
        std::atomic_ref<uint64_t> completed(queue.completed);
        completed.store(mlx5::cqe::completedAfter(completed.load(std::memory_order_relaxed), counter, wqebbs),
                        std::memory_order_release);
      } else {
        std::atomic_ref<uint32_t>(queue.error).store(RAILNET_DOORBELL_PEER_FAILED, std::memory_order_release);
        // The context's error word too: wait_signal and quiet read it, so every wait of the context ends.
        uint32_t none = 0;
        std::atomic_ref<uint32_t>(*s.contextError)
            .compare_exchange_strong(none, RAILNET_DOORBELL_PEER_FAILED, std::memory_order_acq_rel);
        if (!s.warned[peer]) {
          s.warned[peer] = true;
          RN_WARN("NET/railnet: doorbell direct path: an operation to rank %zu failed on %s (completion opcode 0x%x, "
                  "syndrome 0x%x, vendor syndrome 0x%x); kernels see error %d",
                  peer, s.device->port().device.c_str(), mlx5::cqe::opcode(entry), mlx5::cqe::syndrome(entry),
                  mlx5::cqe::vendorSyndrome(entry), RAILNET_DOORBELL_PEER_FAILED);
        }
      }
      ++reader.consumer;
    }
    if (reader.consumer != before) {
      std::atomic_ref<uint32_t>(*reader.doorbellRecord)
          .store(mlx5::cqe::doorbellRecordValue(static_cast<uint32_t>(reader.consumer)), std::memory_order_release);
      moved = true;
    }
  }
  return moved;
}

}  // namespace railnet::doorbell
