#include "proxy/tcp/stream.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <functional>

#include "base/clock.h"
#include "railnet/error.h"
#include "railnet/settings.h"

namespace railnet::tcp {

namespace {
std::mutex gTotalsMutex;
StreamTelemetry gTotals;  // guarded by gTotalsMutex
}  // namespace

void Stream::foldTelemetry() const {
  std::lock_guard<std::mutex> lock(gTotalsMutex);
  gTotals.chunksSent += telemetry_.chunksSent;
  gTotals.chunksStolen += telemetry_.chunksStolen;
  gTotals.chunksReceived += telemetry_.chunksReceived;
  gTotals.sendCalls += telemetry_.sendCalls;
  gTotals.sendWouldBlock += telemetry_.sendWouldBlock;
  gTotals.recvCalls += telemetry_.recvCalls;
  gTotals.recvWouldBlock += telemetry_.recvWouldBlock;
}

std::string streamTelemetryLine() {
  StreamTelemetry t;
  {
    std::lock_guard<std::mutex> lock(gTotalsMutex);
    t = gTotals;
  }
  auto per = [](uint64_t calls, uint64_t chunks) { return chunks > 0 ? static_cast<double>(calls) / chunks : 0.0; };
  auto n = [](uint64_t value) { return static_cast<unsigned long long>(value); };
  char line[512];
  snprintf(line, sizeof(line),
           "%llu chunks sent (%llu taken from a slower sibling stream) with %llu sendmsg (%.2f per chunk) and %llu "
           "full-socket EAGAINs (%.2f per chunk); "
           "%llu received with %llu recv (%.2f per chunk) and %llu empty-socket EAGAINs (%.2f per chunk)",
           n(t.chunksSent), n(t.chunksStolen), n(t.sendCalls), per(t.sendCalls, t.chunksSent), n(t.sendWouldBlock),
           per(t.sendWouldBlock, t.chunksSent), n(t.chunksReceived), n(t.recvCalls),
           per(t.recvCalls, t.chunksReceived), n(t.recvWouldBlock), per(t.recvWouldBlock, t.chunksReceived));
  return line;
}

using protocol::kEndOfStream;
using protocol::readVector;
using protocol::writeVector;

namespace {
// Both ends of one TCP connection see the same two addresses, swapped: hashing them in a fixed order gives both
// the same key. 0 when the socket has no peer.
uint64_t connectionKeyOf(int fd) {
  sockaddr_storage local{};
  sockaddr_storage peer{};
  socklen_t localLength = sizeof(local);
  socklen_t peerLength = sizeof(peer);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &localLength) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peerLength) != 0) {
    return 0;
  }
  std::string a(reinterpret_cast<const char*>(&local), localLength);
  std::string b(reinterpret_cast<const char*>(&peer), peerLength);
  if (b < a) a.swap(b);
  return std::hash<std::string>{}(a + b) | 1;
}
}  // namespace

Stream::Stream(Fd fd, StreamOwner* owner, int index, NicCounters* counters, shaping::EgressShaping shaping)
    : fd_(std::move(fd)),
      owner_(owner),
      index_(index),
      counters_(counters),
      shaping_(std::move(shaping)),
      connectionKey_(connectionKeyOf(fd_.get())),
      passBytes_(settings().tcpPassBytes > 0 ? static_cast<uint64_t>(settings().tcpPassBytes) : UINT64_MAX) {}

bool Stream::enqueue(const SendOp& op) {
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    if (releaseOnFailure_ && dead_.load(std::memory_order_relaxed)) return false;
    queue_.push_back(op);
  }
  queuedBytes_.fetch_add(op.header.length, std::memory_order_relaxed);
  wake();
  return true;
}

void Stream::cut() { (void)shutdown(fd_.get(), SHUT_RDWR); }

