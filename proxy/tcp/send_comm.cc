#include "proxy/tcp/send_comm.h"

#include <poll.h>

#include <algorithm>
#include <bit>
#include <cstring>

#include "proxy/protocol/stripe_plan.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"
#include "railnet/text.h"

namespace railnet::tcp {

using protocol::ClearToSendQueue;
using protocol::FrameHeader;
using protocol::FrameType;
using protocol::kChunkStaged;
using protocol::kEndOfStream;
using protocol::kMaxRecvs;
using protocol::kMaxStripeNics;
using protocol::Stripe;

namespace {
// NCCL keeps 32 receives in flight, each of up to 8 buffers: 256 sends; twice that leaves headroom.
constexpr size_t kSendRequests = 2 * NCCL_NET_MAX_REQUESTS * kMaxRecvs;
constexpr auto kStallWarning = std::chrono::seconds(10);
// A stream is robbed only with at least this much queued: two chunks of a 4 MiB message, not 256 KiB ones.
constexpr uint64_t kStealBacklog = 1 << 20;
// Delivered completion: how often a spinning test() looks for done frames on the control socket.
constexpr std::chrono::microseconds kDonePollInterval{5};
}  // namespace

TcpSendComm::TcpSendComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer, NicLayout layout,
                         const protocol::ResumeOptions* resume, bool delivered, bool dataFailover)
    : control_(std::move(control), peer, "send"),
      streams_(std::move(data)),
      delivered_(delivered),
      dataFailover_(dataFailover && delivered),
      requests_(kSendRequests, [this](SendRequest& request) { request.setOwner(this); }),
      slotChunks_(new std::atomic<int>[static_cast<size_t>(stagingSlots())]()),
      slotCopying_(static_cast<size_t>(stagingSlots()), false) {
  const Settings& config = settings();
  inlineBytes_ = static_cast<uint64_t>(config.tcpInlineBytes);      // >= 0 (settings table)
  minChunkBytes_ = static_cast<uint64_t>(config.tcpMinChunkBytes);  // >= 4096 (settings table)
  if (!layout.nics.empty()) control_.setCounters(layout.nics[0]);
  if (resume != nullptr) control_.enableResume(*resume);
  if (!layout.shaping.empty()) controlShaping_ = ownShaping_ = layout.shaping[0];
  streams_.setCounters(layout);
  nics_ = std::clamp(static_cast<int>(layout.nics.size()), 1, std::max(1, streams_.count()));
  nics_ = std::min(nics_, kMaxStripeNics);
  minStripeBytes_ = layout.minStripeBytes;
  nicNames_ = layout.names;
  nicCounters_ = layout.nics;
  if (dataFailover_ && config.faultNicCut >= 0 && config.faultNicCut < nics_) {
    cutNic_ = static_cast<int>(config.faultNicCut);
    cutAfterBytes_ = static_cast<uint64_t>(config.faultNicCutBytes);
  }
  probes_.resize(static_cast<size_t>(nics_));
  probeCap_ = static_cast<uint64_t>(config.failoverProbes);
  keepAliveInterval_ = std::chrono::milliseconds(std::max<int64_t>(config.failoverSilenceMs / 4, 25));
  resumeLimit_ = std::chrono::milliseconds(config.failoverResumeMs);
  // A single-NIC device with other NICs on its host moves when its NIC fails (send_move.cc).
  movable_ = dataFailover_ && nics_ == 1 && !layout.spares.empty() && resume != nullptr;
  spares_ = layout.spares;
  peerRail_ = layout.peerRail;
  streamRoutes_.assign(static_cast<size_t>(streams_.count()), Route{});
  streamMadeFor_.assign(static_cast<size_t>(streams_.count()), 0);
  if (movable_) {
    control_.setRejoinHandlers(
        [this](int stream, Fd socket, uint32_t failure) { movedStreamRejoined(stream, std::move(socket), failure); },
        [this](int stream, uint32_t failure, const std::string& why) { movedRejoinFailed(stream, failure, why); });
  } else if (dataFailover_) {
    control_.setRejoinHandlers([this](int stream, Fd socket, uint32_t) { streamRejoined(stream, std::move(socket)); },
                               [this](int stream, uint32_t, const std::string& why) { rejoinFailed(stream, why); });
  }
  streams_.start(this, dataFailover_);  // helper threads may call stealChunk at once
  watchdog_.start(this);
  if (dataFailover_) links_.start([this](const std::string& interface, bool up) { linkChanged(interface, up); });
  if (dataFailover_ && layout.nicsDownAtConnect != 0) {
    // A fused connection made while some of its NICs could not connect: their sockets stood in over the others.
    // Those NICs are out from the start (their stand-in streams go) and probed from 1 s, as after any failure.
    std::lock_guard<std::mutex> lock(mutex_);
    for (int nic = 0; nic < nics_; ++nic) {
      if ((layout.nicsDownAtConnect >> nic & 1) == 0) continue;
      RN_WARN("NET/railnet: send connection with %s: %s could not connect (%s); the connection starts without it",
              control_.peerName().c_str(), nicName(nic).c_str(), layout.whyDown.c_str());
      takeNicOut(nic);
    }
  }
}

