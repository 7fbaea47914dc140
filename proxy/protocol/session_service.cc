#include "proxy/protocol/session_service.h"

#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::protocol {
namespace {

std::mutex gServiceMutex;
std::weak_ptr<SessionService> gService;  // guarded by gServiceMutex

// How long an accepted socket may take to send its resume hello, and how soon a failed attempt is tried again.
constexpr auto kHelloLimit = std::chrono::seconds(2);
constexpr auto kRetryInterval = std::chrono::milliseconds(50);
// Poll at least this often: retries, deadlines and hello timeouts need no event.
constexpr auto kTick = std::chrono::milliseconds(20);
// One try (connect, hello, answer) through one pair of NICs; then the next pair. A dead path's connect would
// otherwise wait for SYN retransmissions, far beyond RAILNET_FAILOVER_RESUME_MS.
constexpr auto kTryLimit = std::chrono::milliseconds(400);

// The same IP (and family), whatever the port.
SocketAddress withoutPort(SocketAddress address) {
  if (address.storage.ss_family == AF_INET) {
    reinterpret_cast<sockaddr_in*>(&address.storage)->sin_port = 0;
  } else {
    reinterpret_cast<sockaddr_in6*>(&address.storage)->sin6_port = 0;
  }
  return address;
}

}  // namespace

std::vector<std::pair<int, int>> reconnectOrder(const ReconnectPlan& plan) {
  const int targets = static_cast<int>(plan.targets.size());
  const int locals = static_cast<int>(plan.locals.size());
  auto avoided = [&](int nic) { return nic >= 0 && nic < 64 && (plan.avoid >> nic & 1) != 0; };
  std::vector<std::pair<int, int>> order;
  if (locals == 0) {
    for (int t = 0; t < targets; ++t) {
      if (!avoided(t)) order.push_back({-1, t});
    }
    for (int t = 0; t < targets; ++t) {
      if (avoided(t)) order.push_back({-1, t});
    }
    return order;
  }
  auto add = [&](bool wantAvoided, bool sameIndex) {
    for (int l = 0; l < locals; ++l) {
      for (int t = 0; t < targets; ++t) {
        if ((l == t) != sameIndex || (avoided(l) || avoided(t)) != wantAvoided) continue;
        order.push_back({l, t});
      }
    }
  };
  add(false, true);
  add(false, false);
  add(true, true);
  add(true, false);
  return order;
}

void SessionService::Attempt::tryNextPair(std::string why, std::chrono::steady_clock::time_point now) {
  lastError = std::move(why);
  fd.reset();
  phase = Phase::kWaiting;
  next = order.empty() ? 0 : (next + 1) % order.size();
  nextTry = next == 0 ? now + kRetryInterval : now;
}

std::shared_ptr<SessionService> SessionService::acquire() {
  std::lock_guard<std::mutex> lock(gServiceMutex);
  std::shared_ptr<SessionService> service = gService.lock();
  if (!service) {
    service = std::make_shared<SessionService>();
    gService = service;
  }
  return service;
}

SessionService::SessionService() : wakeFd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (!wakeFd_.valid()) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: eventfd for the session service failed: %s", errnoText(err).c_str());
  }
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "railnet-session");
}

SessionService::~SessionService() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake();
  thread_.join();
}

void SessionService::wake() {
  const uint64_t one = 1;
  (void)!write(wakeFd_.get(), &one, sizeof(one));
}

SocketAddress SessionService::listenerFor(const SocketAddress& local) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (const Listener& listener : listeners_) {
    if (sameHostAddress(listener.address, local)) return listener.address;
  }
  Listener listener;
  listener.fd = listenOn(withoutPort(local), &listener.address);
  RN_INFO(NCCL_NET, "NET/railnet: session listener on %s (re-made control connections)",
          listener.address.toString().c_str());
  listeners_.push_back(std::move(listener));
  wake();
  return listeners_.back().address;
}

void SessionService::addAcceptor(ResumeEndpoint* endpoint, const SessionKey& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  acceptors_[key.connectionId] = Acceptor{endpoint, key};
}

void SessionService::watch(ResumeEndpoint* endpoint, Fd socket) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    watched_[endpoint] = std::move(socket);
  }
  wake();
}

void SessionService::reconnect(ResumeEndpoint* endpoint, const ReconnectPlan& plan) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    std::erase_if(attempts_, [endpoint](const Attempt& attempt) {
      return attempt.endpoint == endpoint && attempt.rejoinStream < 0;
    });
    watched_.erase(endpoint);
    Attempt attempt{endpoint, plan, ++nextAttemptId_};
    attempt.order = reconnectOrder(plan);
    attempts_.push_back(std::move(attempt));
  }
  wake();
}

