#include "proxy/tcp/send_comm.h"

#include <algorithm>
#include <cstring>

#include "proxy/protocol/stripe_plan.h"
#include "proxy/tcp/host_region.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::tcp {

using protocol::ClearToSendQueue;
using protocol::FrameHeader;
using protocol::FrameType;
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
}  // namespace

TcpSendComm::TcpSendComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer, NicLayout layout)
    : control_(std::move(control), peer, "send"),
      streams_(std::move(data)),
      requests_(kSendRequests, [this](SendRequest& request) { request.setOwner(this); }) {
  const Settings& config = settings();
  inlineBytes_ = static_cast<uint64_t>(config.tcpInlineBytes);      // >= 0 (settings table)
  minChunkBytes_ = static_cast<uint64_t>(config.tcpMinChunkBytes);  // >= 4096 (settings table)
  if (!layout.nics.empty()) control_.setCounters(layout.nics[0]);
  streams_.setCounters(layout);
  nics_ = std::clamp(static_cast<int>(layout.nics.size()), 1, std::max(1, streams_.count()));
  nics_ = std::min(nics_, kMaxStripeNics);
  minStripeBytes_ = layout.minStripeBytes;
  streams_.start(this);  // last: helper threads may call stealChunk at once
}

TcpSendComm::~TcpSendComm() { streams_.stop(); }

MemoryRegistrar& TcpSendComm::registrar() noexcept { return hostRegistrar(); }

