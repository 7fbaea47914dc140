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
  RequestPool(size_t capacity, Prepare prepare) {
    all_.reserve(capacity);
    free_.reserve(capacity);
    for (size_t i = 0; i < capacity; ++i) {
      all_.push_back(std::make_unique<Request>());
      prepare(*all_.back());
      free_.push_back(all_.back().get());
    }
  }

  // nullptr when every request is in flight.
  Request* acquire() {
    if (free_.empty()) return nullptr;
    Request* request = free_.back();
    free_.pop_back();
    return request;
  }
  void release(Request* request) { free_.push_back(request); }
  size_t capacity() const { return all_.size(); }
  size_t available() const { return free_.size(); }

 private:
  std::vector<std::unique_ptr<Request>> all_;
  std::vector<Request*> free_;
};

}  // namespace railnet::protocol
