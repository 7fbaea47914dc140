#include "proxy/tcp/recv_comm.h"

#include <algorithm>
#include <cstring>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::tcp {

ncclResult_t RecvRequest::test(int* done, int* sizes) noexcept { return comm_->testRequest(this, done, sizes); }

TcpRecvComm::TcpRecvComm(Fd control, std::vector<Fd> data, const SocketAddress& peer, const LaneLayout& layout)
    : link_(std::move(control), std::move(data), peer, "receive"), openStreams_(0) {
  link_.setCounters(layout);
  for (RecvRequest& entry : ring_) {
    entry.comm_ = this;
    entry.postedId_.store(UINT32_MAX, std::memory_order_relaxed);
  }
  link_.start(this);
  openStreams_.store(link_.streamCount(), std::memory_order_release);
}

TcpRecvComm::~TcpRecvComm() { link_.stop(); }

std::unique_ptr<MemoryRegion> TcpRecvComm::regMr(void* data, size_t size, int type) {
  return registerHostMemory(data, size, type);
}

std::unique_ptr<MemoryRegion> TcpRecvComm::regMrDmaBuf(void*, size_t, int, uint64_t, int) {
  return registerHostMemory(nullptr, 0, NCCL_PTR_DMABUF);
}

ncclResult_t TcpRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion**,
                                Request** request) noexcept {
  *request = nullptr;
  if (n < 1 || n > kMaxRecvs) {
    RN_WARN("NET/railnet: irecv of %d buffers from %s; railnet takes 1 to %d", n, link_.peerName().c_str(), kMaxRecvs);
    return ncclInvalidUsage;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (!link_.flushControl() || peerGone()) {
    link_.recordFailure("the sender closed the connection");
    return link_.reportFailure();
  }
  RecvRequest& entry = ring_[nextRecvId_ % kRing];
  if (entry.inUse_) return ncclSuccess;  // more than kRing receives in flight: try again later

  FrameHeader header{static_cast<uint8_t>(FrameType::kClearToSend), static_cast<uint8_t>(n), 0, nextRecvId_, 0};
  ClearToSendEntry entries[kMaxRecvs]{};
  entry.count_ = n;
  for (int i = 0; i < n; ++i) {
    RecvRequest::Slot& slot = entry.slots_[i];
    slot.data = static_cast<char*>(data[i]);
    slot.capacity = sizes[i];
    slot.tag = tags != nullptr ? tags[i] : 0;
    slot.received.store(0, std::memory_order_relaxed);
    slot.size.store(0, std::memory_order_relaxed);
    entries[i].tag = slot.tag;
    entries[i].capacity = sizes[i];
  }
  entry.oversize_.store(false, std::memory_order_relaxed);
  entry.pendingSlots_.store(n, std::memory_order_relaxed);
  entry.inUse_ = true;
  // Publish before the clear-to-send leaves: a helper thread may see the first chunk right after.
  entry.postedId_.store(nextRecvId_, std::memory_order_release);
  ++nextRecvId_;
  link_.sendControl(&header, sizeof(header), entries, sizeof(ClearToSendEntry) * static_cast<size_t>(n));
  *request = &entry;
  return ncclSuccess;
}

ncclResult_t TcpRecvComm::iflush(int, void**, const int*, MemoryRegion**, Request** request) noexcept {
  *request = nullptr;  // host memory: nothing to flush
  return ncclSuccess;
}

RecvRequest* TcpRecvComm::postedRequest(uint32_t recvId, int slot) {
  RecvRequest& entry = ring_[recvId % kRing];
  if (entry.postedId_.load(std::memory_order_acquire) != recvId || slot < 0 || slot >= entry.count_) return nullptr;
  return &entry;
}

void TcpRecvComm::completeSlot(RecvRequest& request, int slot, uint64_t size) {
  request.slots_[slot].size.store(size, std::memory_order_relaxed);
  request.pendingSlots_.fetch_sub(1, std::memory_order_acq_rel);
}

bool TcpRecvComm::startFrame() {
  RecvRequest* request = postedRequest(frame_.recvId, frame_.slot);
  if (request == nullptr) {
    link_.recordFailure("protocol error: control frame for receive " + std::to_string(frame_.recvId) +
                        " slot " + std::to_string(frame_.slot) + ", which is not posted");
    return false;
  }
  RecvRequest::Slot& slot = request->slots_[frame_.slot];
  if (frame_.type == static_cast<uint8_t>(FrameType::kOversize)) {
    RN_WARN("NET/railnet: %s sent %lu bytes (tag %d) into a receive buffer of %lu bytes", link_.peerName().c_str(),
            static_cast<unsigned long>(frame_.size), slot.tag, static_cast<unsigned long>(slot.capacity));
    request->oversize_.store(true, std::memory_order_relaxed);
    completeSlot(*request, frame_.slot, 0);
    return true;
  }
  if (frame_.type != static_cast<uint8_t>(FrameType::kInline) || frame_.size > slot.capacity) {
    link_.recordFailure("protocol error: bad control frame (type " + std::to_string(frame_.type) + ", size " +
                        std::to_string(frame_.size) + ")");
    return false;
  }
  if (frame_.size == 0) {
    completeSlot(*request, frame_.slot, 0);
    return true;
  }
  inInline_ = true;
  inlineDestination_ = slot.data;
  inlineLeft_ = frame_.size;
  return true;
}

void TcpRecvComm::finishInline() {
  inInline_ = false;
  if (NicCounters* counters = link_.controlCounters()) counters->addReceived(frame_.size);
  completeSlot(ring_[frame_.recvId % kRing], frame_.slot, frame_.size);
}

bool TcpRecvComm::consumeBuffered() {
  while (link_.controlSize() > 0) {
    if (inInline_) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(link_.controlSize(), inlineLeft_));
      memcpy(inlineDestination_ + (frame_.size - inlineLeft_), link_.controlData(), take);
      link_.consumeControl(take);
      inlineLeft_ -= take;
      if (inlineLeft_ == 0) finishInline();
      continue;
    }
    if (link_.controlSize() < sizeof(FrameHeader)) break;
    memcpy(&frame_, link_.controlData(), sizeof(FrameHeader));
    link_.consumeControl(sizeof(FrameHeader));
    if (!startFrame()) return false;
  }
  return true;
}