TcpSendComm::~TcpSendComm() {
  links_.reset();
  watchdog_.reset();
  control_.detachFromService();  // no rejoined stream arrives while the streams go
  streams_.stop();
  if (dataFailover_) {
    // Time out of the connection so far, for NICs still failed (or a single-NIC connection still moved).
    const auto now = std::chrono::steady_clock::now();
    const uint64_t failed = failedNics_.load(std::memory_order_acquire);
    for (int nic = 0; nic < nics_; ++nic) {
      if ((failed >> nic & 1) != 0 || (nic == 0 && movable_ && dataRoute_ != Route{})) countDegraded(nic, now);
    }
  }
  if (held_.groupsCarried() != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: send comm to %s carried %llu members of grouped receives in %llu writes",
            control_.peerName().c_str(), static_cast<unsigned long long>(held_.membersCarried()),
            static_cast<unsigned long long>(held_.groupsCarried()));
  }
  if (telemetry_.pieces() != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: send comm to %s staged %s", control_.peerName().c_str(),
            telemetry_.describe("copy down (queued to seen done)").c_str());
  }
}

MemoryRegistrar& TcpSendComm::registrar() noexcept { return staging_; }

void TcpSendComm::pumpControl() {
  if (!control_.flush()) return;
  // A resumable channel's read() reports a broken socket itself (it is re-made) and returns 0.
  std::unique_lock<std::mutex> input = control_.lockInput();
  for (;;) {
    ssize_t got = control_.read();
    if (got == kEndOfStream) {
      control_.recordFailure("the receiver closed the connection");
      return;
    }
    if (got < 0) {
      control_.recordSocketFailure("control connection", got);
      return;
    }
    if (!parseClearToSends() || got == 0 || !control_.mayHaveMore()) return;
  }
}

bool TcpSendComm::parseClearToSends() {
  std::string why;
  done_.clear();
  events_ = protocol::ControlEvents{};
  events_.done = delivered_ ? &done_ : nullptr;
  events_.resumable = control_.resumable();
  long used = posted_.parse(control_.data(), control_.size(), &why, &events_);
  if (used < 0) {
    control_.recordFailure(why);
    return false;
  }
  control_.consume(static_cast<size_t>(used));
  if (events_.acknowledged && !control_.acknowledged(*events_.acknowledged)) return false;
  if (!events_.session.empty() &&
      !control_.sessionListeners(events_.session.data(), events_.session.size(), events_.sessionNics)) {
    return false;
  }
  for (const protocol::DoneFrame& delivered : done_) {
    // The send into buffer `slot` of receive `recvId` has all its bytes at the receiver.
    bool matched = false;
    requests_.forEachInFlight([&](SendRequest& request) {
      if (!matched && request.recvId_ == delivered.recvId && request.slot_ == delivered.slot &&
          request.awaitingDone_.load(std::memory_order_relaxed)) {
        request.awaitingDone_.store(false, std::memory_order_release);
        matched = true;
      }
    });
    if (!matched) {
      control_.recordFailure("protocol error: a done frame for receive " + std::to_string(delivered.recvId) +
                             " buffer " + std::to_string(delivered.slot) + ", which no send in flight went to");
      return false;
    }
  }
  if (control_.resumable()) control_.framesProcessed(events_.numbered);
  return true;
}

void TcpSendComm::warnIfStalled(int tag) {
  auto now = std::chrono::steady_clock::now();
  if (stalledSince_ == std::chrono::steady_clock::time_point{}) {
    stalledSince_ = now;
    return;
  }
  if (stallWarned_ || now - stalledSince_ < kStallWarning || posted_.empty()) return;
  // Receives are posted but none for this tag: a tag mismatch would otherwise wait forever without a word.
  RN_WARN("NET/railnet: send with tag %d to %s has waited %lds for a matching receive; open receive tags: %s", tag,
          control_.peerName().c_str(), static_cast<long>(kStallWarning.count()), posted_.openTags().c_str());
  stallWarned_ = true;
}

