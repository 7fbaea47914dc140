// Misuse and hostile input: each must give a non-success ncclResult_t and a WARN, never a crash or a hang
// (group "failure"; the killed-peer cases are in test_peer_death.cc).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

void requireWarning(uint64_t mark, const std::string& after, const std::vector<std::string>& needles = {}) {
  std::string wanted;
  for (const std::string& n : needles) wanted += " \"" + n + "\"";
  REQUIRE(waitForWarning(mark, needles, kWarnGrace),
          "no WARN" + (wanted.empty() ? std::string() : " containing" + wanted) + " was logged after " + after);
}

// connect() may say "not yet" a few times, but must end in an error, never in a comm.
void requireConnectFails(NetApi& net, void* ctx, int dev, ConnHandle& handle, const std::string& what) {
  const uint64_t mark = logMark();
  const Deadline deadline(std::chrono::seconds(10));
  DevComm* devComm = nullptr;
  for (Backoff backoff;; backoff.idle()) {
    REQUIRE(!deadline.expired(), "connect() with " + what + " neither failed nor connected within 10 s");
    void* comm = nullptr;
    const ncclResult_t rc = net.connect(ctx, dev, handle.bytes, &comm, &devComm);
    if (rc != ncclSuccess) break;
    if (comm) {
      Comm guard(&net, Comm::Kind::Send, comm);
      fail(__FILE__, __LINE__, "connect() with " + what + " returned a send comm");
    }
  }
  requireWarning(mark, "connect() with " + what);
}

// A raw TCP client of the listen address in `handle`; reports our own (the stray's) port.
class StraySocket {
 public:
  explicit StraySocket(const ConnHandle& handle) {
    sockaddr_storage target{};
    std::memcpy(&target, handle.bytes + 8, 28);
    fd_ = socket(target.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd_ >= 0, strf("socket(): %s", std::strerror(errno)));
    const socklen_t length = target.ss_family == AF_INET6 ? sizeof(sockaddr_in6) : sizeof(sockaddr_in);
    REQUIRE(::connect(fd_, reinterpret_cast<sockaddr*>(&target), length) == 0,
            strf("cannot reach the listen address: %s", std::strerror(errno)));
    sockaddr_storage self{};
    socklen_t selfLength = sizeof(self);
    getsockname(fd_, reinterpret_cast<sockaddr*>(&self), &selfLength);
    port_ = ntohs(self.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&self)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&self)->sin_port);
  }
  ~StraySocket() { close(fd_); }
  StraySocket(const StraySocket&) = delete;
  StraySocket& operator=(const StraySocket&) = delete;

  int port() const { return port_; }
  void send(const std::vector<uint8_t>& bytes) const {
    REQUIRE(::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size()),
            "could not send the stray bytes");
  }
  // True once the peer closed us (EOF or reset) within `timeout`; any bytes it sends are read and ignored.
  bool waitClosed(std::chrono::milliseconds timeout) const {
    const auto end = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < end) {
      pollfd pfd{fd_, POLLIN, 0};
      if (poll(&pfd, 1, 50) <= 0) continue;
      char buffer[256];
      const ssize_t n = recv(fd_, buffer, sizeof(buffer), 0);
      if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    }
    return false;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// A stray connection to a listen comm that NCCL is accepting on: it must be dropped and reported, and the
// real peer must still get through on the same listen comm.
void strayCase(NetApi& net, int dev, const std::vector<uint8_t>& garbage, std::chrono::milliseconds closeWithin) {
  NetContext sendCtx(net, nextCommId());
  NetContext recvCtx(net, nextCommId());
  ConnHandle handle;
  Comm listener = listenOn(net, recvCtx.get(), dev, &handle);
  const HandleAddress address = handleAddress(handle);
  Connection conn;
  ThreadGroup threads;
  const Deadline deadline(threads.abortFlag());
  // NCCL keeps calling accept while it waits for its peer; the stray arrives meanwhile.
  threads.spawn([&] { conn.recv = acceptLoop(net, listener.get(), deadline); });
  {
    const uint64_t mark = logMark();
    StraySocket stray(handle);
    if (!garbage.empty()) stray.send(garbage);
    REQUIRE(stray.waitClosed(closeWithin), strf("the plugin kept the stray connection from port %d open for %lld ms",
                                                stray.port(), static_cast<long long>(closeWithin.count())));
    requireWarning(mark, "dropping a stray connection", {address.ip, std::to_string(stray.port())});
  }
  conn.send = connectLoop(net, sendCtx.get(), dev, handle, deadline);
  threads.join();
  REQUIRE_OK(listener.close());
  runTransfer(net, conn, simplePlan({0, 1000, 1 << 20}, 2, 91));
}

}  // namespace

