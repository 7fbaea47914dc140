// A peer process dies (SIGKILL) mid-transfer: the surviving side's requests must fail within 2 s, with a WARN
// naming the peer (group "failure").
#include <algorithm>
#include <cstdlib>
#include <functional>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "child.h"
#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

constexpr size_t kMessage = 16 << 20;  // large enough that a kill lands mid-message
constexpr auto kDetectLimit = std::chrono::milliseconds(2000);
constexpr auto kGiveUp = std::chrono::seconds(10);

using Clock = std::chrono::steady_clock;
// Posts one request; ncclSuccess with *request == NULL means "not yet".
using PostFn = std::function<ncclResult_t(void** request)>;

// Posts with retries until there is a request (or an error).
ncclResult_t postWithRetry(const PostFn& post, void** request, const Deadline& deadline) {
  *request = nullptr;
  for (Backoff backoff;; backoff.idle()) {
    deadline.check("a request to be posted");
    const ncclResult_t rc = post(request);
    if (rc != ncclSuccess || *request) return rc;
  }
}

// Moves `count` complete messages to prove the connection works before the kill.
void warmUp(NetApi& net, const PostFn& post, int count) {
  const Deadline deadline;
  for (int i = 0; i < count; ++i) {
    void* request = nullptr;
    REQUIRE_OK(postWithRetry(post, &request, deadline));
    int sizes[8] = {};
    REQUIRE_OK(waitRequest(net, request, sizes, deadline));
  }
}

// With `pending` in flight, kills the child, then keeps testing (and re-posting once a request completes)
// until the plugin reports an error. Returns how long that took, or nothing within kGiveUp; *code is the error.
std::optional<Clock::duration> timeToError(NetApi& net, const PostFn& post, void* pending, ChildProcess& child,
                                           ncclResult_t* code) {
  const Clock::time_point killedAt = Clock::now();
  child.kill();
  void* request = pending;
  for (Backoff backoff; Clock::now() - killedAt < kGiveUp; backoff.idle()) {
    ncclResult_t rc;
    if (!request) {
      rc = post(&request);
    } else {
      int done = 0;
      int sizes[8] = {};
      rc = net.test(request, &done, sizes);
      if (rc == ncclSuccess && done) request = nullptr;  // completed before the kill took effect: go again
    }
    if (rc != ncclSuccess) {
      *code = rc;
      return Clock::now() - killedAt;
    }
  }
  return std::nullopt;
}

void requirePromptFailure(const std::optional<Clock::duration>& took, ncclResult_t code, uint64_t mark,
                          const char* side) {
  REQUIRE(took.has_value(), strf("the %s never failed within 10 s of the peer's SIGKILL", side));
  // NCCL's own transports report a dead peer as a remote error ("remote process exited or there was a network
  // error"), not as a local system error.
  REQUIRE(code == ncclRemoteError, strf("the %s failed with %s, not ncclRemoteError", side, ncclResultName(code)));
  const long long ms = std::chrono::duration_cast<std::chrono::milliseconds>(*took).count();
  REQUIRE(*took <= kDetectLimit,
          strf("the %s failed %lld ms after the peer's SIGKILL; the limit is 2000 ms", side, ms));
  // Over lo the peer is 127.0.0.1; in the soft-RoCE guest, connections meet on the RoCE port's address.
  const char* rxeIp = getenv("RAILNET_RXE_IP");
  const std::string peer = rxeIp != nullptr ? rxeIp : "127.0.0.1";
  REQUIRE(waitForWarning(mark, {peer}, std::chrono::milliseconds(500)),
          strf("the %s failed but no WARN names the peer %s", side, peer.c_str()));
}

}  // namespace

TEST_CASE("failure", "killed_sender", Scope::PerVersion) {
  NetApi& net = *env.net;
  HostBuffer buffer(kMessage);  // outlives the comm
  NetContext ctx(net, nextCommId());
  std::unique_ptr<ChildProcess> sender;
  Comm recv = acceptFromChildSender(net, ctx.get(), env.version, env.dev, kMessage, &sender);
  ChildProcess& child = *sender;
  Registration reg(net, recv.get(), buffer.data(), kMessage);
  const PostFn post = [&](void** request) {
    void* data = buffer.data();
    size_t size = kMessage;
    int tag = 0;
    void* mhandle = reg.handle();
    return net.irecv(recv.get(), 1, &data, &size, &tag, &mhandle, request);
  };
  warmUp(net, post, 2);
  void* pending = nullptr;
  REQUIRE_OK(postWithRetry(post, &pending, Deadline()));
  const uint64_t mark = logMark();
  ncclResult_t code = ncclSuccess;
  const std::optional<Clock::duration> took = timeToError(net, post, pending, child, &code);
  requirePromptFailure(took, code, mark, "receiver's irecv");
  // Teardown as NCCL's abort does it: deregMr, then close, on the broken comm.
}

