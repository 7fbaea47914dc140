#include "proxy/rma/target_writer.h"

#include <atomic>
#include <cstring>
#include <mutex>

#include "proxy/staging/copy_queue.h"
#include "proxy/staging/pinned_memory.h"
#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::rma {

struct TargetWriter::DeviceLane {
  std::shared_ptr<staging::CopyContext> copyContext;
  std::unique_ptr<staging::DeviceContext> bufferContext;  // when the copy context cannot read the window
  std::unique_ptr<staging::CopyQueue> queue;
  // [0, 8): the signal value read; [8, 16): the value written back; [16, ...): an inline payload going up.
  std::unique_ptr<staging::PinnedMemory> staging;
  uint64_t* readWord() const { return reinterpret_cast<uint64_t*>(staging->data()); }
  uint64_t* writeWord() const { return readWord() + 1; }
  char* payload() const { return staging->data() + 2 * sizeof(uint64_t); }
};

TargetWriter::TargetWriter() = default;
TargetWriter::~TargetWriter() = default;

namespace {

// Measured on H100/H200 (scripts/gpu/timeslice-probe.py, docs/performance.md §11, D70): a copy into GPU memory of
// less than 32 KiB issued from a second context waits for a GPU time slice (~2.4 ms) while a kernel of another
// context runs, as the kernel waiting for a GIN signal does. Under MPS the contexts share the GPU and it does not.
void warnIfCopiesWaitForTimeSlices(const cuda::DriverApi& cuda, int device, bool ownContext) {
  static std::once_flag once;
  if (!ownContext) return;
  cuda::CUdevice handle = 0;
  int mps = 0;
  if (cuda.cuDeviceGet(&handle, device) != cuda::CUDA_SUCCESS ||
      cuda.cuDeviceGetAttribute(&mps, cuda::CU_DEVICE_ATTRIBUTE_MPS_ENABLED, handle) != cuda::CUDA_SUCCESS || mps != 0) {
    return;
  }
  std::call_once(once, [device] {
    RN_WARN("NET/railnet: one-sided: signals and puts under 32 KiB into GPU %d's memory wait for a GPU time slice (about "
            "2.4 ms on H200) while the application's kernel runs, because MPS is not running; start "
            "nvidia-cuda-mps-control -d for round trips near 60 us (docs/performance.md section 11)", device);
  });
}

}  // namespace

int TargetWriter::prepareDevice(const void* window) {
  std::string why;
  const cuda::DriverApi* cuda = cuda::initDriver(&why);
  if (cuda == nullptr) {
    fail(ncclSystemError, "NET/railnet: one-sided: GPU window %p but CUDA is unusable: %s", window, why.c_str());
  }
  auto bufferContext = std::make_unique<staging::DeviceContext>(*cuda, window);  // throws when not GPU memory
  const int device = bufferContext->device();
  if (lanes_.count(device) != 0) return device;
  auto lane = std::make_unique<DeviceLane>();
  // railnet's own context, as the TCP transport's staging (D64); the window's own context when that cannot read it
  // (memory from cudaMalloc rather than NCCL's cuMem).
  lane->copyContext = staging::CopyContext::forDevice(*cuda, device, &why);
  cuda::CUcontext context = nullptr;
  if (lane->copyContext != nullptr && lane->copyContext->canRead(window)) {
    context = lane->copyContext->context();
  } else {
    lane->bufferContext = std::move(bufferContext);
    context = lane->bufferContext->context();
  }
  warnIfCopiesWaitForTimeSlices(*cuda, device, context != nullptr && lane->copyContext != nullptr);
  lane->queue = std::make_unique<staging::CopyQueue>(*cuda, context, 2);
  lane->staging = std::make_unique<staging::PinnedMemory>(*cuda, 2 * sizeof(uint64_t) + kInlinePutBytes, -1);
  lanes_[device] = std::move(lane);
  return device;
}

void TargetWriter::queueCopy(char* destination, int device, std::vector<char> bytes) {
  if (bytes.empty()) return;
  pending_.push_back({destination, device, false, 0, std::move(bytes)});
}

void TargetWriter::queueSignal(uint64_t* word, int device, SignalOp op, uint64_t value) {
  if (op == SignalOp::kNone) return;
  pending_.push_back({reinterpret_cast<char*>(word), device, true, applySignal(0, op, value), {}});
}

// Starts the head entry's first copy on its GPU: the read of a signal word, or an inline payload going up.
bool TargetWriter::start(std::string* why) {
  const Pending& head = pending_.front();
  auto found = lanes_.find(head.device);
  if (found == lanes_.end()) {
    *why = "a write to GPU " + std::to_string(head.device) + ", which no GPU window registered";
    return false;
  }
  active_ = found->second.get();
  const auto device = reinterpret_cast<cuda::CUdeviceptr>(head.destination);
  if (head.isSignal) {
    if (!active_->queue->submit(staging::CopyQueue::Direction::kDeviceToHost, active_->readWord(), device,
                                sizeof(uint64_t), 0, why)) {
      return false;
    }
    stage_ = Stage::kReading;
    return true;
  }
  std::memcpy(active_->payload(), head.bytes.data(), head.bytes.size());
  if (!active_->queue->submit(staging::CopyQueue::Direction::kHostToDevice, active_->payload(), device,
                              head.bytes.size(), 0, why)) {
    return false;
  }
  covered_ = 1;
  stage_ = Stage::kWriting;
  return true;
}

bool TargetWriter::progress(std::string* why) {
  std::vector<uint64_t> finished;
  while (!pending_.empty()) {
    if (stage_ == Stage::kIdle) {
      Pending& head = pending_.front();
      if (head.device < 0) {
        if (head.isSignal) {
          std::atomic_ref<uint64_t>(*reinterpret_cast<uint64_t*>(head.destination))
              .fetch_add(head.delta, std::memory_order_release);
        } else {
          std::memcpy(head.destination, head.bytes.data(), head.bytes.size());
        }
        pending_.pop_front();
        continue;
      }
      if (!start(why)) return false;
    }
    finished.clear();
    if (!active_->queue->poll(&finished, why)) return false;
    if (finished.empty()) return true;  // the copy in flight has not finished: come back later
    if (stage_ == Stage::kReading) {
      // Fold every queued signal on the same word that follows the head: one write covers them all.
      char* word = pending_.front().destination;
      uint64_t delta = 0;
      covered_ = 0;
      while (covered_ < pending_.size() && pending_[covered_].isSignal && pending_[covered_].destination == word) {
        delta += pending_[covered_++].delta;
      }
      *active_->writeWord() = *active_->readWord() + delta;
      if (!active_->queue->submit(staging::CopyQueue::Direction::kHostToDevice, active_->writeWord(),
                                  reinterpret_cast<cuda::CUdeviceptr>(word), sizeof(uint64_t), 0, why)) {
        return false;
      }
      stage_ = Stage::kWriting;
      continue;
    }
    pending_.erase(pending_.begin(), pending_.begin() + static_cast<long>(covered_));
    stage_ = Stage::kIdle;
    active_ = nullptr;
  }
  return true;
}

}  // namespace railnet::rma
