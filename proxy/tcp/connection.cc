#include "proxy/tcp/connection.h"

#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::tcp {

Connection::Connection(Fd control, std::vector<Fd> data, const SocketAddress& peer, const char* direction)
    : control_(std::move(control)),
      peerName_(peer.toString()),
      direction_(direction),
      pendingData_(std::move(data)) {}

Connection::~Connection() { stop(); }

void Connection::setCounters(NicCounters* control, std::vector<NicCounters*> perStream) {
  controlCounters_ = control;
  streamCounters_ = std::move(perStream);
}

void Connection::setCounters(const LaneLayout& layout) {
  if (layout.lanes.empty()) return;
  std::vector<NicCounters*> perStream;
  for (size_t i = 0; i < pendingData_.size(); ++i) perStream.push_back(layout.lanes[i % layout.lanes.size()]);
  setCounters(layout.lanes[0], std::move(perStream));
}

void Connection::start(StreamOwner* owner) {
  started_ = true;
  if (pendingData_.empty()) return;  // control-only (verbs): no helper threads needed
  engine_ = Engine::acquire();
  for (size_t i = 0; i < pendingData_.size(); ++i) {
    NicCounters* counters = i < streamCounters_.size() ? streamCounters_[i] : nullptr;
    streams_.push_back(std::make_unique<Stream>(std::move(pendingData_[i]), owner, static_cast<int>(i), counters));
  }
  pendingData_.clear();
  for (auto& stream : streams_) engine_->attach(stream.get());
}

void Connection::stop() {
  if (!started_) return;
  started_ = false;
  for (auto& stream : streams_) engine_->detach(stream.get());
  streams_.clear();
  engine_.reset();
}

void Connection::sendControl(const void* first, size_t firstSize, const void* second, size_t secondSize) {
  const char* a = static_cast<const char*>(first);
  const char* b = static_cast<const char*>(second);
  if (controlOutSent_ == controlOut_.size() && !failed()) {
    // Nothing queued: write directly, so an inline message costs one syscall and no copy.
    controlOut_.clear();
    controlOutSent_ = 0;
    iovec iov[2] = {{const_cast<char*>(a), firstSize}, {const_cast<char*>(b), secondSize}};
    ssize_t sent = writeVector(control_.get(), iov, secondSize > 0 ? 2 : 1);
    if (sent < 0) {
      recordFailure("control connection: " + errnoText(static_cast<int>(-sent)));
      return;
    }
    size_t done = static_cast<size_t>(sent);
    size_t fromFirst = std::min(done, firstSize);
    a += fromFirst;
    firstSize -= fromFirst;
    done -= fromFirst;
    b += done;
    secondSize -= done;
  }
  controlOut_.insert(controlOut_.end(), a, a + firstSize);
  if (secondSize > 0) controlOut_.insert(controlOut_.end(), b, b + secondSize);
}

ssize_t Connection::readControl() {
  constexpr size_t kInputBytes = 64 * 1024;
  if (input_.empty()) input_.resize(kInputBytes);
  if (inputBegin_ == inputEnd_) {
    inputBegin_ = inputEnd_ = 0;
  } else if (inputBegin_ > 0 && input_.size() - inputEnd_ < sizeof(ClearToSendEntry) * 16) {
    // Keep room for at least a whole frame header and its entries at the end.
    std::memmove(input_.data(), input_.data() + inputBegin_, inputEnd_ - inputBegin_);
    inputEnd_ -= inputBegin_;
    inputBegin_ = 0;
  }
  size_t room = input_.size() - inputEnd_;
  ssize_t got = readSome(control_.get(), input_.data() + inputEnd_, room);
  lastReadFilled_ = got > 0 && static_cast<size_t>(got) == room;
  if (got > 0) inputEnd_ += static_cast<size_t>(got);
  return got;
}

void Connection::consumeControl(size_t bytes) { inputBegin_ += bytes; }

bool Connection::flushControl() {
  while (controlOutSent_ < controlOut_.size()) {
    ssize_t sent = writeSome(control_.get(), controlOut_.data() + controlOutSent_, controlOut_.size() - controlOutSent_);
    if (sent == 0) return true;
    if (sent < 0) {
      recordFailure("control connection: " + errnoText(static_cast<int>(-sent)));
      return false;
    }
    controlOutSent_ += static_cast<size_t>(sent);
  }
  controlOut_.clear();
  controlOutSent_ = 0;
  return true;
}

void Connection::recordFailure(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    if (!failure_.empty()) return;
    failure_ = why;
  }
  failed_.store(true, std::memory_order_release);
}

ncclResult_t Connection::reportFailure() {
  if (!reported_.exchange(true)) {
    RN_WARN("NET/railnet: %s connection with %s failed: %s", direction_, peerName_.c_str(), failure().c_str());
  }
  return ncclSystemError;
}

std::string Connection::failure() const {
  std::lock_guard<std::mutex> lock(failureMutex_);
  return failure_;
}

std::unique_ptr<MemoryRegion> registerHostMemory(void* data, size_t size, int type) {
  if (type != NCCL_PTR_HOST) {
    fail(ncclInvalidArgument, "NET/railnet: the TCP transport registers host memory only (type %d asked)", type);
  }
  return std::make_unique<HostRegion>(data, size);
}

}  // namespace railnet::tcp
