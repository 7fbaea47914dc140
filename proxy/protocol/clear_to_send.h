// The sender's view of the receives its peer has posted, built from clear-to-send frames, and NCCL's matching
// rule over them: the k-th send with tag t takes tag t's buffer in the k-th posted receive that lists t.
// Pure logic (no sockets, no locks): the send comm feeds it bytes and asks it for destinations.
#pragma once

#include <deque>
#include <optional>
#include <vector>
#include <string>

#include "proxy/protocol/wire.h"

namespace railnet::protocol {

// A kDone frame: buffer `slot` of receive `recvId` has all its bytes (wire.h).
struct DoneFrame {
  uint32_t recvId;
  int slot;
  bool operator==(const DoneFrame&) const = default;
};

// What a TCP sender's control input holds besides clear-to-sends (parse() fills it).
struct ControlEvents {
  std::vector<DoneFrame>* done = nullptr;  // kDone frames are taken (delivered completion) only when set
  bool resumable = false;                  // kAck and kSession frames are taken only when set (wire.h kFeatureResume)
  uint32_t numbered = 0;                   // numbered frames taken: clear-to-sends, done, session
  std::optional<uint32_t> acknowledged;    // the last kAck's count
  std::vector<char> session;               // the last kSession frame's payload
  uint16_t sessionNics = 0;                // its count of the connection's own NICs (0: every entry)
};

class ClearToSendQueue {
 public:
  struct Destination {
    uint32_t recvId;
    int slot;
    uint64_t capacity;
    uint64_t address;  // for RDMA writes
    uint32_t rkey;     // path 0's
    uint32_t pathKeys[kMaxKeysPerBuffer];  // [p]: the rkey for verbs path p ([0] = rkey); paths beyond the
                                           // frame's count repeat rkey
    int groupSize = 1;       // buffers in the receive this one belongs to
    int groupUnclaimed = 0;  // of those, still without a send once this one is claimed
  };

  // Takes as many whole clear-to-send frames from `data` as it holds; returns the bytes used, or -1 with
  // *why set when the bytes are not a clear-to-send frame.
  // `done` (TCP with RAILNET_SEND_COMPLETION=delivered) also takes kDone frames, appending them; without it a
  // kDone frame is a protocol error, as the receiver sends none unless asked.
  long parse(const char* data, size_t size, std::string* why, std::vector<DoneFrame>* done = nullptr);
  // The same, taking every frame `events` allows.
  long parse(const char* data, size_t size, std::string* why, ControlEvents* events);
  // The buffer the next send with `tag` goes to, now claimed; nothing when no posted receive has one.
  std::optional<Destination> claim(int tag);
  bool empty() const { return posted_.empty(); }
  // Verbs path failover: a receiver sends again, in order, the clear-to-sends whose SEND failed with a path, some of
  // which may have arrived; one naming a receive already announced is then dropped. And they come over several
  // paths, whose completion queues the sender reads one after another: a clear-to-send sent again over the new path
  // may be read before the original of an earlier one that arrived on the old path. One that names a receive beyond
  // the next is kept aside until the receives before it are announced: matching sends to receives needs them in
  // order, and every receive's clear-to-send arrives, first time or again.
  void dropRepeatedReceives() { dropRepeats_ = true; }
  size_t heldAhead() const { return ahead_.size(); }
  // The tags of buffers still open, for a stalled sender's warning.
  std::string openTags() const;

 private:
  static constexpr size_t kMaxPostedReceives = 4 * NCCL_NET_MAX_REQUESTS * 2;  // 4x a receive ring (2 x 32)
  struct PostedReceive {
    uint32_t recvId;
    int count;
    ClearToSendEntry entries[kMaxRecvs];
    uint32_t extraKeys[kMaxRecvs][kMaxKeysPerBuffer - 1];
    int extraKeyCount;
    uint8_t usedMask;
  };
  // With dropRepeats_: takes a clear-to-send in order, parks one ahead of the next, drops a repeat. False (why set)
  // when more are held than a receiver can have posted.
  bool admit(const PostedReceive& receive, std::string* why);
  std::deque<PostedReceive> posted_;
  bool dropRepeats_ = false;
  uint32_t nextRecvId_ = 0;            // with dropRepeats_: the receive the next new clear-to-send names
  std::deque<PostedReceive> ahead_;    // with dropRepeats_: beyond nextRecvId_, in recvId order
};

}  // namespace railnet::protocol
