// Requests owned by a comm, and a fixed set of them handed out and taken back, so the data path never allocates. Not
// synchronised: the owning comm holds its lock around acquire/release.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "proxy/transport.h"

namespace railnet::protocol {

// A request that its comm owns (in a pool or the receive ring) and completes: test() asks the owner, which
// declares `friend class protocol::CommRequest<Owner, Self>;` and `testRequest(Self*, int* done, int* sizes)`.
template <class Owner, class Self>
class CommRequest : public railnet::Request {
 public:
  ncclResult_t test(int* done, int* sizes) noexcept final {
    return owner_->testRequest(static_cast<Self*>(this), done, sizes);
  }
  void setOwner(Owner* owner) noexcept { owner_ = owner; }

 private:
  Owner* owner_ = nullptr;
};

template <class Request>
class RequestPool {
 public:
  // `prepare` runs once on each request, e.g. to point it at its comm.
  template <class Prepare>
  RequestPool(size_t capacity, Prepare prepare)
      : all_(std::make_unique<Request[]>(capacity)), capacity_(capacity), busy_(capacity, false) {
    free_.reserve(capacity);
    for (size_t i = capacity; i-- > 0;) {
      prepare(all_[i]);
      free_.push_back(&all_[i]);
    }
  }

  // nullptr when every request is in flight.
  Request* acquire() {
    if (free_.empty()) return nullptr;
    Request* request = free_.back();
    free_.pop_back();
    busy_[static_cast<size_t>(request - all_.get())] = true;
    return request;
  }
  void release(Request* request) {
    busy_[static_cast<size_t>(request - all_.get())] = false;
    free_.push_back(request);
  }
  size_t capacity() const { return capacity_; }
  size_t available() const { return free_.size(); }
  // Calls fn(Request&) for each request handed out and not yet released (the watchdog's look).
  template <class Fn>
  void forEachInFlight(Fn&& fn) {
    for (size_t i = 0; i < capacity_; ++i) {
      if (busy_[i]) fn(all_[i]);
    }
  }

 private:
  std::unique_ptr<Request[]> all_;  // one block: a request's index is its distance from the first
  size_t capacity_;
  std::vector<bool> busy_;
  std::vector<Request*> free_;
};

}  // namespace railnet::protocol