ncclResult_t TcpSendComm::isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept {
  *request = nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (failoverDue_.load(std::memory_order_acquire)) sendAgainFromFailedNics();
  if (held_.due()) flushHeld();
  pumpStaging();
  if (control_.failed() || !control_.flush()) return control_.reportFailure();
  if (moving_.load(std::memory_order_acquire)) {
    // A single-NIC connection moving to another path (or back): new sends wait for its streams (NCCL retries).
    advanceMove();
    advanceReturn();
    if (moving_.load(std::memory_order_acquire)) return ncclSuccess;
  }
  if (allDown_.load(std::memory_order_acquire)) {
    whileAllNicsDown(std::chrono::steady_clock::now());
    if (control_.failed()) return control_.reportFailure();
    if (allDown_.load(std::memory_order_acquire)) return ncclSuccess;  // new sends wait for a NIC (NCCL retries)
  }
  const bool fromGpu = onGpu(mr);
  // Fabric emulation: a message that may go inline waits (a NULL request: NCCL retries) until NIC 0's bucket has
  // room for all of it; larger ones wait in their streams. Given back below if it does not go inline after all.
  const bool mayInline = size > 0 && size <= inlineBytes_ && !fromGpu && controlShaping_.active();
  if (mayInline && !controlShaping_.takeWhole(size)) return ncclSuccess;
  std::optional<ClearToSendQueue::Destination> found = posted_.claim(tag);
  if (!found) {
    // Only read the socket when what we already hold does not match: one recv() at most per call.
    pumpControl();
    if (control_.failed()) return control_.reportFailure();
    found = posted_.claim(tag);
  }
  if (!found) {
    if (mayInline) controlShaping_.refund(size);
    warnIfStalled(tag);
    // Waiting for the receiver: a path silent from its side only would otherwise show nothing to the silence check.
    if (dataFailover_) control_.keepAlive(std::chrono::steady_clock::now(), keepAliveInterval_);
    return ncclSuccess;
  }
  stalledSince_ = {};
  stallWarned_ = false;
  const uint32_t recvId = found->recvId;
  const int slot = found->slot;
  const uint64_t capacity = found->capacity;
  // A TCP receiver that lands this buffer in staging (GPU memory) says so with its piece size in the rkey field.
  const uint64_t stagedPieceBytes = found->rkey;

  if (size > capacity) {
    // Tell the receiver too, so both sides fail this message and nothing waits for it.
    FrameHeader oversize{static_cast<uint8_t>(FrameType::kOversize), static_cast<uint8_t>(slot), 0, recvId, size};
    control_.send(&oversize, sizeof(oversize));
    RN_WARN("NET/railnet: send of %zu bytes (tag %d) to %s is larger than the posted receive buffer of %lu bytes", size,
            tag, control_.peerName().c_str(), static_cast<unsigned long>(capacity));
    return ncclInvalidUsage;
  }
  // The range is RAILNET_TCP_STAGING_PIECE_BYTES's: a peer's value is not trusted to be one (a piece of 1 byte would
  // queue one piece per byte).
  if (stagedPieceBytes != 0 && ((stagedPieceBytes & (stagedPieceBytes - 1)) != 0 || stagedPieceBytes < (64 << 10) ||
                                stagedPieceBytes > (64 << 20) || (fromGpu && stagedPieceBytes > staging_.pieceBytes()))) {
    RN_WARN("NET/railnet: %s stages GPU memory in pieces of %lu bytes, this process in pieces of %lu: set the same "
            "RAILNET_TCP_STAGING_PIECE_BYTES (a power of two) on every rank",
            control_.peerName().c_str(), static_cast<unsigned long>(stagedPieceBytes),
            static_cast<unsigned long>(stagingPieceBytes()));
    return ncclInvalidUsage;
  }
  if (fromGpu && !staging_.ready()) {
    RN_WARN("NET/railnet: send of GPU memory %p to %s with a memory handle this comm did not register", data,
            control_.peerName().c_str());
    return ncclInvalidUsage;
  }
  SendRequest* sendRequest = requests_.acquire();
  if (sendRequest == nullptr) {
    RN_WARN("NET/railnet: more than %zu sends in flight to %s", kSendRequests, control_.peerName().c_str());
    return ncclInternalError;
  }
  sendRequest->size_ = size;
  sendRequest->serial_ = ++sends_;
  sendRequest->sentBytes_.store(0, std::memory_order_relaxed);
  sendRequest->watch_.start();
  sendRequest->recvId_ = recvId;
  sendRequest->slot_ = slot;
  sendRequest->chunks_.clear();
  sendRequest->resendable_ = !fromGpu && stagedPieceBytes == 0;

  const bool inlined = size == 0 || (size <= inlineBytes_ && !fromGpu && stagedPieceBytes == 0);
  // Delivered completion holds back only sends whose chunks leave from the caller's buffer: inline bytes are copied
  // into the control queue at once, and rail failover replays them from there (docs/failover.md).
  sendRequest->awaitingDone_.store(delivered_ && !inlined, std::memory_order_relaxed);
  if (mayInline && !inlined) controlShaping_.refund(size);  // its chunks draw from their streams' buckets
  const bool held = held_.holds(*found, inlined);
  if (held_.mustFlushBefore(held, recvId)) flushHeld();  // keeps the order sends were accepted in
  if (held) {
    // Done when its frame is written: with its group, or alone once RAILNET_GROUP_WAIT_US has passed.
    sendRequest->pendingChunks_.store(1, std::memory_order_relaxed);
    FrameHeader header{static_cast<uint8_t>(FrameType::kInline), static_cast<uint8_t>(slot), 0, recvId, size};
    held_.add(HeldMember{sendRequest, header, data}, recvId);
    if (found->groupUnclaimed == 0) flushHeld();
  } else if (inlined) {
    // Inline: the bytes are copied into the control queue, so the send is complete at once.
    FrameHeader header{static_cast<uint8_t>(FrameType::kInline), static_cast<uint8_t>(slot), 0, recvId, size};
    control_.send(&header, sizeof(header), data, size);
    if (NicCounters* counters = control_.counters()) counters->addSent(size);

    sendRequest->pendingChunks_.store(0, std::memory_order_relaxed);
  } else if (fromGpu || stagedPieceBytes != 0) {
    sendPieces(sendRequest, static_cast<const char*>(data), size, recvId, slot, fromGpu, stagedPieceBytes);
  } else if (nics_ > 1) {
    sendStriped(sendRequest, static_cast<const char*>(data), size, recvId, slot);
  } else {
    const uint64_t chunk = chunkBytesFor(size);
    sendRequest->pendingChunks_.store(static_cast<int>((size + chunk - 1) / chunk), std::memory_order_relaxed);
    enqueueChunks(ChunkTemplate{recvId, slot, size, 0, 0, &sendRequest->pendingChunks_, nullptr,
                                &sendRequest->sentBytes_, dataFailover_ ? sendRequest : nullptr},
                  static_cast<const char*>(data), 0, size, chunk, 0, 1);
  }
  *request = sendRequest;
  return ncclSuccess;
}

