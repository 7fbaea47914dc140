// The NVLink hop's node-local rendezvous (proxy/staging/hop_exchange.h) without a GPU: naming, who serves, and
// a driver without the cuMem API (the state of a host without libcuda) answered with a reason. The exchange of
// real staging between two processes that each see one GPU runs on the GPU machine ([nvlink-staging-ipc]).
#include <catch2/catch.hpp>

#include <cstdlib>
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
