#include "proxy/verbs/verbs_send_comm.h"

#include <algorithm>
#include <cstring>

#include "proxy/protocol/stripe_plan.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::verbs {
namespace {
constexpr size_t kSendRequests = 2 * NCCL_NET_MAX_REQUESTS * protocol::kMaxRecvs;
// Stripes are 128-byte aligned (LL128 lines) and at least this long, so small messages use one QP.
constexpr uint64_t kMinStripe = 64 * 1024;
constexpr uint64_t kStripeAlign = 128;
}  // namespace

VerbsSendComm::VerbsSendComm(std::vector<std::shared_ptr<VerbsDevice>> nics, int peerNics, protocol::Fd control,
                             const protocol::SocketAddress& peer, const QpOptions& options, uint64_t minStripeBytes,
                             const std::optional<HopPlan>& hop, bool failover, const protocol::ResumeOptions* resume,
                             int standbyNic)
    : connection_(std::move(nics), peerNics, std::move(control), peer, "send", options, standbyNic),
      requests_(kSendRequests, [this](VerbsSendRequest& request) { request.setOwner(this); }),
      minStripeBytes_(minStripeBytes) {
  if (hop) {
    hop_ = std::make_unique<NvlinkHop>(connection_, hop->mode, hop->railGpuBusId);
    hopPipeline_ = std::make_unique<staging::PiecePipeline<HopMessage>>(hop_->slots(), hop_->pieceBytes());
    hopSlots_.resize(static_cast<size_t>(hop_->slots()));
  }
  if (failover && !hop) {
    connection_.enableFailover();
    posted_.dropRepeatedReceives();
    if (resume != nullptr) connection_.planResume(*resume, std::chrono::milliseconds(settings().failoverSilenceMs));
  }
  eagerHeaders_.resize(kSendRequests);
  for (int i = static_cast<int>(kSendRequests) - 1; i >= 0; --i) freeEagerSlots_.push_back(i);
  eagerRegion_ = connection_.registerMemory(eagerHeaders_.data(), eagerHeaders_.size() * sizeof(protocol::ChunkHeader),
                                      NCCL_PTR_HOST);
  groupHeaders_.resize(static_cast<size_t>(kGroupNotices) * protocol::kMaxRecvs);
  groupRegion_ = connection_.registerMemory(groupHeaders_.data(), groupHeaders_.size() * sizeof(protocol::ChunkHeader),
                                            NCCL_PTR_HOST);
  groupMembers_.resize(kGroupNotices);
  groupPath_.resize(kGroupNotices);
  for (int i = kGroupNotices - 1; i >= 0; --i) freeGroupNotices_.push_back(i);
  const auto paths = static_cast<size_t>(connection_.paths());
  unknown_.resize(paths);
  pathDeadline_.resize(paths);
  ctsBuffers_.resize(paths * kClearToSendBuffers * kClearToSendBytes);
  ctsRegion_ = connection_.registerMemory(ctsBuffers_.data(), ctsBuffers_.size(), NCCL_PTR_HOST);
  // Posted before the QPs reach RTR, so no clear-to-send can arrive without a buffer (a standby's when it is made).
  for (int path = 0; path < connection_.paths(); ++path) {
    if (connection_.resting(path)) continue;
    for (size_t i = 0; i < kClearToSendBuffers; ++i) postClearToSendBuffer(path, i);
  }
  watchdog_.start(this);
}

VerbsSendComm::~VerbsSendComm() {
  watchdog_.reset();
  if (held_.groupsCarried() != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: send comm to %s carried %llu members of grouped receives in %llu notices",
            connection_.control().peerName().c_str(), static_cast<unsigned long long>(held_.membersCarried()),
            static_cast<unsigned long long>(held_.groupsCarried()));
  }
}

