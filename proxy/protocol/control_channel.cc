#include "proxy/protocol/control_channel.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "proxy/protocol/wire.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/text.h"

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

namespace {
// A resumable channel acknowledges the peer's frames after this many: the peer's replay log stays short.
constexpr uint32_t kAcknowledgeEvery = 16;

int64_t steadyNs(std::chrono::steady_clock::time_point when) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(when.time_since_epoch()).count();
}
}  // namespace

ControlChannel::ControlChannel(Fd fd, const SocketAddress& peer, const char* direction)
    : fd_(std::move(fd)), readFd_(fd_.get()), peerName_(peer.toString()), direction_(direction) {}

ControlChannel::~ControlChannel() { detachFromService(); }

void ControlChannel::detachFromService() {
  if (service_) service_->remove(this);  // synchronous: no service call reaches this channel afterwards
}

void ControlChannel::setRejoinHandlers(RejoinedHandler rejoined, RejoinFailedHandler failed) {
  onRejoined_ = std::move(rejoined);
  onRejoinFailed_ = std::move(failed);
}

bool ControlChannel::rejoin(int stream, int streams, int nic, uint32_t failure) {
  size_t targets = 0;
  {
    std::lock_guard<std::mutex> lock(outputMutex_);
    targets = connectionTargets_;
  }
  // Data stream s arrived on the receiver's NIC s % (its count): the same listener again.
  return targets != 0 && rejoinVia(stream, streams, Route{nic, static_cast<int>(static_cast<size_t>(stream) % targets)},
                                   failure);
}

bool ControlChannel::rejoinVia(int stream, int streams, const Route& route, uint32_t failure) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (!resumable_ || route.target < 0 || static_cast<size_t>(route.target) >= resumeTargets_.size() ||
      route.local < 0 || static_cast<size_t>(route.local) >= resume_.locals.size()) {
    return false;
  }
  ReconnectPlan plan{resume_.key, {resumeTargets_[static_cast<size_t>(route.target)]},
                     {resume_.locals[static_cast<size_t>(route.local)]}, 0, resume_.stream,
                     std::chrono::steady_clock::now() + resume_.limit};
  service_->rejoin(this, plan, stream, streams, failure);
  return true;
}

ControlChannel::Route ControlChannel::route() const {
  const uint32_t packed = route_.load(std::memory_order_acquire);
  return Route{static_cast<int>(packed >> 16) - 1, static_cast<int>(packed & 0xffff)};
}

bool ControlChannel::leavesFrom(int nic) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (nic < 0 || static_cast<size_t>(nic) >= resume_.locals.size()) return true;
  SocketAddress local;
  local.length = sizeof(local.storage);
  if (getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.length) != 0) return true;
  return sameHostAddress(local, resume_.locals[static_cast<size_t>(nic)]);
}

bool ControlChannel::knowsListeners() {
  std::lock_guard<std::mutex> lock(outputMutex_);
  return !resumeTargets_.empty();
}

std::string ControlChannel::describeRoute(const Route& route) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  auto name = [](const std::vector<SocketAddress>& list, int index) {
    return index >= 0 && static_cast<size_t>(index) < list.size() ? list[static_cast<size_t>(index)].toString()
                                                                    : std::string("the kernel's choice");
  };
  return name(resume_.locals, route.local) + " to " + name(resumeTargets_, route.target);
}

ControlChannel::Route ControlChannel::routeOf(int fd) const {
  // The local address's IP among the local NICs (any port), the peer's address among the session listeners.
  SocketAddress local;
  local.length = sizeof(local.storage);
  Route route{-1, 0};
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&local.storage), &local.length) == 0) {
    for (size_t i = 0; i < resume_.locals.size(); ++i) {
      if (sameHostAddress(local, resume_.locals[i])) {
        route.local = static_cast<int>(i);
        break;
      }
    }
  }
  const SocketAddress peer = peerAddress(fd);
  for (size_t i = 0; i < resumeTargets_.size(); ++i) {
    if (sameHostAddress(peer, resumeTargets_[i]) && peer.port() == resumeTargets_[i].port()) {
      route.target = static_cast<int>(i);
      break;
    }
  }
  return route;
}