void TcpSendComm::pumpControl() {
  if (!control_.flush()) return;
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
  long used = posted_.parse(control_.data(), control_.size(), &why);
  if (used < 0) {
    control_.recordFailure(why);
    return false;
  }
  control_.consume(static_cast<size_t>(used));
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

ncclResult_t TcpSendComm::isend(void* data, size_t size, int tag, MemoryRegion*, Request** request) noexcept {
  *request = nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (control_.failed() || !control_.flush()) return control_.reportFailure();
  std::optional<ClearToSendQueue::Destination> found = posted_.claim(tag);
  if (!found) {
    // Only read the socket when what we already hold does not match: one recv() at most per call.
    pumpControl();
    if (control_.failed()) return control_.reportFailure();
    found = posted_.claim(tag);
  }
  if (!found) {
    warnIfStalled(tag);
    return ncclSuccess;
  }
  stalledSince_ = {};
  stallWarned_ = false;
  const uint32_t recvId = found->recvId;
  const int slot = found->slot;
  const uint64_t capacity = found->capacity;

  if (size > capacity) {
    // Tell the receiver too, so both sides fail this message and nothing waits for it.
    FrameHeader oversize{static_cast<uint8_t>(FrameType::kOversize), static_cast<uint8_t>(slot), 0, recvId, size};
    control_.send(&oversize, sizeof(oversize));
    RN_WARN("NET/railnet: send of %zu bytes (tag %d) to %s is larger than the posted receive buffer of %lu bytes", size,
            tag, control_.peerName().c_str(), static_cast<unsigned long>(capacity));
    return ncclInvalidUsage;
  }
  SendRequest* sendRequest = requests_.acquire();
  if (sendRequest == nullptr) {
    RN_WARN("NET/railnet: more than %zu sends in flight to %s", kSendRequests, control_.peerName().c_str());
    return ncclInternalError;
  }
  sendRequest->size_ = size;

  if (size <= inlineBytes_) {
    // Inline: the bytes are copied into the control queue, so the send is complete at once.
    FrameHeader header{static_cast<uint8_t>(FrameType::kInline), static_cast<uint8_t>(slot), 0, recvId, size};
    control_.send(&header, sizeof(header), data, size);
    if (NicCounters* counters = control_.counters()) counters->addSent(size);
    sendRequest->pendingChunks_.store(0, std::memory_order_relaxed);
  } else if (nics_ > 1) {
    sendStriped(sendRequest, static_cast<const char*>(data), size, recvId, slot);
  } else {
    sendStreamed(sendRequest, static_cast<const char*>(data), size, recvId, slot);
  }
  *request = sendRequest;
  return ncclSuccess;
}

void TcpSendComm::sendStreamed(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot) {
  int streams = streams_.count();
  uint64_t chunk = protocol::chunkSizeFor(size, std::min(streams, streams_.helpersServing()), minChunkBytes_);
  int chunks = static_cast<int>((size + chunk - 1) / chunk);
  request->pendingChunks_.store(chunks, std::memory_order_relaxed);
  for (int i = 0; i < chunks; ++i) {
    uint64_t offset = static_cast<uint64_t>(i) * chunk;
    // Least-queued stream first, starting from a rotating point: a slow stream gets less new work.
    int best = static_cast<int>(nextStream_++ % static_cast<uint32_t>(streams));
    for (int k = 1; k < streams; ++k) {
      int candidate = (best + k) % streams;
      if (streams_[candidate].queuedBytes() < streams_[best].queuedBytes()) best = candidate;
    }
    SendOp op{};
    op.header.recvId = recvId;
    op.header.slot = static_cast<uint8_t>(slot);
    op.header.messageSize = size;
    op.header.offset = offset;
    op.header.length = std::min(chunk, size - offset);
    op.data = data + offset;
    op.pending = &request->pendingChunks_;
    streams_[best].enqueue(op);
  }
}

void TcpSendComm::sendStriped(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot) {
  Stripe stripes[kMaxStripeNics];
  const int count = protocol::planStripes(size, nics_, stripedMessages_++, minStripeBytes_, stripes);
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
  for (int i = 0; i < count; ++i) {
    enqueueChunks(request, data, size, stripes[i].offset, stripes[i].bytes, chunkOf[i], stripes[i].nic, nics_,
                  recvId, slot);
  }
}

void TcpSendComm::enqueueChunks(SendRequest* request, const char* data, uint64_t size, uint64_t offset,
                                uint64_t bytes, uint64_t chunk, int first, int step, uint32_t recvId, int slot) {
  const int streams = streams_.count();
  const int candidates = (streams - first + step - 1) / step;
  for (uint64_t done = 0; done < bytes; done += chunk) {
    // Least-queued stream of the set first, starting from a rotating point: a slow stream gets less new work.
    int best = first + static_cast<int>(nextStream_++ % static_cast<uint32_t>(candidates)) * step;
    for (int k = 0; k < candidates; ++k) {
      const int candidate = first + k * step;
      if (streams_[candidate].queuedBytes() < streams_[best].queuedBytes()) best = candidate;
    }
    SendOp op{};
    op.header.recvId = recvId;
    op.header.slot = static_cast<uint8_t>(slot);
    op.header.messageSize = size;
    op.header.offset = offset + done;
    op.header.length = std::min(chunk, bytes - done);
    op.data = data + offset + done;
    op.pending = &request->pendingChunks_;
    streams_[best].enqueue(op);
  }
}

ncclResult_t TcpSendComm::testRequest(SendRequest* request, int* done, int* sizes) noexcept {
  *done = 0;
  if (request->pendingChunks_.load(std::memory_order_acquire) == 0) {
    *done = 1;
    if (sizes != nullptr) *sizes = static_cast<int>(request->size_);
    std::lock_guard<std::mutex> lock(mutex_);
    requests_.release(request);
    return ncclSuccess;
  }
  // No socket reads here: chunks are written by helper threads, which notice a vanished receiver, and
  // clear-to-sends are read when isend needs one. Polling stays a pair of atomic loads.
  return control_.failed() ? control_.reportFailure() : ncclSuccess;
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
  // The receiver never writes on data streams: end-of-stream or an error both mean it is gone.
  control_.recordFailure("data stream " + std::to_string(streamIndex) + ": " + why,
                         err == 0 || protocol::isRemoteErrno(err) ? protocol::FailureKind::kRemote
                                                                  : protocol::FailureKind::kLocal);
}

}  // namespace railnet::tcp
