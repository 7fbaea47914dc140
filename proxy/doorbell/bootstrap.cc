#include "proxy/doorbell/bootstrap.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "proxy/protocol/random.h"
#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::doorbell {

namespace {

constexpr uint32_t kIdMagic = 0x55424452;      // "RDBU"
constexpr uint32_t kHelloMagic = 0x48424452;   // "RDBH"

// The id's bytes: magic, address length, secret, then the root's socket address.
struct IdLayout {
  uint32_t magic;
  uint32_t addressLength;
  uint64_t secret;
  char address[112];
};
static_assert(sizeof(IdLayout) == sizeof(UniqueId), "the id is 128 bytes");

struct Hello {
  uint32_t magic;
  uint32_t rank;
  uint32_t nranks;
  uint32_t blobBytes;
  uint64_t secret;
};

using Clock = std::chrono::steady_clock;

int msLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return left > 0 ? static_cast<int>(left) : 0;
}

// Waits for `events` on fd until the deadline; false on timeout.
bool waitFor(int fd, short events, Clock::time_point deadline) {
  pollfd entry{fd, events, 0};
  for (;;) {
    const int ready = ::poll(&entry, 1, msLeft(deadline));
    if (ready > 0) return true;
    if (ready == 0) return false;
    if (errno != EINTR) fail(ncclSystemError, "NET/railnet: doorbell bootstrap: poll: %s", std::strerror(errno));
  }
}

// Moves exactly `bytes` (false: timeout, or the peer closed: *closed says which).
bool transfer(int fd, char* data, size_t bytes, bool sending, Clock::time_point deadline, bool* closed) {
  *closed = false;
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = sending ? ::send(fd, data + done, bytes - done, MSG_NOSIGNAL) : ::recv(fd, data + done, bytes - done, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0 && !sending) {
      *closed = true;
      return false;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      *closed = true;
      return false;
    }
    if (!waitFor(fd, sending ? POLLOUT : POLLIN, deadline)) return false;
  }
  return true;
}

// transfer(), failing with `what` named.
void transferAll(int fd, void* data, size_t bytes, bool sending, Clock::time_point deadline, const char* what) {
  bool closed = false;
  if (!transfer(fd, static_cast<char*>(data), bytes, sending, deadline, &closed)) {
    fail(closed ? ncclRemoteError : ncclSystemError, "NET/railnet: doorbell bootstrap: %s: %s", what,
         closed ? "the peer closed the connection" : "timed out");
  }
}

void sendAll(int fd, const void* data, size_t bytes, Clock::time_point deadline, const char* what) {
  transferAll(fd, const_cast<void*>(data), bytes, true, deadline, what);
}

void receiveAll(int fd, void* data, size_t bytes, Clock::time_point deadline, const char* what) {
  transferAll(fd, data, bytes, false, deadline, what);
}

IdLayout layoutOf(const UniqueId& id) {
  IdLayout layout;
  std::memcpy(&layout, id.bytes, sizeof(layout));
  if (layout.magic != kIdMagic || layout.addressLength == 0 || layout.addressLength > sizeof(layout.address)) {
    fail(ncclInvalidArgument, "NET/railnet: doorbell: not a unique id made by railnet_doorbell_get_unique_id");
  }
  return layout;
}

}  // namespace

std::unique_ptr<BootstrapRoot> makeUniqueId(const protocol::SocketAddress& address, UniqueId* id) {
  protocol::SocketAddress bound;
  protocol::Fd listen = protocol::listenOn(address, &bound);
  uint64_t secret = 0;
  protocol::randomBytes(&secret, sizeof(secret));  // the kernel's entropy, as the listen handle's secret
  IdLayout layout{};
  layout.magic = kIdMagic;
  layout.secret = secret;
  if (bound.length > sizeof(layout.address)) fail(ncclInternalError, "NET/railnet: doorbell: address too long");
  layout.addressLength = bound.length;
  std::memcpy(layout.address, &bound.storage, bound.length);
  std::memcpy(id->bytes, &layout, sizeof(layout));
  RN_INFO(NCCL_INIT, "NET/railnet: doorbell: unique id names %s", bound.toString().c_str());
  return std::make_unique<BootstrapRoot>(std::move(listen), secret);
}

