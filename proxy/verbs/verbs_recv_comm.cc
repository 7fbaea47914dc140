#include "proxy/verbs/verbs_recv_comm.h"

#include <cstring>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"
#include "railnet/text.h"

namespace railnet::verbs {

VerbsRecvComm::VerbsRecvComm(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
                             const protocol::SocketAddress& peer, const QpOptions& options, bool failover,
                             const protocol::ResumeOptions* resume, int standbyNic)
    : connection_(std::move(nics), peerNics, std::move(control), peer, "receive", options, standbyNic) {
  if (failover) connection_.enableFailover();
  if (failover && resume != nullptr) {
    connection_.planResume(*resume, std::chrono::milliseconds(settings().failoverSilenceMs));
  }
  const auto paths = static_cast<size_t>(connection_.paths());
  carriedNotice_.assign(paths, true);
  queries_.resize(paths);
  queried_.assign(paths, false);
  ring_.prepare([this](VerbsRecvRequest& entry) { entry.setOwner(this); });
  flushMode_ = settings().ibFlush;  // parsed and validated once, with the other settings
  flushRequests_.resize(64);
  for (VerbsFlushRequest& flush : flushRequests_) flush.setOwner(this);
  flush_.resize(static_cast<size_t>(connection_.nics()));
  // Every path holds qpsPerPath() QPs' buffers (postNotice), the standby's too: it posts them once it is made.
  notices_.resize(static_cast<size_t>(connection_.paths()) * static_cast<size_t>(connection_.qpsPerPath()) *
                  kNoticesPerQp);
  noticeRegion_ = connection_.registerMemory(notices_.data(), notices_.size() * sizeof(Notice), NCCL_PTR_HOST);
  ctsFrames_.resize(kRing * kClearToSendBytes);
  ctsFrameBytes_.resize(kRing);
  ctsRegion_ = connection_.registerMemory(ctsFrames_.data(), ctsFrames_.size(), NCCL_PTR_HOST);
  // Posted before the QPs reach RTR, so no notice can arrive without a buffer (a standby's when it is made).
  for (int path = 0; path < connection_.paths(); ++path) {
    if (!connection_.resting(path)) postNotices(path);
  }
  watchdog_.start(this);
}

VerbsRecvComm::~VerbsRecvComm() {
  watchdog_.reset();
  if (ring_.groupedPosts() != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: receive comm from %s took %llu grouped receives of %llu buffers",
            connection_.control().peerName().c_str(), static_cast<unsigned long long>(ring_.groupedPosts()),
            static_cast<unsigned long long>(ring_.groupedMembers()));
  }
}

void VerbsRecvComm::postNotices(int path) {
  for (int qp = 0; qp < connection_.qps(path).created(); ++qp) {
    for (int i = 0; i < kNoticesPerQp; ++i) postNotice(path, qp, i);
  }
}

