#include "proxy/verbs/verbs_recv_comm.h"

#include <cstring>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {

ncclResult_t VerbsRecvRequest::test(int* done, int* sizes) noexcept { return comm_->testRequest(this, done, sizes); }

VerbsRecvComm::VerbsRecvComm(std::vector<std::shared_ptr<VerbsDevice>> lanes, int peerLanes, tcp::Fd control,
                             const tcp::SocketAddress& peer, const QpOptions& options)
    : link_(std::move(lanes), peerLanes, std::move(control), peer, "receive", options) {
  for (VerbsRecvRequest& entry : ring_) entry.comm_ = this;
  flushMode_ = settings().ibFlush;  // parsed and validated once, with the other settings
  flushRequests_.resize(64);
  for (VerbsFlushRequest& flush : flushRequests_) flush.comm_ = this;
  flush_.resize(static_cast<size_t>(link_.lanes()));
  size_t qps = 0;
  for (int path = 0; path < link_.paths(); ++path) qps += static_cast<size_t>(link_.qps(path).created());
  notices_.resize(qps * kNoticesPerQp);
  noticeRegion_ = link_.registerMemory(notices_.data(), notices_.size() * sizeof(Notice), NCCL_PTR_HOST);
  ctsFrames_.resize(kRing * kClearToSendBytes);
  ctsRegion_ = link_.registerMemory(ctsFrames_.data(), ctsFrames_.size(), NCCL_PTR_HOST);
  // Posted before the QPs reach RTR, so no notice can arrive without a buffer.
  for (int path = 0; path < link_.paths(); ++path) {
    for (int qp = 0; qp < link_.qps(path).created(); ++qp) {
      for (int i = 0; i < kNoticesPerQp; ++i) postNotice(path, qp, i);
    }
  }
}

std::unique_ptr<MemoryRegion> VerbsRecvComm::regMr(void* data, size_t size, int type) {
  return link_.registerMemory(data, size, type);
}

std::unique_ptr<MemoryRegion> VerbsRecvComm::regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) {
  return link_.registerDmabuf(data, size, type, offset, fd);
}

