#include "proxy/protocol/control_channel.h"

#include <poll.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "proxy/protocol/wire.h"
#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::protocol {

bool isRemoteErrno(int err) {
  switch (err) {
    case ECONNRESET:
    case ECONNREFUSED:
    case ECONNABORTED:
    case EPIPE:
    case ETIMEDOUT:
    case EHOSTUNREACH:
    case EHOSTDOWN:
    case ENETUNREACH:
    case ENETDOWN:
    case ENETRESET:
      return true;
    default:
      return false;
  }
}

ControlChannel::ControlChannel(Fd fd, const SocketAddress& peer, const char* direction)
    : fd_(std::move(fd)), peerName_(peer.toString()), direction_(direction) {}

void ControlChannel::recordSocketFailure(const char* what, ssize_t result) {
  const int err = static_cast<int>(-result);
  recordFailure(std::string(what) + ": " + errnoText(err), isRemoteErrno(err) ? FailureKind::kRemote : FailureKind::kLocal);
}

void ControlChannel::send(const void* first, size_t firstSize, const void* second, size_t secondSize) {
  const iovec pieces[2] = {{const_cast<void*>(first), firstSize}, {const_cast<void*>(second), secondSize}};
  sendVector(pieces, secondSize > 0 ? 2 : 1);
}

void ControlChannel::sendVector(const iovec* pieces, int count) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  size_t done = 0;
  if (outputSent_ == output_.size() && !failed()) {
    // Nothing queued: write directly, so an inline message costs one syscall and no copy.
    output_.clear();
    outputSent_ = 0;
    iovec iov[kMaxSendPieces];
    std::copy(pieces, pieces + count, iov);
    const ssize_t sent = writeVector(fd_.get(), iov, count);
    if (sent < 0) {
      recordSocketFailure("control connection", sent);
      return;
    }
    done = static_cast<size_t>(sent);
  }
  for (int i = 0; i < count; ++i) {
    const char* base = static_cast<const char*>(pieces[i].iov_base);
    const size_t skip = std::min(done, pieces[i].iov_len);
    done -= skip;
    output_.insert(output_.end(), base + skip, base + pieces[i].iov_len);
  }
}

ssize_t ControlChannel::read() {
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
  ssize_t got = readSome(fd_.get(), input_.data() + inputEnd_, room);
  lastReadFilled_ = got > 0 && static_cast<size_t>(got) == room;
  if (got > 0) inputEnd_ += static_cast<size_t>(got);
  return got;
}

void ControlChannel::consume(size_t bytes) { inputBegin_ += bytes; }

bool ControlChannel::flush() {
  std::lock_guard<std::mutex> lock(outputMutex_);
  while (outputSent_ < output_.size()) {
    ssize_t sent = writeSome(fd_.get(), output_.data() + outputSent_, output_.size() - outputSent_);
    if (sent == 0) return true;
    if (sent < 0) {
      recordSocketFailure("control connection", sent);
      return false;
    }
    outputSent_ += static_cast<size_t>(sent);
  }
  output_.clear();
  outputSent_ = 0;
  return true;
}

bool ControlChannel::drain(std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (flush()) {
    {
      std::lock_guard<std::mutex> lock(outputMutex_);
      if (output_.empty()) return true;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd writable{fd_.get(), POLLOUT, 0};
    (void)poll(&writable, 1, static_cast<int>(left.count()));
  }
  return false;
}

void ControlChannel::recordFailure(const std::string& why, FailureKind kind) {
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    if (!failure_.empty()) return;
    failure_ = why;
    failureKind_ = kind;
  }
  failed_.store(true, std::memory_order_release);
}

ncclResult_t ControlChannel::reportFailure() {
  std::string why;
  FailureKind kind;
  {
    std::lock_guard<std::mutex> lock(failureMutex_);
    why = failure_;
    kind = failureKind_;
  }
  if (!reported_.exchange(true)) {
    RN_WARN("NET/railnet: %s connection with %s failed: %s", direction_, peerName_.c_str(), why.c_str());
  }
  return kind == FailureKind::kRemote ? ncclRemoteError : ncclSystemError;
}

std::string ControlChannel::failure() const {
  std::lock_guard<std::mutex> lock(failureMutex_);
  return failure_;
}

}  // namespace railnet::protocol
