// The protocol's connection pieces on real loopback sockets: the control channel (frames out and in, whose
// fault a failure is) and the handshake (non-blocking listen/connect/accept handing a transport its sockets and
// what it learned of the peer, strays rejected). The comms built from the sockets are the transport's part;
// here they only record what they were given.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "proxy/protocol/control_channel.h"
#include "proxy/protocol/handshake.h"

using namespace railnet::protocol;

namespace {

std::pair<Fd, Fd> socketPair() {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  return {Fd(fds[0]), Fd(fds[1])};
}

SocketAddress loopback() {
  sockaddr_in in{};
  in.sin_family = AF_INET;
  in.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  SocketAddress address;
  memcpy(&address.storage, &in, sizeof(in));
  address.length = sizeof(in);
  return address;
}

// What the handshake handed to a transport's factory.
struct Handed {
  int dataStreams = -1;
  PeerInfo peer;
};

class NoRegistrar final : public railnet::MemoryRegistrar {
 public:
  std::unique_ptr<railnet::MemoryRegion> regMr(void*, size_t, int) override { return nullptr; }
  std::unique_ptr<railnet::MemoryRegion> regMrDmaBuf(void*, size_t, int, uint64_t, int) override { return nullptr; }
};

class HandedSend final : public railnet::SendComm {
 public:
  ncclResult_t isend(void*, size_t, int, railnet::MemoryRegion*, railnet::Request**) noexcept override {
    return ncclInternalError;
  }

 private:
  railnet::MemoryRegistrar& registrar() noexcept override { return registrar_; }
  NoRegistrar registrar_;
};

class HandedRecv final : public railnet::RecvComm {
 public:
  ncclResult_t irecv(int, void**, const size_t*, const int*, railnet::MemoryRegion**,
                     railnet::Request**) noexcept override {
    return ncclInternalError;
  }
  ncclResult_t iflush(int, void**, const int*, railnet::MemoryRegion**, railnet::Request**) noexcept override {
    return ncclInternalError;
  }

 private:
  railnet::MemoryRegistrar& registrar() noexcept override { return registrar_; }
  NoRegistrar registrar_;
};

ConnectOptions optionsRecording(Handed* sent, Handed* received, int streams, uint16_t nicCount) {
  ConnectOptions options;
  options.streams = streams;
  options.railId = 3;
  options.nicCount = nicCount;
  options.strayTimeout = std::chrono::milliseconds(200);
  options.makeSendComm = [sent](Fd, std::vector<Fd> data, const PeerInfo& peer) {
    *sent = Handed{static_cast<int>(data.size()), peer};
    return std::unique_ptr<railnet::SendComm>(new HandedSend());
  };
  options.makeRecvComm = [received](Fd, std::vector<Fd> data, const PeerInfo& peer) {
    *received = Handed{static_cast<int>(data.size()), peer};
    return std::unique_ptr<railnet::RecvComm>(new HandedRecv());
  };
  return options;
}

}  // namespace

TEST_CASE("the control channel carries a frame and its payload, written from two pieces", "[control]") {
  auto [a, b] = socketPair();
  ControlChannel sender(std::move(a), SocketAddress{}, "send");
  ControlChannel receiver(std::move(b), SocketAddress{}, "receive");
  FrameHeader header{static_cast<uint8_t>(FrameType::kInline), 2, 0, 41, 5};
  sender.send(&header, sizeof(header), "hello", 5);
  REQUIRE(sender.flush());
  REQUIRE(receiver.read() == static_cast<ssize_t>(sizeof(header) + 5));
  REQUIRE(receiver.size() == sizeof(header) + 5);
  FrameHeader got;
  memcpy(&got, receiver.data(), sizeof(got));
  CHECK(got.recvId == 41);
  CHECK(got.slot == 2);
  CHECK(memcmp(receiver.data() + sizeof(got), "hello", 5) == 0);
  receiver.consume(sizeof(got) + 5);
  CHECK(receiver.size() == 0);
  CHECK(receiver.read() == 0);  // nothing waiting
}

