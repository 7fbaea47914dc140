#include "plugin/tools/socket_pairs.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace railnet::bench {
namespace {

void setOption(int fd, int level, int name, const void* value, socklen_t length, const char* what,
               const char* label) {
  if (setsockopt(fd, level, name, value, length) != 0) fail("%s: setsockopt(%s): %s", label, what, strerror(errno));
}

Socket openSocket(const char* label) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) fail("%s: socket(): %s", label, strerror(errno));
  return Socket(fd);
}

void configureDataSocket(int fd, const char* label) {
  int one = 1;
  setOption(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one), "TCP_NODELAY", label);
  timeval wakeup{0, kWakeupMs * 1000};
  setOption(fd, SOL_SOCKET, SO_SNDTIMEO, &wakeup, sizeof(wakeup), "SO_SNDTIMEO", label);
  setOption(fd, SOL_SOCKET, SO_RCVTIMEO, &wakeup, sizeof(wakeup), "SO_RCVTIMEO", label);
}

}  // namespace

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

std::vector<SocketPair> connectLoopbackPairs(int count, const char* label) {
  Socket listener = openSocket(label);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;  // any free port
  socklen_t length = sizeof(address);
  if (bind(listener.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      listen(listener.fd(), count) != 0 ||
      getsockname(listener.fd(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    fail("%s: cannot listen on 127.0.0.1: %s", label, strerror(errno));
  }
  std::vector<SocketPair> pairs(static_cast<size_t>(count));
  for (SocketPair& pair : pairs) {
    // Connect, then accept at once: the accept queue then holds exactly this connection.
    pair.sender = openSocket(label);
    if (connect(pair.sender.fd(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
      fail("%s: connect to 127.0.0.1:%d: %s", label, ntohs(address.sin_port), strerror(errno));
    }
    int accepted = accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (accepted < 0) fail("%s: accept: %s", label, strerror(errno));
    pair.receiver = Socket(accepted);
    configureDataSocket(pair.sender.fd(), label);
    configureDataSocket(pair.receiver.fd(), label);
  }
  return pairs;
}

void sendAll(StallGuard& guard, int fd, const std::byte* data, size_t size, const char* what) {
  while (size > 0) {
    ssize_t sent = send(fd, data, size, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      size -= static_cast<size_t>(sent);
      guard.progressed();
    } else if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      guard.check([&] { return format("%s: send() cannot write (%zu bytes left)", what, size); });
    } else if (sent < 0 && errno != EINTR) {
      fail("%s: send(): %s", what, strerror(errno));
    }
  }
}

void recvAll(StallGuard& guard, int fd, std::byte* data, size_t size, const char* what,
             const std::function<bool()>& whileEmpty) {
  bool peek = static_cast<bool>(whileEmpty);  // read without blocking first while there may be other work
  while (size > 0) {
    ssize_t received = recv(fd, data, size, peek ? MSG_DONTWAIT : 0);
    if (received > 0) {
      data += received;
      size -= static_cast<size_t>(received);
      guard.progressed();
      peek = static_cast<bool>(whileEmpty);
    } else if (received == 0) {
      fail("%s: the peer closed the connection (%zu bytes missing)", what, size);
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (peek) {
        peek = whileEmpty();  // nothing else to do: the next read blocks
      } else {
        guard.check([&] { return format("%s: recv() gets nothing (%zu bytes missing)", what, size); });
      }
    } else if (errno != EINTR) {
      fail("%s: recv(): %s", what, strerror(errno));
    }
  }
}

void MessageCredit::waitToStart(uint64_t message, int window, const StallGuard& guard, const char* who) {
  std::unique_lock lock(mutex_);
  while (completed_ + static_cast<uint64_t>(window) <= message) {
    changed_.wait_for(lock, std::chrono::milliseconds(kWakeupMs));
    guard.check([&] { return format("%s: waiting for window credit", who); });
  }
}

bool MessageCredit::allows(uint64_t message, int window) {
  std::lock_guard lock(mutex_);
  return completed_ + static_cast<uint64_t>(window) > message;
}

void MessageCredit::complete(uint64_t completed) {
  {
    std::lock_guard lock(mutex_);
    completed_ = completed;
  }
  changed_.notify_one();
}

}  // namespace railnet::bench
