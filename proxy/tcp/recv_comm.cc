#include "proxy/tcp/recv_comm.h"

#include <algorithm>
#include <cstring>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::tcp {

using protocol::ChunkHeader;
using protocol::ClearToSendEntry;
using protocol::FailureKind;
using protocol::FrameHeader;
using protocol::FrameType;
using protocol::kChunkStaged;
using protocol::kEndOfStream;
using protocol::kMaxRecvs;

namespace {
// How long a closing receive comm waits for its last done frames to leave (delivered completion).
constexpr std::chrono::milliseconds kDoneDrainLimit{1000};
}  // namespace

TcpRecvComm::TcpRecvComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer,
                         const NicLayout& layout, bool sendDoneFrames, const protocol::ResumeOptions* resume,
                         bool dataFailover)
    : control_(std::move(control), peer, "receive"),
      sendDoneFrames_(sendDoneFrames),
      dataFailover_(dataFailover),
      nics_(std::max<int>(1, static_cast<int>(layout.nics.size()))),
      nicNames_(layout.names),
      landing_(stagingSlots(), stagingPieceBytes()),
      streams_(std::move(data)),
      openStreams_(0) {
  if (!layout.nics.empty()) control_.setCounters(layout.nics[0]);
  if (dataFailover_) {
    control_.setRejoinHandlers(
        [this](int stream, Fd socket, uint32_t failure) { streamRejoined(stream, std::move(socket), failure); }, {});
    nicRecovered_.assign(static_cast<size_t>(nics_), 0);
  }
  if (resume != nullptr) control_.enableResume(*resume);
  streams_.setCounters(layout);
  ring_.prepare([this](RecvRequest& entry) { entry.setOwner(this); });
  // Counted before the helpers get the streams: a peer that died before this accept has each stream's end of
  // stream reported at once, and a count stored after those reports would never reach 0 (the receive hung).
  openStreams_.store(streams_.count(), std::memory_order_release);
  streams_.start(this);
  watchdog_.start(this);
}

TcpRecvComm::~TcpRecvComm() {
  watchdog_.reset();
  control_.detachFromService();  // no rejoined stream arrives while the streams go
  streams_.stop();
  // The sender's last sends complete on their done frames: let them leave (they fit the socket's buffer unless the
  // sender stopped reading, hence the bound).
  if (sendDoneFrames_ && !control_.failed() && !control_.drain(kDoneDrainLimit)) {
    RN_INFO(NCCL_NET, "NET/railnet: receive comm from %s closed with done frames unsent", control_.peerName().c_str());
  }
  if (ring_.groupedPosts() != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: receive comm from %s took %llu grouped receives of %llu buffers",
            control_.peerName().c_str(), static_cast<unsigned long long>(ring_.groupedPosts()),
            static_cast<unsigned long long>(ring_.groupedMembers()));
  }
  if (telemetry_.pieces() != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: receive comm from %s staged %s; %llu chunks waited for a busy landing slot",
            control_.peerName().c_str(), telemetry_.describe("copy up (landed to seen done)").c_str(),
            static_cast<unsigned long long>(slotWaits_.load(std::memory_order_relaxed)));
  }
}

MemoryRegistrar& TcpRecvComm::registrar() noexcept { return staging_; }