void VerbsSendComm::postClearToSendBuffer(int path, size_t index) {
  // The receiver sends its clear-to-sends on QP 0 of one path (path 0 until that path fails).
  const size_t buffer = static_cast<size_t>(path) * kClearToSendBuffers + index;
  ibv_sge sge{reinterpret_cast<uint64_t>(&ctsBuffers_[buffer * kClearToSendBytes]), kClearToSendBytes,
              ctsRegion_->nic(connection_.nicOf(path)).lkey()};
  ibv_recv_wr wr{};
  wr.wr_id = buffer;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  if (int rc = ibv_post_recv(connection_.qps(path).qp(0), &wr, &bad); rc != 0) {
    if (connection_.failover()) {
      connection_.failPath(path, "ibv_post_recv of a clear-to-send buffer failed: " + errnoText(rc));
      return;
    }
    connection_.control().recordFailure("ibv_post_recv of a clear-to-send buffer failed: " + errnoText(rc),
                                        protocol::FailureKind::kLocal);
  }
}

void VerbsSendComm::pumpControl() {
  protocol::ControlChannel& control = connection_.control();
  if (!control.flush()) return;
  // A resumable channel (D94) is read under its input lock, so a re-made socket replaces the old one between frames;
  // its read() reports a broken socket itself (it is re-made) and returns 0.
  std::unique_lock<std::mutex> input;
  if (control.resumable()) input = control.lockInput();
  ssize_t got = control.read();
  if (got == protocol::kEndOfStream) {
    control.recordFailure("the receiver closed the connection");
    return;
  }
  if (got < 0) {
    control.recordSocketFailure("control connection", got);
    return;
  }
  // After the QP handshake only path failover's frames come this way (clear-to-sends come by RDMA), and with a
  // resumable channel the receiver's kSession and kAck frames.
  while (control.size() >= sizeof(protocol::FrameHeader) && !control.failed()) {
    if (!connection_.failover()) {
      control.recordFailure("protocol error: unexpected bytes on the control connection");
      return;
    }
    protocol::FrameHeader frame;
    memcpy(&frame, control.data(), sizeof(frame));
    if (control.takeAck(frame)) continue;  // the loop stops on a bad count (failed)
    if (frame.size > kMaxPathFramePayload) {
      control.recordFailure("protocol error: a path frame of " + std::to_string(frame.size) + " bytes");
      return;
    }
    if (control.size() < sizeof(frame) + frame.size) return;
    std::vector<char> payload(control.data() + sizeof(frame), control.data() + sizeof(frame) + frame.size);
    control.consume(sizeof(frame) + frame.size);
    if (control.resumable() && frame.type == static_cast<uint8_t>(protocol::FrameType::kSession)) {
      if (!control.sessionListeners(payload.data(), payload.size(), frame.extraKeys)) return;
    } else if (!applyPathFrame(frame, payload.data())) {
      return;
    }
    if (control.resumable()) control.framesProcessed(1);
  }
}

void VerbsSendComm::completeWork(uint32_t index) {
  SentWork& work = work_[index];
  if ((work.owner & kHopWrTag) != 0) {
    onHopNotice(static_cast<int>(work.owner & ~kHopWrTag));
  } else {
    VerbsSendRequest* request = work.request;
    ++request->completedStripes_;
    if (--request->pendingStripes_ == 0 && request->eagerSlot_ >= 0) {
      freeEagerSlots_.push_back(request->eagerSlot_);
      request->eagerSlot_ = -1;
    }
  }
  work = SentWork{};
  freeWork_.push_back(index);
}