uint64_t TcpSendComm::chunkBytesFor(uint64_t bytes) const {
  // No more pieces than helpers serve the streams: more would run one after another on one helper.
  return protocol::chunkSizeFor(bytes, std::min(streams_.count(), streams_.helpersServing()), minChunkBytes_);
}

void TcpSendComm::sendStriped(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot) {
  // Over the NICs still alive (rail failover): stripe i of the plan goes to the i-th of them.
  int alive[kMaxStripeNics];
  int aliveCount = 0;
  for (uint64_t live = liveNics(); live != 0; live &= live - 1) alive[aliveCount++] = std::countr_zero(live);
  if (aliveCount == 0) alive[aliveCount++] = 0;  // placeChunk records the failure
  Stripe stripes[kMaxStripeNics];
  const int count = protocol::planStripes(size, aliveCount, stripedMessages_++, minStripeBytes_, stripes);
  for (int i = 0; i < count; ++i) stripes[i].nic = alive[stripes[i].nic];
  const int streams = streams_.count();
  uint64_t chunkOf[kMaxStripeNics];
  int total = 0;
  for (int i = 0; i < count; ++i) {
    // Streams of NIC l: l, l + nics_, l + 2 nics_, ...
    const int nicStreams = (streams - stripes[i].nic + nics_ - 1) / nics_;
    const int nicHelpers = std::max(1, (streams_.helpersServing() + nics_ - 1) / nics_);
    chunkOf[i] = protocol::chunkSizeFor(stripes[i].bytes, std::min(nicStreams, nicHelpers), minChunkBytes_);
    total += static_cast<int>((stripes[i].bytes + chunkOf[i] - 1) / chunkOf[i]);
  }
  // Every chunk is counted before the first is queued: a worker may finish one at once.
  request->pendingChunks_.store(total, std::memory_order_relaxed);
  const ChunkTemplate what{recvId, slot, size, 0, 0, &request->pendingChunks_, nullptr, &request->sentBytes_,
                           dataFailover_ ? request : nullptr};
  for (int i = 0; i < count; ++i) {
    enqueueChunks(what, data + stripes[i].offset, stripes[i].offset, stripes[i].bytes, chunkOf[i], stripes[i].nic,
                  nics_);
  }
}