TEST_CASE("a closed peer reads as end-of-stream, and failures keep the first reason and its kind", "[control]") {
  auto [a, b] = socketPair();
  ControlChannel channel(std::move(a), SocketAddress{}, "receive");
  b.reset();
  CHECK(channel.read() == kEndOfStream);
  CHECK(!channel.failed());  // end-of-stream alone is no failure

  channel.recordFailure("the sender closed the connection");
  channel.recordFailure("a later reason", FailureKind::kLocal);
  CHECK(channel.failed());
  CHECK(channel.failure() == "the sender closed the connection");
  CHECK(channel.reportFailure() == ncclRemoteError);
  CHECK(channel.reportFailure() == ncclRemoteError);  // logged once, reported every time
}

TEST_CASE("socket errors are the peer's or this host's by errno", "[control]") {
  for (int err : {ECONNRESET, EPIPE, ETIMEDOUT, ECONNREFUSED, EHOSTUNREACH}) CHECK(isRemoteErrno(err));
  for (int err : {ENOMEM, EBADF, EINVAL, ENOBUFS}) CHECK(!isRemoteErrno(err));
  auto [a, b] = socketPair();
  ControlChannel local(std::move(a), SocketAddress{}, "send");
  local.recordSocketFailure("control connection", -ENOMEM);
  CHECK(local.reportFailure() == ncclSystemError);
  ControlChannel remote(std::move(b), SocketAddress{}, "send");
  remote.recordSocketFailure("control connection", -ECONNRESET);
  CHECK(remote.reportFailure() == ncclRemoteError);
  CHECK(remote.failure() == "control connection: " + railnet::errnoText(ECONNRESET));
}

TEST_CASE("the handshake connects without blocking and tells each end about the other", "[handshake]") {
  Handed sent, received;
  const ConnectOptions options = optionsRecording(&sent, &received, 3, 2);
  Handle handle;
  HandshakeListener listener(loopback(), options, &handle);
  CHECK(handle.magic == kHandleMagic);
  CHECK(handle.nicCount == 2);
  std::unique_ptr<railnet::SendComm> send;
  std::unique_ptr<railnet::RecvComm> recv;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((!send || !recv) && std::chrono::steady_clock::now() < deadline) {
    if (!send) connectStep(&handle, options, &send);
    if (!recv) listener.accept(&recv);
    if (!send || !recv) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(send);
  REQUIRE(recv);
  CHECK(handle.connectToken == 0);  // the in-progress state is gone once the comm is out
  CHECK(sent.dataStreams == 3);
  CHECK(received.dataStreams == 3);
  CHECK(received.peer.controlRail == 3);
  CHECK(received.peer.dataRails == std::vector<int16_t>{3, 3, 3});
  CHECK(received.peer.nicCount == 2);
  CHECK(sent.peer.nicCount == 2);
}

TEST_CASE("a connection with the wrong secret, or one that never says hello, is rejected", "[handshake]") {
  Handed sent, received;
  const ConnectOptions options = optionsRecording(&sent, &received, 1, 0);
  Handle handle;
  HandshakeListener listener(loopback(), options, &handle);
  Handle forged = handle;
  forged.secret[0] ^= 1;
  std::unique_ptr<railnet::SendComm> send;
  std::unique_ptr<railnet::RecvComm> recv;
  // The forging side finishes its own connect (it cannot tell), but the listener never hands out a comm.
  Fd silent = startConnect(handleAddresses(handle)[0].address);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(600);
  while (std::chrono::steady_clock::now() < until) {
    if (!send) connectStep(&forged, options, &send);
    listener.accept(&recv);
    REQUIRE(!recv);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CHECK(send);
  CHECK(received.dataStreams == -1);  // the factory never ran
}

TEST_CASE("a connect token railnet never issued is a corrupt handle", "[handshake]") {
  Handed sent, received;
  const ConnectOptions options = optionsRecording(&sent, &received, 1, 0);
  Handle handle;
  HandshakeListener listener(loopback(), options, &handle);
  handle.connectToken = 0xfeedface;
  std::unique_ptr<railnet::SendComm> send;
  CHECK_THROWS_AS(connectStep(&handle, options, &send), railnet::Error);
}