std::vector<std::vector<char>> allGather(const UniqueId& id, BootstrapRoot* root, int rank, int nranks,
                                         const std::vector<char>& blob, int timeoutMs) {
  const IdLayout layout = layoutOf(id);
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    fail(ncclInvalidArgument, "NET/railnet: doorbell: rank %d of %d ranks", rank, nranks);
  }
  if ((rank == 0) != (root != nullptr)) {
    fail(ncclInvalidUsage, "NET/railnet: doorbell: rank 0 (and only rank 0) passes the root that made the id");
  }
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
  const size_t blobBytes = blob.size();
  std::vector<std::vector<char>> all(static_cast<size_t>(nranks));
  all[static_cast<size_t>(rank)] = blob;

  if (rank != 0) {
    protocol::SocketAddress rootAddress;
    std::memcpy(&rootAddress.storage, layout.address, layout.addressLength);
    rootAddress.length = layout.addressLength;
    protocol::Fd fd = protocol::startConnect(rootAddress);
    while (protocol::connectFinished(fd.get(), rootAddress) == 0) {
      if (!waitFor(fd.get(), POLLOUT, deadline)) {
        fail(ncclSystemError, "NET/railnet: doorbell bootstrap: rank %d: no connection to rank 0 at %s within %d ms",
             rank, rootAddress.toString().c_str(), timeoutMs);
      }
    }
    const Hello hello{kHelloMagic, static_cast<uint32_t>(rank), static_cast<uint32_t>(nranks),
                      static_cast<uint32_t>(blobBytes), layout.secret};
    sendAll(fd.get(), &hello, sizeof(hello), deadline, "sending this rank's hello to rank 0");
    sendAll(fd.get(), blob.data(), blobBytes, deadline, "sending this rank's blob to rank 0");
    for (auto& entry : all) {
      entry.resize(blobBytes);
      receiveAll(fd.get(), entry.data(), blobBytes, deadline, "receiving every rank's blob from rank 0");
    }
    return all;
  }

  // Rank 0: gather, then answer every rank.
  std::vector<protocol::Fd> peers(static_cast<size_t>(nranks));
  int arrived = 1;
  while (arrived < nranks) {
    if (!waitFor(root->fd(), POLLIN, deadline)) {
      std::string missing;
      for (int r = 1; r < nranks; ++r) {
        if (!peers[static_cast<size_t>(r)].valid()) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      fail(ncclSystemError, "NET/railnet: doorbell bootstrap: rank 0 waited %d ms; ranks %s never arrived", timeoutMs,
           missing.c_str());
    }
    sockaddr_storage from{};
    socklen_t fromLength = sizeof(from);
    protocol::Fd fd(::accept4(root->fd(), reinterpret_cast<sockaddr*>(&from), &fromLength, SOCK_NONBLOCK));
    if (!fd.valid()) continue;  // EAGAIN: another thread or a reset connection
    protocol::SocketAddress peer;
    peer.storage = from;
    peer.length = fromLength;
    Hello hello{};
    bool closed = false;
    // A stray connection gets at most a second of rank 0's deadline.
    const auto helloDeadline = std::min(deadline, Clock::now() + std::chrono::seconds(1));
    if (!transfer(fd.get(), reinterpret_cast<char*>(&hello), sizeof(hello), false, helloDeadline, &closed) ||
        hello.magic != kHelloMagic || hello.secret != root->secret()) {
      RN_WARN("NET/railnet: doorbell bootstrap: rejected a connection from %s: not a rank of this id",
              peer.toString().c_str());
      continue;
    }
    if (hello.nranks != static_cast<uint32_t>(nranks) || hello.blobBytes != blobBytes || hello.rank == 0 ||
        hello.rank >= static_cast<uint32_t>(nranks) || peers[hello.rank].valid()) {
      fail(ncclInvalidUsage, "NET/railnet: doorbell bootstrap: %s says rank %u of %u with %u-byte blobs; rank 0 has %d "
           "ranks and %zu-byte blobs%s", peer.toString().c_str(), hello.rank, hello.nranks, hello.blobBytes, nranks,
           blobBytes, hello.rank < static_cast<uint32_t>(nranks) && hello.rank > 0 && peers[hello.rank].valid()
                          ? " (that rank is here already)" : "");
    }
    all[hello.rank].resize(blobBytes);
    receiveAll(fd.get(), all[hello.rank].data(), blobBytes, deadline, "receiving a rank's blob");
    peers[hello.rank] = std::move(fd);
    ++arrived;
  }
  for (int r = 1; r < nranks; ++r) {
    for (const auto& entry : all) {
      sendAll(peers[static_cast<size_t>(r)].get(), entry.data(), blobBytes, deadline, "answering a rank");
    }
  }
  return all;
}

}  // namespace railnet::doorbell
