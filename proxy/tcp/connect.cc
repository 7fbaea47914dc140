#include "proxy/tcp/connect.h"

#include <netinet/in.h>
#include <sys/random.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::tcp {
namespace {

void randomBytes(void* out, size_t size) {
  auto* bytes = static_cast<char*>(out);
  while (size > 0) {
    ssize_t got = getrandom(bytes, size, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      fail(ncclSystemError, "NET/railnet: getrandom failed: %s", errnoText(err).c_str());
    }
    bytes += got;
    size -= static_cast<size_t>(got);
  }
}

// A connect in progress. NCCL only lets us keep 128 bytes in the handle, so the handle stores a token and
// the state lives here; a token we never issued is a corrupt or foreign handle, never a pointer we follow.
struct PendingConnect {
  struct Socket {
    Fd fd;
    bool connected = false;
    Hello hello{};
    size_t sent = 0;
  };
  SocketAddress peer;
  std::vector<Socket> sockets;  // [0] is the control socket
};

std::mutex gPendingMutex;
std::map<uint64_t, std::unique_ptr<PendingConnect>> gPending;  // guarded by gPendingMutex
uint64_t gNextToken = 0;                                       // guarded by gPendingMutex

std::unique_ptr<PendingConnect> startConnection(const Handle& handle, const ConnectOptions& options) {
  auto pending = std::make_unique<PendingConnect>();
  pending->peer = handleAddress(handle);
  uint64_t connectionId;
  randomBytes(&connectionId, sizeof(connectionId));
  int streams = std::clamp(options.streams, 0, kMaxStreams);
  for (int i = 0; i <= streams; ++i) {
    PendingConnect::Socket socket;
    socket.fd = startConnect(pending->peer);
    configureStream(socket.fd.get(), options.stream);
    Hello& hello = socket.hello;
    hello.magic = kHelloMagic;
    hello.version = kWireVersion;
    hello.role = static_cast<uint16_t>(i == 0 ? StreamRole::kControl : StreamRole::kData);
    hello.secret[0] = handle.secret[0];
    hello.secret[1] = handle.secret[1];
    hello.connectionId = connectionId;
    hello.streamIndex = static_cast<uint16_t>(i == 0 ? 0 : i - 1);
    hello.streamCount = static_cast<uint16_t>(streams);
    hello.railId = options.railId;
    pending->sockets.push_back(std::move(socket));
  }
  return pending;
}

// True once every socket is connected and its hello written.
bool advance(PendingConnect& pending) {
  bool complete = true;
  for (PendingConnect::Socket& socket : pending.sockets) {
    if (!socket.connected) {
      if (connectFinished(socket.fd.get(), pending.peer) == 0) {
        complete = false;
        continue;
      }
      socket.connected = true;
    }
    while (socket.sent < sizeof(Hello)) {
      ssize_t sent = writeSome(socket.fd.get(), reinterpret_cast<const char*>(&socket.hello) + socket.sent,
                               sizeof(Hello) - socket.sent);
      if (sent < 0) {
        fail(ncclSystemError, "NET/railnet: sending hello to %s failed: %s", pending.peer.toString().c_str(),
             errnoText(static_cast<int>(-sent)).c_str());
      }
      if (sent == 0) break;
      socket.sent += static_cast<size_t>(sent);
    }
    complete = complete && socket.sent == sizeof(Hello);
  }
  return complete;
}

}  // namespace

SocketAddress handleAddress(const Handle& handle) {
  if (handle.magic != kHandleMagic) {
    fail(ncclInvalidUsage, "NET/railnet: connect handle is not a railnet TCP handle (magic 0x%08x)", handle.magic);
  }
  if (handle.version != kWireVersion) {
    fail(ncclInvalidUsage, "NET/railnet: connect handle has wire version %u, this railnet speaks %u", handle.version,
         kWireVersion);
  }
  SocketAddress address;
  sa_family_t family;
  memcpy(&family, handle.address, sizeof(family));
  if (family == AF_INET) {
    address.length = sizeof(sockaddr_in);
  } else if (family == AF_INET6) {
    address.length = sizeof(sockaddr_in6);
  } else {
    fail(ncclInvalidUsage, "NET/railnet: connect handle has address family %u", family);
  }
  memcpy(&address.storage, handle.address, address.length);
  return address;
}

