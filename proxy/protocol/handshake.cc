#include "proxy/protocol/handshake.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>
#include <mutex>

#include "proxy/protocol/random.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::protocol {
namespace {

// A connect in progress. NCCL only lets us keep 128 bytes in the handle, so the handle stores a token and
// the state lives here; a token we never issued is a corrupt or foreign handle, never a pointer we follow.
struct PendingConnect {
  struct Socket {
    Fd fd;
    SocketAddress target;
    bool connected = false;
    Hello hello{};
    size_t sent = 0;
    std::chrono::steady_clock::time_point retryAt{};  // a refused connect of a connection that waits: when again
    size_t nic = 0;                                    // the local NIC its connect leaves from
  };
  PeerInfo peer;
  std::vector<Socket> sockets;  // [0] is the control socket
  std::vector<ListenAddress> remote;
  std::vector<LocalNic> local;
  StreamOptions stream;
  bool standIns = false;  // a fused connection that can fail over: a socket whose NICs cannot connect stands in
  // A single-NIC connection that can move: a connect its NIC refuses (link down, reset) is tried again every
  // kConnectRetryPause until this deadline, as NCCL's own socket connect retries, rather than failing at once.
  std::chrono::steady_clock::time_point retryUntil{};
};

constexpr auto kConnectRetryPause = std::chrono::milliseconds(100);
constexpr auto kConnectRetryLimit = std::chrono::seconds(10);

// Socket i failed to connect (why): true when it will be tried again (a connection that waits, within its time).
bool retryLater(PendingConnect& pending, size_t i, const std::string& why) {
  const auto now = std::chrono::steady_clock::now();
  if (pending.retryUntil == std::chrono::steady_clock::time_point{} || now >= pending.retryUntil) return false;
  PendingConnect::Socket& socket = pending.sockets[i];
  if (pending.peer.whyDown.empty()) {
    pending.peer.whyDown = why;
    RN_INFO(NCCL_NET, "NET/railnet: %s; trying again every %lld ms for up to %lld s", why.c_str(),
            static_cast<long long>(kConnectRetryPause.count()), static_cast<long long>(kConnectRetryLimit.count()));
  }
  socket.fd.reset();
  socket.connected = false;
  socket.sent = 0;
  socket.retryAt = now + kConnectRetryPause;
  return true;
}

// Socket i's connect from local NIC l to the peer's address r. Throws railnet::Error when connect() fails at once.
void startSocket(PendingConnect& pending, size_t i, size_t l, size_t r) {
  PendingConnect::Socket& socket = pending.sockets[i];
  socket.target = pending.remote[r].address;
  socket.connected = false;
  socket.sent = 0;
  socket.nic = l;
  socket.fd.reset();
  socket.fd = startConnect(socket.target, pending.local[l].bind);
  configureStream(socket.fd.get(), pending.stream);
}

// Socket i could not connect (why) over its own pair of NICs, or a stand-in over another pair: that pair's NIC is
// marked down, and the socket goes again over the first pair of NICs not marked down. False when none is left.
bool standIn(PendingConnect& pending, size_t i, const std::string& why) {
  const size_t nics = std::min(pending.local.size(), pending.remote.size());
  if (pending.peer.nicsDownAtConnect == 0) pending.peer.whyDown = why;
  pending.peer.nicsDownAtConnect |= uint64_t{1} << pending.sockets[i].nic;
  for (size_t nic = 0; nic < nics; ++nic) {
    if ((pending.peer.nicsDownAtConnect >> nic & 1) != 0) continue;
    pending.sockets[i].hello.features |= kFeatureStandIn;
    try {
      startSocket(pending, i, nic, nic);
      return true;
    } catch (const Error&) {
      pending.peer.nicsDownAtConnect |= uint64_t{1} << nic;  // this pair fails at once too: the next
    }
  }
  return false;
}

std::mutex gPendingMutex;
std::map<uint64_t, std::unique_ptr<PendingConnect>> gPending;  // guarded by gPendingMutex
uint64_t gNextToken = 0;                                       // guarded by gPendingMutex

std::unique_ptr<PendingConnect> startConnection(const Handle& handle, const ConnectOptions& options) {
  auto pending = std::make_unique<PendingConnect>();
  const std::vector<ListenAddress> remote = handleAddresses(handle);
  pending->peer.peer = remote[0].address;
  pending->peer.controlRail = remote[0].railId;
  pending->peer.nicCount = std::max<int>(1, handle.nicCount);
  const std::vector<LocalNic> local =
      options.nics.empty() ? std::vector<LocalNic>{LocalNic{SocketAddress{}, options.railId}} : options.nics;
  uint64_t connectionId;
  randomBytes(&connectionId, sizeof(connectionId));
  pending->peer.session = SessionKey{connectionId, {handle.secret[0], handle.secret[1]}};
  pending->remote = remote;
  pending->local = local;
  pending->stream = options.stream;
  pending->standIns = (options.features & kFeatureDataFailover) != 0 && local.size() > 1 && remote.size() > 1;
  if ((options.features & kFeatureMove) != 0) pending->retryUntil = std::chrono::steady_clock::now() + kConnectRetryLimit;
  int streams = dataStreamCount(options);
  for (int i = 0; i <= streams; ++i) {
    // Control: NIC 0 to the first address; data stream s: NIC s % local to address s % remote.
    const size_t s = i == 0 ? 0 : static_cast<size_t>(i - 1);
    const LocalNic& from = local[s % local.size()];
    const ListenAddress& to = remote[s % remote.size()];
    if (i > 0) pending->peer.dataRails.push_back(to.railId);
    pending->sockets.emplace_back();
    PendingConnect::Socket& socket = pending->sockets.back();
    socket.nic = s % local.size();
    Hello& hello = socket.hello;
    hello.magic = kHelloMagic;
    hello.version = kWireVersion;
    hello.role = static_cast<uint16_t>(i == 0 ? StreamRole::kControl : StreamRole::kData);
    hello.secret[0] = handle.secret[0];
    hello.secret[1] = handle.secret[1];
    hello.connectionId = connectionId;
    hello.streamIndex = static_cast<uint16_t>(i == 0 ? 0 : i - 1);
    hello.streamCount = static_cast<uint16_t>(streams);
    hello.railId = from.railId;
    hello.nicCount = options.nicCount;
    hello.features = i == 0 ? options.features : 0;
    const bool knownDown = (pending->peer.nicsDownAtConnect >> (s % local.size()) & 1) != 0;
    try {
      if (knownDown) {
        if (!standIn(*pending, static_cast<size_t>(i), pending->peer.whyDown)) {
          fail(ncclSystemError, "NET/railnet: connect to %s failed on every pair of NICs: %s",
               remote[0].address.toString().c_str(), pending->peer.whyDown.c_str());
        }
      } else {
        startSocket(*pending, static_cast<size_t>(i), s % local.size(), s % remote.size());
      }
    } catch (const Error& error) {
      if (knownDown) throw;
      if (!(pending->standIns && standIn(*pending, static_cast<size_t>(i), error.what())) &&
          !retryLater(*pending, static_cast<size_t>(i), error.what())) {
        throw;
      }
    }
  }
  return pending;
}

// True once every socket is connected and its hello written.
bool advance(PendingConnect& pending) {
  bool complete = true;
  for (size_t i = 0; i < pending.sockets.size(); ++i) {
    PendingConnect::Socket& socket = pending.sockets[i];
    if (!socket.fd.valid()) {  // waiting to try its connect again
      complete = false;
      if (std::chrono::steady_clock::now() < socket.retryAt) continue;
      const size_t s = i == 0 ? 0 : i - 1;
      try {
        startSocket(pending, i, s % pending.local.size(), s % pending.remote.size());
      } catch (const Error& error) {
        if (!retryLater(pending, i, error.what())) throw;
      }
      continue;
    }
    if (!socket.connected) {
      int finished = 0;
      try {
        finished = connectFinished(socket.fd.get(), socket.target);
      } catch (const Error& error) {
        // A fused connection that can fail over starts without the NIC that refuses (link down, reset): its sockets
        // stand in over another pair, and the sender takes the NIC out and probes it. A single-NIC one that can move
        // tries again for a while (docs/failover.md).
        if (!(pending.standIns && standIn(pending, i, error.what())) && !retryLater(pending, i, error.what())) throw;
        complete = false;
        continue;
      }
      if (finished == 0) {
        complete = false;
        continue;
      }
      socket.connected = true;
    }
    while (socket.sent < sizeof(Hello)) {
      ssize_t sent = writeSome(socket.fd.get(), reinterpret_cast<const char*>(&socket.hello) + socket.sent,
                               sizeof(Hello) - socket.sent);
      if (sent < 0) {
        fail(ncclSystemError, "NET/railnet: sending hello to %s failed: %s", socket.target.toString().c_str(),
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

int dataStreamCount(const ConnectOptions& options) {
  const int nics = std::max<int>(1, static_cast<int>(options.nics.size()));
  return std::clamp(options.streams * nics, 0, kMaxStreams);
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

HandshakeListener::HandshakeListener(const SocketAddress& address, const ConnectOptions& options, Handle* handle)
    : HandshakeListener(std::vector<ListenAddress>{ListenAddress{address, options.railId}}, options, handle) {}

HandshakeListener::HandshakeListener(const std::vector<ListenAddress>& addresses, const ConnectOptions& options,
                             Handle* handle)
    : options_(options) {
  std::vector<ListenAddress> bound = addresses;
  for (ListenAddress& listening : bound) {
    SocketAddress where;
    listeners_.push_back(listenOn(listening.address, &where));
    listening.address = where;
  }
  address_ = bound.at(0).address;
  randomBytes(secret_, sizeof(secret_));
  memset(handle, 0, sizeof(Handle));
  handle->magic = kHandleMagic;
  handle->version = kWireVersion;
  writeHandleAddresses(handle, bound);
  handle->nicCount = options.nicCount;
  handle->secret[0] = secret_[0];
  handle->secret[1] = secret_[1];
}

void HandshakeListener::reject(Arrival& arrival, const char* why) {
  // A scanner must not flood NCCL's log: the first few rejections each get a WARN, then one per thousand.
  ++rejected_;
  if (rejected_ <= kRejectionsWarned || rejected_ % 1000 == 0) {
    RN_WARN("NET/railnet: rejected a connection from %s to %s: %s%s", arrival.peer.toString().c_str(),
            address_.toString().c_str(), why,
            rejected_ == kRejectionsWarned ? " (further rejections: one WARN per thousand)"
            : rejected_ > kRejectionsWarned ? textf(" (%llu rejected so far)",
                                                    static_cast<unsigned long long>(rejected_)).c_str()
                                            : "");
  }
  arrival.fd.reset();
}

void HandshakeListener::dropOldestArrival(const char* why) {
  reject(arrivals_.front(), why);
  arrivals_.erase(arrivals_.begin());
}

void HandshakeListener::acceptArrivals() {
  for (size_t index = 0; index < listeners_.size(); ++index) acceptArrivals(index);
}

void HandshakeListener::acceptArrivals(size_t index) {
  for (;;) {
    Arrival arrival;
    arrival.listener = index;
    arrival.peer.length = sizeof(arrival.peer.storage);
    int fd = accept4(listeners_[index].get(), reinterpret_cast<sockaddr*>(&arrival.peer.storage),
                     &arrival.peer.length, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      if (errno == ECONNABORTED) continue;
      int err = errno;
      // Out of descriptors while connections without a hello hold some: a batch of those goes (oldest first) and
      // accepting stops for this call, so hellos are read and a completed connection has descriptors left for its
      // comm; a flood of strays cannot fail the job's setup. Only a process out of descriptors for its own
      // connections fails.
      if ((err == EMFILE || err == ENFILE) && !arrivals_.empty()) {
        for (size_t dropped = 0; dropped < kDescriptorReserve && !arrivals_.empty(); ++dropped) {
          dropOldestArrival("out of file descriptors, and it had sent no hello yet");
        }
        return;
      }
      fail(ncclSystemError, "NET/railnet: accept on listener %zu of %s failed: %s", index, address_.toString().c_str(),
           socketErrorText(err).c_str());
    }
    arrival.fd.reset(fd);
    arrival.since = std::chrono::steady_clock::now();
    if (arrivals_.size() >= kMaxArrivals) {
      // Give the waiting ones their chance first: a real connection sends its hello right after connecting.
      std::erase_if(arrivals_, [this](Arrival& waiting) { return readHello(waiting); });
      if (arrivals_.size() >= kMaxArrivals) dropOldestArrival("too many connections without a hello");
    }
    arrivals_.push_back(std::move(arrival));
  }
}

bool HandshakeListener::readHello(Arrival& arrival) {
  while (arrival.helloBytes < sizeof(Hello)) {
    ssize_t got = readSome(arrival.fd.get(), reinterpret_cast<char*>(&arrival.hello) + arrival.helloBytes,
                           sizeof(Hello) - arrival.helloBytes);
    if (got == 0) {
      const auto waited = std::chrono::steady_clock::now() - arrival.since;
      if (waited > options_.strayTimeout) {
        // How long and how much: a peer that sent part of its hello is slow or its path lossy, not a scanner.
        reject(arrival, textf("no hello before RAILNET_STRAY_TIMEOUT_MS (accepted %.1f s ago, %zu of %zu hello bytes "
                              "arrived)", std::chrono::duration<double>(waited).count(), arrival.helloBytes,
                              sizeof(Hello)).c_str());
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
  bool control = arrival.hello.role == static_cast<uint16_t>(StreamRole::kControl);
  const size_t expectedListener = control ? 0 : arrival.hello.streamIndex % listeners_.size();
  if (arrival.listener != expectedListener && (arrival.hello.features & kFeatureStandIn) == 0) {
    reject(arrival, "arrived on another NIC of this fused device than its stream index names");
    return true;
  }
  auto [entry, created] = groups_.try_emplace(arrival.hello.connectionId);
  Group& group = entry->second;
  if (created) {
    group.data.resize(arrival.hello.streamCount);
    group.peer.dataRails.assign(arrival.hello.streamCount, -1);
  }
  if (arrival.hello.streamCount != group.data.size()) {
    reject(arrival, "stream count differs from the rest of its connection");
    return true;
  }
  Fd& place = control ? group.control : group.data[arrival.hello.streamIndex];
  if (place.valid()) {
    reject(arrival, "duplicate stream for its connection");
    return true;
  }
  // Socket options (buffer sizes, keepalive) only once the hello proved the peer knows the secret: a stray's
  // socket keeps the kernel's defaults (docs/security.md).
  configureStream(arrival.fd.get(), options_.stream);
  place = std::move(arrival.fd);
  if (control) {
    group.peer.peer = arrival.peer;
    group.peer.controlRail = arrival.hello.railId;
    group.peer.nicCount = std::max<int>(1, arrival.hello.nicCount);
    group.peer.features = arrival.hello.features & ~kFeatureStandIn;
    group.peer.session = SessionKey{arrival.hello.connectionId, {secret_[0], secret_[1]}};
  } else {
    group.peer.dataRails[arrival.hello.streamIndex] = arrival.hello.railId;
  }
  ++group.present;
  return true;
}

bool HandshakeListener::abandoned(const Group& group) const {
  // Nothing comes on a connection's sockets before it is accepted (the sender waits for clear-to-sends), so any
  // readiness is its end: the connecting process died or gave up, and the rest of its sockets will never come.
  std::vector<pollfd> sockets;
  if (group.control.valid()) sockets.push_back(pollfd{group.control.get(), POLLRDHUP, 0});
  for (const Fd& data : group.data) {
    if (data.valid()) sockets.push_back(pollfd{data.get(), POLLRDHUP, 0});
  }
  if (poll(sockets.data(), sockets.size(), 0) <= 0) return false;
  for (const pollfd& socket : sockets) {
    if ((socket.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) return true;
  }
  return false;
}

void HandshakeListener::dropAbandonedGroups() {
  for (auto it = groups_.begin(); it != groups_.end();) {
    const Group& group = it->second;
    if (group.present == static_cast<int>(group.data.size()) + 1 || !abandoned(group)) {
      ++it;
      continue;
    }
    RN_WARN("NET/railnet: a connection to %s from %s was closed by its peer before all its sockets arrived (%d of "
            "%zu): the connecting process died or gave up; dropped", address_.toString().c_str(),
            group.control.valid() ? group.peer.peer.toString().c_str() : "a peer", group.present,
            group.data.size() + 1);
    it = groups_.erase(it);
  }
}

void HandshakeListener::accept(std::unique_ptr<RecvComm>* comm) {
  acceptArrivals();
  std::erase_if(arrivals_, [this](Arrival& arrival) { return readHello(arrival); });
  dropAbandonedGroups();
  for (auto it = groups_.begin(); it != groups_.end(); ++it) {
    Group& group = it->second;
    if (group.present != static_cast<int>(group.data.size()) + 1) continue;
    *comm = options_.makeRecvComm(std::move(group.control), std::move(group.data), group.peer);
    groups_.erase(it);
    return;
  }
}

}  // namespace railnet::protocol
