// Multireceive aggregation's bookkeeping, the same for both transports (docs/design.md "Multireceive", D65): the
// small sends of one grouped receive wait here until the group is complete, a send for anything else comes (they
// go first, so order is kept), or the oldest has waited long enough; then the transport sends them together
// (TCP: one writev of their frames; verbs: their WRITEs and one notice naming them all). Pure logic; the owner's
// lock guards everything but anyHeld(), which a lock-free test() may read.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>

#include "proxy/protocol/clear_to_send.h"

namespace railnet::protocol {

template <class Member>
class HeldGroup {
 public:
  using Clock = std::chrono::steady_clock;

  // wait 0: nothing is ever held.
  explicit HeldGroup(std::chrono::microseconds wait) : wait_(wait) {}

  // Whether a send to `destination` is held: aggregation on, a group of two or more, and a message the transport
  // can carry with others (`small`).
  bool holds(const ClearToSendQueue::Destination& destination, bool small) const {
    return small && wait_.count() > 0 && destination.groupSize > 1;
  }
  // Before an accepted send is held or sent: true when the held members must leave first, because this send is
  // not held or belongs to another receive.
  bool mustFlushBefore(bool held, uint32_t recvId) const {
    return !members_.empty() && (!held || recvId != recvId_);
  }
  // Holds a member of receive `recvId` (after mustFlushBefore: all held members are of one receive). The caller
  // flushes at once when the claim left no buffer of the group open (Destination::groupUnclaimed == 0).
  void add(const Member& member, uint32_t recvId) {
    if (members_.empty()) {
      since_ = Clock::now();
      recvId_ = recvId;
    }
    members_.push_back(member);
    anyHeld_.store(true, std::memory_order_release);
  }
  // The oldest held member has waited RAILNET_GROUP_WAIT_US.
  bool due() const { return !members_.empty() && Clock::now() - since_ >= wait_; }
  bool empty() const { return members_.empty(); }
  bool anyHeld() const { return anyHeld_.load(std::memory_order_acquire); }

  // Hands the held members (in the order they were held) to `send`, then forgets them. No-op when none.
  template <class Send>
  void flush(Send&& send) {
    if (members_.empty()) return;
    send(members_);
    if (members_.size() > 1) {
      ++groupsCarried_;
      membersCarried_ += members_.size();
    }
    members_.clear();
    anyHeld_.store(false, std::memory_order_release);
  }

  // For the close log: writes (TCP) or notices (verbs) that carried two or more members, and those members.
  uint64_t groupsCarried() const { return groupsCarried_; }
  uint64_t membersCarried() const { return membersCarried_; }

 private:
  std::chrono::microseconds wait_;
  std::vector<Member> members_;
  uint32_t recvId_ = 0;
  Clock::time_point since_{};
  std::atomic<bool> anyHeld_{false};
  uint64_t groupsCarried_ = 0;
  uint64_t membersCarried_ = 0;
};

}  // namespace railnet::protocol