void SessionService::rejoin(ResumeEndpoint* endpoint, const ReconnectPlan& plan, int stream, int streams,
                            uint32_t failure) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    Attempt attempt{endpoint, plan, ++nextAttemptId_};
    attempt.order = {{plan.locals.empty() ? -1 : 0, 0}};
    attempt.rejoinStream = stream;
    attempt.frozen = true;  // nothing to freeze: a data stream
    attempt.hello.streamIndex = static_cast<uint16_t>(stream);
    attempt.hello.streamCount = static_cast<uint16_t>(streams);
    attempt.hello.resumeProcessed = failure;
    attempt.plan.deadline = std::min(plan.deadline, std::chrono::steady_clock::now() + kTryLimit);
    attempts_.push_back(std::move(attempt));
  }
  wake();
}

void SessionService::remove(ResumeEndpoint* endpoint) {
  std::unique_lock<std::mutex> lock(mutex_);
  std::erase_if(acceptors_, [endpoint](const auto& entry) { return entry.second.endpoint == endpoint; });
  std::erase_if(attempts_, [endpoint](const Attempt& attempt) { return attempt.endpoint == endpoint; });
  watched_.erase(endpoint);
  idle_.wait(lock, [&] { return busy_ != endpoint; });
}

template <class Call>
void SessionService::callEndpoint(std::unique_lock<std::mutex>& lock, ResumeEndpoint* endpoint, Call&& call) {
  busy_ = endpoint;
  lock.unlock();
  call();
  lock.lock();
  busy_ = nullptr;
  idle_.notify_all();
}

std::chrono::milliseconds SessionService::nextTimeout() const {
  auto timeout = std::chrono::duration_cast<std::chrono::milliseconds>(kTick);
  const auto now = std::chrono::steady_clock::now();
  for (const Attempt& attempt : attempts_) {
    if (attempt.phase == Attempt::Phase::kWaiting) {
      timeout = std::min(timeout, std::chrono::duration_cast<std::chrono::milliseconds>(
                                      std::max(attempt.nextTry - now, std::chrono::steady_clock::duration::zero())));
    }
  }
  return timeout;
}

void SessionService::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  std::vector<pollfd> fds;
  while (!stop_) {
    fds.clear();
    fds.push_back(pollfd{wakeFd_.get(), POLLIN, 0});
    for (const Listener& listener : listeners_) fds.push_back(pollfd{listener.fd.get(), POLLIN, 0});
    for (const Arrival& arrival : arrivals_) fds.push_back(pollfd{arrival.fd.get(), POLLIN, 0});
    for (const Attempt& attempt : attempts_) {
      if (!attempt.fd.valid()) continue;
      const short events = attempt.phase == Attempt::Phase::kAnswer ? POLLIN : POLLOUT;
      fds.push_back(pollfd{attempt.fd.get(), events, 0});
    }
    for (const auto& [endpoint, socket] : watched_) fds.push_back(pollfd{socket.get(), POLLRDHUP, 0});
    const int timeout = static_cast<int>(nextTimeout().count());
    lock.unlock();
    (void)poll(fds.data(), fds.size(), timeout);
    uint64_t drained;
    while (read(wakeFd_.get(), &drained, sizeof(drained)) > 0) {
    }
    lock.lock();
    if (stop_) break;
    // Everything is non-blocking, so each pass simply tries every socket (they are few).
    acceptArrivals(lock);
    for (auto it = arrivals_.begin(); it != arrivals_.end();) {
      it = serveArrival(lock, *it) ? arrivals_.erase(it) : std::next(it);
    }
    stepAttempts(lock);
    checkWatched(lock);
  }
}