ncclResult_t TcpRecvComm::irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                                Request** request) noexcept {
  *request = nullptr;
  if (!protocol::validReceiveCount(n, control_.peerName())) return ncclInvalidUsage;
  std::lock_guard<std::mutex> lock(mutex_);
  if (!control_.flush() || peerGone()) {
    control_.recordFailure("the sender closed the connection");
    return control_.reportFailure();
  }
  uint8_t staged = 0;
  for (int i = 0; i < n; ++i) {
    if (mrs == nullptr || !onGpu(mrs[i])) continue;
    if (!staging_.ready()) {
      RN_WARN("NET/railnet: receive into GPU memory %p from %s with a memory handle this comm did not register",
              data[i], control_.peerName().c_str());
      return ncclInvalidUsage;
    }
    staged = static_cast<uint8_t>(staged | 1u << i);
  }
  pumpStaging();
  const uint32_t recvId = ring_.nextId();
  RecvRequest* entry = ring_.post(n, data, sizes, tags);
  if (entry == nullptr) return ncclSuccess;  // more than the ring's receives in flight: try again later
  // Published before the clear-to-send leaves: a helper thread may see the first chunk right after.
  entry->stagedBuffers.store(staged, std::memory_order_release);
  entry->serial = ++receives_;
  entry->watch.start();
  ClearToSendEntry entries[kMaxRecvs];
  const FrameHeader header = Ring::clearToSend(*entry, recvId, 0, entries);
  for (int i = 0; i < n; ++i) {
    // TCP has no rkeys: the field tells the sender that this buffer lands in staging, and in pieces of what size.
    if ((staged >> i & 1) != 0) entries[i].rkey = static_cast<uint32_t>(landing_.pieceBytes());
  }
  control_.send(&header, sizeof(header), entries, sizeof(ClearToSendEntry) * static_cast<size_t>(n));
  *request = entry;
  return ncclSuccess;
}

ncclResult_t TcpRecvComm::iflush(int, void**, const int*, MemoryRegion**, Request** request) noexcept {
  *request = nullptr;  // host memory: nothing to flush
  return ncclSuccess;
}

bool TcpRecvComm::startFrame() {
  if (frame_.type == static_cast<uint8_t>(FrameType::kAck) && control_.resumable()) {
    return control_.acknowledged(static_cast<uint32_t>(frame_.size));
  }
  if (frame_.type == static_cast<uint8_t>(FrameType::kNicFailed) && dataFailover_) {
    const int nic = frame_.slot;
    if (nic < nics_ && frame_.recvId > nicRecovered_[static_cast<size_t>(nic)]) {
      for (int s = nic; s < streams_.count(); s += nics_) streams_[s].cut();
    }
    control_.framesProcessed(1);
    return true;
  }
  if (frame_.type == static_cast<uint8_t>(FrameType::kOversize)) {
    if (ring_.applyOversize(frame_, control_.peerName())) {
      if (control_.resumable()) control_.framesProcessed(1);
      return true;
    }
  }
  RecvRequest* request = ring_.find(frame_.recvId, frame_.slot);
  if (request == nullptr) {
    control_.recordFailure("protocol error: control frame for receive " + std::to_string(frame_.recvId) + " buffer " +
                           std::to_string(frame_.slot) + ", which is not posted");
    return false;
  }
  const protocol::ReceiveBuffer& buffer = request->buffer(frame_.slot);
  const bool staged = (request->stagedBuffers.load(std::memory_order_acquire) >> frame_.slot & 1) != 0;
  if (frame_.type != static_cast<uint8_t>(FrameType::kInline) || frame_.size > buffer.capacity ||
      (staged && frame_.size > 0)) {  // inline bytes cannot be written into GPU memory
    control_.recordFailure("protocol error: bad control frame (type " + std::to_string(frame_.type) + ", size " +
                           std::to_string(frame_.size) + ")");
    return false;
  }
  if (frame_.size == 0) {
    Ring::completeBuffer(*request, frame_.slot, 0);
    if (control_.resumable()) control_.framesProcessed(1);
    return true;
  }
  inInline_ = true;
  inlineDestination_ = buffer.data;
  inlineLeft_ = frame_.size;
  return true;
}

void TcpRecvComm::finishInline() {
  inInline_ = false;
  if (NicCounters* counters = control_.counters()) counters->addReceived(frame_.size);
  Ring::completeBuffer(*ring_.find(frame_.recvId, frame_.slot), frame_.slot, frame_.size);
  if (control_.resumable()) control_.framesProcessed(1);
}