void VerbsSendComm::pollCompletions() {
  for (int path = 0; path < connection_.paths(); ++path) {
    connection_.drainCompletions(path, [&](const ibv_wc& completion) {
      if (completion.opcode == IBV_WC_RECV) {
        // A clear-to-send frame from the receiver.
        size_t buffer = completion.wr_id;
        std::string why;
        long used = posted_.parse(&ctsBuffers_[buffer * kClearToSendBytes], completion.byte_len, &why);
        if (used != static_cast<long>(completion.byte_len)) {
          connection_.control().recordFailure(used < 0 ? why : "protocol error: a partial clear-to-send frame");
        }
        if (connection_.live(path)) postClearToSendBuffer(path, buffer % kClearToSendBuffers);
      } else if ((completion.wr_id & kGroupWrTag) != 0) {
        // A group notice went out: every member it named is done.
        const int slot = static_cast<int>(completion.wr_id & ~kGroupWrTag);
        --connection_.sendsInFlight(path);
        for (HeldMember& member : groupMembers_[static_cast<size_t>(slot)]) {
          --member.request->pendingStripes_;
          ++member.request->completedStripes_;
        }
        groupMembers_[static_cast<size_t>(slot)].clear();
        freeGroupNotices_.push_back(slot);
      } else if ((completion.wr_id & kWorkTag) != 0) {
        --connection_.sendsInFlight(path);
        completeWork(static_cast<uint32_t>(completion.wr_id & ~kWorkTag));
      }
    }, [&](const ibv_wc& completion) {
      // Flushed or failed: a clear-to-send buffer or an unsignaled WRITE (wr_id below the tags) needs nothing; the
      // fate of a notice is the receiver's to tell (failover), or the connection has failed.
      if ((completion.wr_id & kGroupWrTag) != 0) {
        --connection_.sendsInFlight(path);
        unknown_[static_cast<size_t>(path)].push_back({-1, static_cast<int>(completion.wr_id & ~kGroupWrTag), 0});
      } else if ((completion.wr_id & kWorkTag) != 0) {
        --connection_.sendsInFlight(path);
        unknown_[static_cast<size_t>(path)].push_back({static_cast<int>(completion.wr_id & ~kWorkTag), -1, 0});
      }
    });
  }
}

uint32_t VerbsSendComm::newWork() {
  ++workStarted_;
  if (freeWork_.empty()) {
    work_.emplace_back();
    return static_cast<uint32_t>(work_.size() - 1);
  }
  uint32_t index = freeWork_.back();
  freeWork_.pop_back();
  return index;
}

bool VerbsSendComm::postWork(uint32_t index, int path) {
  SentWork& work = work_[index];
  work.path = path;
  const int nic = connection_.nicOf(path);
  const uint32_t lkey = work.region != nullptr ? work.region->nic(nic).lkey() : work.lkey;
  QueuePairs& qps = connection_.qps(path);
  ibv_qp* qp = qps.qp(static_cast<int>(nextQp_[path]++ % static_cast<uint32_t>(qps.count())));
  const uint64_t at = work.header.offset;
  const uint64_t bytes = work.header.length;
  ibv_send_wr notice{};
  notice.wr_id = kWorkTag | index;
  notice.opcode = IBV_WR_SEND;
  notice.send_flags = IBV_SEND_SIGNALED;
  ibv_sge sges[2];
  ibv_send_wr write{};
  ibv_send_wr* first = &notice;
  if (work.kind == SentWork::Kind::kEager) {
    // Header from its registered slot, payload from the user buffer: one SEND.
    const protocol::ChunkHeader& header = eagerHeaders_[static_cast<size_t>(work.request->eagerSlot_)];
    sges[0] = {reinterpret_cast<uint64_t>(&header), sizeof(header), eagerRegion_->nic(nic).lkey()};
    sges[1] = {work.localBase, static_cast<uint32_t>(bytes), lkey};
    notice.sg_list = sges;
    notice.num_sge = 2;
  } else {
    // The payload goes straight into the receiver's buffer; the SEND after it on the same QP arrives after it
    // (RC ordering) and tells the receiver how many bytes landed where.
    sges[0] = {reinterpret_cast<uint64_t>(&work.header), sizeof(work.header), 0};
    notice.sg_list = &sges[0];
    notice.num_sge = 1;
    notice.send_flags |= IBV_SEND_INLINE;
    if (bytes > 0) {
      sges[1] = {work.localBase + at, static_cast<uint32_t>(bytes), lkey};
      write.sg_list = &sges[1];
      write.num_sge = 1;
      write.opcode = IBV_WR_RDMA_WRITE;
      write.wr.rdma.remote_addr = work.destination.address + at;
      write.wr.rdma.rkey = work.destination.pathKeys[path];
      write.next = &notice;
      first = &write;
    }
  }
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp, first, &bad); rc != 0) {
    const std::string why = "ibv_post_send on QP " + std::to_string(qp->qp_num) + " failed: " + errnoText(rc);
    if (connection_.failover()) {
      connection_.failPath(path, why);
      unknown_[static_cast<size_t>(path)].push_back({static_cast<int>(index), -1, 0});
      return !connection_.control().failed();
    }
    connection_.control().recordFailure(why, protocol::FailureKind::kLocal);
    return false;
  }
  ++connection_.sendsInFlight(path);
  return true;
}