void Stream::restart(Fd fd) {
  if (!dead()) abandonIncoming();
  fd_ = std::move(fd);
  connectionKey_ = connectionKeyOf(fd_.get());
  {
    std::lock_guard<std::mutex> lock(queueMutex_);
    queue_.clear();
  }
  queuedBytes_.store(0, std::memory_order_relaxed);
  sending_.clear();
  sentOfFront_ = 0;
  incoming_ = {};
  headerBytes_ = 0;
  destination_ = nullptr;
  payloadLeft_ = 0;
  inPayload_ = false;
  awaitingDestination_ = false;
  waitingForSlot_.store(false, std::memory_order_relaxed);
  discarding_ = false;
  readable_ = true;
  writable_ = true;
  peerClosed_ = false;
  shapedUntilNs_ = 0;
  shapedWait_ = false;
}

void Stream::abandonIncoming() {
  // Resolved to a real destination and not finished: its claim (rail failover) ends here.
  if (inPayload_ && !discarding_ && !awaitingDestination_ && destination_ != nullptr) owner_->chunkAbandoned(incoming_);
  inPayload_ = false;
}

void Stream::fail(const char* why, int err, bool endOfStream) {
  if (dead_.exchange(true)) return;
  abandonIncoming();
  if (releaseOnFailure_) {
    // Helper thread: sending_ is this helper's; the queue is taken under its lock, after which enqueue() refuses.
    std::deque<SendOp> unsent;
    {
      std::lock_guard<std::mutex> lock(queueMutex_);
      unsent.swap(queue_);
    }
    for (std::deque<SendOp>* ops : {&sending_, &unsent}) {
      for (const SendOp& op : *ops) {
        if (op.slotPending != nullptr) op.slotPending->fetch_sub(1, std::memory_order_release);
        op.pending->fetch_sub(1, std::memory_order_release);
      }
      ops->clear();
    }
    sentOfFront_ = 0;
    queuedBytes_.store(0, std::memory_order_relaxed);
  }
  owner_->streamFailed(index_, why, err, endOfStream);
}

void Stream::failWith(const char* why, int err) noexcept { fail(why, err, false); }

void Stream::markReady(bool readable, bool writable, bool peerClosed) noexcept {
  if (readable) readable_ = true;
  if (writable) writable_ = true;
  if (peerClosed) peerClosed_ = true;
}

uint64_t Stream::progress() noexcept {
  if (dead_.load(std::memory_order_relaxed)) return 0;
  uint64_t moved = progressReceive();
  if (!dead_.load(std::memory_order_relaxed)) moved += progressSend();
  return moved;
}

bool Stream::refill(uint64_t budget) {
  {
    // Only what this pass can write leaves the shared queue: the rest stays where an idle sibling can take it.
    std::lock_guard<std::mutex> lock(queueMutex_);
    uint64_t taken = 0;
    while (!queue_.empty() && taken < budget && sending_.size() < kMaxGather) {
      taken += queue_.front().header.length;
      sending_.push_back(queue_.front());
      queue_.pop_front();
    }
  }
  if (!sending_.empty()) return true;
  SendOp stolen{};
  if (!owner_->stealChunk(index_, &stolen)) return false;
  queuedBytes_.fetch_add(stolen.header.length, std::memory_order_relaxed);
  sending_.push_back(stolen);
  ++telemetry_.chunksStolen;
  return true;
}

bool Stream::giveQueuedChunk(SendOp* out) {
  std::lock_guard<std::mutex> lock(queueMutex_);
  // The next chunk stays: its own helper is about to write it. Only a backlog behind it is worth moving.
  if (queue_.size() < 2) return false;
  // A staged chunk (GPU memory at the receiver) stays on its stream: another stream may already carry later
  // pieces that wait for this one's slot at the receiver, and this chunk would queue behind them there
  // (proxy/staging/landing_ring.h).
  if ((queue_.front().header.flags & protocol::kChunkStaged) != 0) return false;
  *out = queue_.front();  // the oldest: the message every later one waits behind
  queue_.pop_front();
  queuedBytes_.fetch_sub(out->header.length, std::memory_order_relaxed);
  return true;
}

int64_t Stream::retryAtNs() const noexcept {
  if (awaitingDestination_ && retryingSoon_) return monotonicNs() + 100'000;
  return shapedWait_ ? shapedUntilNs_ : 0;
}