bool TcpRecvComm::consumeBuffered() {
  while (control_.size() > 0) {
    if (inInline_) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(control_.size(), inlineLeft_));
      memcpy(inlineDestination_ + (frame_.size - inlineLeft_), control_.data(), take);
      control_.consume(take);
      inlineLeft_ -= take;
      if (inlineLeft_ == 0) finishInline();
      continue;
    }
    if (control_.size() < sizeof(FrameHeader)) break;
    memcpy(&frame_, control_.data(), sizeof(FrameHeader));
    control_.consume(sizeof(FrameHeader));
    if (!startFrame()) return false;
  }
  return true;
}

void TcpRecvComm::pumpControl() {
  if (!control_.flush() || controlClosed_.load(std::memory_order_relaxed)) return;
  std::unique_lock<std::mutex> input = control_.lockInput();
  if (control_.inputGeneration() != inputGeneration_) {
    // The socket was re-made: a frame begun on the old one comes again whole.
    inputGeneration_ = control_.inputGeneration();
    inInline_ = false;
    inlineLeft_ = 0;
    inlineDestination_ = nullptr;
  }
  // Big inline payloads are read straight into their buffer rather than through the staging buffer.
  constexpr uint64_t kDirectRead = 16 * 1024;
  for (;;) {
    if (!consumeBuffered()) return;
    bool direct = inInline_ && inlineLeft_ >= kDirectRead;
    size_t wanted = direct ? static_cast<size_t>(inlineLeft_) : 0;
    ssize_t got = direct ? protocol::readSome(control_.fd(), inlineDestination_ + (frame_.size - inlineLeft_), wanted)
                         : control_.read();
    if (got == 0) return;
    if (got < 0 && control_.resumable()) {  // a direct read's: the channel's own read() reports losses itself
      control_.lost(got == kEndOfStream ? std::string("the peer closed the control connection")
                                        : "control connection: " + errnoText(static_cast<int>(-got)));
      return;
    }
    if (got == kEndOfStream) {
      // Not an error yet: chunks already on the data streams may still complete the posted receives.
      controlClosed_.store(true, std::memory_order_release);
      if (inInline_ || control_.size() != 0) control_.recordFailure("the sender closed the connection mid-message");
      return;
    }
    if (got < 0) {
      control_.recordSocketFailure("control connection", got);
      return;
    }
    if (direct) {
      inlineLeft_ -= static_cast<uint64_t>(got);
      if (inlineLeft_ == 0) finishInline();
      if (static_cast<size_t>(got) < wanted) return;  // drained
    } else if (!control_.mayHaveMore()) {
      consumeBuffered();
      return;
    }
  }
}

bool TcpRecvComm::peerGone() const {
  // Failed for a reason other than a clean close, or closed with nothing left on any stream.
  return control_.failed() ||
         ((controlClosed_.load(std::memory_order_acquire) || (control_.broken() && !dataFailover_)) &&
          openStreams_.load(std::memory_order_acquire) == 0);
}

ncclResult_t TcpRecvComm::testRequest(RecvRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  if (!request->complete()) {
    std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
    if (lock.owns_lock()) {
      pumpControl();
      pumpStaging();
    }
    if (!request->complete()) {
      if (!peerGone()) return ncclSuccess;
      if (!control_.failed()) control_.recordFailure("the sender closed the connection before this receive completed");
      return control_.reportFailure();
    }
  }
  *done = 1;
  std::lock_guard<std::mutex> lock(mutex_);
  if (request->watch.reported()) {
    progress::reportCompletedAfterStall("receive #" + std::to_string(request->serial) + " from " + control_.peerName(),
                                        request->watch);
  }
  return Ring::finish(*request, sizes);
}