void TcpSendComm::enqueueChunks(const ChunkTemplate& what, const char* data, uint64_t offset, uint64_t bytes,
                                uint64_t chunk, int first, int step) {
  for (uint64_t done = 0; done < bytes; done += chunk) {
    SendOp op{};
    op.header.recvId = what.recvId;
    op.header.slot = static_cast<uint8_t>(what.slot);
    op.header.flags = what.flags;
    op.header.pieceSeq = what.pieceSeq;
    op.header.messageSize = what.messageSize;
    op.header.offset = offset + done;
    op.header.length = std::min(chunk, bytes - done);
    op.data = data + done;
    op.pending = what.pending;
    op.slotPending = what.slotPending;
    op.sentBytes = what.sentBytes;
    int stream = placeChunk(op, first, step);
    if (stream == kParked && what.record == nullptr) {
      control_.recordFailure("a NIC's data streams failed under a send staged from GPU memory, which cannot be sent "
                             "again");
      stream = -1;
    }
    if (stream == kParked) {
      // A single-NIC connection moving to another NIC: the chunk goes once it has (moveFinished sends every chunk of
      // the sends in flight again); until then it counts as released, like those its dead streams held.
      what.pending->fetch_sub(1, std::memory_order_release);
      what.record->chunks_.push_back(SendRequest::QueuedChunk{op, 0});
      continue;
    }
    if (stream < 0) {
      // No stream left: this chunk and the rest never leave, and count as done so nothing waits on them; the
      // recorded failure fails the send at test.
      const int left = static_cast<int>((bytes - done + chunk - 1) / chunk);
      if (what.slotPending != nullptr) what.slotPending->fetch_sub(left, std::memory_order_release);
      what.pending->fetch_sub(left, std::memory_order_release);
      return;
    }
    if (what.record != nullptr) what.record->chunks_.push_back(SendRequest::QueuedChunk{op, stream});
    cutIfDue(stream, op.header.length);
  }
}

int TcpSendComm::placeChunk(const SendOp& op, int first, int step) {
  const int streams = streams_.count();
  for (int pass = 0; pass < 2; ++pass) {
    // Pass 0: the streams asked for; pass 1 (their NIC failed): any live stream.
    const int from = pass == 0 ? first : 0;
    const int stride = pass == 0 ? step : 1;
    const int candidates = (streams - from + stride - 1) / stride;
    for (int attempt = 0; attempt < candidates; ++attempt) {
      // Least-queued live stream of the set first, starting from a rotating point: a slow stream gets less new work.
      int best = -1;
      const int start = static_cast<int>(nextStream_++ % static_cast<uint32_t>(candidates));
      for (int k = 0; k < candidates; ++k) {
        const int candidate = from + ((start + k) % candidates) * stride;
        if (streams_[candidate].dead() || !nicAlive(nicOf(candidate))) continue;
        if (best < 0 || streams_[candidate].queuedBytes() < streams_[best].queuedBytes()) best = candidate;
      }
      if (best < 0) break;
      if (streams_[best].enqueue(op)) return best;  // false: it failed just now; choose again
    }
  }
  // Every NIC failed: a single-NIC connection moves (send_move.cc), a fused one probes its NICs (whileAllNicsDown).
  if (dataFailover_ && !control_.failed()) return kParked;
  control_.recordFailure("every data stream of the connection failed");
  return -1;
}

void TcpSendComm::sendPieces(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot,
                             bool fromGpu, uint64_t stagedPieceBytes) {
  const uint64_t pieceBytes = stagedPieceBytes != 0 ? stagedPieceBytes : staging_.pieceBytes();
  const auto now = staging::StagingTelemetry::Clock::now();
  int chunks = 0;
  for (uint64_t offset = 0; offset < size; offset += pieceBytes) {
    const uint64_t bytes = std::min(pieceBytes, size - offset);
    const uint64_t chunk = chunkBytesFor(bytes);
    chunks += static_cast<int>((bytes + chunk - 1) / chunk);
    pieces_.push_back(Piece{request, data, fromGpu, stagedPieceBytes != 0, size, offset, bytes, recvId, slot, now});
  }
  request->pendingChunks_.store(chunks, std::memory_order_relaxed);
  pumpStaging();
}