void VerbsRecvComm::postNotice(int path, int qpIndex, int bufferIndex) {
  // Paths before this one hold their QPs' buffers first (every path has the same QP count until connect()
  // lowers it to the peer's, which only leaves buffers at the end unused).
  size_t index = (static_cast<size_t>(path) * static_cast<size_t>(link_.qps(0).created()) +
                  static_cast<size_t>(qpIndex)) * kNoticesPerQp + static_cast<size_t>(bufferIndex);
  ibv_sge sge{reinterpret_cast<uint64_t>(&notices_[index]), sizeof(Notice),
              noticeRegion_->lane(link_.laneOf(path)).lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = index;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ibv_qp* qp = link_.qps(path).qp(qpIndex);
  if (int rc = ibv_post_recv(qp, &wr, &bad); rc != 0) {
    link_.control().recordFailure("ibv_post_recv on QP " + std::to_string(qp->qp_num) + " failed: " + errnoText(rc));
  }
}

bool VerbsRecvComm::sendClearToSend(uint32_t recvId, const void* frame, size_t size) {
  // The frame's staging slot belongs to this receive-ring entry, so it is free again by the time the entry is.
  char* staged = &ctsFrames_[(recvId % kRing) * kClearToSendBytes];
  memcpy(staged, frame, size);
  ibv_sge sge{reinterpret_cast<uint64_t>(staged), static_cast<uint32_t>(size), ctsRegion_->lane(0).lkey()};
  ibv_send_wr wr{};
  wr.wr_id = UINT64_MAX;  // tells pollCompletions this is ours, not a notice buffer
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ibv_qp* qp = link_.qps(0).qp(0);  // path 0, on lane 0: where the sender posted its clear-to-send buffers
  if (int rc = ibv_post_send(qp, &wr, &bad); rc != 0) {
    link_.control().recordFailure("ibv_post_send of a clear-to-send on QP " + std::to_string(qp->qp_num) +
                                  " failed: " + errnoText(rc));
    return false;
  }
  return true;
}

void VerbsRecvComm::completeSlot(VerbsRecvRequest& request, int slot, uint64_t size) {
  request.slots_[slot].size = size;
  --request.pendingSlots_;
}

void VerbsRecvComm::applyNotice(int path, const Notice& notice, uint32_t bytes) {
  const tcp::ChunkHeader& header = notice.header;
  VerbsRecvRequest& request = ring_[header.recvId % kRing];
  if (request.postedId_ != header.recvId || header.slot >= request.count_) {
    link_.control().recordFailure("protocol error: a notice for receive " + std::to_string(header.recvId) +
                                  ", which is not posted");
    return;
  }
  VerbsRecvRequest::Slot& slot = request.slots_[header.slot];
  if (header.messageSize > slot.capacity || header.offset + header.length > header.messageSize) {
    link_.control().recordFailure("protocol error: a notice outside the posted buffer");
    return;
  }
  if (carriesPayload(header)) {
    // A small message came inside its notice instead of by RDMA WRITE.
    if (header.length > kEagerBytes || bytes != sizeof(tcp::ChunkHeader) + header.length) {
      link_.control().recordFailure("protocol error: a notice with a malformed payload");
      return;
    }
    memcpy(slot.data + header.offset, notice.payload, header.length);
  }
  slot.received += header.length;
  link_.counters(path).addReceived(header.length);
  if (slot.received == header.messageSize) completeSlot(request, header.slot, header.messageSize);
}

void VerbsRecvComm::pollCompletions() {
  for (int path = 0; path < link_.paths(); ++path) {
    link_.drainCompletions(path, [&](const ibv_wc& completion) {
      if (completion.opcode == IBV_WC_SEND) return;  // a clear-to-send of ours went out
      size_t index = completion.wr_id;
      applyNotice(path, notices_[index], completion.byte_len);
      const size_t perPath = static_cast<size_t>(link_.qps(0).created()) * kNoticesPerQp;
      postNotice(path, static_cast<int>(index % perPath / kNoticesPerQp), static_cast<int>(index % kNoticesPerQp));
    });
  }
}

void VerbsRecvComm::pumpControl() {
  tcp::Connection& control = link_.control();
  if (controlClosed_ || !control.flushControl()) return;
  for (;;) {
    while (control.controlSize() >= sizeof(tcp::FrameHeader)) {
      tcp::FrameHeader frame;
      memcpy(&frame, control.controlData(), sizeof(frame));
      control.consumeControl(sizeof(frame));
      VerbsRecvRequest& request = ring_[frame.recvId % kRing];
      if (frame.type != static_cast<uint8_t>(tcp::FrameType::kOversize) || request.postedId_ != frame.recvId ||
          frame.slot >= request.count_) {
        control.recordFailure("protocol error: unexpected control frame type " + std::to_string(frame.type));
        return;
      }
      RN_WARN("NET/railnet: %s sent %lu bytes (tag %d) into a receive buffer of %lu bytes", control.peerName().c_str(),
              static_cast<unsigned long>(frame.size), request.slots_[frame.slot].tag,
              static_cast<unsigned long>(request.slots_[frame.slot].capacity));
      request.oversize_ = true;
      completeSlot(request, frame.slot, 0);
    }
    ssize_t got = control.readControl();
    if (got == 0) return;
    if (got == tcp::kEndOfStream) {
      controlClosed_ = true;
      return;
    }
    if (got < 0) {
      control.recordFailure("control connection: " + errnoText(static_cast<int>(-got)));
      return;
    }
  }
}

ncclResult_t VerbsRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                                  Request** request) noexcept {
  *request = nullptr;
  tcp::Connection& control = link_.control();
  if (n < 1 || n > tcp::kMaxRecvs) {
    RN_WARN("NET/railnet: irecv of %d buffers from %s; railnet takes 1 to %d", n, control.peerName().c_str(),
            tcp::kMaxRecvs);
    return ncclInvalidUsage;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (control.failed() || !link_.ready()) return control.failed() ? control.reportFailure() : ncclSuccess;
  if (controlClosed_) {
    control.recordFailure("the sender closed the connection");
    return control.reportFailure();
  }
  VerbsRecvRequest& entry = ring_[nextRecvId_ % kRing];
  if (entry.inUse_) return ncclSuccess;
  // Each path writes through its own lane's registration: one rkey per path, the first in the entry and the
  // others after the entries (tcp/wire.h, ClearToSendEntry).
  const int extraKeys = link_.paths() - 1;
  tcp::FrameHeader header{static_cast<uint8_t>(tcp::FrameType::kClearToSend), static_cast<uint8_t>(n),
                          static_cast<uint16_t>(extraKeys), nextRecvId_, 0};
  tcp::ClearToSendEntry entries[tcp::kMaxRecvs]{};
  uint32_t keys[tcp::kMaxRecvs * (kMaxPaths - 1)]{};
  for (int i = 0; i < n; ++i) {
    auto* region = mrs != nullptr ? dynamic_cast<LinkRegion*>(mrs[i]) : nullptr;
    if (region == nullptr && sizes[i] > 0) {
      RN_WARN("NET/railnet: irecv buffer %d from %s has no verbs memory registration", i, control.peerName().c_str());
      return ncclInvalidUsage;
    }
    if (region != nullptr && region->lanes() != link_.lanes()) {
      RN_WARN("NET/railnet: irecv buffer %d from %s was registered with another comm", i, control.peerName().c_str());
      return ncclInvalidUsage;
    }
    for (int path = 1; path <= extraKeys; ++path) {
      keys[i * extraKeys + path - 1] = region != nullptr ? region->lane(link_.laneOf(path)).rkey() : 0;
    }
    entry.slots_[i] = {static_cast<char*>(data[i]), sizes[i], tags != nullptr ? tags[i] : 0, 0, 0};
    entries[i] = {entry.slots_[i].tag, region != nullptr ? region->lane(0).rkey() : 0, sizes[i],
                  reinterpret_cast<uint64_t>(data[i])};
  }
  entry.count_ = n;
  entry.pendingSlots_ = n;
  entry.oversize_ = false;
  entry.inUse_ = true;
  entry.postedId_ = nextRecvId_++;
  char frame[kClearToSendBytes];
  const size_t entryBytes = sizeof(tcp::ClearToSendEntry) * static_cast<size_t>(n);
  const size_t keyBytes = sizeof(uint32_t) * static_cast<size_t>(n * extraKeys);
  static_assert(sizeof(tcp::FrameHeader) + sizeof(entries) + sizeof(keys) <= kClearToSendBytes);
  memcpy(frame, &header, sizeof(header));
  memcpy(frame + sizeof(header), entries, entryBytes);
  memcpy(frame + sizeof(header) + entryBytes, keys, keyBytes);
  if (!sendClearToSend(header.recvId, frame, sizeof(header) + entryBytes + keyBytes)) {
    entry.inUse_ = false;
    entry.postedId_ = UINT32_MAX;
    return control.reportFailure();
  }
  *request = &entry;
  return ncclSuccess;
}

ncclResult_t VerbsRecvComm::iflush(int n, void** data, const int* sizes, MemoryRegion** mrs,
                                   Request** request) noexcept {
  *request = nullptr;
  tcp::Connection& control = link_.control();
  if (n < 1 || n > tcp::kMaxRecvs || data == nullptr || sizes == nullptr) {
    RN_WARN("NET/railnet: iflush of %d buffers from %s; railnet takes 1 to %d", n, control.peerName().c_str(),
            tcp::kMaxRecvs);
    return ncclInvalidUsage;
  }
  if (flushMode_ == FlushMode::kNever) return ncclSuccess;
  int last = flushTarget(n, sizes);
  if (last < 0) return ncclSuccess;  // nothing arrived: nothing to make visible
  auto* region = mrs != nullptr ? dynamic_cast<LinkRegion*>(mrs[last]) : nullptr;
  if (region == nullptr || region->lanes() != link_.lanes()) {
    RN_WARN("NET/railnet: iflush buffer %d from %s has no verbs memory registration of this comm", last,
            control.peerName().c_str());
    return ncclInvalidUsage;
  }
  // Host memory: RDMA writes are visible once their notice arrived. GPU memory: the READ orders them.
  if (flushMode_ == FlushMode::kAuto && !region->gpuMemory()) return ncclSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  if (control.failed()) return control.reportFailure();
  pollFlush();
  for (int lane = 0; lane < link_.lanes(); ++lane) {
    std::unique_ptr<LoopbackFlush>& qp = flush_[static_cast<size_t>(lane)];
    if (qp && qp->broken()) retiredFlushes_.push_back(std::move(qp));
    if (qp) continue;
    try {
      qp = std::make_unique<LoopbackFlush>(link_.devicePtr(lane));
    } catch (const std::exception& e) {
      RN_WARN("NET/railnet: iflush for %s: cannot create the loopback QP on %s: %s", control.peerName().c_str(),
              link_.device(lane).port().info.name.c_str(), e.what());
      return ncclSystemError;
    }
  }
  VerbsFlushRequest* flush = nullptr;
  for (VerbsFlushRequest& candidate : flushRequests_) {
    if (!candidate.inUse_) {
      flush = &candidate;
      break;
    }
  }
  bool full = flush == nullptr;
  for (const std::unique_ptr<LoopbackFlush>& qp : flush_) full = full || qp->inFlight() >= qp->capacity();
  if (full) {
    RN_WARN("NET/railnet: more than %zu flushes in flight for %s", flushRequests_.size(), control.peerName().c_str());
    return ncclInternalError;
  }
  flush->inUse_ = true;
  flush->pendingReads_ = 0;
  flush->error_.clear();
  // A NIC orders only its own writes, so a fused comm READs through every lane (as NCCL's merged devices do).
  for (int lane = 0; lane < link_.lanes(); ++lane) {
    std::string why;
    if (!flush_[static_cast<size_t>(lane)]->post(reinterpret_cast<uint64_t>(flush),
                                                   reinterpret_cast<uint64_t>(data[last]), region->lane(lane).rkey(),
                                                   &why)) {
      RN_WARN("NET/railnet: iflush for %s: %s", control.peerName().c_str(), why.c_str());
      if (flush->pendingReads_ == 0) {
        flush->inUse_ = false;
        return ncclSystemError;
      }
      // READs already posted complete later and free the request; NCCL sees the failure at test().
      flush->error_ = why;
      break;
    }
    ++flush->pendingReads_;
  }
  *request = flush;
  return ncclSuccess;
}

void VerbsRecvComm::pollFlush() {
  auto onDone = [](uint64_t wrId, bool ok, const std::string& error) {
    auto* flush = reinterpret_cast<VerbsFlushRequest*>(wrId);
    --flush->pendingReads_;
    if (!ok && flush->error_.empty()) flush->error_ = error;
  };
  std::string why;
  for (const std::unique_ptr<LoopbackFlush>& qp : flush_) {
    if (qp && !qp->poll(onDone, &why)) link_.control().recordFailure(why);
  }
  for (size_t i = 0; i < retiredFlushes_.size();) {
    if (!retiredFlushes_[i]->poll(onDone, &why)) link_.control().recordFailure(why);
    if (retiredFlushes_[i]->inFlight() == 0) {
      retiredFlushes_.erase(retiredFlushes_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

ncclResult_t VerbsFlushRequest::test(int* done, int* sizes) noexcept {
  (void)sizes;  // NCCL passes NULL for flushes
  return comm_->testFlush(this, done);
}

ncclResult_t VerbsRecvComm::testFlush(VerbsFlushRequest* request, int* done) noexcept {
  *done = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  pollFlush();
  if (request->pendingReads_ > 0) {
    return link_.control().failed() ? link_.control().reportFailure() : ncclSuccess;
  }
  *done = 1;
  request->inUse_ = false;
  if (!request->error_.empty()) {
    RN_WARN("NET/railnet: iflush of a receive from %s failed: %s", link_.control().peerName().c_str(),
            request->error_.c_str());
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t VerbsRecvComm::testRequest(VerbsRecvRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  tcp::Connection& control = link_.control();
  pollCompletions();
  if (request->pendingSlots_ != 0) {
    pumpControl();
    if (request->pendingSlots_ != 0) {
      // The CQ was drained first, so a sender that finished and closed cannot be mistaken for a dead one.
      if (controlClosed_ && !control.failed()) {
        control.recordFailure("the sender closed the connection before this receive completed");
      }
      return control.failed() ? control.reportFailure() : ncclSuccess;
    }
  }
  *done = 1;
  if (sizes != nullptr) {
    for (int i = 0; i < request->count_; ++i) sizes[i] = static_cast<int>(request->slots_[i].size);
  }
  request->postedId_ = UINT32_MAX;
  request->inUse_ = false;
  return request->oversize_ ? ncclInvalidUsage : ncclSuccess;
}

}  // namespace railnet::verbs
