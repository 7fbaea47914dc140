#include "plugin/tools/raw_ce_tcp.h"

#include <algorithm>
#include <array>
#include <bit>

#include "railnet/settings.h"

namespace railnet::bench {
namespace {

// cuEventCreate flags. CU_EVENT_BLOCKING_SYNC is not in base/cuda_driver.h (the plugin only polls its events):
// with it cuEventSynchronize sleeps until the copy is done instead of spinning on a core TCP needs.
constexpr unsigned kEventBlockingSync = 0x1;  // CU_EVENT_BLOCKING_SYNC in cuda.h
constexpr unsigned kEventFlags = kEventBlockingSync | cuda::CU_EVENT_DISABLE_TIMING;

}  // namespace

// One thread's copy-engine staging: its own CUDA stream, kSlots pinned slots of `slotBytes`, one event per slot
// recorded after the copy that uses the slot.
class StagingLane {
 public:
  static constexpr int kSlots = RawCeTcpPeer::kSlots;

  StagingLane(const GpuDevice& gpu, size_t slotBytes)
      : gpu_(gpu), slotBytes_(slotBytes), memory_(gpu, slotBytes * kSlots) {
    try {
      gpu.check(gpu.api().cuStreamCreate(&stream_, cuda::CU_STREAM_NON_BLOCKING), "cuStreamCreate");
      for (cuda::CUevent& event : events_) gpu.check(gpu.api().cuEventCreate(&event, kEventFlags), "cuEventCreate");
    } catch (...) {
      release();
      throw;
    }
  }
  ~StagingLane() { release(); }
  StagingLane(const StagingLane&) = delete;
  StagingLane& operator=(const StagingLane&) = delete;

  size_t slotBytes() const noexcept { return slotBytes_; }
  std::byte* slot(int index) const noexcept { return memory_.data() + static_cast<size_t>(index) * slotBytes_; }

  void copyDown(int index, cuda::CUdeviceptr from, size_t bytes) {
    gpu_.check(gpu_.api().cuMemcpyDtoHAsync(slot(index), from, bytes, stream_), "cuMemcpyDtoHAsync");
    gpu_.check(gpu_.api().cuEventRecord(events_[static_cast<size_t>(index)], stream_), "cuEventRecord");
  }
  void copyUp(cuda::CUdeviceptr to, int index, size_t bytes) {
    gpu_.check(gpu_.api().cuMemcpyHtoDAsync(to, slot(index), bytes, stream_), "cuMemcpyHtoDAsync");
    gpu_.check(gpu_.api().cuEventRecord(events_[static_cast<size_t>(index)], stream_), "cuEventRecord");
  }
  // Sleeps until the copy last queued on slot `index` finished.
  void wait(int index) {
    gpu_.check(gpu_.api().cuEventSynchronize(events_[static_cast<size_t>(index)]), "cuEventSynchronize");
  }
  // Whether it has finished, without waiting.
  bool finished(int index) {
    const cuda::CUresult result = gpu_.api().cuEventQuery(events_[static_cast<size_t>(index)]);
    if (result == cuda::CUDA_ERROR_NOT_READY) return false;
    gpu_.check(result, "cuEventQuery");
    return true;
  }

 private:
  void release() noexcept {
    const cuda::DriverApi& api = gpu_.api();
    if (stream_) api.cuStreamSynchronize(stream_);  // copies still in flight use the slots freed below
    for (cuda::CUevent& event : events_) {
      if (event) api.cuEventDestroy(event);
      event = nullptr;
    }
    if (stream_) api.cuStreamDestroy(stream_);
    stream_ = nullptr;
  }

  const GpuDevice& gpu_;
  const size_t slotBytes_;
  PinnedMemory memory_;
  cuda::CUstream stream_ = nullptr;
  std::array<cuda::CUevent, kSlots> events_ = {};
};

namespace {

// Pieces queued on a lane in order, slot = sequence number % kSlots: at most kSlots, the oldest first.
struct Piece {
  int slot;
  size_t bytes;
  uint64_t message;  // the receiver's message, which lands when its last piece is copied up
  bool lastOfMessage;
};

class PieceQueue {
 public:
  bool empty() const noexcept { return count_ == 0; }
  bool full() const noexcept { return count_ == RawCeTcpPeer::kSlots; }
  int nextSlot() const noexcept { return static_cast<int>((head_ + count_) % RawCeTcpPeer::kSlots); }
  const Piece& oldest() const noexcept { return pieces_[head_]; }
  void push(const Piece& piece) noexcept {
    pieces_[(head_ + count_) % RawCeTcpPeer::kSlots] = piece;
    ++count_;
  }
  void pop() noexcept {
    head_ = (head_ + 1) % RawCeTcpPeer::kSlots;
    --count_;
  }