char* TcpRecvComm::resolveChunk(const ChunkHeader& header) noexcept {
  RecvRequest* entry = ring_.find(header.recvId, header.slot);
  if (dataFailover_ && (header.flags & kChunkStaged) == 0) {
    // Rail failover may send a chunk again while its first copy is still arriving on another stream: the range is
    // claimed before it is written, so two streams never write it at once and a copy never lands after its
    // buffer completed (a receive already finished names no posted buffer at all).
    switch (ring_.claim(header)) {
      case protocol::ChunkLedger::Claim::kPlaced:
        return StreamOwner::discard();
      case protocol::ChunkLedger::Claim::kBusy:
        return StreamOwner::retrySoon();
      case protocol::ChunkLedger::Claim::kGo:
        break;
    }
    char* destination = ring_.destination(header);
    if (destination == nullptr) ring_.release(header);
    return destination;
  }
  const bool staged = entry != nullptr && (entry->stagedBuffers.load(std::memory_order_acquire) >> header.slot & 1) != 0;
  if (staged != ((header.flags & kChunkStaged) != 0)) {
    if (entry == nullptr) return nullptr;  // the stream reports the chunk that matches nothing
    control_.recordFailure(staged ? "protocol error: an unstaged chunk for a receive buffer in GPU memory"
                                  : "protocol error: a staged chunk for a receive buffer in host memory");
    return nullptr;
  }
  char* destination = ring_.destination(header);  // also checks that the chunk fits the buffer
  if (!staged || destination == nullptr) return destination;
  return landStagedChunk(entry, header);
}

char* TcpRecvComm::landStagedChunk(RecvRequest*, const ChunkHeader& header) noexcept {
  uint64_t offset = 0;
  std::string why;
  switch (landing_.place(header, &offset, &why)) {
    case staging::LandingRing::Verdict::kLand:
      return staging_.slot(0) + offset;
    case staging::LandingRing::Verdict::kWait:
      slotWaits_.fetch_add(1, std::memory_order_relaxed);
      return StreamOwner::retryLater();
    case staging::LandingRing::Verdict::kReject:
      break;
  }
  control_.recordFailure("protocol error: " + why);
  return nullptr;
}

void TcpRecvComm::chunkAbandoned(const ChunkHeader& header) noexcept {
  if (!dataFailover_ || (header.flags & kChunkStaged) != 0) return;
  ring_.release(header);  // a stream waiting for this chunk (retrySoon) claims it at its next ask
}

void TcpRecvComm::chunkReceived(const ChunkHeader& header) noexcept {
  // A staged chunk's bytes are the receive's only once its piece is copied up (pumpStaging).
  if ((header.flags & kChunkStaged) != 0) {
    landing_.landed(header);
    return;
  }
  std::string why;
  bool completed = false;
  if (!ring_.addBytes(header, &why, &completed)) control_.recordFailure("protocol error: " + why);
  if (completed && sendDoneFrames_) {
    // The helper that completed the buffer says so at once, whether or not the receiver is testing.
    try {
      sendDone(header.recvId, header.slot);  // the channel orders its writers; the comm's lock is not needed
    } catch (const std::exception& error) {  // out of memory queueing 16 bytes
      control_.recordFailure(std::string("cannot queue a done frame: ") + error.what(), protocol::FailureKind::kLocal);
    }
  }
}

void TcpRecvComm::sendDone(uint32_t recvId, int slot) {
  FrameHeader delivered{static_cast<uint8_t>(FrameType::kDone), static_cast<uint8_t>(slot), 0, recvId, 0};
  control_.send(&delivered, sizeof(delivered));
}

std::string TcpRecvComm::describeReceive(const RecvRequest& request) const {
  std::string buffers;
  const uint8_t staged = request.stagedBuffers.load(std::memory_order_relaxed);
  for (int i = 0; i < request.count(); ++i) {
    const protocol::ReceiveBuffer& buffer = request.buffer(i);
    buffers += " [" + std::to_string(i) + "] tag " + std::to_string(buffer.tag) + ((staged >> i & 1) != 0 ? " GPU" : " host") +
               " " + std::to_string(buffer.ledger.placed()) + " of " +
               std::to_string(buffer.capacity) + " B";
  }
  return textf("receive #%llu:%s", static_cast<unsigned long long>(request.serial), buffers.c_str());
}