void SessionService::acceptArrivals(std::unique_lock<std::mutex>&) {
  for (const Listener& listener : listeners_) {
    for (;;) {
      Arrival arrival;
      arrival.peer.length = sizeof(arrival.peer.storage);
      const int fd = accept4(listener.fd.get(), reinterpret_cast<sockaddr*>(&arrival.peer.storage), &arrival.peer.length,
                             SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;  // EAGAIN, or out of descriptors: the next pass tries again
      arrival.fd.reset(fd);
      arrival.since = std::chrono::steady_clock::now();
      if (arrivals_.size() >= kMaxArrivals) arrivals_.pop_front();
      arrivals_.push_back(std::move(arrival));
    }
  }
}

bool SessionService::serveArrival(std::unique_lock<std::mutex>& lock, Arrival& arrival) {
  auto reject = [&](const char* why) {
    ++rejected_;
    if (rejected_ <= 10 || rejected_ % 1000 == 0) {
      RN_WARN("NET/railnet: session listener rejected a connection from %s: %s", arrival.peer.toString().c_str(), why);
    }
    return true;
  };
  while (arrival.got < sizeof(Hello)) {
    const ssize_t got = readSome(arrival.fd.get(), reinterpret_cast<char*>(&arrival.hello) + arrival.got,
                                 sizeof(Hello) - arrival.got);
    if (got == 0) return std::chrono::steady_clock::now() - arrival.since > kHelloLimit ? reject("no hello in 2 s") : false;
    if (got < 0) return reject(got == kEndOfStream ? "closed before its hello" : "its socket failed before its hello");
    arrival.got += static_cast<size_t>(got);
  }
  const Hello& hello = arrival.hello;
  if (hello.magic != kHelloMagic || hello.version != kWireVersion) return reject("not a railnet resume hello");
  const bool rejoining = hello.role == static_cast<uint16_t>(StreamRole::kRejoin);
  if (hello.role != static_cast<uint16_t>(StreamRole::kResume) && !rejoining) return reject("not a re-made socket");
  auto found = acceptors_.find(hello.connectionId);
  if (found == acceptors_.end()) {
    // The receive comm closed (or never existed): closing the socket tells the sender at once.
    RN_INFO(NCCL_NET, "NET/railnet: session listener: a re-made control socket from %s for a connection this process "
            "no longer has; closed", arrival.peer.toString().c_str());
    return true;
  }
  if (hello.secret[0] != found->second.key.secret[0] || hello.secret[1] != found->second.key.secret[1]) {
    return reject("wrong secret for its connection");
  }
  ResumeEndpoint* endpoint = found->second.endpoint;
  Fd socket = std::move(arrival.fd);
  if (rejoining) {
    const int stream = hello.streamIndex;
    const uint32_t failure = hello.resumeProcessed;
    callEndpoint(lock, endpoint, [&] { endpoint->rejoinedStream(stream, std::move(socket), failure); });
    return true;
  }
  const uint32_t peerProcessed = hello.resumeProcessed;
  callEndpoint(lock, endpoint, [&] { endpoint->resumed(std::move(socket), peerProcessed); });
  return true;
}

void SessionService::stepAttempts(std::unique_lock<std::mutex>& lock) {
  std::vector<uint64_t> ids;
  for (const Attempt& attempt : attempts_) ids.push_back(attempt.id);
  for (uint64_t id : ids) {
    auto it = std::find_if(attempts_.begin(), attempts_.end(), [id](const Attempt& a) { return a.id == id; });
    if (it == attempts_.end()) continue;  // removed during an earlier callback
    Attempt& attempt = *it;
    ResumeEndpoint* endpoint = attempt.endpoint;
    const auto now = std::chrono::steady_clock::now();
    auto retry = [&](std::string why) { attempt.tryNextPair(std::move(why), now); };
    const int rejoinStream = attempt.rejoinStream;
    const uint32_t rejoinFailure = attempt.hello.resumeProcessed;
    auto giveUp = [&](const std::string& why) {
      attempts_.erase(it);
      if (rejoinStream >= 0) {
        callEndpoint(lock, endpoint, [&] { endpoint->rejoinFailed(rejoinStream, rejoinFailure, why); });
      } else {
        callEndpoint(lock, endpoint, [&] { endpoint->resumeFailed(why); });
      }
    };
    if (now >= attempt.plan.deadline || attempt.order.empty()) {
      giveUp(attempt.order.empty() ? std::string("the receiver named no session listener")
                                   : textf("not re-made within its time (%d tries over %zu pairs of NICs; last: %s)",
                                           attempt.tries, attempt.order.size(), attempt.lastError.c_str()));
      continue;
    }
    if (attempt.phase != Attempt::Phase::kWaiting && now >= attempt.tryDeadline) {
      retry(textf("no answer within %lld ms", static_cast<long long>(kTryLimit.count())));
      continue;
    }
    try {
      if (attempt.phase == Attempt::Phase::kWaiting) {
        if (now < attempt.nextTry) continue;
        if (!attempt.frozen) {
          uint32_t processed = 0;
          callEndpoint(lock, endpoint, [&] { processed = endpoint->freezeInput(); });
          it = std::find_if(attempts_.begin(), attempts_.end(), [id](const Attempt& a) { return a.id == id; });
          if (it == attempts_.end()) continue;
          it->frozen = true;
          it->hello.resumeProcessed = processed;
        }
        Attempt& current = *it;
        ++current.tries;
        current.hello.magic = kHelloMagic;
        current.hello.version = kWireVersion;
        current.hello.role = static_cast<uint16_t>(current.rejoinStream >= 0 ? StreamRole::kRejoin : StreamRole::kResume);
        current.hello.secret[0] = current.plan.key.secret[0];
        current.hello.secret[1] = current.plan.key.secret[1];
        current.hello.connectionId = current.plan.key.connectionId;
        current.sent = 0;
        current.got = 0;
        const auto [local, target] = current.order[current.next];
        current.target = current.plan.targets[static_cast<size_t>(target)];
        current.fd = startConnect(current.target, local < 0 ? SocketAddress{} : current.plan.locals[static_cast<size_t>(local)]);
        configureStream(current.fd.get(), current.plan.stream);
        current.phase = Attempt::Phase::kConnecting;
        current.tryDeadline = now + kTryLimit;
      }
      Attempt& current = *it;
      if (current.phase == Attempt::Phase::kConnecting) {
        if (connectFinished(current.fd.get(), current.target) == 0) continue;
        current.phase = Attempt::Phase::kHello;
      }
      if (current.phase == Attempt::Phase::kHello) {
        while (current.sent < sizeof(Hello)) {
          const ssize_t sent = writeSome(current.fd.get(), reinterpret_cast<const char*>(&current.hello) + current.sent,
                                         sizeof(Hello) - current.sent);
          if (sent < 0) {
            retry("sending the resume hello: " + errnoText(static_cast<int>(-sent)));
            break;
          }
          if (sent == 0) break;
          current.sent += static_cast<size_t>(sent);
        }
        if (current.sent < sizeof(Hello)) continue;
        if (current.rejoinStream >= 0) {
          // A data stream: nothing answers; it is the comm's now.
          Fd socket = std::move(current.fd);
          const int stream = current.rejoinStream;
          const uint32_t failure = current.hello.resumeProcessed;  // which failure of its NIC this recovers from
          attempts_.erase(it);
          callEndpoint(lock, endpoint, [&] { endpoint->rejoinedStream(stream, std::move(socket), failure); });
          continue;
        }
        current.phase = Attempt::Phase::kAnswer;
      }
      if (current.phase == Attempt::Phase::kAnswer) {
        // Exactly the answer: the frames sent again follow it on the socket and are the channel's to read.
        bool refused = false;
        while (current.got < sizeof(FrameHeader)) {
          const ssize_t got = readSome(current.fd.get(), reinterpret_cast<char*>(&current.answer) + current.got,
                                       sizeof(FrameHeader) - current.got);
          if (got == 0) break;
          if (got == kEndOfStream) {
            refused = true;
            break;
          }
          if (got < 0) {
            retry("waiting for the resume answer: " + errnoText(static_cast<int>(-got)));
            break;
          }
          current.got += static_cast<size_t>(got);
        }
        if (refused) {
          giveUp("the receiver no longer has this connection (its session listener closed the re-made socket)");
          continue;
        }
        if (current.got < sizeof(FrameHeader) || current.phase != Attempt::Phase::kAnswer) continue;
        if (current.answer.type != static_cast<uint8_t>(FrameType::kResume)) {
          giveUp("protocol error: the resume answer is frame type " + std::to_string(current.answer.type));
          continue;
        }
        Fd socket = std::move(current.fd);
        const auto peerProcessed = static_cast<uint32_t>(current.answer.size);
        attempts_.erase(it);
        callEndpoint(lock, endpoint, [&] { endpoint->resumed(std::move(socket), peerProcessed); });
      }
    } catch (const std::exception& error) {
      auto again = std::find_if(attempts_.begin(), attempts_.end(), [id](const Attempt& a) { return a.id == id; });
      if (again != attempts_.end()) again->tryNextPair(error.what(), std::chrono::steady_clock::now());
    }
  }
}

void SessionService::checkWatched(std::unique_lock<std::mutex>& lock) {
  std::vector<ResumeEndpoint*> closed;
  for (const auto& [endpoint, socket] : watched_) {
    pollfd entry{socket.get(), POLLRDHUP, 0};
    if (poll(&entry, 1, 0) > 0 && (entry.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) closed.push_back(endpoint);
  }
  for (ResumeEndpoint* endpoint : closed) {
    if (watched_.erase(endpoint) == 0) continue;  // removed during an earlier callback
    callEndpoint(lock, endpoint, [&] { endpoint->peerClosed(); });
  }
}

}  // namespace railnet::protocol