TEST_CASE("failure", "bad_device", Scope::PerVersion) {
  NetApi& net = *env.net;
  NetContext ctx(net, nextCommId());
  int ndev = 0;
  REQUIRE_OK(net.devices(&ndev));
  ConnHandle valid;
  Comm listener = listenOn(net, ctx.get(), env.dev, &valid);
  for (int dev : {ndev, -1, ndev + 1000}) {
    const std::string which = strf("dev %d of %d", dev, ndev);
    uint64_t mark = logMark();
    DeviceProps props;
    REQUIRE(net.getProperties(dev, &props) != ncclSuccess, "getProperties(" + which + ") succeeded");
    requireWarning(mark, "getProperties(" + which + ")");

    mark = logMark();
    ConnHandle handle;
    void* listenComm = nullptr;
    const ncclResult_t rc = net.listen(ctx.get(), dev, handle.bytes, &listenComm);
    Comm guard(&net, Comm::Kind::Listen, rc == ncclSuccess ? listenComm : nullptr);
    REQUIRE(rc != ncclSuccess, "listen(" + which + ") succeeded");
    requireWarning(mark, "listen(" + which + ")");

    ConnHandle copy = valid;
    requireConnectFails(net, ctx.get(), dev, copy, "a valid handle but " + which);
  }
}

TEST_CASE("failure", "garbage_handle", Scope::PerVersion) {
  NetApi& net = *env.net;
  NetContext ctx(net, nextCommId());
  std::mt19937_64 rng(env.version);
  ConnHandle random;
  for (uint8_t& b : random.bytes) b = static_cast<uint8_t>(rng());
  requireConnectFails(net, ctx.get(), env.dev, random, "128 random bytes as handle");
  ConnHandle zero;
  requireConnectFails(net, ctx.get(), env.dev, zero, "an all-zero handle");
  // A real listen address behind a wrong magic: the plugin must check the magic, not just dial.
  ConnHandle real;
  Comm listener = listenOn(net, ctx.get(), env.dev, &real);
  real.bytes[0] ^= 0xFF;
  real.bytes[2] ^= 0x5A;
  requireConnectFails(net, ctx.get(), env.dev, real, "a handle whose magic is corrupted");
}

TEST_CASE("failure", "oversized_send", Scope::PerVersion) {
  NetApi& net = *env.net;
  constexpr size_t kPosted = 1024, kSent = 4096;
  HostBuffer sendBuffer(kSent), recvBuffer(kSent);  // outlive the comms
  {
    LinkedPair pair(net, env.dev);
    Registration sendReg(net, pair.conn.send.get(), sendBuffer.data(), kSent);
    Registration recvReg(net, pair.conn.recv.get(), recvBuffer.data(), kSent);
    fillPattern(sendBuffer.data(), kSent, 5);
    const uint64_t mark = logMark();
    std::string sendOutcome, recvOutcome;
    ThreadGroup threads;
    const Deadline deadline(std::chrono::seconds(10));
    threads.spawn([&] {
      void* request = postRecv(net, pair.conn.recv.get(), recvBuffer.data(), kPosted, recvReg.handle(), deadline);
      int received = -1;
      const ncclResult_t rc = waitRequest(net, request, &received, deadline);
      REQUIRE(rc != ncclSuccess, strf("the receiver's request completed successfully (%d bytes) although 4 KiB "
                                      "were sent into 1 KiB; it must fail",
                                      received));
    });
    threads.spawn([&] {
      void* request = nullptr;
      for (Backoff backoff; !request; backoff.idle()) {
        deadline.check("isend of 4 KiB to fail");
        const ncclResult_t rc =
            net.isend(pair.conn.send.get(), sendBuffer.data(), kSent, 0, sendReg.handle(), &request);
        if (rc != ncclSuccess) return;  // failing at isend is fine
      }
      int sent = -1;
      const ncclResult_t rc = waitRequest(net, request, &sent, deadline);
      REQUIRE(rc != ncclSuccess, strf("the 4 KiB send into a 1 KiB receive completed successfully (%d bytes)", sent));
    });
    threads.join();
    requireWarning(mark, "a 4 KiB send into a 1 KiB receive");
  }
  // The failure stays with that connection: a new one works.
  LinkedPair fresh(net, env.dev);
  runTransfer(net, fresh.conn, simplePlan({kPosted, kSent, 0}, 1, 92));
}

TEST_CASE("failure", "stray_garbage", Scope::PerVersion) {
  std::vector<uint8_t> garbage(200);
  std::mt19937 rng(93);
  for (uint8_t& b : garbage) b = static_cast<uint8_t>(rng());
  // Rejected at its hello (200 bytes, none of them a valid one): no timeout is involved.
  strayCase(*env.net, env.dev, garbage, std::chrono::seconds(5));
}

TEST_CASE("failure", "stray_silent", Scope::PerVersionOwnLoad) {
  // A socket that never says a word goes after RAILNET_STRAY_TIMEOUT_MS: a short one, so that the test is short.
  OwnLoad load(*env.pluginPath, env.version, "RAILNET_STRAY_TIMEOUT_MS", kShortStrayTimeoutMs);
  strayCase(*load.net, env.dev, {}, std::chrono::seconds(5));
}

}  // namespace conformance
