#include "proxy/tcp/send_comm.h"

#include <algorithm>
#include <cstring>

#include "proxy/stripe_plan.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::tcp {
namespace {
// NCCL keeps 32 receives in flight, each of up to 8 buffers: 256 sends; twice that leaves headroom.
constexpr size_t kSendRequests = 2 * NCCL_NET_MAX_REQUESTS * kMaxRecvs;
constexpr auto kStallWarning = std::chrono::seconds(10);
}  // namespace

ncclResult_t SendRequest::test(int* done, int* sizes) noexcept { return comm_->testRequest(this, done, sizes); }

TcpSendComm::TcpSendComm(Fd control, std::vector<Fd> data, const SocketAddress& peer, LaneLayout layout)
    : link_(std::move(control), std::move(data), peer, "send"),
      requests_(kSendRequests, [this](SendRequest& request) { request.comm_ = this; }) {
  const Settings& config = settings();
  inlineBytes_ = static_cast<uint64_t>(config.tcpInlineBytes);      // >= 0 (settings table)
  minChunkBytes_ = static_cast<uint64_t>(config.tcpMinChunkBytes);  // >= 4096 (settings table)
  link_.setCounters(layout);
  link_.start(this);
  lanes_ = std::clamp(static_cast<int>(layout.lanes.size()), 1, std::max(1, link_.streamCount()));
  lanes_ = std::min(lanes_, kMaxStripeLanes);
  minStripeBytes_ = layout.minStripeBytes;
}

TcpSendComm::~TcpSendComm() { link_.stop(); }

std::unique_ptr<MemoryRegion> TcpSendComm::regMr(void* data, size_t size, int type) {
  return registerHostMemory(data, size, type);
}

std::unique_ptr<MemoryRegion> TcpSendComm::regMrDmaBuf(void*, size_t, int, uint64_t, int) {
  return registerHostMemory(nullptr, 0, NCCL_PTR_DMABUF);
}

void TcpSendComm::pumpControl() {
  if (!link_.flushControl()) return;
  for (;;) {
    ssize_t got = link_.readControl();
    if (got == kEndOfStream) {
      link_.recordFailure("the receiver closed the connection");
      return;
    }
    if (got < 0) {
      link_.recordFailure("control connection: " + errnoText(static_cast<int>(-got)));
      return;
    }
    if (!parseClearToSends() || got == 0 || !link_.controlMayHaveMore()) return;
  }
}

bool TcpSendComm::parseClearToSends() {
  std::string why;
  long used = posted_.parse(link_.controlData(), link_.controlSize(), &why);
  if (used < 0) {
    link_.recordFailure(why);
    return false;
  }
  link_.consumeControl(static_cast<size_t>(used));
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
          link_.peerName().c_str(), static_cast<long>(kStallWarning.count()), posted_.openTags().c_str());
  stallWarned_ = true;
}

ncclResult_t TcpSendComm::isend(void* data, size_t size, int tag, MemoryRegion*, Request** request) noexcept {
  *request = nullptr;
  std::lock_guard<std::mutex> lock(mutex_);
  if (link_.failed() || !link_.flushControl()) return link_.reportFailure();
  std::optional<ClearToSendQueue::Destination> found = posted_.claim(tag);
  if (!found) {
    // Only read the socket when what we already hold does not match: one recv() at most per call.
    pumpControl();
    if (link_.failed()) return link_.reportFailure();
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
    link_.sendControl(&oversize, sizeof(oversize));
    RN_WARN("NET/railnet: send of %zu bytes (tag %d) to %s is larger than the posted receive buffer of %lu bytes", size,
            tag, link_.peerName().c_str(), static_cast<unsigned long>(capacity));
    return ncclInvalidUsage;
  }
  SendRequest* sendRequest = requests_.acquire();
  if (sendRequest == nullptr) {
    RN_WARN("NET/railnet: more than %zu sends in flight to %s", kSendRequests, link_.peerName().c_str());
    return ncclInternalError;
  }
  sendRequest->size_ = size;

  if (size <= inlineBytes_) {
    // Inline: the bytes are copied into the control queue, so the send is complete at once.
    FrameHeader header{static_cast<uint8_t>(FrameType::kInline), static_cast<uint8_t>(slot), 0, recvId, size};
    link_.sendControl(&header, sizeof(header), data, size);
    if (NicCounters* counters = link_.controlCounters()) counters->addSent(size);
    sendRequest->pendingChunks_.store(0, std::memory_order_relaxed);
  } else if (lanes_ > 1) {
    sendStriped(sendRequest, static_cast<const char*>(data), size, recvId, slot);
  } else {
    sendStreamed(sendRequest, static_cast<const char*>(data), size, recvId, slot);
  }
  *request = sendRequest;
  return ncclSuccess;
}

