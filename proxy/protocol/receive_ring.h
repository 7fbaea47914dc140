// The receive side of the protocol, one for both transports: the ring of posted receives (irecv) that chunks,
// notices, inline frames and oversize frames are matched against by receive id, and how a receive completes.
//
// Receives are numbered per connection (recvId); entry recvId % kEntries serves receive recvId. NCCL keeps at
// most 32 receives in flight, so 64 entries never run out in practice (irecv answers "not yet" if they do).
// Threads: post/finish run under the comm's lock; find/destination/addBytes may run on helper threads (TCP), so
// an entry is published with a release store of its recvId after its buffers are set, and bytes and pending
// counts are atomics.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "proxy/protocol/chunk_ledger.h"
#include "proxy/protocol/wire.h"
#include "railnet/log.h"
#include "railnet/nccl/common.h"

namespace railnet::protocol {

// One buffer of a grouped receive.
struct ReceiveBuffer {
  char* data = nullptr;
  uint64_t capacity = 0;
  int tag = 0;
  ChunkLedger ledger;              // the bytes placed so far, each counted once
  std::atomic<uint64_t> size{0};  // the message's size once complete
};

// A posted receive: what an entry of the ring holds. Transports derive their receive request from it.
class PostedReceive {
 public:
  int count() const { return count_; }
  uint32_t postedId() const { return postedId_.load(std::memory_order_relaxed); }  // the receive it serves
  ReceiveBuffer& buffer(int index) { return buffers_[index]; }
  const ReceiveBuffer& buffer(int index) const { return buffers_[index]; }
  bool complete() const { return pendingBuffers_.load(std::memory_order_acquire) == 0; }
  // Bytes in so far, over every buffer (the watchdog's measure of progress).
  uint64_t receivedBytes() const {
    uint64_t total = 0;
    for (int i = 0; i < count_; ++i) total += buffers_[i].ledger.placed();
    return total;
  }

 private:
  template <class Entry>
  friend class ReceiveRing;
  std::atomic<uint32_t> postedId_{UINT32_MAX};  // the receive this entry serves; UINT32_MAX when free
  int count_ = 0;
  ReceiveBuffer buffers_[kMaxRecvs];
  std::atomic<int> pendingBuffers_{0};
  std::atomic<bool> oversize_{false};
  bool inUse_ = false;  // guarded by the comm's lock
};

// irecv's argument check, shared by both transports: 1..kMaxRecvs buffers. Logs why not.
inline bool validReceiveCount(int n, const std::string& peer) {
  if (n >= 1 && n <= kMaxRecvs) return true;
  RN_WARN("NET/railnet: irecv of %d buffers from %s; railnet takes 1 to %d", n, peer.c_str(), kMaxRecvs);
  return false;
}

template <class Entry>
class ReceiveRing {
 public:
  static constexpr uint32_t kEntries = 2 * NCCL_NET_MAX_REQUESTS;

  // Runs once per entry, e.g. to point it at its comm.
  template <class Prepare>
  void prepare(Prepare&& prepareEntry) {
    for (Entry& entry : entries_) prepareEntry(entry);
  }

  // irecv, under the comm's lock: the receive id the next post() takes, and whether its entry is free.
  uint32_t nextId() const { return nextId_; }
  bool full() const { return entries_[nextId_ % kEntries].inUse_; }

  // Grouped receives (n > 1) posted so far and their buffers: what NCCL asked of multireceive (logged at close).
  uint64_t groupedPosts() const { return groupedPosts_; }
  uint64_t groupedMembers() const { return groupedMembers_; }

  // Under the comm's lock: fn(Entry&) for each posted receive not yet finished (the watchdog's look, a dump).
  template <class Fn>
  void forEachPosted(Fn&& fn) {
    for (Entry& entry : entries_) {
      if (entry.inUse_) fn(entry);
    }
  }

  // irecv, under the comm's lock: fills the next entry and publishes it (release), so a helper thread may
  // place the first chunk right after; nullptr when every entry is in flight (answer "not yet").
  Entry* post(int n, void* const* data, const size_t* sizes, const int* tags) {
    Entry& entry = entries_[nextId_ % kEntries];
    if (entry.inUse_) return nullptr;
    if (n > 1) {
      ++groupedPosts_;
      groupedMembers_ += static_cast<uint64_t>(n);
    }
    entry.count_ = n;
    for (int i = 0; i < n; ++i) {
      ReceiveBuffer& buffer = entry.buffers_[i];
      buffer.data = static_cast<char*>(data[i]);
      buffer.capacity = sizes[i];
      buffer.tag = tags != nullptr ? tags[i] : 0;
      buffer.ledger.reset();
      buffer.size.store(0, std::memory_order_relaxed);
    }
    entry.oversize_.store(false, std::memory_order_relaxed);
    entry.pendingBuffers_.store(n, std::memory_order_relaxed);
    entry.inUse_ = true;
    entry.postedId_.store(nextId_, std::memory_order_release);
    ++nextId_;
    return &entry;
  }

  // Undoes the last post() when its clear-to-send could not be sent. Under the comm's lock.
  void unpost(Entry& entry) {
    entry.postedId_.store(UINT32_MAX, std::memory_order_relaxed);
    entry.inUse_ = false;
    --nextId_;
  }

  // The clear-to-send frame header and the entries' tag and capacity for a posted receive (address and rkeys
  // are the transport's to add).
  static FrameHeader clearToSend(const Entry& entry, uint32_t recvId, uint16_t extraKeys, ClearToSendEntry* out) {
    for (int i = 0; i < entry.count_; ++i) {
      out[i] = ClearToSendEntry{};
      out[i].tag = entry.buffers_[i].tag;
      out[i].capacity = entry.buffers_[i].capacity;
    }
    return FrameHeader{static_cast<uint8_t>(FrameType::kClearToSend), static_cast<uint8_t>(entry.count_), extraKeys,
                       recvId, 0};
  }