bool VerbsSendComm::postEager(VerbsSendRequest* request, int path, const char* data, const LinkRegion* region,
                              uint64_t size, const protocol::ClearToSendQueue::Destination& destination) {
  int slot = freeEagerSlots_.back();
  freeEagerSlots_.pop_back();
  protocol::ChunkHeader& header = eagerHeaders_[static_cast<size_t>(slot)];
  header = {};
  header.recvId = destination.recvId;
  header.slot = static_cast<uint8_t>(destination.slot);
  header.flags = kPayloadFollows;
  header.messageSize = size;
  header.length = size;
  request->pendingStripes_ = 1;
  request->eagerSlot_ = slot;
  request->pathBytes_[path] += size;
  const uint32_t index = newWork();
  SentWork& work = work_[index];
  work.kind = SentWork::Kind::kEager;
  work.request = request;
  work.localBase = reinterpret_cast<uint64_t>(data);
  work.region = region;
  work.header = header;
  work.destination = destination;
  if (!postWork(index, path)) {
    freeEagerSlots_.push_back(slot);
    request->eagerSlot_ = -1;
    request->pendingStripes_ = 0;
    work_[index] = SentWork{};
    freeWork_.push_back(index);
    return false;
  }
  return true;
}

bool VerbsSendComm::postStripes(VerbsSendRequest* request, int path, uint64_t localBase, const LinkRegion* region,
                                uint32_t lkey, uint64_t size,
                                uint64_t offset, uint64_t length,
                                const protocol::ClearToSendQueue::Destination& destination, uint64_t wrId,
                                int* posted) {
  const int qpCount = connection_.qps(path).count();
  uint64_t perQp = (length + static_cast<uint64_t>(qpCount) - 1) / static_cast<uint64_t>(qpCount);
  uint64_t stripe = std::max(kMinStripe, (perQp + kStripeAlign - 1) / kStripeAlign * kStripeAlign);
  int stripes = length == 0 ? 1 : static_cast<int>((length + stripe - 1) / stripe);
  request->pendingStripes_ += stripes;
  request->pathBytes_[path] += length;
  for (int k = 0; k < stripes; ++k) {
    uint64_t at = offset + static_cast<uint64_t>(k) * stripe;
    const uint32_t index = newWork();
    SentWork& work = work_[index];
    work.kind = SentWork::Kind::kStripe;
    work.request = request;
    work.owner = wrId;
    work.localBase = localBase;
    work.region = region;
    work.lkey = lkey;
    work.header.recvId = destination.recvId;
    work.header.slot = static_cast<uint8_t>(destination.slot);
    work.header.messageSize = size;
    work.header.offset = at;
    work.header.length = length == 0 ? 0 : std::min(stripe, offset + length - at);
    work.destination = destination;
    if (!postWork(index, path)) {
      // Stripes not posted will never complete: the failure recorded fails the request in test().
      work_[index] = SentWork{};
      freeWork_.push_back(index);
      request->pendingStripes_ -= stripes - k;
      if (posted != nullptr) *posted = k;
      return false;
    }
  }
  if (posted != nullptr) *posted = stripes;
  return true;
}

