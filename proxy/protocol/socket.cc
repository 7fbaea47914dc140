#include "proxy/protocol/socket.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "railnet/error.h"
#include "railnet/text.h"
#include "topo/netif.h"

namespace railnet::protocol {

void Fd::reset(int fd) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = fd;
}

std::string SocketAddress::toString() const { return topo::formatAddress(get()); }

uint16_t SocketAddress::port() const {
  if (storage.ss_family == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (storage.ss_family == AF_INET6) return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return 0;
}

bool sameHostAddress(const SocketAddress& a, const SocketAddress& b) {
  if (a.storage.ss_family != b.storage.ss_family) return false;
  if (a.storage.ss_family == AF_INET) {
    return reinterpret_cast<const sockaddr_in*>(&a.storage)->sin_addr.s_addr ==
           reinterpret_cast<const sockaddr_in*>(&b.storage)->sin_addr.s_addr;
  }
  if (a.storage.ss_family == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&a.storage);
    const auto* b6 = reinterpret_cast<const sockaddr_in6*>(&b.storage);
    return memcmp(&a6->sin6_addr, &b6->sin6_addr, sizeof(in6_addr)) == 0 && a6->sin6_scope_id == b6->sin6_scope_id;
  }
  return false;
}

namespace {

void setOption(int fd, int level, int name, int value, const char* what) {
  if (setsockopt(fd, level, name, &value, sizeof(value)) != 0) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: setsockopt(%s=%d) failed: %s", what, value, errnoText(err).c_str());
  }
}

}  // namespace

std::string socketErrorText(int err) {
  std::string text = errnoText(err);
  if (err == EMFILE) {
    rlimit limit{};
    getrlimit(RLIMIT_NOFILE, &limit);
    text += textf(" (this process has all the %llu files open that RLIMIT_NOFILE, ulimit -n, allows; every railnet "
                  "connection holds 1 + RAILNET_TCP_STREAMS sockets at each end: raise the limit or lower the streams)",
                  static_cast<unsigned long long>(limit.rlim_cur));
  } else if (err == ENFILE) {
    text += " (the system-wide file limit, fs.file-max, is reached)";
  }
  return text;
}

Fd listenOn(const SocketAddress& address, SocketAddress* bound) {
  Fd fd(socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: socket() failed: %s", socketErrorText(err).c_str());
  }
  setOption(fd.get(), SOL_SOCKET, SO_REUSEADDR, 1, "SO_REUSEADDR");
  if (bind(fd.get(), address.get(), address.length) != 0) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: bind to %s failed: %s", address.toString().c_str(), errnoText(err).c_str());
  }
  // A deep backlog: every railnet connection opens 1 + streams sockets at once.
  if (::listen(fd.get(), 16384) != 0) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: listen on %s failed: %s", address.toString().c_str(), errnoText(err).c_str());
  }
  bound->length = sizeof(bound->storage);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->length) != 0) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: getsockname failed: %s", errnoText(err).c_str());
  }
  return fd;
}

Fd startConnect(const SocketAddress& address) { return startConnect(address, SocketAddress{}); }

Fd startConnect(const SocketAddress& address, const SocketAddress& local) {
  Fd fd(socket(address.storage.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: socket() failed: %s", socketErrorText(err).c_str());
  }
  // A bound socket would take its ephemeral port at bind(), unique host-wide for that address: 28,232 ports by
  // default, 9 per connection. Deferred to connect(), the kernel may reuse a port for different peers.
  // Best effort: a kernel without it (before 4.2) still connects, with unique ports.
  if (local.length > 0) {
    const int on = 1;
    (void)setsockopt(fd.get(), IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &on, sizeof(on));
  }
  if (local.length > 0 && bind(fd.get(), local.get(), local.length) != 0) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: binding a connection to %s failed: %s", local.toString().c_str(),
         errnoText(err).c_str());
  }
  if (::connect(fd.get(), address.get(), address.length) != 0 && errno != EINPROGRESS) {
    int err = errno;
    fail(ncclSystemError, "NET/railnet: connect to %s failed: %s", address.toString().c_str(),
         errnoText(err).c_str());
  }
  return fd;
}