void ControlChannel::stopAvoiding(int nic) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (nic >= 0 && nic < 64) avoidNics_ &= ~(uint64_t{1} << nic);
}

void ControlChannel::rejoinedStream(int stream, Fd socket, uint32_t failure) noexcept {
  try {
    configureStream(socket.get(), resume_.stream);
  } catch (...) {
    // Options are a tuning; the stream works without them.
  }
  if (onRejoined_) onRejoined_(stream, std::move(socket), failure);
}

void ControlChannel::rejoinFailed(int stream, uint32_t failure, const std::string& why) noexcept {
  if (onRejoinFailed_) onRejoinFailed_(stream, failure, why);
}

void ControlChannel::recordSocketFailure(const char* what, ssize_t result) {
  const int err = static_cast<int>(-result);
  recordFailure(std::string(what) + ": " + errnoText(err), isRemoteErrno(err) ? FailureKind::kRemote : FailureKind::kLocal);
}

void ControlChannel::enableResume(const ResumeOptions& options) {
  resume_ = options;
  resumable_ = true;
  service_ = SessionService::acquire();
  if (!resume_.acceptor) {
    watchForClose();
    std::lock_guard<std::mutex> lock(outputMutex_);
    cutEvery_ = options.cutEvery;
    return;
  }
  std::vector<SocketAddress> locals = resume_.locals;
  if (locals.empty()) {
    SocketAddress local;
    local.length = sizeof(local.storage);
    if (getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.length) != 0) {
      const int err = errno;
      fail(ncclSystemError, "NET/railnet: getsockname on a control socket failed: %s", errnoText(err).c_str());
    }
    locals.push_back(local);
  }
  if (locals.size() > kMaxSessionEntries) locals.resize(kMaxSessionEntries);
  std::vector<char> entries(locals.size() * kSessionEntryBytes, 0);
  for (size_t i = 0; i < locals.size(); ++i) {
    const SocketAddress listener = service_->listenerFor(locals[i]);
    memcpy(entries.data() + i * kSessionEntryBytes, &listener.storage, std::min<size_t>(listener.length, kSessionEntryBytes));
  }
  service_->addAcceptor(this, resume_.key);
  const size_t ownNics = resume_.connectionNics == 0 ? locals.size() : std::min(resume_.connectionNics, locals.size());
  FrameHeader session{static_cast<uint8_t>(FrameType::kSession), static_cast<uint8_t>(locals.size()),
                      static_cast<uint16_t>(ownNics), 0, entries.size()};
  send(&session, sizeof(session), entries.data(), entries.size());
  std::lock_guard<std::mutex> lock(outputMutex_);
  cutEvery_ = options.cutEvery;  // after the session frame: a sender that never learns it cannot re-make anything
}

void ControlChannel::watchForClose() {
  Fd duplicate(fcntl(fd_.get(), F_DUPFD_CLOEXEC, 0));
  if (duplicate.valid()) service_->watch(this, std::move(duplicate));
}

void ControlChannel::send(const void* first, size_t firstSize, const void* second, size_t secondSize) {
  const iovec pieces[2] = {{const_cast<void*>(first), firstSize}, {const_cast<void*>(second), secondSize}};
  sendVector(pieces, secondSize > 0 ? 2 : 1);
}