bool VerbsSendComm::postGroup(std::vector<HeldMember>& members) {
  const int path = connection_.livePath(messages_++);
  if (path < 0) return false;  // every path failed: the connection failed with the last
  const int slot = freeGroupNotices_.back();
  freeGroupNotices_.pop_back();
  const int nic = connection_.nicOf(path);
  QueuePairs& qps = connection_.qps(path);
  ibv_qp* qp = qps.qp(static_cast<int>(nextQp_[path]++ % static_cast<uint32_t>(qps.count())));
  protocol::ChunkHeader* headers = &groupHeaders_[static_cast<size_t>(slot) * protocol::kMaxRecvs];
  ibv_sge dataSges[protocol::kMaxRecvs];
  ibv_send_wr writes[protocol::kMaxRecvs + 1] = {};
  int posted = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    const HeldMember& member = members[i];
    headers[i] = {};
    headers[i].recvId = member.destination.recvId;
    headers[i].slot = static_cast<uint8_t>(member.destination.slot);
    headers[i].flags = kGroupMember;
    headers[i].messageSize = member.size;
    headers[i].length = member.size;
    member.request->pathBytes_[path] += member.size;
    if (member.size == 0) continue;  // its header alone completes it
    dataSges[posted] = {reinterpret_cast<uint64_t>(member.data), static_cast<uint32_t>(member.size),
                        member.region->nic(nic).lkey()};
    ibv_send_wr& write = writes[posted];
    write.sg_list = &dataSges[posted];
    write.num_sge = 1;
    write.opcode = IBV_WR_RDMA_WRITE;
    write.wr.rdma.remote_addr = member.destination.address;
    write.wr.rdma.rkey = member.destination.pathKeys[path];
    ++posted;
  }
  groupMembers_[static_cast<size_t>(slot)] = members;
  groupPath_[static_cast<size_t>(slot)] = path;
  ibv_sge noticeSge{reinterpret_cast<uint64_t>(headers), static_cast<uint32_t>(members.size() * sizeof(protocol::ChunkHeader)),
                    groupRegion_->nic(nic).lkey()};
  ibv_send_wr& notice = writes[posted];
  notice.wr_id = kGroupWrTag | static_cast<uint64_t>(slot);
  notice.sg_list = &noticeSge;
  notice.num_sge = 1;
  notice.opcode = IBV_WR_SEND;
  notice.send_flags = IBV_SEND_SIGNALED;
  for (int i = 0; i < posted; ++i) writes[i].next = &writes[i + 1];
  ibv_send_wr* bad = nullptr;
  if (int rc = ibv_post_send(qp, &writes[0], &bad); rc != 0) {
    const std::string why = "ibv_post_send on QP " + std::to_string(qp->qp_num) + " failed: " + errnoText(rc);
    if (connection_.failover()) {
      // Like a flushed notice: the receiver is asked about the members once the path is drained.
      connection_.failPath(path, why);
      unknown_[static_cast<size_t>(path)].push_back({-1, slot, 0});
      return !connection_.control().failed();
    }
    // The members' requests stay pending; the failure recorded here fails them in test().
    groupMembers_[static_cast<size_t>(slot)].clear();
    freeGroupNotices_.push_back(slot);
    connection_.control().recordFailure(why, protocol::FailureKind::kLocal);
    return false;
  }
  ++connection_.sendsInFlight(path);
  return true;
}

bool VerbsSendComm::postMessage(VerbsSendRequest* request, const char* data, const LinkRegion* region, uint64_t size,
                                const protocol::ClearToSendQueue::Destination& destination) {
  // The fusion scheduler (proxy/stripe_plan.h) spreads the message over the live paths; with one path it is one
  // stripe, which the path's QPs split further.
  const int live = connection_.livePaths();
  if (live == 0) return false;  // every path failed: the connection failed with the last
  protocol::Stripe stripes[protocol::kMaxStripeNics] = {};
  const int count = protocol::planStripes(size, live, messages_++, minStripeBytes_, stripes);
  if (size > 0 && size <= kEagerBytes && !freeEagerSlots_.empty()) {
    return postEager(request, connection_.livePath(static_cast<uint64_t>(stripes[0].nic)), data, region, size,
                     destination);
  }
  for (int i = 0; i < count; ++i) {
    const int path = connection_.livePath(static_cast<uint64_t>(stripes[i].nic));
    if (!postStripes(request, path, reinterpret_cast<uint64_t>(data), region, 0, size, stripes[i].offset,
                     stripes[i].bytes, destination)) {
      return false;
    }
  }
  return true;
}