 private:
  std::array<Piece, RawCeTcpPeer::kSlots> pieces_ = {};
  size_t head_ = 0;
  size_t count_ = 0;
};

// A sender thread's pipeline: ranges are copied down piece by piece into free slots, and a piece goes on the socket
// once its copy finished. A new copy needs a free slot, so the copies run up to kSlots pieces ahead of send().
class PieceSender {
 public:
  PieceSender(StagingLane& lane, StallGuard& guard, int fd, const char* what)
      : lane_(lane), guard_(guard), fd_(fd), what_(what) {}

  void copyDown(cuda::CUdeviceptr from, size_t bytes) {
    for (size_t offset = 0; offset < bytes; offset += lane_.slotBytes()) {
      if (queue_.full()) sendOldest();
      const Piece piece{queue_.nextSlot(), std::min(lane_.slotBytes(), bytes - offset), 0, false};
      lane_.copyDown(piece.slot, from + offset, piece.bytes);
      queue_.push(piece);
    }
  }
  // False when nothing was queued.
  bool sendOldest() {
    if (queue_.empty()) return false;
    const Piece& piece = queue_.oldest();
    lane_.wait(piece.slot);
    sendAll(guard_, fd_, lane_.slot(piece.slot), piece.bytes, what_);
    queue_.pop();
    return true;
  }
  void flush() {
    while (sendOldest()) {
    }
  }

 private:
  StagingLane& lane_;
  StallGuard& guard_;
  const int fd_;
  const char* what_;
  PieceQueue queue_;
};

// A receiver thread's pipeline: each piece is received into a free slot and copied up at once; finished copies
// free their slots and, for a message's last piece, report the message as landed. While its socket is empty the
// thread waits for its oldest copy instead, so a message lands (and the sender gets its credit) without delay.
class PieceReceiver {
 public:
  using Landed = std::function<void(uint64_t message)>;
  PieceReceiver(StagingLane& lane, StallGuard& guard, int fd, const char* what, Landed landed)
      : lane_(lane), guard_(guard), fd_(fd), what_(what), landed_(std::move(landed)) {}

  void receive(cuda::CUdeviceptr to, size_t bytes, uint64_t message) {
    for (size_t offset = 0; offset < bytes; offset += lane_.slotBytes()) {
      if (queue_.full()) landOldest();
      const size_t pieceBytes = std::min(lane_.slotBytes(), bytes - offset);
      const Piece piece{queue_.nextSlot(), pieceBytes, message, offset + pieceBytes == bytes};
      recvAll(guard_, fd_, lane_.slot(piece.slot), piece.bytes, what_, [this] { return landOldest(); });
      lane_.copyUp(to + offset, piece.slot, piece.bytes);
      queue_.push(piece);
      while (!queue_.empty() && lane_.finished(queue_.oldest().slot)) landOldest();
    }
  }
  // False when no copy was in flight.
  bool landOldest() {
    if (queue_.empty()) return false;
    const Piece piece = queue_.oldest();
    lane_.wait(piece.slot);
    queue_.pop();
    if (piece.lastOfMessage && landed_) landed_(piece.message);
    return true;
  }
  void drain() {
    while (landOldest()) {
    }
  }

