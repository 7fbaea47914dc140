#include "proxy/protocol/replay_log.h"

#include <cstring>

#include "proxy/protocol/wire.h"

namespace railnet::protocol {

int ReplayLog::append(const iovec* pieces, int count, std::string* why) {
  const size_t oldEnd = bytes_.size();
  for (int i = 0; i < count; ++i) {
    const char* base = static_cast<const char*>(pieces[i].iov_base);
    bytes_.insert(bytes_.end(), base, base + pieces[i].iov_len);
  }
  // Walk the new bytes frame by frame; numbered frames stay, kAck/kResume are cut out.
  const size_t oldFrames = starts_.size();
  size_t read = oldEnd;
  size_t write = oldEnd;
  while (read < bytes_.size()) {
    FrameHeader header;
    const uint64_t left = bytes_.size() - read;
    if (left < sizeof(header)) break;
    memcpy(&header, bytes_.data() + read, sizeof(header));
    const uint64_t length = frameLength(header);
    if (length == 0 || length > left) break;
    if (numberedFrame(header.type)) {
      if (write != read) memmove(bytes_.data() + write, bytes_.data() + read, length);
      starts_.push_back(write);
      write += length;
    }
    read += length;
  }
  if (read != bytes_.size()) {
    *why = "internal error: control bytes that are not whole frames (" + std::to_string(bytes_.size() - read) +
           " bytes left over)";
    bytes_.resize(oldEnd);
    starts_.resize(oldFrames);
    return -1;
  }
  bytes_.resize(write);
  return static_cast<int>(starts_.size() - oldFrames);
}

bool ReplayLog::covers(uint32_t sequence) const {
  return sequence - first_ <= static_cast<uint32_t>(starts_.size());
}

bool ReplayLog::acknowledge(uint32_t processed) {
  if (!covers(processed)) return false;
  for (uint32_t dropped = processed - first_; dropped > 0; --dropped) starts_.pop_front();
  first_ = processed;
  begin_ = starts_.empty() ? bytes_.size() : starts_.front();
  // Reclaim the dropped prefix once it is most of the buffer, so appends stay amortized O(1).
  if (begin_ > 0 && begin_ >= bytes_.size() / 2) {
    bytes_.erase(bytes_.begin(), bytes_.begin() + static_cast<std::ptrdiff_t>(begin_));
    for (size_t& start : starts_) start -= begin_;
    begin_ = 0;
  }
  return true;
}

bool ReplayLog::replayFrom(uint32_t from, std::vector<char>* out) const {
  if (!covers(from)) return false;
  const size_t index = from - first_;
  if (index == starts_.size()) return true;
  out->insert(out->end(), bytes_.begin() + static_cast<std::ptrdiff_t>(starts_[index]), bytes_.end());
  return true;
}

}  // namespace railnet::protocol