TEST_CASE("failure", "killed_receiver", Scope::PerVersion) {
  NetApi& net = *env.net;
  HostBuffer buffer(kMessage);  // outlives the comm
  fillPattern(buffer.data(), kMessage, 3);
  NetContext ctx(net, nextCommId());
  ChildProcess child(childReceiverArgs(env.version, env.dev, kMessage));
  Comm send = connectToChildReceiver(net, ctx.get(), env.dev, child);
  Registration reg(net, send.get(), buffer.data(), kMessage);
  const PostFn post = [&](void** request) {
    return net.isend(send.get(), buffer.data(), kMessage, 0, reg.handle(), request);
  };
  warmUp(net, post, 2);
  void* pending = nullptr;
  REQUIRE_OK(postWithRetry(post, &pending, Deadline()));
  const uint64_t mark = logMark();
  ncclResult_t code = ncclSuccess;
  const std::optional<Clock::duration> took = timeToError(net, post, pending, child, &code);
  requirePromptFailure(took, code, mark, "sender's isend");
}

// The kill lands at random points (issue 11): the child receives or sends (alternating), messages of 4 KiB (inline on
// TCP), 256 KiB or 16 MiB, after 0-3 completed messages, 0-30 ms after the pending request was posted (before its
// clear-to-send, mid-message, or between chunks). Every trial must fail its pending request within 2 s, naming the
// peer. RAILNET_TEST_KILL_TRIALS trials (3 in CI; the campaign in docs/reliability.md ran 60).
TEST_CASE("failure", "killed_at_random", Scope::PerVersion) {
  if (!env.heavy) SKIP("runs on the newest version only");
  NetApi& net = *env.net;
  const char* set = std::getenv("RAILNET_TEST_KILL_TRIALS");
  const int trials = set != nullptr ? std::atoi(set) : 3;
  // CI's few trials repeat the same points; a campaign (more than 3) draws new ones every run.
  std::mt19937_64 rng(trials > 3 ? std::random_device()() : 11);
  const size_t sizes[] = {4096, 256 << 10, kMessage};
  std::vector<long long> detectMs;
  for (int trial = 0; trial < trials; ++trial) {
    const bool childSends = trial % 2 == 0;
    const size_t size = sizes[rng() % 3];
    const int warm = static_cast<int>(rng() % 4);
    const auto delay = std::chrono::microseconds(rng() % 30000);
    HostBuffer buffer(size);
    fillPattern(buffer.data(), size, 3);
    NetContext ctx(net, nextCommId());
    std::unique_ptr<ChildProcess> child;
    Comm comm;
    if (childSends) {
      comm = acceptFromChildSender(net, ctx.get(), env.version, env.dev, size, &child);
    } else {
      child = std::make_unique<ChildProcess>(childReceiverArgs(env.version, env.dev, size));
      comm = connectToChildReceiver(net, ctx.get(), env.dev, *child);
    }
    Registration reg(net, comm.get(), buffer.data(), size);
    const PostFn post = [&](void** request) {
      if (!childSends) return net.isend(comm.get(), buffer.data(), size, 0, reg.handle(), request);
      void* data = buffer.data();
      size_t bytes = size;
      int tag = 0;
      void* mhandle = reg.handle();
      return net.irecv(comm.get(), 1, &data, &bytes, &tag, &mhandle, request);
    };
    warmUp(net, post, warm);
    void* pending = nullptr;
    REQUIRE_OK(postWithRetry(post, &pending, Deadline()));
    std::this_thread::sleep_for(delay);
    const uint64_t mark = logMark();
    ncclResult_t code = ncclSuccess;
    const std::optional<Clock::duration> took = timeToError(net, post, pending, *child, &code);
    const std::string what = strf("trial %d (%s of %zu bytes after %d messages, killed %lld us after posting)", trial,
                                  childSends ? "receive" : "send", size, warm, static_cast<long long>(delay.count()));
    try {
      requirePromptFailure(took, code, mark, what.c_str());
    } catch (const TestFailure& e) {
      throw TestFailure(what + ": " + e.what());
    }
    detectMs.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(*took).count());
  }
  if (!detectMs.empty()) {
    std::sort(detectMs.begin(), detectMs.end());
    note(strf("%d kills: every pending request failed with ncclRemoteError naming the peer; detection median %lld ms, "
              "max %lld ms", trials, detectMs[detectMs.size() / 2], detectMs.back()));
  }
}

}  // namespace conformance
