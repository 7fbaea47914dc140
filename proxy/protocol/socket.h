// Thin RAII and option helpers over non-blocking TCP sockets.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <string>
#include <utility>

namespace railnet::protocol {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void reset(int fd = -1);

 private:
  int fd_ = -1;
};

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  const sockaddr* get() const { return reinterpret_cast<const sockaddr*>(&storage); }
  std::string toString() const;
  uint16_t port() const;  // host order; 0 for a family other than IPv4/IPv6
};

// The same family and IP (and IPv6 scope), ports aside.
bool sameHostAddress(const SocketAddress& a, const SocketAddress& b);

// A non-blocking listening socket bound to `address` (port 0 picks one); returns the bound address.
// errno's text, and for EMFILE/ENFILE what the limit is, how many are open and what a connection costs, so running
// out of file descriptors reads as what it is (docs/reliability.md, "Limits").
std::string socketErrorText(int err);

Fd listenOn(const SocketAddress& address, SocketAddress* bound);

// Starts a non-blocking connect; the connection completes later (see connectFinished).
Fd startConnect(const SocketAddress& address);
// The same from a given local address (port 0): the socket leaves through that NIC's address.
Fd startConnect(const SocketAddress& address, const SocketAddress& local);

// 1: connected; 0: still in progress; throws on failure.
int connectFinished(int fd, const SocketAddress& peer);

struct StreamOptions {
  int bufferBytes = 0;   // SO_SNDBUF/SO_RCVBUF, 0 keeps auto-tuning
  int notSentLowat = 0;  // TCP_NOTSENT_LOWAT, 0 leaves it
  int peerTimeoutMs = 0; // keepalive: a silent host is declared gone after about this long
};

// TCP_NODELAY, keepalive/user timeout, and the optional buffer settings.
void configureStream(int fd, const StreamOptions& options);

SocketAddress peerAddress(int fd);

// The peer closed its end (reads only).
constexpr ssize_t kEndOfStream = -(1 << 20);

// Non-blocking I/O on hot paths, so plain return codes: bytes moved (>0), 0 for "would block",
// kEndOfStream, or -errno.
ssize_t readSome(int fd, void* data, size_t size);
ssize_t writeSome(int fd, const void* data, size_t size);
ssize_t writeVector(int fd, const struct iovec* iov, int count);
// Scatter read; the iovecs' total must be non-zero (0 means EAGAIN, as for readSome).
ssize_t readVector(int fd, const struct iovec* iov, int count);

}  // namespace railnet::protocol