std::string TcpRecvComm::stagingState() {
  int waiting = 0;
  for (int s = 0; s < streams_.count(); ++s) waiting += streams_[s].waitingForSlot() ? 1 : 0;
  return textf("%d of %d data streams hold a chunk for a busy staging slot; %zu copies up in flight; landing ring: %s",
               waiting, streams_.count(), copyingUp_.size(), landing_.describe().c_str());
}

void TcpRecvComm::watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) return;  // the data path is here: look next round
  const bool idleExpected = idleReceivesExpected_.load(std::memory_order_relaxed);
  ring_.forEachPosted([&](RecvRequest& request) {
    if (request.complete()) return;  // done, not yet collected by test
    const uint64_t received = request.receivedBytes();
    // A receive kept posted for a sender that has nothing to say yet (GIN's control records) is not stalled.
    if (idleExpected && received == 0) return;
    progress::lookAt(request.watch, received, now, limit,
                     [&] { return "receive #" + std::to_string(request.serial) + " from " + control_.peerName(); },
                     [&] {
      // Not an error: a slow sender looks the same. The report says what the receive waits for.
      RN_WARN("NET/railnet: watchdog: receive #%llu from %s has made no progress for %.1f s (%llu bytes in); it is "
              "not failed; %s; %s", static_cast<unsigned long long>(request.serial), control_.peerName().c_str(),
              request.watch.quietFor(now),
              static_cast<unsigned long long>(received), describeReceive(request).c_str(), stagingState().c_str());
    });
  });
}

void TcpRecvComm::watchPeerHost(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  // Idle comms too, as the send side (TcpSendComm::watchPeerHost): a clear-to-send may wait unacknowledged.
  if (!lock.owns_lock() || peerGone()) return;
  try {
    if (auto lost = streams_.peerHostLost(control_.fd(), now, silenceLimit)) control_.recordFailure(*lost);
  } catch (...) {
    // Out of memory for a vector of descriptors: look again next round.
  }
}

void TcpRecvComm::describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept {
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock()) {
    lines->push_back("TCP receive comm from " + control_.peerName() + ": busy (its lock is held), not described");
    return;
  }
  size_t posted = 0;
  ring_.forEachPosted([&](RecvRequest&) { ++posted; });
  lines->push_back(textf("TCP receive comm from %s: %zu receives posted, %llu so far, %d data streams (%d open), "
                         "control %s; %s", control_.peerName().c_str(), posted,
                         static_cast<unsigned long long>(receives_), streams_.count(),
                         openStreams_.load(std::memory_order_relaxed), peerGone() ? "closed or failed" : "ok",
                         stagingState().c_str()));
  ring_.forEachPosted([&](RecvRequest& request) {
    lines->push_back(textf("  %s%s, last progress %.1f s ago", describeReceive(request).c_str(),
                           request.complete() ? " (complete)" : "", request.watch.quietFor(now)));
  });
}