int TcpSendComm::freeStagingSlot() {
  const int slots = staging_.slots();
  for (int k = 1; k <= slots; ++k) {
    const int candidate = (lastSlot_ + k) % slots;
    if (!slotCopying_[static_cast<size_t>(candidate)] &&
        slotChunks_[static_cast<size_t>(candidate)].load(std::memory_order_acquire) == 0) {
      lastSlot_ = candidate;
      return candidate;
    }
  }
  return -1;
}

void TcpSendComm::queuePiece(const Piece& piece, const char* data, std::atomic<int>* slotPending) {
  const uint64_t chunk = chunkBytesFor(piece.bytes);
  if (slotPending != nullptr) slotPending->store(static_cast<int>((piece.bytes + chunk - 1) / chunk));
  ChunkTemplate what{piece.recvId, piece.slot, piece.messageSize, 0, 0, &piece.request->pendingChunks_, slotPending,
                     &piece.request->sentBytes_};
  if (piece.staged) {
    // Numbered as queued: every stream then carries staged pieces in order, which the receiver's landing ring
    // relies on (proxy/staging/landing_ring.h).
    what.flags = kChunkStaged;
    what.pieceSeq = nextPieceSeq_++;
  }
  // Every NIC's streams: pieces are not striped per NIC (the stripe plan is for host messages).
  enqueueChunks(what, data, piece.offset, piece.bytes, chunk, 0, 1);
}

void TcpSendComm::flushHeld() {
  held_.flush([&](std::vector<HeldMember>& members) {
    iovec pieces[protocol::ControlChannel::kMaxSendPieces];
    int count = 0;
    uint64_t bytes = 0;
    for (HeldMember& member : members) {
      pieces[count++] = {&member.header, sizeof(member.header)};
      pieces[count++] = {const_cast<void*>(member.data), member.header.size};
      bytes += member.header.size;
    }
    // Copied into the control queue when the socket does not take it all: every member is complete now.
    control_.sendVector(pieces, count);
    if (NicCounters* counters = control_.counters()) counters->addSent(bytes);

    for (HeldMember& member : members) member.request->pendingChunks_.store(0, std::memory_order_release);
  });
}

void TcpSendComm::pumpStaging() {
  telemetry_.polled(!copying_.empty() || !pieces_.empty());
  if (pieces_.empty() && copying_.empty()) return;
  std::string why;
  if (!copying_.empty()) {
    const auto now = staging::StagingTelemetry::Clock::now();
    finishedCopies_.clear();
    if (!staging_.copies().poll(&finishedCopies_, &why)) {
      control_.recordFailure("GPU staging: " + why, protocol::FailureKind::kLocal);
      return;
    }
    for (size_t i = 0; i < finishedCopies_.size(); ++i) {
      const CopyingPiece copied = copying_.front();
      copying_.pop_front();
      telemetry_.add(staging::StagingTelemetry::kCopy, now - copied.submittedAt);
      telemetry_.countPiece(copied.piece.bytes);
      auto* slotPending = &slotChunks_[static_cast<size_t>(copied.stagingSlot)];
      queuePiece(copied.piece, staging_.slot(copied.stagingSlot), slotPending);
      slotCopying_[static_cast<size_t>(copied.stagingSlot)] = false;
    }
  }
  while (!pieces_.empty()) {
    const Piece& piece = pieces_.front();
    if (!piece.fromGpu) {
      if (!copying_.empty()) break;  // its number must come after the pieces being copied
      queuePiece(piece, piece.source + piece.offset, nullptr);
      pieces_.pop_front();
      continue;
    }
    if (staging_.copies().full()) break;
    const int stagingSlot = freeStagingSlot();
    if (stagingSlot < 0) break;
    const auto device = reinterpret_cast<cuda::CUdeviceptr>(piece.source + piece.offset);
    if (!staging_.copies().submit(staging::CopyQueue::Direction::kDeviceToHost, staging_.slot(stagingSlot), device,
                                  piece.bytes, static_cast<uint64_t>(stagingSlot), &why)) {
      control_.recordFailure("GPU staging: " + why, protocol::FailureKind::kLocal);
      return;
    }
    slotCopying_[static_cast<size_t>(stagingSlot)] = true;
    const auto submitted = staging::StagingTelemetry::Clock::now();
    telemetry_.add(staging::StagingTelemetry::kWaitForSlot, submitted - piece.queuedAt);
    copying_.push_back(CopyingPiece{piece, stagingSlot, submitted});
    pieces_.pop_front();
  }
  stagingWork_.store(!pieces_.empty() || !copying_.empty(), std::memory_order_release);
}

