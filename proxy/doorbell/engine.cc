#include "proxy/doorbell/engine.h"

#include <utility>

#include "base/clock.h"
#include "railnet/log.h"

namespace railnet::doorbell {

namespace {

// Descriptors taken per round: bounds one round's time so tests of earlier puts are not starved.
constexpr int kBatch = 64;

const char* opName(uint32_t op) {
  switch (static_cast<Op>(op)) {
    case Op::kPut: return "put";
    case Op::kPutSignal: return "put+signal";
    case Op::kSignal: return "signal";
    case Op::kQuiet: return "quiet";
  }
  return "unknown op";
}

}  // namespace

Engine::Engine(rma::RmaComm& comm, Descriptor* slots, RingControl* control, uint64_t capacity,
               std::vector<void*> windows, void* signals, uint64_t stallNs)
    : comm_(comm),
      consumer_(slots, control, capacity),
      windows_(std::move(windows)),
      signals_(signals),
      stallNs_(stallNs) {}

bool Engine::toArguments(const Descriptor& descriptor, rma::PutArguments* arguments) const {
  const auto op = static_cast<Op>(descriptor.op);
  if (op != Op::kPut && op != Op::kPutSignal && op != Op::kSignal) return false;
  if (descriptor.peer >= static_cast<uint32_t>(comm_.ranks())) return false;
  arguments->rank = descriptor.peer;
  if (op == Op::kSignal) {
    // No payload: a 0-byte put that carries the signal, ordered after every earlier put to the peer.
    arguments->srcHandle = signals_;
    arguments->dstHandle = signals_;
  } else {
    if (descriptor.sourceWindow >= windows_.size() || descriptor.targetWindow >= windows_.size()) return false;
    arguments->srcHandle = windows_[descriptor.sourceWindow];
    arguments->srcOffset = descriptor.sourceOffset;
    arguments->dstHandle = windows_[descriptor.targetWindow];
    arguments->dstOffset = descriptor.targetOffset;
    arguments->size = descriptor.bytes;
  }
  if (op == Op::kPutSignal || op == Op::kSignal) {
    if (static_cast<SignalOp>(descriptor.signalOp) != SignalOp::kAdd) return false;
    arguments->signalOp = rma::SignalOp::kAdd;
    arguments->signalHandle = signals_;
    arguments->signalOffset = static_cast<uint64_t>(descriptor.signal) * sizeof(uint64_t);
    arguments->signalValue = descriptor.signalValue;
  }
  return true;
}

void Engine::fail(RingError error, uint64_t ticket, const char* what, int code) {
  consumer_.fail(error);
  if (failed_) return;  // one WARN per ring: the error word keeps the first cause
  failed_ = true;
  RN_WARN("NET/railnet: doorbell ring: ticket %lu: %s (result %d); kernels see error %u in the ring's error word",
          static_cast<unsigned long>(ticket), what, code, static_cast<unsigned>(error));
}

void Engine::issue(const Descriptor& descriptor, uint64_t ticket) {
  if (static_cast<Op>(descriptor.op) == Op::kQuiet) {
    pending_.push_back({ticket, nullptr});
    return;
  }
  rma::PutArguments arguments;
  if (!toArguments(descriptor, &arguments)) {
    fail(RingError::kBadDescriptor, ticket, "a descriptor with an unknown op, peer, window or signal op", 0);
    pending_.push_back({ticket, nullptr});
    return;
  }
  void* request = nullptr;
  const ncclResult_t result = comm_.put(arguments, &request);
  if (result != ncclSuccess) {
    // ncclInvalidArgument: a range outside a window (RmaComm checked both sides' sizes); anything else: the peer.
    fail(result == ncclInvalidArgument ? RingError::kBadDescriptor : RingError::kPeerFailed, ticket,
         opName(descriptor.op), result);
    request = nullptr;
  }
  pending_.push_back({ticket, request});
}

bool Engine::progress() noexcept {
  bool moved = false;
  Descriptor descriptor;
  for (int taken = 0; taken < kBatch && consumer_.take(&descriptor); ++taken) {
    issue(descriptor, descriptor.sequence - 1);
    moved = true;
  }
  if (const ncclResult_t result = comm_.progress(); result != ncclSuccess) {
    fail(RingError::kPeerFailed, completed_, "the one-sided comm failed", result);
  }
  // Completion in ticket order: a quiet completes once everything before it has.
  while (!pending_.empty()) {
    Pending& front = pending_.front();
    if (front.request != nullptr) {
      int done = 0;
      const ncclResult_t result = comm_.test(front.request, &done);
      if (result != ncclSuccess) fail(RingError::kPeerFailed, front.ticket, "a one-sided operation failed", result);
      if (!done && result == ncclSuccess) break;
    }
    completed_ = front.ticket + 1;
    pending_.pop_front();
    moved = true;
  }
  if (moved) consumer_.markCompleted(completed_);
  // A producer that reserved a ticket and never published it holds every later ticket back: say so, once.
  if (pending_.empty() && consumer_.reservedButUnpublished()) {
    const auto now = static_cast<uint64_t>(monotonicNs());
    if (stallSinceNs_ == 0) stallSinceNs_ = now;
    if (now - stallSinceNs_ >= stallNs_) fail(RingError::kStalled, consumer_.taken(), "reserved, never published", 0);
  } else {
    stallSinceNs_ = 0;
  }
  return moved;
}

}  // namespace railnet::doorbell