void VerbsRecvComm::postNotice(int path, int qpIndex, int bufferIndex) {
  // Paths before this one hold their QPs' buffers first (every path has the same QP count until connect()
  // lowers it to the peer's, which only leaves buffers at the end unused).
  size_t index = (static_cast<size_t>(path) * static_cast<size_t>(connection_.qpsPerPath()) +
                  static_cast<size_t>(qpIndex)) * kNoticesPerQp + static_cast<size_t>(bufferIndex);
  ibv_sge sge{reinterpret_cast<uint64_t>(&notices_[index]), sizeof(Notice),
              noticeRegion_->nic(connection_.nicOf(path)).lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = index;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  ibv_qp* qp = connection_.qps(path).qp(qpIndex);
  if (int rc = ibv_post_recv(qp, &wr, &bad); rc != 0) {
    const std::string why = "ibv_post_recv on QP " + std::to_string(qp->qp_num) + " failed: " + errnoText(rc);
    if (connection_.failover()) {
      connection_.failPath(path, why);
    } else {
      connection_.control().recordFailure(why, protocol::FailureKind::kLocal);
    }
    return;
  }
  ++connection_.recvsInFlight(path);
}

bool VerbsRecvComm::sendClearToSend(uint32_t recvId, const void* frame, size_t size) {
  // The frame's staging slot belongs to this receive-ring entry, so it is free again by the time the entry is.
  memcpy(&ctsFrames_[(recvId % kRing) * kClearToSendBytes], frame, size);
  ctsFrameBytes_[recvId % kRing] = static_cast<uint32_t>(size);
  unackedClearToSends_.push_back(recvId);
  // While the clear-to-send path moves, the frame waits its turn behind those to be sent again.
  if (!connection_.live(clearToSendPath_)) return !connection_.control().failed();
  return postClearToSend(recvId);
}

bool VerbsRecvComm::postClearToSend(uint32_t recvId) {
  const int path = clearToSendPath_;
  const uint32_t slot = recvId % kRing;
  ibv_sge sge{reinterpret_cast<uint64_t>(&ctsFrames_[slot * kClearToSendBytes]), ctsFrameBytes_[slot],
              ctsRegion_->nic(connection_.nicOf(path)).lkey()};
  ibv_send_wr wr{};
  wr.wr_id = kClearToSendTag | recvId;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  ibv_qp* qp = connection_.qps(path).qp(0);  // the sender posted its clear-to-send buffers on QP 0 of every path
  if (int rc = ibv_post_send(qp, &wr, &bad); rc != 0) {
    const std::string why = "ibv_post_send of a clear-to-send on QP " + std::to_string(qp->qp_num) + " failed: " +
                            errnoText(rc);
    if (connection_.failover()) {
      connection_.failPath(path, why);  // the frame stays unacknowledged and goes again on the next path
      return !connection_.control().failed();
    }
    unackedClearToSends_.pop_back();
    connection_.control().recordFailure(why, protocol::FailureKind::kLocal);
    return false;
  }
  ++connection_.sendsInFlight(path);
  return true;
}

void VerbsRecvComm::applyGroupNotice(int path, const Notice& notice, uint32_t bytes) {
  // Multireceive aggregation: the members' payloads were written before this SEND on the same QP.
  const size_t count = bytes / sizeof(protocol::ChunkHeader);
  if (bytes % sizeof(protocol::ChunkHeader) != 0 || count == 0 || count > protocol::kMaxRecvs) {
    connection_.control().recordFailure("protocol error: a group notice of " + std::to_string(bytes) + " bytes");
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    protocol::ChunkHeader header;
    memcpy(&header, reinterpret_cast<const char*>(&notice) + i * sizeof(header), sizeof(header));
    if (!isGroupMember(header) || carriesPayload(header) || header.offset != 0 || header.length != header.messageSize) {
      connection_.control().recordFailure("protocol error: a malformed member in a group notice");
      return;
    }
    if (ring_.destination(header) == nullptr) {
      connection_.control().recordFailure("protocol error: a group notice names receive " +
                                          std::to_string(header.recvId) + " buffer " + std::to_string(header.slot) +
                                          " outside what is posted");
      return;
    }
    connection_.counters(path).addReceived(header.length);
    std::string why;
    if (!ring_.addBytes(header, &why)) {
      connection_.control().recordFailure("protocol error: " + why);
      return;
    }
  }
}

void VerbsRecvComm::applyNotice(int path, const Notice& notice, uint32_t bytes) {
  const protocol::ChunkHeader& header = notice.header;
  if (isGroupMember(header)) {
    applyGroupNotice(path, notice, bytes);
    return;
  }
  char* destination = ring_.destination(header);
  if (destination == nullptr) {
    connection_.control().recordFailure("protocol error: a notice for receive " + std::to_string(header.recvId) +
                                  " buffer " + std::to_string(header.slot) + " outside what is posted");
    return;
  }
  if (carriesPayload(header)) {
    // A small message came inside its notice instead of by RDMA WRITE.
    if (header.length > kEagerBytes || bytes != sizeof(protocol::ChunkHeader) + header.length) {
      connection_.control().recordFailure("protocol error: a notice with a malformed payload");
      return;
    }
    memcpy(destination, notice.payload, header.length);
  }
  connection_.counters(path).addReceived(header.length);
  std::string why;
  if (!ring_.addBytes(header, &why)) connection_.control().recordFailure("protocol error: " + why);
}

void VerbsRecvComm::pollCompletions() {
  for (int path = 0; path < connection_.paths(); ++path) {
    connection_.drainCompletions(path, [&](const ibv_wc& completion) {
      if ((completion.wr_id & kClearToSendTag) != 0) {
        // A clear-to-send of ours arrived: they complete in the order they were posted.
        --connection_.sendsInFlight(path);
        if (!unackedClearToSends_.empty()) unackedClearToSends_.pop_front();
        return;
      }
      --connection_.recvsInFlight(path);
      carriedNotice_[static_cast<size_t>(path)] = true;
      size_t index = completion.wr_id;
      applyNotice(path, notices_[index], completion.byte_len);
      if (!connection_.live(path)) return;  // a notice that made it before its path failed: counted, not reposted
      const size_t perPath = static_cast<size_t>(connection_.qpsPerPath()) * kNoticesPerQp;
      postNotice(path, static_cast<int>(index % perPath / kNoticesPerQp), static_cast<int>(index % kNoticesPerQp));
    }, [&](const ibv_wc& completion) {
      // Flushed or failed (the connection took it in): only the count of what the path still holds changes.
      if ((completion.wr_id & kClearToSendTag) != 0) {
        --connection_.sendsInFlight(path);
      } else {
        --connection_.recvsInFlight(path);
      }
    });
  }
  if (connection_.failover()) advanceFailover();
}

void VerbsRecvComm::pumpControl() {
  protocol::ControlChannel& control = connection_.control();
  if (controlClosed_ || !control.flush()) return;
  // A resumable channel (D94) is read under its input lock, so a re-made socket replaces the old one between frames;
  // its read() reports a broken socket itself (the sender re-makes it) and returns 0.
  std::unique_lock<std::mutex> input;
  if (control.resumable()) input = control.lockInput();
  for (;;) {
    while (control.size() >= sizeof(protocol::FrameHeader) && !control.failed()) {
      protocol::FrameHeader frame;
      memcpy(&frame, control.data(), sizeof(frame));
      // After the QP handshake the control channel carries oversize notices (receive_ring.h) and, with failover,
      // path frames with their payload, and the sender's kAck frames when it is resumable.
      if (control.takeAck(frame)) continue;  // the loop stops on a bad count (failed)
      if (frame.type == static_cast<uint8_t>(protocol::FrameType::kOversize)) {
        control.consume(sizeof(frame));
        if (!ring_.applyOversize(frame, control.peerName())) {
          control.recordFailure("protocol error: an oversize notice for a receive that is not posted");
          return;
        }
        if (control.resumable()) control.framesProcessed(1);
        continue;
      }
      if (!connection_.failover() || frame.size > kMaxPathFramePayload) {
        control.recordFailure("protocol error: unexpected control frame type " + std::to_string(frame.type) + " (" +
                              std::to_string(frame.size) + " bytes)");
        return;
      }
      if (control.size() < sizeof(frame) + frame.size) break;
      std::vector<char> payload(control.data() + sizeof(frame), control.data() + sizeof(frame) + frame.size);
      control.consume(sizeof(frame) + frame.size);
      if (!applyPathFrame(frame, payload.data())) return;
      if (control.resumable()) control.framesProcessed(1);
    }
    if (control.failed()) return;
    ssize_t got = control.read();
    if (got == 0) return;
    if (got == protocol::kEndOfStream) {
      controlClosed_ = true;
      return;
    }
    if (got < 0) {
      control.recordSocketFailure("control connection", got);
      return;
    }
  }
}

ncclResult_t VerbsRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                                  Request** request) noexcept {
  *request = nullptr;
  protocol::ControlChannel& control = connection_.control();
  if (!protocol::validReceiveCount(n, control.peerName())) return ncclInvalidUsage;
  std::lock_guard<std::mutex> lock(mutex_);
  if (control.failed() || !connection_.ready()) return control.failed() ? control.reportFailure() : ncclSuccess;
  if (controlClosed_) {
    control.recordFailure("the sender closed the connection");
    return control.reportFailure();
  }
  if (ring_.full()) return ncclSuccess;
  // Each path writes through its own NIC's registration: one rkey per path, the first in the entry and the
  // others after the entries (protocol/wire.h, ClearToSendEntry).
  const int extraKeys = connection_.paths() - 1;
  uint32_t keys[protocol::kMaxRecvs * (kMaxPaths - 1)]{};
  uint32_t firstKeys[protocol::kMaxRecvs]{};
  for (int i = 0; i < n; ++i) {
    auto* region = mrs != nullptr ? dynamic_cast<LinkRegion*>(mrs[i]) : nullptr;
    if (region == nullptr && sizes[i] > 0) {
      RN_WARN("NET/railnet: irecv buffer %d from %s has no verbs memory registration", i, control.peerName().c_str());
      return ncclInvalidUsage;
    }
    if (region != nullptr && region->nics() != connection_.nics()) {
      RN_WARN("NET/railnet: irecv buffer %d from %s was registered with another comm", i, control.peerName().c_str());
      return ncclInvalidUsage;
    }
    for (int path = 1; path <= extraKeys; ++path) {
      keys[i * extraKeys + path - 1] = region != nullptr ? region->nic(connection_.nicOf(path)).rkey() : 0;
    }
    firstKeys[i] = region != nullptr ? region->nic(0).rkey() : 0;
  }
  const uint32_t recvId = ring_.nextId();
  VerbsRecvRequest* entry = ring_.post(n, data, sizes, tags);
  entry->serial_ = ++receives_;
  entry->watch_.start();
  protocol::ClearToSendEntry entries[protocol::kMaxRecvs];
  const protocol::FrameHeader header = Ring::clearToSend(*entry, recvId, static_cast<uint16_t>(extraKeys), entries);
  for (int i = 0; i < n; ++i) {
    entries[i].rkey = firstKeys[i];
    entries[i].address = reinterpret_cast<uint64_t>(data[i]);
  }
  char frame[kClearToSendBytes];
  const size_t entryBytes = sizeof(protocol::ClearToSendEntry) * static_cast<size_t>(n);
  const size_t keyBytes = sizeof(uint32_t) * static_cast<size_t>(n * extraKeys);
  static_assert(sizeof(protocol::FrameHeader) + sizeof(entries) + sizeof(keys) <= kClearToSendBytes);
  memcpy(frame, &header, sizeof(header));
  memcpy(frame + sizeof(header), entries, entryBytes);
  memcpy(frame + sizeof(header) + entryBytes, keys, keyBytes);
  if (!sendClearToSend(recvId, frame, sizeof(header) + entryBytes + keyBytes)) {
    ring_.unpost(*entry);
    return control.reportFailure();
  }
  *request = entry;
  return ncclSuccess;
}