ncclResult_t TcpSendComm::testRequest(SendRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  if (failoverDue_.load(std::memory_order_acquire) || moving_.load(std::memory_order_acquire) ||
      allDown_.load(std::memory_order_acquire)) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (failoverDue_.load(std::memory_order_acquire)) sendAgainFromFailedNics();
      advanceMove();
      advanceReturn();
      if (allDown_.load(std::memory_order_acquire)) whileAllNicsDown(std::chrono::steady_clock::now());
    }
  }
  if (request->awaitingDone_.load(std::memory_order_acquire) &&
      request->pendingChunks_.load(std::memory_order_acquire) == 0) {
    // Delivered completion: every byte is written; the receiver's done frame says when it has them all. poll()
    // first: unlike recv() it does not take the socket's lock, which the receiver's helper needs to write the frame
    // (on loopback the writer delivers into this socket), and NCCL tests the oldest send in a tight loop.
    // At most one look per kDonePollInterval: NCCL's proxy thread spins on test(), and a syscall per spin took CPU
    // from the helper threads that move the bytes (performance.md §14).
    const auto now = std::chrono::steady_clock::now();
    if (now - lastDonePoll_.load(std::memory_order_relaxed) >= kDonePollInterval) {
      lastDonePoll_.store(now, std::memory_order_relaxed);
      pollfd readable{control_.fd(), POLLIN, 0};
      if (poll(&readable, 1, 0) > 0) {
        std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
        if (lock.owns_lock()) pumpControl();
      }
    }
  }
  if (request->pendingChunks_.load(std::memory_order_acquire) == 0 &&
      !request->awaitingDone_.load(std::memory_order_acquire)) {
    *done = 1;
    if (sizes != nullptr) *sizes = static_cast<int>(request->size_);
    std::lock_guard<std::mutex> lock(mutex_);
    if (request->watch_.reported()) {
      progress::reportCompletedAfterStall("send #" + std::to_string(request->serial_) + " to " + control_.peerName(),
                                          request->watch_);
    }
    requests_.release(request);
    return ncclSuccess;
  }
  // No socket reads here: chunks are written by helper threads, which notice a vanished receiver, and
  // clear-to-sends are read when isend needs one. Polling stays a pair of atomic loads, unless pieces wait for
  // the copy engines or for a staging slot: then this thread moves them on.
  if (stagingWork_.load(std::memory_order_acquire) || held_.anyHeld()) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      if (held_.due()) flushHeld();
      pumpStaging();
    }
  }
  return control_.failed() ? control_.reportFailure() : ncclSuccess;
}

std::string TcpSendComm::stagingState() {
  std::string slots;
  for (int i = 0; i < staging_.slots(); ++i) {
    slots += " [" + std::to_string(i) + "] " + (slotCopying_[static_cast<size_t>(i)] ? "copying" : "") +
             std::to_string(slotChunks_[static_cast<size_t>(i)].load(std::memory_order_relaxed)) + " chunks";
  }
  std::string queued;
  for (int s = 0; s < streams_.count(); ++s) queued += " " + std::to_string(streams_[s].queuedBytes());
  return textf("%zu pieces not started, %zu being copied down (%d copies in flight), next piece number %u; slots:%s; "
              "bytes queued per stream:%s", pieces_.size(), copying_.size(),
              staging_.ready() ? staging_.copies().inFlight() : 0, static_cast<unsigned>(nextPieceSeq_),
              slots.empty() ? " none" : slots.c_str(), queued.c_str());
}

void TcpSendComm::reportStalled(const SendRequest& request, progress::WatchClock::time_point now) {
  RN_WARN("NET/railnet: watchdog: send #%llu of %llu bytes to %s has made no progress for %.1f s (%llu bytes written, "
          "%d chunks left%s); it is not failed; %s", static_cast<unsigned long long>(request.serial_),
          static_cast<unsigned long long>(request.size_), control_.peerName().c_str(),
          request.watch_.quietFor(now),
          static_cast<unsigned long long>(request.sentBytes_.load(std::memory_order_relaxed)),
          request.pendingChunks_.load(std::memory_order_relaxed),
          request.awaitingDone_.load(std::memory_order_relaxed) ? ", waiting for the receiver's done frame" : "",
          stagingState().c_str());
}

