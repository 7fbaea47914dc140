#include "proxy/tcp/clear_to_send.h"

#include <cstring>

namespace railnet::tcp {

long ClearToSendQueue::parse(const char* data, size_t size, std::string* why) {
  size_t used = 0;
  while (size - used >= sizeof(FrameHeader)) {
    FrameHeader frame;
    memcpy(&frame, data + used, sizeof(frame));
    if (frame.type != static_cast<uint8_t>(FrameType::kClearToSend) || frame.slot < 1 || frame.slot > kMaxRecvs) {
      *why = "protocol error: expected a clear-to-send frame, got type " + std::to_string(frame.type) + " with " +
             std::to_string(frame.slot) + " buffers";
      return -1;
    }
    size_t total = sizeof(FrameHeader) + frame.slot * sizeof(ClearToSendEntry);
    if (size - used < total) break;
    PostedReceive receive{};
    receive.recvId = frame.recvId;
    receive.count = frame.slot;
    memcpy(receive.entries, data + used + sizeof(FrameHeader), total - sizeof(FrameHeader));
    posted_.push_back(receive);
    used += total;
  }
  return static_cast<long>(used);
}

std::optional<ClearToSendQueue::Destination> ClearToSendQueue::claim(int tag) {
  for (PostedReceive& receive : posted_) {
    for (int i = 0; i < receive.count; ++i) {
      if ((receive.usedMask & (1u << i)) != 0 || receive.entries[i].tag != tag) continue;
      receive.usedMask = static_cast<uint8_t>(receive.usedMask | (1u << i));
      const ClearToSendEntry& entry = receive.entries[i];
      Destination destination{receive.recvId, i, entry.capacity, entry.address, entry.rkey};
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

}  // namespace railnet::tcp
