#include "proxy/protocol/clear_to_send.h"

#include <algorithm>
#include <cstring>

namespace railnet::protocol {

long ClearToSendQueue::parse(const char* data, size_t size, std::string* why, std::vector<DoneFrame>* done) {
  ControlEvents events;
  events.done = done;
  return parse(data, size, why, &events);
}

long ClearToSendQueue::parse(const char* data, size_t size, std::string* why, ControlEvents* events) {
  constexpr uint64_t kMaxSessionBytes = kSessionEntryBytes * kMaxSessionEntries;
  size_t used = 0;
  while (size - used >= sizeof(FrameHeader)) {
    FrameHeader frame;
    memcpy(&frame, data + used, sizeof(frame));
    if (events->done != nullptr && frame.type == static_cast<uint8_t>(FrameType::kDone)) {
      if (frame.slot >= kMaxRecvs) {
        *why = "protocol error: a done frame for buffer " + std::to_string(frame.slot);
        return -1;
      }
      events->done->push_back({frame.recvId, frame.slot});
      ++events->numbered;
      used += sizeof(FrameHeader);
      continue;
    }
    if (events->resumable && frame.type == static_cast<uint8_t>(FrameType::kAck)) {
      events->acknowledged = static_cast<uint32_t>(frame.size);
      used += sizeof(FrameHeader);
      continue;
    }
    if (events->resumable && frame.type == static_cast<uint8_t>(FrameType::kSession)) {
      if (frame.size > kMaxSessionBytes) {
        *why = "protocol error: a session frame of " + std::to_string(frame.size) + " bytes";
        return -1;
      }
      if (size - used < sizeof(FrameHeader) + frame.size) break;
      const char* payload = data + used + sizeof(FrameHeader);
      events->session.assign(payload, payload + frame.size);
      events->sessionNics = frame.extraKeys;
      ++events->numbered;
      used += sizeof(FrameHeader) + frame.size;
      continue;
    }
    if (frame.type != static_cast<uint8_t>(FrameType::kClearToSend) || frame.slot < 1 || frame.slot > kMaxRecvs) {
      *why = "protocol error: expected a clear-to-send frame, got type " + std::to_string(frame.type) + " with " +
             std::to_string(frame.slot) + " buffers";
      return -1;
    }
    if (frame.extraKeys >= kMaxKeysPerBuffer) {
      *why = "protocol error: a clear-to-send frame with " + std::to_string(frame.extraKeys + 1) + " keys per buffer";
      return -1;
    }
    const size_t entryBytes = frame.slot * sizeof(ClearToSendEntry);
    const size_t keyBytes = size_t{frame.slot} * frame.extraKeys * sizeof(uint32_t);
    size_t total = sizeof(FrameHeader) + entryBytes + keyBytes;
    if (size - used < total) break;
    // A receiver has at most its ring's receives posted (protocol/receive_ring.h: 64): more is a broken or hostile
    // peer, and would grow this queue without bound.
    if (posted_.size() >= kMaxPostedReceives) {
      *why = "protocol error: more than " + std::to_string(kMaxPostedReceives) + " receives posted at once";
      return -1;
    }
    PostedReceive receive{};
    receive.recvId = frame.recvId;
    receive.count = frame.slot;
    receive.extraKeyCount = frame.extraKeys;
    memcpy(receive.entries, data + used + sizeof(FrameHeader), entryBytes);
    const char* keys = data + used + sizeof(FrameHeader) + entryBytes;
    for (int i = 0; i < frame.slot; ++i) {
      memcpy(receive.extraKeys[i], keys + size_t(i) * frame.extraKeys * sizeof(uint32_t),
             frame.extraKeys * sizeof(uint32_t));
    }
    if (dropRepeats_) {
      if (!admit(receive, why)) return -1;
    } else {
      posted_.push_back(receive);
    }
    ++events->numbered;
    used += total;
  }
  return static_cast<long>(used);
}

bool ClearToSendQueue::admit(const PostedReceive& receive, std::string* why) {
  const auto distance = [this](uint32_t recvId) { return static_cast<int32_t>(recvId - nextRecvId_); };
  if (distance(receive.recvId) < 0) return true;  // a repeat of one announced
  if (distance(receive.recvId) > 0) {
    auto at = std::find_if(ahead_.begin(), ahead_.end(),
                           [&](const PostedReceive& held) { return distance(held.recvId) >= distance(receive.recvId); });
    if (at != ahead_.end() && at->recvId == receive.recvId) return true;  // held already
    if (ahead_.size() >= kMaxPostedReceives) {
      *why = "protocol error: more than " + std::to_string(kMaxPostedReceives) + " clear-to-sends ahead of receive " +
             std::to_string(nextRecvId_);
      return false;
    }
    ahead_.insert(at, receive);
    return true;
  }
  posted_.push_back(receive);
  ++nextRecvId_;
  while (!ahead_.empty() && ahead_.front().recvId == nextRecvId_) {
    posted_.push_back(ahead_.front());
    ahead_.pop_front();
    ++nextRecvId_;
  }
  return true;
}

std::optional<ClearToSendQueue::Destination> ClearToSendQueue::claim(int tag) {
  for (PostedReceive& receive : posted_) {
    for (int i = 0; i < receive.count; ++i) {
      if ((receive.usedMask & (1u << i)) != 0 || receive.entries[i].tag != tag) continue;
      receive.usedMask = static_cast<uint8_t>(receive.usedMask | (1u << i));
      const ClearToSendEntry& entry = receive.entries[i];
      Destination destination{receive.recvId, i, entry.capacity, entry.address, entry.rkey, {}, receive.count, 0};
      for (int j = 0; j < receive.count; ++j) destination.groupUnclaimed += (receive.usedMask >> j & 1) == 0 ? 1 : 0;
      for (int p = 0; p < kMaxKeysPerBuffer; ++p) {
        destination.pathKeys[p] = p == 0 || p > receive.extraKeyCount ? entry.rkey : receive.extraKeys[i][p - 1];
      }
      while (!posted_.empty() && posted_.front().usedMask == (1u << posted_.front().count) - 1) posted_.pop_front();
      return destination;
    }
  }
  return std::nullopt;
}

std::string ClearToSendQueue::openTags() const {
  std::string tags;
  for (const PostedReceive& receive : posted_) {
    for (int i = 0; i < receive.count; ++i) {
      if ((receive.usedMask & (1u << i)) == 0) tags += (tags.empty() ? "" : " ") + std::to_string(receive.entries[i].tag);
    }
  }
  return tags;
}

}  // namespace railnet::protocol