void VerbsSendComm::flushHeld() {
  if (connection_.livePaths() == 0) return;  // held until a path is made again (or the connection failed)
  held_.flush([&](std::vector<HeldMember>& members) {
    if (!freeGroupNotices_.empty()) {
      postGroup(members);
      return;
    }
    // Every group notice still in flight: each member goes as it would have alone (pendingStripes_ is recounted).
    for (HeldMember& member : members) {
      member.request->pendingStripes_ = 0;
      if (!postMessage(member.request, member.data, member.region, member.size, member.destination)) return;
    }
  });
}

ncclResult_t VerbsSendComm::isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept {
  *request = nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  protocol::ControlChannel& control = connection_.control();
  if (control.failed() || !connection_.ready()) return control.failed() ? control.reportFailure() : ncclSuccess;
  pollCompletions();
  if (connection_.failover()) advanceFailover();
  if (held_.due()) flushHeld();
  if (hop_ != nullptr && !pumpHop()) return control.reportFailure();
  if (connection_.livePaths() == 0) {
    // Every path is out while the standby path (or a failed one) is made (D96): new sends wait; NCCL calls again.
    pumpControl();
    return control.failed() ? control.reportFailure() : ncclSuccess;
  }
  std::optional<protocol::ClearToSendQueue::Destination> found = posted_.claim(tag);
  if (!found) {
    // Clear-to-sends come by RDMA; the control socket only says whether the receiver is still there.
    pumpControl();
    if (control.failed()) return control.reportFailure();
    return ncclSuccess;
  }
  if (size > found->capacity) {
    protocol::FrameHeader oversize{static_cast<uint8_t>(protocol::FrameType::kOversize), static_cast<uint8_t>(found->slot), 0,
                              found->recvId, size};
    control.send(&oversize, sizeof(oversize));
    RN_WARN("NET/railnet: send of %zu bytes (tag %d) to %s is larger than the posted receive buffer of %lu bytes", size,
            tag, control.peerName().c_str(), static_cast<unsigned long>(found->capacity));
    return ncclInvalidUsage;
  }
  // A hopped message is copied into the hop's staging, which is registered; its own region is not (GPU memory).
  const bool hopped = size > 0 && hop_ != nullptr && hop_->carries(mr);
  auto* region = dynamic_cast<LinkRegion*>(mr);
  if (region == nullptr && size > 0 && !hopped) {
    RN_WARN("NET/railnet: isend of %zu bytes to %s without a verbs memory registration", size,
            control.peerName().c_str());
    return ncclInvalidUsage;
  }
  VerbsSendRequest* sendRequest = requests_.acquire();
  if (sendRequest == nullptr) {
    RN_WARN("NET/railnet: more than %zu sends in flight to %s", kSendRequests, control.peerName().c_str());
    return ncclInternalError;
  }
  if (!hopped && region != nullptr && region->nics() != connection_.nics()) {
    RN_WARN("NET/railnet: isend to %s with a memory registration of another comm", control.peerName().c_str());
    requests_.release(sendRequest);
    return ncclInvalidUsage;
  }
  sendRequest->size_ = size;
  sendRequest->pendingStripes_ = 0;
  sendRequest->completedStripes_ = 0;
  sendRequest->hopPieces_ = 0;
  sendRequest->hopped_ = hopped;
  sendRequest->serial_ = ++sends_;
  sendRequest->watch_.start();
  for (uint64_t& bytes : sendRequest->pathBytes_) bytes = 0;
  const char* bytes = static_cast<const char*>(data);
  const bool held = !hopped && held_.holds(*found, size <= kGroupMemberBytes);
  if (held_.mustFlushBefore(held, found->recvId)) flushHeld();  // keeps the order sends were accepted in
  if (hopped) {
    addHopMessage(sendRequest, bytes, size, *found);
    *request = sendRequest;
    return pumpHop() ? ncclSuccess : control.reportFailure();
  }
  if (held) {
    // Done when the group's notice has gone out: with its group, or alone once RAILNET_GROUP_WAIT_US has passed.
    sendRequest->pendingStripes_ = 1;
    held_.add(HeldMember{sendRequest, bytes, region, size, *found}, found->recvId);
    if (found->groupUnclaimed == 0) flushHeld();
    *request = sendRequest;
    return control.failed() ? control.reportFailure() : ncclSuccess;
  }
  const bool posted = postMessage(sendRequest, bytes, region, size, *found);
  if (!posted && sendRequest->pendingStripes_ > 0) {
    // Some stripes went out and will complete (or fail) on their own; the request stays with us until then.
    // NCCL sees the failure recorded on the connection now and on every later call.
    return control.reportFailure();
  }
  if (!posted) {
    requests_.release(sendRequest);
    return control.reportFailure();
  }
  *request = sendRequest;
  return ncclSuccess;
}