void TcpSendComm::sendStreamed(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot) {
  int streams = link_.streamCount();
  uint64_t chunk = chunkSizeFor(size, streams, minChunkBytes_);
  int chunks = static_cast<int>((size + chunk - 1) / chunk);
  request->pendingChunks_.store(chunks, std::memory_order_relaxed);
  for (int i = 0; i < chunks; ++i) {
    uint64_t offset = static_cast<uint64_t>(i) * chunk;
    // Least-queued stream first, starting from a rotating point: a slow stream gets less new work.
    int best = static_cast<int>(nextStream_++ % static_cast<uint32_t>(streams));
    for (int k = 1; k < streams; ++k) {
      int candidate = (best + k) % streams;
      if (link_.stream(candidate).queuedBytes() < link_.stream(best).queuedBytes()) best = candidate;
    }
    SendOp op{};
    op.header.recvId = recvId;
    op.header.slot = static_cast<uint8_t>(slot);
    op.header.messageSize = size;
    op.header.offset = offset;
    op.header.length = std::min(chunk, size - offset);
    op.data = data + offset;
    op.pending = &request->pendingChunks_;
    link_.stream(best).enqueue(op);
  }
}

void TcpSendComm::sendStriped(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot) {
  Stripe stripes[kMaxStripeLanes];
  const int count = planStripes(size, lanes_, stripedMessages_++, minStripeBytes_, stripes);
  const int streams = link_.streamCount();
  uint64_t chunkOf[kMaxStripeLanes];
  int total = 0;
  for (int i = 0; i < count; ++i) {
    // Streams of lane l: l, l + lanes_, l + 2 lanes_, ...
    const int laneStreams = (streams - stripes[i].lane + lanes_ - 1) / lanes_;
    chunkOf[i] = chunkSizeFor(stripes[i].bytes, laneStreams, minChunkBytes_);
    total += static_cast<int>((stripes[i].bytes + chunkOf[i] - 1) / chunkOf[i]);
  }
  // Every chunk is counted before the first is queued: a worker may finish one at once.
  request->pendingChunks_.store(total, std::memory_order_relaxed);
  for (int i = 0; i < count; ++i) {
    enqueueChunks(request, data, size, stripes[i].offset, stripes[i].bytes, chunkOf[i], stripes[i].lane, lanes_,
                  recvId, slot);
  }
}

void TcpSendComm::enqueueChunks(SendRequest* request, const char* data, uint64_t size, uint64_t offset,
                                uint64_t bytes, uint64_t chunk, int first, int step, uint32_t recvId, int slot) {
  const int streams = link_.streamCount();
  const int candidates = (streams - first + step - 1) / step;
  for (uint64_t done = 0; done < bytes; done += chunk) {
    // Least-queued stream of the set first, starting from a rotating point: a slow stream gets less new work.
    int best = first + static_cast<int>(nextStream_++ % static_cast<uint32_t>(candidates)) * step;
    for (int k = 0; k < candidates; ++k) {
      const int candidate = first + k * step;
      if (link_.stream(candidate).queuedBytes() < link_.stream(best).queuedBytes()) best = candidate;
    }
    SendOp op{};
    op.header.recvId = recvId;
    op.header.slot = static_cast<uint8_t>(slot);
    op.header.messageSize = size;
    op.header.offset = offset + done;
    op.header.length = std::min(chunk, bytes - done);
    op.data = data + offset + done;
    op.pending = &request->pendingChunks_;
    link_.stream(best).enqueue(op);
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
  return link_.failed() ? link_.reportFailure() : ncclSuccess;
}

char* TcpSendComm::resolveChunk(const ChunkHeader&) noexcept { return nullptr; }

void TcpSendComm::chunkReceived(const ChunkHeader&) noexcept {}

void TcpSendComm::streamFailed(int streamIndex, const char* why, bool) noexcept {
  // The receiver never writes on data streams: end-of-stream or an error both mean it is gone.
  link_.recordFailure("data stream " + std::to_string(streamIndex) + ": " + why);
}

}  // namespace railnet::tcp
