// Single-buffer data movement: sizes, zero bytes, short sends, request windows, concurrency (group "data").
#include <algorithm>
#include <chrono>
#include <string>
#include <random>
#include <thread>

#include "comms.h"
#include "harness.h"
#include "transfer.h"

namespace conformance {
namespace {


}  // namespace

TEST_CASE("data", "sizes_small", Scope::PerVersion) {
  const size_t limit = messageLimit(env);
  std::vector<size_t> sizes = {0, 1, 2, 3, 4, 5, 7, 8, 9};
  // Around every power of two up to 4 MiB: the edges of inline, chunking and stream-splitting thresholds.
  for (size_t p = 16; p <= 4 * MiB; p *= 2) {
    sizes.insert(sizes.end(), {p - 1, p, p + 1});
  }
  sizes = clampSizes(sizes, limit);
  LinkedPair pair(*env.net, env.dev);
  runTransfer(*env.net, pair.conn, simplePlan(sizes, 1, 21));
  std::reverse(sizes.begin(), sizes.end());
  runTransfer(*env.net, pair.conn, simplePlan(sizes, 4, 22));
}

TEST_CASE("data", "sizes_large", Scope::PerVersion) {
  const size_t limit = messageLimit(env);
  std::vector<size_t> sizes = clampSizes({8 * MiB, 16 * MiB + 4097, 32 * MiB, 64 * MiB - 3}, limit);
  if (env.heavy) {
    // The biggest messages (>= 256 MiB) run on one version per run: they cost seconds each.
    for (size_t s : {256 * MiB, 512 * MiB + 4097}) {
      if (s < limit) sizes.push_back(s);
    }
  }
  if (limit > 4 * MiB) sizes.push_back(limit);  // exactly the largest allowed size
  if (sizes.empty()) return;                    // --max-size keeps this run small
  LinkedPair pair(*env.net, env.dev);
  runTransfer(*env.net, pair.conn, simplePlan(sizes, 1, 23));
}

TEST_CASE("data", "zero_bytes", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  Plan plan = simplePlan({0, 0, 5, 0, 100000, 0, 0, 8192, 0, 1, 0}, 4, 24);
  // Zero-byte sends into non-empty buffers, and an empty buffer receiving an empty send.
  plan.sends.insert(plan.sends.end(), {{0, 0}, {0, 0}, {0, 3}});
  plan.recvs.insert(plan.recvs.end(), {{{0, 4096}}, {{0, 0}}, {{0, 1 * MiB}}});
  runTransfer(*env.net, pair.conn, plan);
  plan.sendWindow = plan.recvWindow = 1;
  runTransfer(*env.net, pair.conn, plan);
}

TEST_CASE("data", "short_sends", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  std::mt19937_64 rng(25);
  Plan plan;
  plan.seed = 25;
  plan.sendWindow = plan.recvWindow = 8;
  for (int i = 0; i < 300; ++i) {
    const size_t size = randomSize(rng, 1 * MiB);
    plan.sends.push_back({0, size});
    plan.recvs.push_back({{0, size + rng() % (64 * KiB + 1)}});  // the receiver posts more than is sent
  }
  runTransfer(*env.net, pair.conn, plan);
}

TEST_CASE("data", "window32", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  runTransfer(*env.net, pair.conn, randomPlan(1024, 256 * KiB, NCCL_NET_MAX_REQUESTS, 26));
  // Many tiny messages: the latency path, with the full window on both sides.
  runTransfer(*env.net, pair.conn, randomPlan(3000, 64, NCCL_NET_MAX_REQUESTS, 27));
}

TEST_CASE("data", "requests_in_flight", Scope::PerVersion) {
  // 32 irecvs posted before any send exists must all get a request; then 32 isends must all be accepted
  // without the harness testing any request in between.
  NetApi& net = *env.net;
  constexpr int kCount = NCCL_NET_MAX_REQUESTS;
  constexpr size_t kSize = 4 * KiB;
  HostBuffer sendBuffer(kCount * kSize), recvBuffer(kCount * kSize);  // outlive the comms on failure
  LinkedPair pair(net, env.dev);
  Registration sendReg(net, pair.conn.send.get(), sendBuffer.data(), sendBuffer.size());
  Registration recvReg(net, pair.conn.recv.get(), recvBuffer.data(), recvBuffer.size());
  // isend may take a send only once the receiver's clear-to-send has come (verbs), so calls wait on the peer: each
  // gets the harness's wait timeout, counted from when it starts. One 5 s budget for all of them failed under TCG and
  // a parallel build's load (soft-RoCE stage, stop 33), where the whole case takes about 5 s unloaded.
  std::vector<void*> recvs, sends;
  for (int i = 0; i < kCount; ++i) {
    recvs.push_back(
        postRecv(net, pair.conn.recv.get(), recvBuffer.data() + i * kSize, kSize, recvReg.handle(), Deadline()));
  }
  for (int i = 0; i < kCount; ++i) {
    fillPattern(sendBuffer.data() + i * kSize, kSize, 100 + i);
    sends.push_back(
        postSend(net, pair.conn.send.get(), sendBuffer.data() + i * kSize, kSize, 0, sendReg.handle(), Deadline()));
  }
  for (int i = 0; i < kCount; ++i) {
    int size = -1;
    REQUIRE_OK(waitRequest(net, sends[i], &size, Deadline()));
    REQUIRE(size == static_cast<int>(kSize), strf("send %d reported %d bytes", i, size));
    REQUIRE_OK(waitRequest(net, recvs[i], &size, Deadline()));
    REQUIRE(size == static_cast<int>(kSize), strf("receive %d reported %d bytes", i, size));
    REQUIRE(findMismatch(recvBuffer.data() + i * kSize, kSize, 100 + i) == SIZE_MAX,
            strf("receive %d holds the wrong bytes (order not preserved?)", i));
  }
}

TEST_CASE("data", "optional_completion", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  Plan plan = randomPlan(256, 64 * KiB, 8, 28);
  plan.optionalCompletion = true;
  runTransfer(*env.net, pair.conn, plan);
}

TEST_CASE("data", "concurrent_connections", Scope::PerVersion) {
  // Eight connections set up and driven at once, each by its own sender/receiver thread pair.
  constexpr int kConnections = 8;
  ThreadGroup threads;
  for (int c = 0; c < kConnections; ++c) {
    threads.spawn([&env, c] {
      LinkedPair pair(*env.net, env.dev);
      runTransfer(*env.net, pair.conn, randomPlan(200, 256 * KiB, 8, 300 + c));
    });
  }
  threads.join();
}

TEST_CASE("data", "many_connections", Scope::PerVersion) {
  // NCCL opens a connection per channel and peer; maxComms promises many at once. All stay open together. On verbs
  // (the soft-RoCE guest under TCG) a connection's QPs and registrations take about a second to set up, so 16 there;
  // the 1,024-connection trial is group scale's, on TCP.
  const int kConnections = verbsTransport() ? 16 : 64;
  NetContext sendCtx(*env.net, nextCommId());
  NetContext recvCtx(*env.net, nextCommId());
  std::vector<Connection> conns;
  for (int c = 0; c < kConnections; ++c) conns.push_back(connectPair(*env.net, sendCtx.get(), recvCtx.get(), env.dev));
  for (int c = 0; c < kConnections; ++c) {
    runTransfer(*env.net, conns[c], simplePlan({static_cast<size_t>(c), 100000}, 2, 400 + c));
  }
}

TEST_CASE("data", "both_directions", Scope::PerVersion) {
  // Two communicators with a connection each way; each context both listens and connects.
  NetContext a(*env.net, nextCommId());
  NetContext b(*env.net, nextCommId());
  Connection ab = connectPair(*env.net, a.get(), b.get(), env.dev);
  Connection ba = connectPair(*env.net, b.get(), a.get(), env.dev);
  ThreadGroup threads;
  threads.spawn([&] { runTransfer(*env.net, ab, randomPlan(300, 1 * MiB, 8, 31)); });
  threads.spawn([&] { runTransfer(*env.net, ba, randomPlan(300, 1 * MiB, 8, 32)); });
  threads.join();
}

TEST_CASE("data", "register_during_transfer", Scope::PerVersion) {
  // NCCL registers user buffers from its service thread while the progress thread moves data on the comm.
  LinkedPair pair(*env.net, env.dev);
  std::atomic<bool> stop{false};
  std::atomic<bool> stopped{false};
  std::atomic<int> cycles{0};
  auto stopRegistering = [&] {
    stop.store(true);
    while (!stopped.load()) std::this_thread::yield();
  };
  ThreadGroup threads;
  threads.spawn([&] {
    runTransfer(*env.net, pair.conn, randomPlan(400, 2 * MiB, 8, 33), stopRegistering);
    stop.store(true);
  });
  threads.spawn([&] {
    struct Done {
      std::atomic<bool>& flag;
      ~Done() { flag.store(true); }
    } done{stopped};
    HostBuffer scratch(1 * MiB);
    while (!stop.load()) {
      Registration onSend(*env.net, pair.conn.send.get(), scratch.data(), scratch.size());
      Registration onRecv(*env.net, pair.conn.recv.get(), scratch.data() + 8, scratch.size() - 8);
      cycles.fetch_add(1);
    }
  });
  threads.join();
  REQUIRE(cycles.load() > 0, "no registration ran during the transfer");
}

TEST_CASE("data", "delivered_completion", Scope::PerVersionOwnLoad) {
  // RAILNET_SEND_COMPLETION (docs/failover.md): "delivered" completes a send that left on the data streams only on
  // the receiver's done frame, which the helper thread that placed the buffer's last byte sends, whether or not the
  // receiver is testing. So once such a send completes, the receive must be complete at the first test. ("written",
  // the default, completes a send when its bytes are in the kernel, when most of a large message may still be on
  // its way: no such promise, so only its data is checked.) Large messages, and inline ones between: those complete
  // at once either way (their bytes are copied into the control queue).
  const std::vector<size_t> sizes = {64 * MiB, 5, 16 * MiB + 3, 0, 8 * MiB, 2 * MiB + 1};
  constexpr size_t kInlineBytes = 64 * KiB;  // RAILNET_TCP_INLINE_BYTES' default
  for (const char* mode : {"written", "delivered"}) {
    const bool delivered = std::string(mode) == "delivered";
    OwnLoad load(*env.pluginPath, env.version, "RAILNET_SEND_COMPLETION", mode);
    NetApi& net = *load.net;
    LinkedPair pair(net, env.dev);
    for (size_t round = 0; round < sizes.size(); ++round) {
      const size_t size = sizes[round];
      HostBuffer send(std::max<size_t>(size, 1)), recv(std::max<size_t>(size, 1));
      Registration sendReg(net, pair.conn.send.get(), send.data(), send.size());
      Registration recvReg(net, pair.conn.recv.get(), recv.data(), recv.size());
      fillPattern(send.data(), size, 61 + round);
      const Deadline deadline;
      void* rreq = postRecv(net, pair.conn.recv.get(), recv.data(), size, recvReg.handle(), deadline);
      void* sreq = postSend(net, pair.conn.send.get(), send.data(), size, 0, sendReg.handle(), deadline);
      REQUIRE_OK(waitRequest(net, sreq, nullptr, deadline));  // the receiver has not tested yet
      int done = 0, received = -1;
      REQUIRE_OK(net.test(rreq, &done, &received));
      if (delivered && size > kInlineBytes) {
        REQUIRE(done == 1, strf("a delivered send of %zu bytes completed before its receive had every byte", size));
      }
      if (done == 0) REQUIRE_OK(waitRequest(net, rreq, &received, deadline));
      REQUIRE(received == static_cast<int>(size), strf("%s: received %d bytes of %zu", mode, received, size));
      REQUIRE(findMismatch(recv.data(), size, 61 + round) == SIZE_MAX, strf("%s: received bytes differ", mode));
    }
  }
}

}  // namespace conformance