void ControlChannel::sendVector(const iovec* pieces, int count) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (resumable_) {
    std::string why;
    const int frames = log_.append(pieces, count, &why);
    if (frames < 0) {
      recordFailure(why, FailureKind::kLocal);
      return;
    }
    if (broken() || failed()) return;  // the log has them; a re-made socket carries them
    framesSinceCut_ += static_cast<uint32_t>(frames);
    if (cutEvery_ != 0 && framesSinceCut_ >= cutEvery_) {
      // Test feature: half of these bytes leave, then the socket is cut, as a failing path would leave it.
      framesSinceCut_ = 0;
      size_t total = 0;
      for (int i = 0; i < count; ++i) total += pieces[i].iov_len;
      size_t half = total / 2;
      for (int i = 0; i < count && half > 0 && outputSent_ == output_.size(); ++i) {
        const size_t take = std::min(half, pieces[i].iov_len);
        (void)writeSome(fd_.get(), pieces[i].iov_base, take);
        half -= take;
      }
      (void)shutdown(fd_.get(), SHUT_RDWR);
      lostLocked("cut by RAILNET_FAULT_CONTROL_CUT (a test feature)", FailureKind::kRemote);
      return;
    }
  }
  writeLocked(pieces, count);
}

void ControlChannel::writeLocked(const iovec* pieces, int count) {
  size_t done = 0;
  if (outputSent_ == output_.size() && !failed()) {
    // Nothing queued: write directly, so an inline message costs one syscall and no copy.
    output_.clear();
    outputSent_ = 0;
    iovec iov[kMaxSendPieces];
    std::copy(pieces, pieces + count, iov);
    const ssize_t sent = writeVector(fd_.get(), iov, count);
    if (sent < 0) {
      const int err = static_cast<int>(-sent);
      lostLocked("control connection: " + errnoText(err), isRemoteErrno(err) ? FailureKind::kRemote : FailureKind::kLocal);
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

void ControlChannel::dropInput() {
  inputBegin_ = inputEnd_ = 0;
  lastReadFilled_ = false;
}

ssize_t ControlChannel::read() {
  constexpr size_t kInputBytes = 64 * 1024;
  if (resumable_) {
    retired_.clear();  // sockets replaced since the last read: nobody reads them any more
    const int64_t deadline = deadlineNs_.load(std::memory_order_acquire);
    if (broken() && deadline != 0 && steadyNs(std::chrono::steady_clock::now()) > deadline && !failed()) {
      std::lock_guard<std::mutex> lock(outputMutex_);
      recordFailure(textf("the control connection broke (%s) and was not re-made within RAILNET_FAILOVER_RESUME_MS "
                          "(%lld ms)", lossWhy_.c_str(), static_cast<long long>(resume_.limit.count())));
    }
    if (frozen_ || failed()) return 0;
  }
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
  ssize_t got = readSome(fd(), input_.data() + inputEnd_, room);
  lastReadFilled_ = got > 0 && static_cast<size_t>(got) == room;
  if (got > 0) inputEnd_ += static_cast<size_t>(got);
  if (got < 0 && resumable_) {
    lost(got == kEndOfStream ? std::string("the peer closed the control connection")
                             : "control connection: " + errnoText(static_cast<int>(-got)));
    return 0;
  }
  return got;
}

void ControlChannel::consume(size_t bytes) { inputBegin_ += bytes; }

bool ControlChannel::flush() {
  std::lock_guard<std::mutex> lock(outputMutex_);
  return flushLocked();
}

bool ControlChannel::flushLocked() {
  if (broken()) return !failed();  // a re-made socket carries the log
  while (outputSent_ < output_.size()) {
    ssize_t sent = writeSome(fd_.get(), output_.data() + outputSent_, output_.size() - outputSent_);
    if (sent == 0) return true;
    if (sent < 0) {
      const int err = static_cast<int>(-sent);
      return lostLocked("control connection: " + errnoText(err),
                        isRemoteErrno(err) ? FailureKind::kRemote : FailureKind::kLocal);
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
      if (broken()) return false;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd writable{fd(), POLLOUT, 0};
    (void)poll(&writable, 1, static_cast<int>(left.count()));
  }
  return false;
}

void ControlChannel::framesProcessed(uint32_t count) {
  processed_ += count;
  if (processed_ - acknowledgedUpTo_ < kAcknowledgeEvery) return;
  acknowledgedUpTo_ = processed_;
  const FrameHeader ack{static_cast<uint8_t>(FrameType::kAck), 0, 0, 0, processed_};
  const iovec piece{const_cast<FrameHeader*>(&ack), sizeof(ack)};
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (!broken() && !failed()) writeLocked(&piece, 1);  // not logged: a re-made socket's resume carries the count
}

void ControlChannel::keepAlive(std::chrono::steady_clock::time_point now, std::chrono::milliseconds interval) {
  if (!resumable_ || broken() || failed()) return;
  std::lock_guard<std::mutex> input(inputMutex_);
  if (now - lastKeepAlive_ < interval) return;
  lastKeepAlive_ = now;
  acknowledgedUpTo_ = processed_;
  const FrameHeader ack{static_cast<uint8_t>(FrameType::kAck), 0, 0, 0, processed_};
  const iovec piece{const_cast<FrameHeader*>(&ack), sizeof(ack)};
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (!broken() && !failed()) writeLocked(&piece, 1);
}

bool ControlChannel::acknowledged(uint32_t processed) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (log_.acknowledge(processed)) return true;
  recordFailure(textf("protocol error: the peer acknowledged control frames up to %u, but %u..%u were sent", processed,
                      log_.first(), log_.next()));
  return false;
}

bool ControlChannel::takeAck(const FrameHeader& frame) {
  if (!resumable_ || frame.type != static_cast<uint8_t>(FrameType::kAck)) return false;
  consume(sizeof(frame));
  (void)acknowledged(static_cast<uint32_t>(frame.size));  // a bad count is recorded: the caller sees failed()
  return true;
}

bool ControlChannel::sessionListeners(const char* entries, size_t size, size_t connectionNics) {
  std::vector<SocketAddress> targets;
  for (size_t at = 0; at + kSessionEntryBytes <= size; at += kSessionEntryBytes) {
    SocketAddress target;
    memcpy(&target.storage, entries + at, kSessionEntryBytes);
    const sa_family_t family = target.storage.ss_family;
    if (family != AF_INET && family != AF_INET6) {
      recordFailure("protocol error: a session listener of address family " + std::to_string(family));
      return false;
    }
    target.length = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    targets.push_back(target);
  }
  if (targets.empty() || size % kSessionEntryBytes != 0) {
    recordFailure("protocol error: a session frame of " + std::to_string(size) + " bytes");
    return false;
  }
  std::lock_guard<std::mutex> lock(outputMutex_);
  connectionTargets_ = connectionNics == 0 ? targets.size() : std::min(connectionNics, targets.size());
  resumeTargets_ = std::move(targets);
  // Broken before the frame was read (it was still in the old socket's buffer): re-make the socket now.
  if (broken()) {
    service_->reconnect(this, reconnectPlan(brokenSince_ + resume_.limit));
  }
  return true;
}

void ControlChannel::avoidNic(int nic) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  if (nic >= 0 && nic < 64) avoidNics_ |= uint64_t{1} << nic;
}

void ControlChannel::cut(const std::string& why) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  (void)shutdown(fd_.get(), SHUT_RDWR);
  if (!why.empty()) lostLocked(why, FailureKind::kRemote);  // under the same lock: the socket cut is the one lost
}

ReconnectPlan ControlChannel::reconnectPlan(std::chrono::steady_clock::time_point deadline) const {
  return ReconnectPlan{resume_.key, resumeTargets_, resume_.locals, avoidNics_, resume_.stream, deadline};
}

bool ControlChannel::lost(const std::string& why, FailureKind kind) {
  std::lock_guard<std::mutex> lock(outputMutex_);
  return lostLocked(why, kind);
}

bool ControlChannel::lostLocked(const std::string& why, FailureKind kind) {
  if (!resumable_ || failed()) {
    recordFailure(why, kind);
    return false;
  }
  if (broken()) return true;
  const auto now = std::chrono::steady_clock::now();
  brokenSince_ = now;
  lossWhy_ = why;
  deadlineNs_.store(steadyNs(now + resume_.limit), std::memory_order_release);
  broken_.store(true, std::memory_order_release);
  // The sending side re-makes it, once it knows where to: the receiver's kSession frame may still be in the old
  // socket's buffer, and sessionListener() starts the attempt then (or read() fails the channel at the deadline).
  if (resume_.acceptor || resumeTargets_.empty()) return true;
  service_->reconnect(this, reconnectPlan(now + resume_.limit));
  return true;
}

uint32_t ControlChannel::freezeInput() noexcept {
  std::lock_guard<std::mutex> lock(inputMutex_);
  frozen_ = true;
  dropInput();
  return processed_;
}

void ControlChannel::resumed(Fd socket, uint32_t peerProcessed) noexcept {
  try {
    std::scoped_lock lock(inputMutex_, outputMutex_);
    if (failed()) return;
    configureStream(socket.get(), resume_.stream);
    std::vector<char> out;
    if (resume_.acceptor) {
      const FrameHeader answer{static_cast<uint8_t>(FrameType::kResume), 0, 0, 0, processed_};
      const char* bytes = reinterpret_cast<const char*>(&answer);
      out.insert(out.end(), bytes, bytes + sizeof(answer));
    }
    const uint32_t logged = log_.next() - log_.first();
    if (!log_.replayFrom(peerProcessed, &out)) {
      recordFailure(textf("cannot resume the control connection: the peer processed %u of our frames, but frames "
                          "%u..%u are all this side still has", peerProcessed, log_.first(), log_.next()));
      return;
    }
    const uint32_t again = log_.next() - peerProcessed;
    log_.acknowledge(peerProcessed);
    retired_.push_back(std::move(fd_));
    fd_ = std::move(socket);
    readFd_.store(fd_.get(), std::memory_order_release);
    if (!resume_.acceptor) {
      const Route now = routeOf(fd_.get());
      route_.store(static_cast<uint32_t>(now.local + 1) << 16 | static_cast<uint32_t>(now.target),
                   std::memory_order_release);
    }
    dropInput();
    frozen_ = false;
    ++inputGeneration_;
    acknowledgedUpTo_ = processed_;
    output_ = std::move(out);
    outputSent_ = 0;
    const double tookMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - brokenSince_).count();
    const bool wasBroken = broken();
    broken_.store(false, std::memory_order_release);
    deadlineNs_.store(0, std::memory_order_release);
    const uint64_t count = resumes_.fetch_add(1, std::memory_order_relaxed) + 1;
    const std::string what = wasBroken ? textf("broke (%s); re-made %.1f ms later", lossWhy_.c_str(), tookMs)
                                       : std::string("was re-made by the peer");
    SocketAddress local;
    local.length = sizeof(local.storage);
    if (getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&local.storage), &local.length) != 0) local.length = 0;
    RN_WARN("NET/railnet: %s connection with %s: the control connection %s (resume %llu, now %s to %s); %u of %u "
            "unacknowledged frames sent again", direction_, peerName_.c_str(), what.c_str(),
            static_cast<unsigned long long>(count), local.toString().c_str(), peerAddress(fd_.get()).toString().c_str(),
            again, logged);
    if (!resume_.acceptor) watchForClose();
    flushLocked();
  } catch (const std::exception& error) {
    recordFailure(std::string("re-making the control connection: ") + error.what(), FailureKind::kLocal);
  }
}

void ControlChannel::resumeFailed(const std::string& why) noexcept {
  std::lock_guard<std::mutex> lock(outputMutex_);
  recordFailure("the control connection broke (" + lossWhy_ + ") and could not be re-made: " + why);
}

void ControlChannel::peerClosed() noexcept { lost("the peer closed the control connection"); }

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