uint64_t Stream::progressSend() {
  uint64_t moved = 0;
  shapedWait_ = false;
  while (writable_ && moved < passBytes_) {
    if (sending_.empty() && !refill(passBytes_ - moved)) break;
    // Gather the head of the queue into one sendmsg: fewer syscalls for runs of chunks.
    constexpr int kMaxIov = 2 * kMaxGather;
    iovec iov[kMaxIov];
    int count = 0;
    uint64_t done = sentOfFront_;  // only the front op can be partly written
    uint64_t budget = passBytes_ - moved;
    uint64_t granted = 0;
    if (shaping_.active()) {
      // Fabric emulation: write only what the NIC's (and across rails the spine's) bucket grants now.
      const int64_t now = monotonicNs();
      int64_t wait = 0;
      if (now < shapedUntilNs_ || (granted = shaping_.take(budget, now, &wait)) == 0) {
        if (now >= shapedUntilNs_) shapedUntilNs_ = now + wait;
        shapedWait_ = true;
        break;
      }
      budget = granted;
    }
    for (const SendOp& op : sending_) {
      if (count + 2 > kMaxIov || budget == 0) break;
      auto* header = reinterpret_cast<char*>(const_cast<ChunkHeader*>(&op.header));
      if (done < sizeof(ChunkHeader)) {
        // Headers ride outside the budget: a chunk of exactly the pass size leaves in one sendmsg, not two.
        iov[count++] = {header + done, sizeof(ChunkHeader) - done};
        done = 0;
      } else {
        done -= sizeof(ChunkHeader);
      }
      if (op.header.length > done && budget > 0) {
        const uint64_t bytes = std::min(op.header.length - done, budget);
        iov[count++] = {const_cast<char*>(op.data) + done, bytes};
        budget -= bytes;
      }
      done = 0;
    }
    ssize_t sent = writeVector(fd_.get(), iov, count);
    ++(sent == 0 ? telemetry_.sendWouldBlock : telemetry_.sendCalls);
    // Chunk headers are charged too (they ride outside the pass budget): at most a few dozen bytes over.
    if (granted > 0 && sent >= 0 && static_cast<uint64_t>(sent) < granted) shaping_.refund(granted - static_cast<uint64_t>(sent));
    if (sent == 0) {
      writable_ = false;
      break;
    }
    if (sent < 0) {
      fail(errnoText(static_cast<int>(-sent)).c_str(), static_cast<int>(-sent), false);
      return moved;
    }
    moved += static_cast<uint64_t>(sent);
    for (uint64_t left = static_cast<uint64_t>(sent); left > 0;) {
      SendOp& front = sending_.front();
      uint64_t total = sizeof(ChunkHeader) + front.header.length;
      uint64_t take = std::min(left, total - sentOfFront_);
      if (front.sentBytes != nullptr) {
        // Payload bytes as they leave, a 128 MiB chunk included: the watchdog's measure of progress.
        constexpr uint64_t kHeader = sizeof(ChunkHeader);
        const uint64_t payloadBefore = sentOfFront_ > kHeader ? sentOfFront_ - kHeader : 0;
        const uint64_t payloadAfter = sentOfFront_ + take > kHeader ? sentOfFront_ + take - kHeader : 0;
        if (payloadAfter != payloadBefore) {
          front.sentBytes->fetch_add(payloadAfter - payloadBefore, std::memory_order_relaxed);
        }
      }
      sentOfFront_ += take;
      left -= take;
      if (sentOfFront_ < total) break;
      queuedBytes_.fetch_sub(front.header.length, std::memory_order_relaxed);
      if (counters_ != nullptr) counters_->addSent(front.header.length);
      if (front.slotPending != nullptr) front.slotPending->fetch_sub(1, std::memory_order_release);
      front.pending->fetch_sub(1, std::memory_order_release);
      ++telemetry_.chunksSent;
      sending_.pop_front();
      sentOfFront_ = 0;
    }
  }
  return moved;
}

char* StreamOwner::retryLater() noexcept {
  static char marker;
  return &marker;
}

char* StreamOwner::discard() noexcept {
  static char marker;
  return &marker;
}

