// The ring + engine path of railnet's GPU doorbells (issue 15): takes descriptors from a doorbell ring (ring.h) in
// ticket order and carries each out as a one-sided operation of an rma::RmaComm, the layer that serves NCCL's GIN
// too, so both transports (and fused devices) carry doorbell traffic alike. Completion is reported in ticket order
// through the ring's `completed` counter, which `quiet` and the producers read; a failure sets the ring's sticky
// error word and is logged once with the ticket and the peer, and later descriptors are still taken (so no
// producer waits for a slot for ever) and carried out when they can be.
//
// Thread safety: one thread drives an engine (progress()); the RmaComm takes its own lock per call.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "proxy/doorbell/ring.h"
#include "proxy/rma/rma_comm.h"

namespace railnet::doorbell {

class Engine {
 public:
  // `windows`: the comm's window handles by the index descriptors name (registered collectively, so one index is
  // the same window on every rank); `signals`: the window holding the signal words (8 bytes each, by index).
  // `stallNs`: how long a reserved ticket may stay unpublished before the ring is failed with kStalled.
  Engine(rma::RmaComm& comm, Descriptor* slots, RingControl* control, uint64_t capacity, std::vector<void*> windows,
         void* signals, uint64_t stallNs);

  // One round: takes every published descriptor (up to a batch), issues it, and marks what completed, in ticket
  // order. True when anything moved. Never throws.
  bool progress() noexcept;

  uint64_t completed() const { return completed_; }
  // A window registered after the engine started takes the next index (the caller serializes with progress()).
  void addWindow(void* handle) { windows_.push_back(handle); }

 private:
  struct Pending {
    uint64_t ticket;
    void* request;  // nullptr: nothing to wait for (a quiet, or an operation that failed when issued)
  };

  void issue(const Descriptor& descriptor, uint64_t ticket);
  bool toArguments(const Descriptor& descriptor, rma::PutArguments* arguments) const;
  void fail(RingError error, uint64_t ticket, const char* what, int code);

  rma::RmaComm& comm_;
  RingConsumer consumer_;
  std::vector<void*> windows_;
  void* signals_;
  uint64_t stallNs_;
  uint64_t stallSinceNs_ = 0;  // when the next ticket was first seen reserved but unpublished; 0: not stalled
  std::deque<Pending> pending_;
  uint64_t completed_ = 0;
  bool failed_ = false;
};

}  // namespace railnet::doorbell
