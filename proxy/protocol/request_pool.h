// A fixed set of request objects handed out and taken back, so the data path never allocates. Not
// synchronised: the owning comm holds its lock around acquire/release.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace railnet::protocol {

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