void TcpRecvComm::pumpControl() {
  if (!link_.flushControl() || controlClosed_.load(std::memory_order_relaxed)) return;
  // Big inline payloads are read straight into their buffer rather than through the staging buffer.
  constexpr uint64_t kDirectRead = 16 * 1024;
  for (;;) {
    if (!consumeBuffered()) return;
    bool direct = inInline_ && inlineLeft_ >= kDirectRead;
    size_t wanted = direct ? static_cast<size_t>(inlineLeft_) : 0;
    ssize_t got = direct ? readSome(link_.controlFd(), inlineDestination_ + (frame_.size - inlineLeft_), wanted)
                         : link_.readControl();
    if (got == 0) return;
    if (got == kEndOfStream) {
      // Not an error yet: chunks already on the data streams may still complete the posted receives.
      controlClosed_.store(true, std::memory_order_release);
      if (inInline_ || link_.controlSize() != 0) link_.recordFailure("the sender closed the connection mid-message");
      return;
    }
    if (got < 0) {
      link_.recordFailure("control connection: " + errnoText(static_cast<int>(-got)));
      return;
    }
    if (direct) {
      inlineLeft_ -= static_cast<uint64_t>(got);
      if (inlineLeft_ == 0) finishInline();
      if (static_cast<size_t>(got) < wanted) return;  // drained
    } else if (!link_.controlMayHaveMore()) {
      consumeBuffered();
      return;
    }
  }
}

bool TcpRecvComm::peerGone() const {
  // Failed for a reason other than a clean close, or closed with nothing left on any stream.
  return link_.failed() ||
         (controlClosed_.load(std::memory_order_acquire) && openStreams_.load(std::memory_order_acquire) == 0);
}

ncclResult_t TcpRecvComm::testRequest(RecvRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  if (request->pendingSlots_.load(std::memory_order_acquire) != 0) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) pumpControl();
    if (request->pendingSlots_.load(std::memory_order_acquire) != 0) {
      if (!peerGone()) return ncclSuccess;
      if (!link_.failed()) link_.recordFailure("the sender closed the connection before this receive completed");
      return link_.reportFailure();
    }
  }
  *done = 1;
  if (sizes != nullptr) {
    for (int i = 0; i < request->count_; ++i) sizes[i] = static_cast<int>(request->slots_[i].size.load(std::memory_order_relaxed));
  }
  bool oversize = request->oversize_.load(std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    request->postedId_.store(UINT32_MAX, std::memory_order_relaxed);
    request->inUse_ = false;
  }
  return oversize ? ncclInvalidUsage : ncclSuccess;
}

char* TcpRecvComm::resolveChunk(const ChunkHeader& header) noexcept {
  RecvRequest* request = postedRequest(header.recvId, header.slot);
  if (request == nullptr) return nullptr;
  const RecvRequest::Slot& slot = request->slots_[header.slot];
  if (header.messageSize > slot.capacity || header.offset > header.messageSize ||
      header.length > header.messageSize - header.offset) {
    return nullptr;
  }
  return slot.data + header.offset;
}

void TcpRecvComm::chunkReceived(const ChunkHeader& header) noexcept {
  RecvRequest& request = ring_[header.recvId % kRing];
  RecvRequest::Slot& slot = request.slots_[header.slot];
  uint64_t before = slot.received.fetch_add(header.length, std::memory_order_acq_rel);
  if (before + header.length == header.messageSize) completeSlot(request, header.slot, header.messageSize);
}

void TcpRecvComm::streamFailed(int streamIndex, const char* why, bool endOfStream) noexcept {
  if (endOfStream) {
    openStreams_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  link_.recordFailure("data stream " + std::to_string(streamIndex) + ": " + why);
}

}  // namespace railnet::tcp