ncclResult_t VerbsRecvComm::iflush(int n, void** data, const int* sizes, MemoryRegion** mrs,
                                   Request** request) noexcept {
  *request = nullptr;
  protocol::ControlChannel& control = connection_.control();
  if (n < 1 || n > protocol::kMaxRecvs || data == nullptr || sizes == nullptr) {
    RN_WARN("NET/railnet: iflush of %d buffers from %s; railnet takes 1 to %d", n, control.peerName().c_str(),
            protocol::kMaxRecvs);
    return ncclInvalidUsage;
  }
  if (flushMode_ == FlushMode::kNever) return ncclSuccess;
  int last = flushTarget(n, sizes);
  if (last < 0) return ncclSuccess;  // nothing arrived: nothing to make visible
  auto* region = mrs != nullptr ? dynamic_cast<LinkRegion*>(mrs[last]) : nullptr;
  if (region == nullptr || region->nics() != connection_.nics()) {
    RN_WARN("NET/railnet: iflush buffer %d from %s has no verbs memory registration of this comm", last,
            control.peerName().c_str());
    return ncclInvalidUsage;
  }
  // Host memory: RDMA writes are visible once their notice arrived. GPU memory: the READ orders them.
  if (flushMode_ == FlushMode::kAuto && !region->gpuMemory()) return ncclSuccess;
  std::lock_guard<std::mutex> lock(mutex_);
  if (control.failed()) return control.reportFailure();
  pollFlush();
  for (int nic = 0; nic < connection_.nics(); ++nic) {
    std::unique_ptr<LoopbackFlush>& qp = flush_[static_cast<size_t>(nic)];
    if (qp && qp->broken()) retiredFlushes_.push_back(std::move(qp));
    if (qp || !connection_.nicInUse(nic)) continue;  // a resting standby's NIC wrote nothing
    try {
      qp = std::make_unique<LoopbackFlush>(connection_.devicePtr(nic));
    } catch (const std::exception& e) {
      RN_WARN("NET/railnet: iflush for %s: cannot create the loopback QP on %s: %s", control.peerName().c_str(),
              connection_.device(nic).port().info.name.c_str(), e.what());
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
  for (const std::unique_ptr<LoopbackFlush>& qp : flush_) full = full || (qp && qp->inFlight() >= qp->capacity());
  if (full) {
    RN_WARN("NET/railnet: more than %zu flushes in flight for %s", flushRequests_.size(), control.peerName().c_str());
    return ncclInternalError;
  }
  flush->inUse_ = true;
  flush->pendingReads_ = 0;
  flush->error_.clear();
  // A NIC orders only its own writes, so a fused comm READs through every nic (as NCCL's merged devices do).
  for (int nic = 0; nic < connection_.nics(); ++nic) {
    if (!connection_.nicInUse(nic)) continue;
    std::string why;
    if (!flush_[static_cast<size_t>(nic)]->post(reinterpret_cast<uint64_t>(flush),
                                                   reinterpret_cast<uint64_t>(data[last]), region->nic(nic).rkey(),
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
    if (qp && !qp->poll(onDone, &why)) connection_.control().recordFailure(why);
  }
  for (size_t i = 0; i < retiredFlushes_.size();) {
    if (!retiredFlushes_[i]->poll(onDone, &why)) connection_.control().recordFailure(why);
    if (retiredFlushes_[i]->inFlight() == 0) {
      retiredFlushes_.erase(retiredFlushes_.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      ++i;
    }
  }
}

ncclResult_t VerbsRecvComm::testRequest(VerbsFlushRequest* request, int* done, int* /*sizes: NULL for flushes*/) noexcept {
  *done = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  pollFlush();
  if (request->pendingReads_ > 0) {
    return connection_.control().failed() ? connection_.control().reportFailure() : ncclSuccess;
  }
  *done = 1;
  request->inUse_ = false;
  if (!request->error_.empty()) {
    RN_WARN("NET/railnet: iflush of a receive from %s failed: %s", connection_.control().peerName().c_str(),
            request->error_.c_str());
    return ncclSystemError;
  }
  return ncclSuccess;
}

ncclResult_t VerbsRecvComm::testRequest(VerbsRecvRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  protocol::ControlChannel& control = connection_.control();
  pollCompletions();
  if (!request->complete()) {
    pumpControl();
    if (!request->complete()) {
      // The CQ was drained first, so a sender that finished and closed cannot be mistaken for a dead one.
      if (controlClosed_ && !control.failed()) {
        control.recordFailure("the sender closed the connection before this receive completed");
      }
      return control.failed() ? control.reportFailure() : ncclSuccess;
    }
  }
  *done = 1;
  if (request->watch_.reported()) {
    progress::reportCompletedAfterStall(
        "receive #" + std::to_string(request->serial_) + " from " + connection_.control().peerName(), request->watch_);
  }
  return Ring::finish(*request, sizes);
}

std::string VerbsRecvComm::describeReceive(const VerbsRecvRequest& request) const {
  std::string buffers;
  for (int i = 0; i < request.count(); ++i) {
    const protocol::ReceiveBuffer& buffer = request.buffer(i);
    buffers += " [" + std::to_string(i) + "] tag " + std::to_string(buffer.tag) + " " +
               std::to_string(buffer.ledger.placed()) + " of " +
               std::to_string(buffer.capacity) + " B";
  }
  return textf("receive #%llu:%s", static_cast<unsigned long long>(request.serial_), buffers.c_str());
}

void VerbsRecvComm::watchPaths(progress::WatchClock::time_point, std::chrono::milliseconds) noexcept {
  // Rail failover's look: the sender's path frames are answered while NCCL has no receive to test (a query may be
  // about receives that finished).
  if (!connection_.failover()) return;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || connection_.control().failed() || !connection_.ready()) return;
  try {
    pollCompletions();
    pumpControl();
  } catch (...) {  // bad_alloc: the data path's next call goes on from here
  }
}

void VerbsRecvComm::watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the data path is here: look next round
  const bool idleExpected = idleReceivesExpected_.load(std::memory_order_relaxed);
  ring_.forEachPosted([&](VerbsRecvRequest& request) {
    if (request.complete()) return;  // done, not yet collected by test
    const uint64_t received = request.receivedBytes();
    if (idleExpected && received == 0) return;  // kept posted for a sender with nothing to say (GIN)
    progress::lookAt(request.watch_, received, now, limit,
                     [&] { return "receive #" + std::to_string(request.serial_) + " from " + connection_.control().peerName(); },
                     [&] {
      RN_WARN("NET/railnet: watchdog: receive #%llu from %s has made no progress for %.1f s (%llu bytes in); it is "
              "not failed; %s", static_cast<unsigned long long>(request.serial_), connection_.control().peerName().c_str(),
              request.watch_.quietFor(now), static_cast<unsigned long long>(received),
              describeReceive(request).c_str());
    });
  });
}

void VerbsRecvComm::describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  const std::string peer = connection_.control().peerName();
  if (!lock.owns_lock()) {
    lines->push_back("verbs receive comm from " + peer + ": busy (its lock is held), not described");
    return;
  }
  size_t posted = 0;
  ring_.forEachPosted([&](VerbsRecvRequest&) { ++posted; });
  lines->push_back(textf("verbs receive comm from %s: %zu receives posted, %llu so far, %d paths, control %s",
                         peer.c_str(), posted, static_cast<unsigned long long>(receives_), connection_.paths(),
                         connection_.control().failed() ? "failed" : controlClosed_ ? "closed by the peer" : "ok"));
  ring_.forEachPosted([&](VerbsRecvRequest& request) {
    lines->push_back(textf("  %s%s, last progress %.1f s ago", describeReceive(request).c_str(),
                           request.complete() ? " (complete)" : "",
                           request.watch_.quietFor(now)));
  });
}

}  // namespace railnet::verbs
