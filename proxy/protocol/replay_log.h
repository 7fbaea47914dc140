// The control frames one side of a resumable connection sent and the other has not acknowledged yet, numbered in
// sending order (mod 2^32): what a re-made control socket carries again (docs/failover.md, "The session layer").
// Pure logic, no locks: the control channel guards it with its output lock.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <vector>

namespace railnet::protocol {

class ReplayLog {
 public:
  // Frames are numbered from `first` (0 on the wire; tests start near 2^32 to cross the wrap).
  explicit ReplayLog(uint32_t first = 0) : first_(first) {}
  // Keeps the numbered frames among the `count` pieces, which hold whole frames (wire.h frameLength), and returns
  // how many numbered frames they held; -1 with *why set when the bytes do not end on a frame boundary or name an
  // unknown frame (nothing is kept then). kAck and kResume frames are skipped: they are never sent again.
  int append(const iovec* pieces, int count, std::string* why);

  uint32_t next() const { return first_ + static_cast<uint32_t>(starts_.size()); }  // the next frame's number
  uint32_t first() const { return first_; }  // the oldest frame kept
  size_t frames() const { return starts_.size(); }
  size_t bytes() const { return bytes_.size() - begin_; }

  // The peer processed every frame numbered before `processed`: they are dropped. False when `processed` lies
  // outside [first(), next()] (a broken or hostile peer; nothing changes).
  bool acknowledge(uint32_t processed);
  // Appends frames [from, next()) to *out; false when `from` lies outside [first(), next()].
  bool replayFrom(uint32_t from, std::vector<char>* out) const;

 private:
  bool covers(uint32_t sequence) const;  // first() <= sequence <= next(), modulo 2^32
  std::vector<char> bytes_;   // frames' bytes, from begin_
  size_t begin_ = 0;
  std::deque<size_t> starts_;  // frame first_ + i starts at bytes_[starts_[i]]
  uint32_t first_ = 0;
};

}  // namespace railnet::protocol
