#include "plugin/tools/raw_tcp.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>

namespace railnet::bench {
namespace {

// Blocking calls wake up this often to look at the stall guard (stall or another thread's failure); on a
// moving stream they never time out.
constexpr int kWakeupMs = 200;

void setOption(int fd, int level, int name, const void* value, socklen_t length, const char* what) {
  if (setsockopt(fd, level, name, value, length) != 0) fail("raw TCP: setsockopt(%s): %s", what, strerror(errno));
}

Socket openSocket() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("raw TCP: socket(): %s", strerror(errno));
  return Socket(fd);
}

void configureDataSocket(int fd) {
  int one = 1;
  setOption(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one), "TCP_NODELAY");
  timeval wakeup{0, kWakeupMs * 1000};
  setOption(fd, SOL_SOCKET, SO_SNDTIMEO, &wakeup, sizeof(wakeup), "SO_SNDTIMEO");
  setOption(fd, SOL_SOCKET, SO_RCVTIMEO, &wakeup, sizeof(wakeup), "SO_RCVTIMEO");
}

}  // namespace

// How many messages receiver j has finished: sender j waits on it to stay within the window.
struct RawTcpPeer::Credit {
  std::mutex mutex;
  std::condition_variable changed;
  uint64_t completed = 0;
};

Socket::~Socket() {
  if (fd_ >= 0) close(fd_);
}

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) close(fd_);
    fd_ = other.fd_;
    other.fd_ = -1;
  }
  return *this;
}

RawTcpPeer::RawTcpPeer(int streams, int window, BenchBuffers& buffers, StallGuard& guard)
    : buffers_(buffers), guard_(guard), window_(window) {
  guard.setPhase("raw TCP connect");
  Socket listener = openSocket();
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // any free port
  socklen_t length = sizeof(address);
  if (bind(listener.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener.fd(), streams) != 0 ||
      getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    fail("raw TCP: cannot listen on 127.0.0.1: %s", strerror(errno));
  }
  auto connectPairs = [&](std::vector<Pair>& pairs) {
    pairs.resize(static_cast<size_t>(streams));
    for (Pair& pair : pairs) {
      // Connect, then accept at once: the accept queue then holds exactly this connection.
      pair.sender = openSocket();
      if (connect(pair.sender.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
        fail("raw TCP: connect to 127.0.0.1:%d: %s", ntohs(address.sin_port), strerror(errno));
      }
      int accepted = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
      if (accepted < 0) fail("raw TCP: accept: %s", strerror(errno));
      pair.receiver = Socket(accepted);
      configureDataSocket(pair.sender.fd());
      configureDataSocket(pair.receiver.fd());
    }
  };
  connectPairs(pairs_);
  connectPairs(backPairs_);
}

int RawTcpPeer::streamsFor(size_t size) const noexcept {
  return static_cast<int>(std::min<size_t>(pairs_.size(), std::max<size_t>(size, 1)));
}

void RawTcpPeer::sendAll(int fd, const std::byte* data, size_t size, const char* what) const {
  while (size > 0) {
    ssize_t sent = send(fd, data, size, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      size -= static_cast<size_t>(sent);
      guard_.progressed();
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      guard_.check([&] { return format("%s: send() cannot write (%zu bytes left)", what, size); });
    } else if (sent < 0 && errno != EINTR) {
      fail("%s: send(): %s", what, strerror(errno));
    }
  }
}

void RawTcpPeer::recvAll(int fd, std::byte* data, size_t size, const char* what) const {
  while (size > 0) {
    ssize_t received = recv(fd, data, size, 0);
    if (received > 0) {
      data += received;
      size -= static_cast<size_t>(received);
      guard_.progressed();
    } else if (received == 0) {
      fail("%s: the peer closed the connection (%zu bytes missing)", what, size);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      guard_.check([&] { return format("%s: recv() gets nothing (%zu bytes missing)", what, size); });
    } else if (errno != EINTR) {
      fail("%s: recv(): %s", what, strerror(errno));
    }
  }
}

void RawTcpPeer::addStreamTasks(const std::vector<Pair>& pairs, const HostBuffer& source, HostBuffer& destination,
                                size_t size, uint64_t count, std::vector<std::unique_ptr<Credit>>* credits,
                                std::vector<std::function<void()>>* tasks) {
  const int used = streamsFor(size);
  for (int j = 0; j < used; ++j) {
    credits->push_back(std::make_unique<Credit>());
    Credit& credit = *credits->back();
    const size_t begin = size * static_cast<size_t>(j) / static_cast<size_t>(used);
    const size_t length = size * static_cast<size_t>(j + 1) / static_cast<size_t>(used) - begin;
    const int senderFd = pairs[static_cast<size_t>(j)].sender.fd();
    const int receiverFd = pairs[static_cast<size_t>(j)].receiver.fd();
    std::byte* from = source.data();
    std::byte* to = destination.data();

    tasks->emplace_back([=, this, &credit] {
      for (uint64_t i = 0; i < count; ++i) {
        {
          std::unique_lock lock(credit.mutex);
          while (credit.completed + static_cast<uint64_t>(window_) <= i) {
            credit.changed.wait_for(lock, std::chrono::milliseconds(kWakeupMs));
            guard_.check([&] { return format("raw TCP sender %d: waiting for window credit", j); });
          }
        }
        sendAll(senderFd, from + buffers_.slotOffset(size, i) + begin, length, "raw TCP sender");
      }
    });
    tasks->emplace_back([=, this, &credit] {
      for (uint64_t i = 0; i < count; ++i) {
        recvAll(receiverFd, to + buffers_.slotOffset(size, i) + begin, length, "raw TCP receiver");
        {
          std::lock_guard lock(credit.mutex);
          credit.completed = i + 1;
        }
        credit.changed.notify_one();
      }
    });
  }
}

double RawTcpPeer::stream(size_t size, uint64_t count) {
  std::vector<std::unique_ptr<Credit>> credits;
  std::vector<std::function<void()>> tasks;
  addStreamTasks(pairs_, buffers_.send, buffers_.recv, size, count, &credits, &tasks);
  return runTogether(guard_, tasks);
}

double RawTcpPeer::streamBothWays(size_t size, uint64_t count) {
  std::vector<std::unique_ptr<Credit>> credits;
  std::vector<std::function<void()>> tasks;
  addStreamTasks(pairs_, buffers_.send, buffers_.recv, size, count, &credits, &tasks);
  addStreamTasks(backPairs_, buffers_.echoSend, buffers_.echoRecv, size, count, &credits, &tasks);
  return runTogether(guard_, tasks);
}

double RawTcpPeer::pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) {
  const int initiatorFd = pairs_.front().sender.fd();
  const int echoFd = pairs_.front().receiver.fd();
  halfRttUs->reserve(halfRttUs->size() + count);
  auto initiator = [&] {
    for (uint64_t i = 0; i < count; ++i) {
      double start = now();
      sendAll(initiatorFd, buffers_.send.data(), size, "raw TCP ping send");
      recvAll(initiatorFd, buffers_.echoRecv.data(), size, "raw TCP pong recv");
      halfRttUs->push_back((now() - start) * 1e6 / 2);
    }
  };
  auto echo = [&] {
    for (uint64_t i = 0; i < count; ++i) {
      recvAll(echoFd, buffers_.recv.data(), size, "raw TCP ping recv");
      sendAll(echoFd, buffers_.echoSend.data(), size, "raw TCP pong send");
    }
  };
  return runTogether(guard_, {initiator, echo});
}

}  // namespace railnet::bench