  // Any thread: the posted receive `recvId` when it has buffer `index`, else nullptr (acquire).
  Entry* find(uint32_t recvId, int index) {
    Entry& entry = entries_[recvId % kEntries];
    if (entry.postedId_.load(std::memory_order_acquire) != recvId || index < 0 || index >= entry.count_) return nullptr;
    return &entry;
  }

  // Any thread: where a chunk's payload goes, or nullptr when the chunk names no posted buffer or does not fit.
  char* destination(const ChunkHeader& header) {
    Entry* entry = find(header.recvId, header.slot);
    if (entry == nullptr) return nullptr;
    const ReceiveBuffer& buffer = entry->buffers_[header.slot];
    if (header.messageSize > buffer.capacity || header.offset > header.messageSize ||
        header.length > header.messageSize - header.offset) {
      return nullptr;
    }
    return buffer.data + header.offset;
  }

  // Any thread, rail failover (ChunkLedger::claim): the chunk's range claimed before its payload is written; kPlaced
  // too when the chunk names no posted buffer (a copy of a chunk of a receive already finished).
  ChunkLedger::Claim claim(const ChunkHeader& header) {
    Entry* entry = find(header.recvId, header.slot);
    if (entry == nullptr) return ChunkLedger::Claim::kPlaced;
    return entry->buffers_[header.slot].ledger.claim(header.offset, header.length);
  }
  // Verbs path failover (kPathAnswer): the chunk's bytes are placed, or its receive is no longer posted (finished:
  // every byte arrived), so sending it again could only land in a buffer NCCL may have reused.
  bool placed(const ChunkHeader& header) {
    Entry* entry = find(header.recvId, header.slot);
    return entry == nullptr || entry->buffers_[header.slot].ledger.holds(header.offset, header.length);
  }
  // Any thread: a claimed chunk that will not be whole (its stream failed mid-payload).
  void release(const ChunkHeader& header) {
    if (Entry* entry = find(header.recvId, header.slot)) entry->buffers_[header.slot].ledger.release(header.offset, header.length);
  }

  // Any thread, after destination() accepted the chunk and its bytes landed: counts the bytes no chunk placed
  // before, and completes the buffer when the whole message is in. False, with why, for a chunk that overlaps
  // placed bytes in part or names another message size than the buffer's other chunks (a protocol error for the
  // caller to record); a chunk that repeats placed bytes exactly counts nothing and is not an error.
  // *completed (when given) is set when this chunk completed its buffer: exactly one chunk of a buffer does.
  bool addBytes(const ChunkHeader& header, std::string* why, bool* completed = nullptr) {
    Entry& entry = entries_[header.recvId % kEntries];
    ReceiveBuffer& buffer = entry.buffers_[header.slot];
    switch (buffer.ledger.add(header.offset, header.length, header.messageSize, why)) {
      case ChunkLedger::Verdict::kComplete:
        completeBuffer(entry, header.slot, header.messageSize);
        if (completed != nullptr) *completed = true;
        return true;
      case ChunkLedger::Verdict::kCounted:
      case ChunkLedger::Verdict::kRepeated:
        return true;
      case ChunkLedger::Verdict::kConflict:
        break;
    }
    *why = "receive " + std::to_string(header.recvId) + " buffer " + std::to_string(header.slot) + ": " + *why;
    return false;
  }

  static void completeBuffer(Entry& entry, int index, uint64_t size) {
    entry.buffers_[index].size.store(size, std::memory_order_relaxed);
    entry.pendingBuffers_.fetch_sub(1, std::memory_order_acq_rel);
  }

  // An oversize frame: the sender's message did not fit the buffer. Logs it and completes the buffer with 0
  // bytes; the receive then fails with ncclInvalidUsage. False (nothing changed) when the frame names no
  // posted buffer: a protocol error for the caller to record.
  bool applyOversize(const FrameHeader& frame, const std::string& peer) {
    Entry* entry = find(frame.recvId, frame.slot);
    if (entry == nullptr) return false;
    const ReceiveBuffer& buffer = entry->buffers_[frame.slot];
    RN_WARN("NET/railnet: %s sent %lu bytes (tag %d) into a receive buffer of %lu bytes", peer.c_str(),
            static_cast<unsigned long>(frame.size), buffer.tag, static_cast<unsigned long>(buffer.capacity));
    entry->oversize_.store(true, std::memory_order_relaxed);
    completeBuffer(*entry, frame.slot, 0);
    return true;
  }

  // test() of a complete receive, under the comm's lock: sizes, the entry freed for reuse, and the result.
  static ncclResult_t finish(Entry& entry, int* sizes) {
    if (sizes != nullptr) {
      for (int i = 0; i < entry.count_; ++i) sizes[i] = static_cast<int>(entry.buffers_[i].size.load(std::memory_order_relaxed));
    }
    const bool oversize = entry.oversize_.load(std::memory_order_relaxed);
    entry.postedId_.store(UINT32_MAX, std::memory_order_relaxed);
    entry.inUse_ = false;
    return oversize ? ncclInvalidUsage : ncclSuccess;
  }

 private:
  uint64_t groupedPosts_ = 0;    // under the comm's lock
  uint64_t groupedMembers_ = 0;  // under the comm's lock
  Entry entries_[kEntries];
  uint32_t nextId_ = 0;  // guarded by the comm's lock
};

}  // namespace railnet::protocol