void connectStep(Handle* handle, const ConnectOptions& options, std::unique_ptr<SendComm>* comm) {
  std::unique_ptr<PendingConnect> pending;
  {
    std::lock_guard<std::mutex> lock(gPendingMutex);
    if (handle->connectToken != 0) {
      auto found = gPending.find(handle->connectToken);
      if (found == gPending.end()) {
        fail(ncclInvalidUsage, "NET/railnet: connect handle names connection attempt %lu, which railnet does not know",
             static_cast<unsigned long>(handle->connectToken));
      }
      pending = std::move(found->second);
      gPending.erase(found);
    }
  }
  if (!pending) pending = startConnection(*handle, options);
  if (advance(*pending)) {
    std::vector<Fd> data;
    for (size_t i = 1; i < pending->sockets.size(); ++i) data.push_back(std::move(pending->sockets[i].fd));
    *comm = options.makeSendComm(std::move(pending->sockets[0].fd), std::move(data), pending->peer);
    handle->connectToken = 0;
    return;
  }
  std::lock_guard<std::mutex> lock(gPendingMutex);
  if (handle->connectToken == 0) handle->connectToken = ++gNextToken;
  gPending[handle->connectToken] = std::move(pending);
}

TcpListenComm::TcpListenComm(const SocketAddress& address, const ConnectOptions& options, Handle* handle)
    : options_(options) {
  listener_ = listenOn(address, &address_);
  randomBytes(secret_, sizeof(secret_));
  memset(handle, 0, sizeof(Handle));
  handle->magic = kHandleMagic;
  handle->version = kWireVersion;
  memcpy(handle->address, &address_.storage, address_.length);
  handle->secret[0] = secret_[0];
  handle->secret[1] = secret_[1];
}

void TcpListenComm::reject(Arrival& arrival, const char* why) {
  RN_WARN("NET/railnet: rejected a connection from %s to %s: %s", arrival.peer.toString().c_str(),
          address_.toString().c_str(), why);
  arrival.fd.reset();
}

void TcpListenComm::acceptArrivals() {
  for (;;) {
    Arrival arrival;
    arrival.peer.length = sizeof(arrival.peer.storage);
    int fd = accept4(listener_.get(), reinterpret_cast<sockaddr*>(&arrival.peer.storage), &arrival.peer.length,
                     SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      int err = errno;
      fail(ncclSystemError, "NET/railnet: accept on %s failed: %s", address_.toString().c_str(), errnoText(err).c_str());
    }
    arrival.fd.reset(fd);
    configureStream(fd, options_.stream);
    arrival.since = std::chrono::steady_clock::now();
    arrivals_.push_back(std::move(arrival));
  }
}

bool TcpListenComm::readHello(Arrival& arrival) {
  while (arrival.helloBytes < sizeof(Hello)) {
    ssize_t got = readSome(arrival.fd.get(), reinterpret_cast<char*>(&arrival.hello) + arrival.helloBytes,
                           sizeof(Hello) - arrival.helloBytes);
    if (got == 0) {
      if (std::chrono::steady_clock::now() - arrival.since > options_.strayTimeout) {
        reject(arrival, "no hello before RAILNET_STRAY_TIMEOUT_MS");
        return true;
      }
      return false;
    }
    if (got < 0) {
      reject(arrival, got == kEndOfStream ? "closed before its hello" : errnoText(static_cast<int>(-got)).c_str());
      return true;
    }
    arrival.helloBytes += static_cast<size_t>(got);
  }
  if (const char* why = validateHello(arrival.hello, secret_)) {
    reject(arrival, why);
    return true;
  }
  auto [entry, created] = groups_.try_emplace(arrival.hello.connectionId);
  Group& group = entry->second;
  if (created) {
    group.data.resize(arrival.hello.streamCount);
    group.peer = arrival.peer;
  }
  if (arrival.hello.streamCount != group.data.size()) {
    reject(arrival, "stream count differs from the rest of its connection");
    return true;
  }
  bool control = arrival.hello.role == static_cast<uint16_t>(StreamRole::kControl);
  Fd& place = control ? group.control : group.data[arrival.hello.streamIndex];
  if (place.valid()) {
    reject(arrival, "duplicate stream for its connection");
    return true;
  }
  place = std::move(arrival.fd);
  ++group.present;
  return true;
}

void TcpListenComm::accept(std::unique_ptr<RecvComm>* comm) {
  acceptArrivals();
  std::erase_if(arrivals_, [this](Arrival& arrival) { return readHello(arrival); });
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    Group& group = it->second;
    if (group.present != static_cast<int>(group.data.size()) + 1) continue;
    *comm = options_.makeRecvComm(std::move(group.control), std::move(group.data), group.peer);
    groups_.erase(it);
    return;
  }
}

}  // namespace railnet::tcp
