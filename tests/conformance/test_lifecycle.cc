// Teardown and lifetime: closing with requests in flight, several communicators, dlclose/reopen cycles
// (group "lifecycle").
#include <random>
#include <thread>

#include "comms.h"
#include "harness.h"
#include "transfer.h"

namespace conformance {
namespace {

constexpr size_t kChunk = 1 << 20;
constexpr int kRequests = NCCL_NET_MAX_REQUESTS;
constexpr auto kCloseLimit = std::chrono::seconds(10);

// close() must return (success or an error, but promptly).
void closeWithin(Comm& comm, const char* what) {
  const auto start = std::chrono::steady_clock::now();
  (void)comm.close();
  REQUIRE(std::chrono::steady_clock::now() - start < kCloseLimit, strf("%s took more than 10 s", what));
}

// Posts up to `count` irecvs / isends of kChunk each (taking whatever the plugin accepts right now) and leaves
// them in flight.
void postReceives(NetApi& net, void* comm, uint8_t* base, void* mhandle, int count) {
  for (int i = 0; i < count; ++i) {
    void* data = base + i * kChunk;
    size_t size = kChunk;
    int tag = 0;
    void* request = nullptr;
    REQUIRE_OK(net.irecv(comm, 1, &data, &size, &tag, &mhandle, &request));
  }
}

void postSends(NetApi& net, void* comm, uint8_t* base, void* mhandle, int count) {
  for (int i = 0; i < count; ++i) {
    void* request = nullptr;
    REQUIRE_OK(net.isend(comm, base + i * kChunk, kChunk, 0, mhandle, &request));
  }
}

enum class Posted { Both, ReceivesOnly, SendsOnly };

// One connection with requests abandoned in flight, torn down like NCCL's abort path (deregMr, close).
void abandonInFlight(NetApi& net, int dev, Posted posted, bool recvFirst) {
  HostBuffer sendBuffer(kRequests * kChunk), recvBuffer(kRequests * kChunk);  // outlive the comms
  LinkedPair pair(net, dev);
  {
    Registration sendReg(net, pair.conn.send.get(), sendBuffer.data(), sendBuffer.size());
    Registration recvReg(net, pair.conn.recv.get(), recvBuffer.data(), recvBuffer.size());
    if (posted != Posted::SendsOnly) {
      postReceives(net, pair.conn.recv.get(), recvBuffer.data(), recvReg.handle(), kRequests);
    }
    if (posted != Posted::ReceivesOnly) {
      postSends(net, pair.conn.send.get(), sendBuffer.data(), sendReg.handle(), kRequests);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // let some bytes move
  }
  if (recvFirst) {
    closeWithin(pair.conn.recv, "closeRecv with requests in flight");
    closeWithin(pair.conn.send, "closeSend after its peer closed");
  } else {
    closeWithin(pair.conn.send, "closeSend with requests in flight");
    closeWithin(pair.conn.recv, "closeRecv after its peer closed");
  }
}

}  // namespace

TEST_CASE("lifecycle", "close_inflight", Scope::PerVersion) {
  const struct {
    Posted posted;
    bool recvFirst;
    const char* name;
  } cases[] = {
      {Posted::Both, false, "sends and receives pending, send side closed first"},
      {Posted::Both, true, "sends and receives pending, receive side closed first"},
      {Posted::ReceivesOnly, false, "only receives pending"},
      {Posted::SendsOnly, true, "only sends attempted"},
  };
  for (const auto& c : cases) {
    try {
      abandonInFlight(*env.net, env.dev, c.posted, c.recvFirst);
    } catch (const TestFailure& e) {
      throw TestFailure(std::string(c.name) + ": " + e.what());
    }
  }
  // The plugin is still healthy afterwards.
  LinkedPair pair(*env.net, env.dev);
  runTransfer(*env.net, pair.conn, simplePlan({0, 4096, kChunk}, 2, 101));
}

TEST_CASE("lifecycle", "multi_context", Scope::PerVersion) {
  // Three communicators in a ring, driven at once; one is finalized while the others live on.
  NetApi& net = *env.net;
  auto a = std::make_unique<NetContext>(net, nextCommId());
  auto b = std::make_unique<NetContext>(net, nextCommId());
  auto c = std::make_unique<NetContext>(net, nextCommId());
  {
    Connection ab = connectPair(net, a->get(), b->get(), env.dev);
    Connection bc = connectPair(net, b->get(), c->get(), env.dev);
    Connection ca = connectPair(net, c->get(), a->get(), env.dev);
    ThreadGroup threads;
    threads.spawn([&] { runTransfer(net, ab, simplePlan({1, 70000, 3 << 20}, 2, 111)); });
    threads.spawn([&] { runTransfer(net, bc, simplePlan({0, 9000, 1 << 20}, 2, 112)); });
    threads.spawn([&] { runTransfer(net, ca, simplePlan({65536, 5, 2 << 20}, 2, 113)); });
    threads.join();
    REQUIRE_OK(ab.send.close());
    REQUIRE_OK(ab.recv.close());
    REQUIRE_OK(bc.send.close());
    REQUIRE_OK(bc.recv.close());
    Connection stillUp = std::move(ca);
    b->finalize();
    b.reset();
    runTransfer(net, stillUp, simplePlan({12345}, 1, 114));
  }
  auto d = std::make_unique<NetContext>(net, nextCommId());
  Connection da = connectPair(net, d->get(), a->get(), env.dev);
  runTransfer(net, da, simplePlan({777, 0}, 1, 115));
  REQUIRE_OK(da.send.close());
  REQUIRE_OK(da.recv.close());
  a->finalize();
  d->finalize();
  c->finalize();
}

TEST_CASE("lifecycle", "reload_cycles", Scope::PerVersionOwnLoad) {
  // NCCL dlcloses the plugin when its last communicator goes away and dlopens it again for the next one.
  const int baseline = startupThreadCount();
  auto waitForThreads = [baseline](const char* when) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    int now = threadCount();
    while (now > baseline && std::chrono::steady_clock::now() < end) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      now = threadCount();
    }
    if (now <= baseline) return;
    std::string names;
    for (const std::string& name : threadNames()) names += " " + name;
    const bool mapped = isMapped(options().plugin);
    fail(__FILE__, __LINE__,
         strf("%s: %d threads remain (%s ), %d before the plugin was first loaded%s", when, now, names.c_str(),
              baseline, mapped ? "; the library is still mapped (dlclose did not unload it)" : ""));
  };
  waitForThreads("after the shared load was dlclosed");
  for (int cycle = 0; cycle < 3; ++cycle) {
    {
      PluginLibrary library(options().plugin);
      std::unique_ptr<NetApi> net = openApi(library, env.version);
      REQUIRE(net != nullptr, "symbol vanished on reload");
      for (int i = 0; i < 2; ++i) NetContext(*net, nextCommId()).finalize();  // init/finalize with no traffic
      NetContext sendCtx(*net, nextCommId());
      NetContext recvCtx(*net, nextCommId());
      {
        Connection conn = connectPair(*net, sendCtx.get(), recvCtx.get(), env.dev);
        std::mt19937_64 rng(120 + cycle);
        std::vector<size_t> sizes;
        for (int i = 0; i < 50; ++i) sizes.push_back(randomSize(rng, 4 << 20));
        runTransfer(*net, conn, simplePlan(sizes, 4, 120 + cycle));
        REQUIRE_OK(conn.send.close());
        REQUIRE_OK(conn.recv.close());
      }
      sendCtx.finalize();
      recvCtx.finalize();
    }
    waitForThreads(strf("after dlclose in cycle %d", cycle + 1).c_str());
  }
}

}  // namespace conformance