char* StreamOwner::retrySoon() noexcept {
  static char marker;
  return &marker;
}

bool Stream::startChunk() {
  memcpy(&incoming_, nextHeader_, sizeof(ChunkHeader));
  headerBytes_ = 0;
  return resolveIncoming();
}

bool Stream::resolveIncoming() {
  destination_ = owner_->resolveChunk(incoming_);
  retryingSoon_ = destination_ == StreamOwner::retrySoon();
  awaitingDestination_ = destination_ == StreamOwner::retryLater() || retryingSoon_;
  waitingForSlot_.store(awaitingDestination_, std::memory_order_relaxed);
  if (awaitingDestination_) return true;
  if (destination_ == nullptr) {
    fail("received a chunk that matches no posted receive", 0, false);
    return false;
  }
  discarding_ = destination_ == StreamOwner::discard();
  if (discarding_ && !discardBuffer_) discardBuffer_.reset(new char[kDiscardBytes]);
  payloadLeft_ = incoming_.length;
  inPayload_ = payloadLeft_ > 0;
  if (counters_ != nullptr && !discarding_) counters_->addReceived(incoming_.length);
  if (!inPayload_) finishChunk();
  return true;
}

void Stream::finishChunk() {
  inPayload_ = false;
  if (discarding_) {
    discarding_ = false;
    return;
  }
  ++telemetry_.chunksReceived;
  owner_->chunkReceived(incoming_);
}

uint64_t Stream::progressReceive() {
  uint64_t moved = 0;
  if (awaitingDestination_ && !resolveIncoming()) return 0;
  while (readable_ && moved < passBytes_ && !awaitingDestination_) {
    // The next chunk's header rides along with this payload's tail: one recvmsg per chunk, not two.
    iovec iov[2];
    int count = 0;
    uint64_t wanted = 0;
    if (discarding_ && inPayload_ && payloadLeft_ > kDiscardBytes) {
      // A dropped payload larger than the scratch buffer: no header may follow it in this read.
      iov[count++] = {discardBuffer_.get(), kDiscardBytes};
      wanted = kDiscardBytes;
    } else {
      if (inPayload_) {
        char* into = discarding_ ? discardBuffer_.get() : destination_ + (incoming_.length - payloadLeft_);
        iov[count++] = {into, payloadLeft_};
      }
      iov[count++] = {nextHeader_ + headerBytes_, sizeof(ChunkHeader) - headerBytes_};
      wanted = (inPayload_ ? payloadLeft_ : 0) + sizeof(ChunkHeader) - headerBytes_;
    }
    const ssize_t got = readVector(fd_.get(), iov, count);
    ++(got == 0 ? telemetry_.recvWouldBlock : telemetry_.recvCalls);
    if (got == 0) {
      readable_ = false;
      break;
    }
    if (got == kEndOfStream) {
      const bool clean = !inPayload_ && headerBytes_ == 0;
      fail(clean ? "peer closed the stream" : "peer closed the stream in the middle of a chunk", 0, clean);
      return moved;
    }
    if (got < 0) {
      fail(errnoText(static_cast<int>(-got)).c_str(), static_cast<int>(-got), false);
      return moved;
    }
    moved += static_cast<uint64_t>(got);
    uint64_t left = static_cast<uint64_t>(got);
    if (inPayload_) {
      const uint64_t payload = std::min(left, payloadLeft_);
      payloadLeft_ -= payload;
      left -= payload;
      if (payloadLeft_ == 0) finishChunk();
    }
    headerBytes_ += left;
    if (headerBytes_ == sizeof(ChunkHeader) && !startChunk()) return moved;
    // A short read emptied the socket: whatever arrives next raises a new edge-triggered event, so the EAGAIN
    // read that would confirm it is saved. Not once the peer has closed: a FIN already queued behind the last
    // bytes is consumed by the read that returns them short, and the end of stream the next read reports raises
    // no new edge, so a stream that stopped here would never report it (a killed sender went unnoticed).
    if (static_cast<uint64_t>(got) < wanted && !peerClosed_) {
      readable_ = false;
      break;
    }
  }
  return moved;
}

}  // namespace railnet::tcp