ncclResult_t VerbsSendComm::testRequest(VerbsSendRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  pollCompletions();
  if (connection_.failover()) advanceFailover();
  if (held_.due()) flushHeld();
  if (hop_ != nullptr) pumpHop();  // a failure is recorded and reported below
  if (!request->workLeft()) {
    *done = 1;
    for (int path = 0; path < connection_.paths(); ++path) {
      if (request->pathBytes_[path] == 0) continue;
      connection_.counters(path).addSent(request->pathBytes_[path]);
      if (request->hopped_) connection_.counters(path).addHopped(request->pathBytes_[path]);
    }
    if (sizes != nullptr) *sizes = static_cast<int>(request->size_);
    if (request->watch_.reported()) {
      progress::reportCompletedAfterStall(
          "send #" + std::to_string(request->serial_) + " to " + connection_.control().peerName(), request->watch_);
    }
    requests_.release(request);
    return ncclSuccess;
  }
  // A receiver that died leaves its QPs retrying for seconds; its closed control socket says so at once.
  if (!connection_.control().failed()) pumpControl();
  return connection_.control().failed() ? connection_.control().reportFailure() : ncclSuccess;
}

void VerbsSendComm::watchPaths(progress::WatchClock::time_point, std::chrono::milliseconds) noexcept {
  // Rail failover's look: a path's query and probes go on while NCCL has nothing to call this comm for, and the
  // control socket is watched for silence (D94).
  if (!connection_.failover()) return;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || connection_.control().failed() || !connection_.ready()) return;
  try {
    pollCompletions();
    advanceFailover();
    pumpControl();
  } catch (...) {  // bad_alloc: the data path's next call goes on from here
  }
}

void VerbsSendComm::watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the data path is here: look next round
  const std::string peer = connection_.control().peerName();
  requests_.forEachInFlight([&](VerbsSendRequest& request) {
    if (!request.workLeft()) return;  // done, not yet collected by test
    progress::lookAt(request.watch_, request.completedStripes_, now, limit,
                     [&] { return "send #" + std::to_string(request.serial_) + " to " + peer; },
                     [&] {
      RN_WARN("NET/railnet: watchdog: send #%llu of %llu bytes to %s has made no progress for %.1f s (%llu work "
              "requests completed, %d outstanding); it is not failed", static_cast<unsigned long long>(request.serial_),
              static_cast<unsigned long long>(request.size_), peer.c_str(),
              request.watch_.quietFor(now),
              static_cast<unsigned long long>(request.completedStripes_), request.pendingStripes_);
    });
  });
}

void VerbsSendComm::describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  const std::string peer = connection_.control().peerName();
  if (!lock.owns_lock()) {
    lines->push_back("verbs send comm to " + peer + ": busy (its lock is held), not described");
    return;
  }
  lines->push_back(textf("verbs send comm to %s: %zu of %zu requests in flight, %llu sends so far, %d paths, control %s",
                         peer.c_str(), requests_.capacity() - requests_.available(), requests_.capacity(),
                         static_cast<unsigned long long>(sends_), connection_.paths(),
                         connection_.control().failed() ? "failed" : "ok"));
  requests_.forEachInFlight([&](VerbsSendRequest& request) {
    lines->push_back(textf("  send #%llu of %llu bytes: %llu work requests completed, %d outstanding, last progress "
                           "%.1f s ago", static_cast<unsigned long long>(request.serial_),
                           static_cast<unsigned long long>(request.size_),
                           static_cast<unsigned long long>(request.completedStripes_), request.pendingStripes_,
                           request.watch_.quietFor(now)));
  });
}

}  // namespace railnet::verbs