int connectFinished(int fd, const SocketAddress& peer) {
  pollfd entry{fd, POLLOUT, 0};
  int ready = poll(&entry, 1, 0);
  if (ready == 0) return 0;
  if (ready < 0) {
    int err = errno;
    if (err == EINTR) return 0;
    fail(ncclSystemError, "NET/railnet: poll failed: %s", errnoText(err).c_str());
  }
  int err = 0;
  socklen_t length = sizeof(err);
  if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &length) != 0) err = errno;
  if (err != 0) {
    fail(ncclSystemError, "NET/railnet: connect to %s failed: %s", peer.toString().c_str(), errnoText(err).c_str());
  }
  return 1;
}

void configureStream(int fd, const StreamOptions& options) {
  setOption(fd, IPPROTO_TCP, TCP_NODELAY, 1, "TCP_NODELAY");
  if (options.peerTimeoutMs > 0) {
    // Keepalive only: the peer's kernel answers its probes even while the process is stopped or busy, so only
    // a host or link that is really gone trips it (after about peerTimeoutMs of silence: idle for half of it,
    // then unanswered probes over the other half, up to 5). No TCP_USER_TIMEOUT: it also bounds zero-window
    // probing and unacknowledged data, so it failed live receivers that stopped reading for longer than the
    // timeout (docs/reliability.md, decisions D58); connections with data in flight are the watchdog's
    // lost-host check instead (protocol/host_silence.h, D78).
    const int seconds = std::max(2, options.peerTimeoutMs / 1000);
    const int idleSeconds = seconds / 2;
    const int probeSeconds = std::max(1, (seconds - idleSeconds) / 5);
    const int probes = std::clamp((seconds - idleSeconds) / probeSeconds, 1, 127);
    setOption(fd, SOL_SOCKET, SO_KEEPALIVE, 1, "SO_KEEPALIVE");
    setOption(fd, IPPROTO_TCP, TCP_KEEPIDLE, idleSeconds, "TCP_KEEPIDLE");
    setOption(fd, IPPROTO_TCP, TCP_KEEPINTVL, probeSeconds, "TCP_KEEPINTVL");
    setOption(fd, IPPROTO_TCP, TCP_KEEPCNT, probes, "TCP_KEEPCNT");
  }
  if (options.bufferBytes > 0) {
    setOption(fd, SOL_SOCKET, SO_SNDBUF, options.bufferBytes, "SO_SNDBUF");
    setOption(fd, SOL_SOCKET, SO_RCVBUF, options.bufferBytes, "SO_RCVBUF");
  }
  if (options.notSentLowat > 0) setOption(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, options.notSentLowat, "TCP_NOTSENT_LOWAT");
}

SocketAddress peerAddress(int fd) {
  SocketAddress address;
  address.length = sizeof(address.storage);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address.storage), &address.length) != 0) address.length = 0;
  return address;
}

ssize_t readSome(int fd, void* data, size_t size) {
  for (;;) {
    ssize_t got = recv(fd, data, size, MSG_DONTWAIT);
    if (got > 0) return got;
    if (got == 0) return size == 0 ? 0 : kEndOfStream;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

ssize_t readVector(int fd, const iovec* iov, int count) {
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(iov);
  message.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    ssize_t got = recvmsg(fd, &message, MSG_DONTWAIT);
    if (got > 0) return got;
    if (got == 0) return kEndOfStream;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

ssize_t writeSome(int fd, const void* data, size_t size) {
  for (;;) {
    ssize_t sent = send(fd, data, size, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent >= 0) return sent;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

ssize_t writeVector(int fd, const iovec* iov, int count) {
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(iov);
  message.msg_iovlen = static_cast<size_t>(count);
  for (;;) {
    ssize_t sent = sendmsg(fd, &message, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (sent >= 0) return sent;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
    return -errno;
  }
}

}  // namespace railnet::protocol
