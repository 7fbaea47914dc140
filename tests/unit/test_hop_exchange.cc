// The NVLink hop's node-local rendezvous (proxy/staging/hop_exchange.h) without a GPU: naming, who serves, and
// a driver without the cuMem API (the state of a host without libcuda) answered with a reason. The exchange of
// real staging between two processes that each see one GPU runs on the GPU machine ([nvlink-staging-ipc]).
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "proxy/staging/hop_exchange.h"

using railnet::staging::HopExchangeServer;
using railnet::staging::hopExchangeName;
using railnet::staging::hopExchangeServed;
using railnet::staging::ImportedStaging;

namespace {
// Sets NCCL_HOSTID for the scope (the rendezvous key), restoring what was there.
struct HostId {
  explicit HostId(const std::string& id) {
    if (const char* old = getenv("NCCL_HOSTID")) saved = old, had = true;
    setenv("NCCL_HOSTID", id.c_str(), 1);
  }
  ~HostId() { had ? setenv("NCCL_HOSTID", saved.c_str(), 1) : unsetenv("NCCL_HOSTID"); }
  std::string saved;
  bool had = false;
};
const railnet::cuda::DriverApi kNoDriver{};  // every entry point null: no cuMem API
}  // namespace

TEST_CASE("hop exchange names: keyed by NCCL's host id, bus ids in any case", "[hop-exchange]") {
  std::string a, b;
  {
    HostId id("host-a");
    a = hopExchangeName("0000:1B:00.0");
    CHECK(a == hopExchangeName("0000:1b:00.0"));
    CHECK(a.find("0000:1b:00.0") != std::string::npos);
  }
  {
    HostId id("host-b");
    b = hopExchangeName("0000:1b:00.0");
  }
  CHECK(a != b);  // fake hosts of one machine never meet
  CHECK(a.size() < 100);  // fits an abstract socket name
}

TEST_CASE("hop exchange: one server per GPU and host id; gone when it stops", "[hop-exchange]") {
  HostId id("hop-exchange-test-" + std::to_string(getpid()));
  const std::string bus = "0000:42:00.0";
  CHECK(!hopExchangeServed(bus));
  {
    auto server = std::make_unique<HopExchangeServer>(kNoDriver, 0, bus);
    REQUIRE(server->serving());
    CHECK(hopExchangeServed(bus));
    CHECK(hopExchangeServed("0000:42:00.0"));
    CHECK(!hopExchangeServed("0000:43:00.0"));
    HopExchangeServer second(kNoDriver, 0, bus);
    CHECK(!second.serving());  // another process (here: server) serves this GPU already
    {
      HostId other("another-fake-host-" + std::to_string(getpid()));
      CHECK(!hopExchangeServed(bus));
    }
    std::string why;
    CHECK(ImportedStaging::request(kNoDriver, bus, 0, 1 << 20, &why) == nullptr);
    CHECK(why.find("cuMem import API") != std::string::npos);
  }
  CHECK(!hopExchangeServed(bus));
}

namespace {
// The exchange's request and reply as hop_exchange.cc lays them out (this test pins the wire format).
struct WireRequest {
  uint32_t magic = 0x524e4850;
  uint32_t version = 1;
  uint64_t bytes = 0;
};
struct WireReply {
  uint32_t magic;
  int32_t status;
  uint64_t bytes;
  uint32_t hasDmabuf;
  char why[200];
};

int connectToServer(const std::string& bus) {
  int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = hopExchangeName(bus);
  memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&address), length) == 0);
  return fd;
}

// The next message from the server within 5 s: its bytes, or "" when it closed the connection.
std::string nextMessage(int fd) {
  pollfd wait{fd, POLLIN, 0};
  REQUIRE(poll(&wait, 1, 5000) == 1);
  char buffer[512];
  const ssize_t got = recv(fd, buffer, sizeof(buffer), 0);
  REQUIRE(got >= 0);
  return std::string(buffer, static_cast<size_t>(got));
}
}  // namespace

TEST_CASE("hop exchange: a malformed request closes the connection; a refused one says why", "[hop-exchange]") {
  HostId id("hop-exchange-wire-" + std::to_string(getpid()));
  const std::string bus = "0000:44:00.0";
  HopExchangeServer server(kNoDriver, 0, bus);
  REQUIRE(server.serving());
  {
    const int fd = connectToServer(bus);
    REQUIRE(send(fd, "abc", 3, 0) == 3);
    CHECK(nextMessage(fd).empty());  // closed, no reply
    close(fd);
  }
  {
    const int fd = connectToServer(bus);
    WireRequest wrongVersion;
    wrongVersion.version = 9;
    wrongVersion.bytes = 4096;
    REQUIRE(send(fd, &wrongVersion, sizeof(wrongVersion), 0) == static_cast<ssize_t>(sizeof(wrongVersion)));
    CHECK(nextMessage(fd).empty());
    close(fd);
  }
  for (uint64_t bytes : {uint64_t{0}, (uint64_t{1} << 30) + 1, uint64_t{1} << 20}) {
    const int fd = connectToServer(bus);
    WireRequest request;
    request.bytes = bytes;
    REQUIRE(send(fd, &request, sizeof(request), 0) == static_cast<ssize_t>(sizeof(request)));
    const std::string reply = nextMessage(fd);
    REQUIRE(reply.size() == sizeof(WireReply));
    WireReply parsed;
    memcpy(&parsed, reply.data(), sizeof(parsed));
    CHECK(parsed.status != 0);
    parsed.why[sizeof(parsed.why) - 1] = '\0';
    const std::string why = parsed.why;
    INFO(why);
    // Out of range is refused before any CUDA call; in range, this driver has no cuMem API.
    CHECK(why.find(bytes == (uint64_t{1} << 20) ? "cuMem" : "bytes (1 to") != std::string::npos);
    CHECK(nextMessage(fd).empty());  // and the connection is closed after the refusal
    close(fd);
  }
  CHECK(hopExchangeServed(bus));  // the server serves on
}