 private:
  StagingLane& lane_;
  StallGuard& guard_;
  const int fd_;
  const char* what_;
  Landed landed_;
  PieceQueue queue_;
};

}  // namespace

RawCeTcpPeer::RawCeTcpPeer(int streams, int window, size_t maxMessage, BenchBuffers& buffers, StallGuard& guard,
                           const GpuDevice& gpu)
    : buffers_(buffers), guard_(guard), window_(window) {
  if (!buffers.onGpu()) fail("raw CE+TCP needs GPU buffers");
  guard.setPhase("raw CE+TCP connect");
  pairs_ = connectLoopbackPairs(streams, "raw CE+TCP");
  backPairs_ = connectLoopbackPairs(streams, "raw CE+TCP");
  // The plugin's staging piece, so both move GPU memory in the same steps; no larger than a message.
  const auto configured = static_cast<uint64_t>(railnet::settings().tcpStagingPieceBytes);
  pieceBytes_ = std::min<size_t>(std::bit_floor(configured), std::max<size_t>(maxMessage, 1));
  guard.setPhase("raw CE+TCP pinned slots");
  auto makeLanes = [&](std::vector<PairLanes>& lanes) {
    lanes.resize(static_cast<size_t>(streams));
    for (PairLanes& pair : lanes) {
      pair.sender = std::make_unique<StagingLane>(gpu, pieceBytes_);
      pair.receiver = std::make_unique<StagingLane>(gpu, pieceBytes_);
    }
  };
  makeLanes(lanes_);
  makeLanes(backLanes_);
}

RawCeTcpPeer::~RawCeTcpPeer() = default;

int RawCeTcpPeer::streamsFor(size_t size) const noexcept {
  return static_cast<int>(std::min<size_t>(pairs_.size(), std::max<size_t>(size, 1)));
}

double RawCeTcpPeer::runThreads(const std::vector<std::function<void()>>& tasks) {
  // Every thread copies: each makes the GPU's context current before the clock starts.
  return runTogether(guard_, tasks, [this] { buffers_.prepareThread(); });
}

void RawCeTcpPeer::addStreamTasks(const std::vector<SocketPair>& pairs, const std::vector<PairLanes>& lanes,
                                  const BenchBuffer& source, const BenchBuffer& destination, size_t size,
                                  uint64_t count, std::vector<std::unique_ptr<MessageCredit>>* credits,
                                  std::vector<std::function<void()>>* tasks) {
  const int used = streamsFor(size);
  for (int j = 0; j < used; ++j) {
    credits->push_back(std::make_unique<MessageCredit>());
    MessageCredit& credit = *credits->back();
    const auto [begin, length] = sliceOf(size, j, used);
    const auto pair = static_cast<size_t>(j);
    const int senderFd = pairs[pair].sender.fd();
    const int receiverFd = pairs[pair].receiver.fd();
    StagingLane& senderLane = *lanes[pair].sender;
    StagingLane& receiverLane = *lanes[pair].receiver;
    const cuda::CUdeviceptr from = source.deviceAddress();
    const cuda::CUdeviceptr to = destination.deviceAddress();

    tasks->emplace_back([=, this, &credit, &senderLane] {
      const std::string who = format("raw CE+TCP sender %d", j);
      PieceSender sender(senderLane, guard_, senderFd, "raw CE+TCP sender");
      for (uint64_t i = 0; i < count; ++i) {
        // Pieces already copied down go out first: the receiver's credit may be waiting for them.
        while (!credit.allows(i, window_)) {
          if (!sender.sendOldest()) credit.waitToStart(i, window_, guard_, who.c_str());
        }
        sender.copyDown(from + buffers_.slotOffset(size, i) + begin, length);
      }
      sender.flush();
    });
    tasks->emplace_back([=, this, &credit, &receiverLane] {
      PieceReceiver receiver(receiverLane, guard_, receiverFd, "raw CE+TCP receiver",
                             [&credit](uint64_t message) { credit.complete(message + 1); });
      for (uint64_t i = 0; i < count; ++i) receiver.receive(to + buffers_.slotOffset(size, i) + begin, length, i);
      receiver.drain();
    });
  }
}

double RawCeTcpPeer::stream(size_t size, uint64_t count) {
  std::vector<std::unique_ptr<MessageCredit>> credits;
  std::vector<std::function<void()>> tasks;
  addStreamTasks(pairs_, lanes_, buffers_.send, buffers_.recv, size, count, &credits, &tasks);
  return runThreads(tasks);
}

double RawCeTcpPeer::streamBothWays(size_t size, uint64_t count) {
  std::vector<std::unique_ptr<MessageCredit>> credits;
  std::vector<std::function<void()>> tasks;
  addStreamTasks(pairs_, lanes_, buffers_.send, buffers_.recv, size, count, &credits, &tasks);
  addStreamTasks(backPairs_, backLanes_, buffers_.echoSend, buffers_.echoRecv, size, count, &credits, &tasks);
  return runThreads(tasks);
}

double RawCeTcpPeer::pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) {
  const int initiatorFd = pairs_.front().sender.fd();
  const int echoFd = pairs_.front().receiver.fd();
  StagingLane& initiatorLane = *lanes_.front().sender;
  StagingLane& echoLane = *lanes_.front().receiver;
  halfRttUs->reserve(halfRttUs->size() + count);
  // One message each way: every piece is sent, or copied up, before the other side's turn.
  auto sendMessage = [&](StagingLane& lane, int fd, cuda::CUdeviceptr from, const char* what) {
    PieceSender sender(lane, guard_, fd, what);
    sender.copyDown(from, size);
    sender.flush();
  };
  auto receiveMessage = [&](StagingLane& lane, int fd, cuda::CUdeviceptr to, const char* what) {
    PieceReceiver receiver(lane, guard_, fd, what, nullptr);
    receiver.receive(to, size, 0);
    receiver.drain();
  };
  auto initiator = [&] {
    for (uint64_t i = 0; i < count; ++i) {
      double start = now();
      sendMessage(initiatorLane, initiatorFd, buffers_.send.deviceAddress(), "raw CE+TCP ping send");
      receiveMessage(initiatorLane, initiatorFd, buffers_.echoRecv.deviceAddress(), "raw CE+TCP pong recv");
      halfRttUs->push_back((now() - start) * 1e6 / 2);
    }
  };
  auto echo = [&] {
    for (uint64_t i = 0; i < count; ++i) {
      receiveMessage(echoLane, echoFd, buffers_.recv.deviceAddress(), "raw CE+TCP ping recv");
      sendMessage(echoLane, echoFd, buffers_.echoSend.deviceAddress(), "raw CE+TCP pong send");
    }
  };
  return runThreads({initiator, echo});
}

}  // namespace railnet::bench