void TcpSendComm::watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the data path is here: look next round
  requests_.forEachInFlight([&](SendRequest& request) {
    if (request.pendingChunks_.load(std::memory_order_acquire) == 0 &&
        !request.awaitingDone_.load(std::memory_order_acquire)) {
      return;  // done, not yet collected by test
    }
    progress::lookAt(request.watch_, request.sentBytes_.load(std::memory_order_relaxed), now, limit,
                     [&] { return "send #" + std::to_string(request.serial_) + " to " + control_.peerName(); },
                     [&] {
      reportStalled(request, now);
    });
  });
}

void TcpSendComm::watchPeerHost(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  // Idle comms too: a send completes once its bytes are in the kernel, so a comm with nothing in flight may still
  // hold its last message unacknowledged on a socket whose path died, and wait for ever for the next clear-to-send.
  if (!lock.owns_lock() || control_.failed()) return;
  try {
    if (auto lost = streams_.peerHostLost(control_.fd(), now, silenceLimit)) control_.recordFailure(*lost);
  } catch (...) {
    // Out of memory for a vector of descriptors: look again next round.
  }
}

void TcpSendComm::describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    lines->push_back("TCP send comm to " + control_.peerName() + ": busy (its lock is held), not described");
    return;
  }
  lines->push_back(textf("TCP send comm to %s: %zu of %zu requests in flight, %llu sends so far, %d data streams, "
                        "control %s; %s", control_.peerName().c_str(), requests_.capacity() - requests_.available(),
                        requests_.capacity(), static_cast<unsigned long long>(sends_), streams_.count(),
                        control_.failed() ? "failed" : "ok", stagingState().c_str()));
  requests_.forEachInFlight([&](SendRequest& request) {
    lines->push_back(textf("  send #%llu: %llu of %llu bytes written, %d chunks left, last progress %.1f s ago",
                          static_cast<unsigned long long>(request.serial_),
                          static_cast<unsigned long long>(request.sentBytes_.load(std::memory_order_relaxed)),
                          static_cast<unsigned long long>(request.size_),
                          request.pendingChunks_.load(std::memory_order_relaxed),
                          request.watch_.quietFor(now)));
  });
}

bool TcpSendComm::stealChunk(int thief, SendOp* out) noexcept {
  // Any stream of the thief's NIC may carry any chunk (chunks say where they go). Only a real backlog on a stream
  // served by another helper is worth moving: the thief's own helper writes its other streams' chunks in this
  // very pass anyway, and moving the few small chunks of mid-size messages between helpers cost twice the CPU
  // per byte on 2 cores (docs/performance.md §7). The stream with the most queued is the slowest to drain.
  // Read without locks: a stale choice only means another look next pass.
  const int thiefHelper = streams_[thief].helper();
  int victim = -1;
  uint64_t most = 0;
  for (int s = thief % nics_; s < streams_.count(); s += nics_) {
    const uint64_t queued = streams_[s].queuedBytes();
    if (queued >= kStealBacklog && queued > most && streams_[s].helper() != thiefHelper) {
      most = queued;
      victim = s;
    }
  }
  return victim >= 0 && streams_[victim].giveQueuedChunk(out);
}

char* TcpSendComm::resolveChunk(const ChunkHeader&) noexcept { return nullptr; }

void TcpSendComm::chunkReceived(const ChunkHeader&) noexcept {}

void TcpSendComm::streamFailed(int streamIndex, const char* why, int err, bool) noexcept {
  if (dataFailover_) {
    // Its chunks were released (Stream::releaseOnFailure); the next call sends them again over the other NICs, or
    // fails the connection when no NIC is left. A receiver that is gone closes every stream.
    failedNics_.fetch_or(uint64_t{1} << nicOf(streamIndex), std::memory_order_acq_rel);
    failoverDue_.store(true, std::memory_order_release);
    RN_INFO(NCCL_NET, "NET/railnet: send connection with %s: data stream %d (NIC %d) failed: %s",
            control_.peerName().c_str(), streamIndex, nicOf(streamIndex), why);
    return;
  }
  // The receiver never writes on data streams: end-of-stream or an error both mean it is gone.
  control_.recordFailure("data stream " + std::to_string(streamIndex) + ": " + why,
                         err == 0 || protocol::isRemoteErrno(err) ? protocol::FailureKind::kRemote
                                                                  : protocol::FailureKind::kLocal);
}

}  // namespace railnet::tcp