void TcpRecvComm::pumpStaging() {
  if (!staging_.ready()) return;
  telemetry_.polled(!copyingUp_.empty() || landing_.anyLanded());
  if (!landing_.anyLanded() && copyingUp_.empty()) return;
  std::string why;
  staging::CopyQueue& copies = staging_.copies();
  const auto now = staging::StagingTelemetry::Clock::now();
  if (!copyingUp_.empty()) {
    finishedCopies_.clear();
    if (!copies.poll(&finishedCopies_, &why)) {
      control_.recordFailure("GPU staging: " + why, FailureKind::kLocal);
      return;
    }
    for (size_t i = 0; i < finishedCopies_.size(); ++i) {
      const staging::LandingRing::LandedPiece piece = copyingUp_.front().landed;
      telemetry_.add(staging::StagingTelemetry::kCopy, now - copyingUp_.front().submittedAt);
      telemetry_.countPiece(piece.piece.length);
      copyingUp_.pop_front();
      bool completed = false;
      if (!ring_.addBytes(piece.piece, &why, &completed)) control_.recordFailure("protocol error: " + why);
      if (completed && sendDoneFrames_) sendDone(piece.piece.recvId, piece.piece.slot);
      landing_.release(piece.slot);
    }
    // Streams that found their piece's slot busy read on now.
    if (!finishedCopies_.empty()) {
      for (int s = 0; s < streams_.count(); ++s) streams_[s].resumeReceive();
    }
  }
  landedScratch_.clear();
  landing_.takeLanded(&landedScratch_, staging_.slots() - copies.inFlight());
  for (const staging::LandingRing::LandedPiece& piece : landedScratch_) {
    RecvRequest* entry = ring_.find(piece.piece.recvId, piece.piece.slot);
    const auto device = reinterpret_cast<cuda::CUdeviceptr>(entry->buffer(piece.piece.slot).data + piece.piece.offset);
    if (!copies.submit(staging::CopyQueue::Direction::kHostToDevice, staging_.slot(piece.slot), device,
                       piece.piece.length, static_cast<uint64_t>(piece.slot), &why)) {
      control_.recordFailure("GPU staging: " + why, FailureKind::kLocal);
      return;
    }
    copyingUp_.push_back(CopyingUp{piece, now});
  }
}

void TcpRecvComm::streamRejoined(int stream, Fd socket, uint32_t failure) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!dataFailover_ || stream < 0 || stream >= streams_.count()) return;  // the socket closes
  try {
    uint32_t& recovered = nicRecovered_[static_cast<size_t>(stream % nics_)];
    recovered = std::max(recovered, failure);
    if (streams_.rejoin(stream, std::move(socket))) openStreams_.fetch_add(1, std::memory_order_acq_rel);
    const int nic = stream % nics_;
    if ((failedNics_.fetch_and(~(uint64_t{1} << nic), std::memory_order_acq_rel) >> nic & 1) != 0) {
      RN_INFO(NCCL_NET, "NET/railnet: receive connection from %s: the sender makes the data streams of %s again",
              control_.peerName().c_str(), static_cast<size_t>(nic) < nicNames_.size() ? nicNames_[nic].c_str() : "a NIC");
    }
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: receive connection from %s: taking data stream %d made again failed: %s",
            control_.peerName().c_str(), stream, error.what());
  }
}

void TcpRecvComm::streamFailed(int streamIndex, const char* why, int err, bool endOfStream) noexcept {
  if (dataFailover_) {
    // The sender sends this NIC's chunks again over the others; only every stream and the control connection
    // gone together is the sender's end (peerGone). A chunk cut off mid-way counted nothing.
    openStreams_.fetch_sub(1, std::memory_order_acq_rel);
    const int nic = streamIndex % nics_;
    if ((failedNics_.fetch_or(uint64_t{1} << nic, std::memory_order_acq_rel) >> nic & 1) == 0 && !endOfStream) {
      RN_WARN("NET/railnet: receive connection from %s: a data stream of %s failed (%s); the sender sends its "
              "chunks again over the other NICs", control_.peerName().c_str(),
              static_cast<size_t>(nic) < nicNames_.size() ? nicNames_[nic].c_str() : "a NIC", why);
    }
    return;
  }
  if (endOfStream) {
    openStreams_.fetch_sub(1, std::memory_order_acq_rel);
    return;
  }
  control_.recordFailure("data stream " + std::to_string(streamIndex) + ": " + why,
                         err == 0 || protocol::isRemoteErrno(err) ? FailureKind::kRemote : FailureKind::kLocal);
}

}  // namespace railnet::tcp
