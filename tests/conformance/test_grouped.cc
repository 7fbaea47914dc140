// Grouped receives (irecv with n buffers, one tag each) and the tag-matching rule under many send orders:
// the k-th send with tag t lands in tag t's buffer of the k-th grouped receive listing t (group "grouped").
#include <algorithm>
#include <map>
#include <random>

#include "comms.h"
#include "harness.h"
#include "transfer.h"

namespace conformance {
namespace {

constexpr int kMaxRecvs = 8;

std::vector<int> allTags(int, std::mt19937_64&) { return {0, 1, 2, 3, 4, 5, 6, 7}; }

// All sends of one tag, then the next tag, in `tagOrder`.
void tagMajor(Plan& plan, const std::vector<int>& tagOrder) {
  interleave(plan, [&](const std::vector<int>& open) {
    for (int t : tagOrder) {
      if (std::find(open.begin(), open.end(), t) != open.end()) return t;
    }
    return open.front();
  });
}

// Within each round of sends, tags in descending order.
void reverseTags(Plan& plan) {
  std::map<int, int> seen;
  std::vector<std::pair<std::pair<int, int>, SendSpec>> keyed;
  for (const SendSpec& s : plan.sends) keyed.push_back({{seen[s.tag]++, -s.tag}, s});
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < keyed.size(); ++i) plan.sends[i] = keyed[i].second;
}

// One peer lags `rounds` receives behind the others.
void laggingPeer(Plan& plan, int slowTag, int rounds) {
  std::map<int, int> seen;
  std::vector<std::pair<int, SendSpec>> keyed;
  for (const SendSpec& s : plan.sends) {
    const int k = seen[s.tag]++;
    keyed.push_back({k + (s.tag == slowTag ? rounds : 0), s});
  }
  std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < keyed.size(); ++i) plan.sends[i] = keyed[i].second;
}

Plan eightTagPlan(int groups, size_t capacity, uint64_t seed, int sendWindow, int recvWindow) {
  Plan plan = groupedPlan(
      groups, allTags, [capacity](int, std::mt19937_64&) { return capacity; }, seed);
  plan.sendWindow = sendWindow;
  plan.recvWindow = recvWindow;
  return plan;
}

}  // namespace

TEST_CASE("grouped", "in_order", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  runTransfer(*env.net, pair.conn, eightTagPlan(16, 64 * KiB, 41, 8, 8));
}

TEST_CASE("grouped", "interleavings", Scope::PerVersion) {
  // NCCL's proxy advances every peer (tag) independently, so any cross-tag order can reach the plugin.
  LinkedPair pair(*env.net, env.dev);
  struct Variant {
    const char* name;
    void (*apply)(Plan&);
  };
  const Variant variants[] = {
      {"tag 3 first, then 1, 7, 0, 5, 2, 6, 4",
       [](Plan& p) {
         tagMajor(p, {3, 1, 7, 0, 5, 2, 6, 4});
       }},
      {"tags descending", [](Plan& p) { reverseTags(p); }},
      {"tag 5 lags two receives", [](Plan& p) { laggingPeer(p, 5, 2); }},
      {"tag 0 runs three receives ahead", [](Plan& p) { laggingPeer(p, 0, -3); }},
      {"random interleaving A", [](Plan& p) { randomInterleave(p, 42); }},
      {"random interleaving B", [](Plan& p) { randomInterleave(p, 43); }},
  };
  uint64_t seed = 50;
  for (const Variant& v : variants) {
    for (int sendWindow : {8, 2}) {
      Plan plan = eightTagPlan(6, 32 * KiB, ++seed, sendWindow, 8);
      v.apply(plan);
      try {
        runTransfer(*env.net, pair.conn, plan);
      } catch (const TestFailure& e) {
        throw TestFailure(strf("%s, send window %d: %s", v.name, sendWindow, e.what()));
      }
    }
  }
}

TEST_CASE("grouped", "tag_subsets", Scope::PerVersion) {
  // Receives list different subsets of 16 peers (n = 1..8), with uneven and zero sizes, in random orders.
  LinkedPair pair(*env.net, env.dev);
  auto subset = [](int, std::mt19937_64& rng) {
    std::vector<int> peers(16);
    for (int i = 0; i < 16; ++i) peers[i] = i * 3 + 1;  // tags are ranks; not necessarily dense
    std::shuffle(peers.begin(), peers.end(), rng);
    peers.resize(1 + rng() % kMaxRecvs);
    return peers;
  };
  auto capacity = [](int, std::mt19937_64& rng) { return randomSize(rng, 256 * KiB); };
  for (uint64_t seed : {61, 62, 63}) {
    Plan plan = groupedPlan(40, subset, capacity, seed);
    plan.sendWindow = 8;
    plan.recvWindow = 8;
    plan.optionalCompletion = true;  // n == 1 receives get the optional-completion preset
    randomInterleave(plan, seed * 7);
    runTransfer(*env.net, pair.conn, plan);
  }
}

TEST_CASE("grouped", "window256", Scope::PerVersion) {
  // A send comm must take 32 x 8 = 256 requests in flight when receives are grouped by 8.
  LinkedPair pair(*env.net, env.dev);
  Plan plan = eightTagPlan(128, 4 * KiB, 71, NCCL_NET_MAX_REQUESTS, NCCL_NET_MAX_REQUESTS);
  runTransfer(*env.net, pair.conn, plan);
  tagMajor(plan, {7, 6, 5, 4, 3, 2, 1, 0});
  runTransfer(*env.net, pair.conn, plan);
}

TEST_CASE("grouped", "requests_in_flight", Scope::PerVersion) {
  // 32 grouped irecvs of 8 posted up front, then 256 isends, none tested until all were accepted.
  NetApi& net = *env.net;
  constexpr int kGroups = NCCL_NET_MAX_REQUESTS;
  constexpr size_t kSize = 2 * KiB;
  constexpr size_t kSends = kGroups * kMaxRecvs;
  HostBuffer sendBuffer(kSends * kSize), recvBuffer(kSends * kSize);  // outlive the comms on failure
  LinkedPair pair(net, env.dev);
  Registration sendReg(net, pair.conn.send.get(), sendBuffer.data(), sendBuffer.size());
  Registration recvReg(net, pair.conn.recv.get(), recvBuffer.data(), recvBuffer.size());
  // isend may take a send only once the receiver's clear-to-send has come (verbs), so calls wait on the peer: each
  // gets the harness's wait timeout, counted from when it starts. One 5 s budget for all of them failed under TCG and
  // a parallel build's load (soft-RoCE stage, stop 33), where the whole case takes about 5 s unloaded.
  auto slot = [&](HostBuffer& b, size_t g, int t) { return b.data() + (g * kMaxRecvs + t) * kSize; };
  std::vector<void*> recvs, sends;
  for (size_t g = 0; g < kGroups; ++g) {
    void* data[kMaxRecvs];
    size_t sizes[kMaxRecvs];
    int tags[kMaxRecvs];
    void* mhandles[kMaxRecvs];
    for (int t = 0; t < kMaxRecvs; ++t) {
      data[t] = slot(recvBuffer, g, t);
      sizes[t] = kSize;
      tags[t] = t;
      mhandles[t] = recvReg.handle();
    }
    recvs.push_back(postRecv(net, pair.conn.recv.get(), kMaxRecvs, data, sizes, tags, mhandles, Deadline()));
  }
  // Receive by receive, so a plugin that (like NCCL's IB transport) only matches the oldest open receive can
  // also take all 256; tag-major orders are covered by the interleaving tests, which retry like NCCL.
  for (size_t g = 0; g < kGroups; ++g) {
    for (int t = 0; t < kMaxRecvs; ++t) {
      fillPattern(slot(sendBuffer, g, t), kSize, 1000 + g * kMaxRecvs + t);
      sends.push_back(
          postSend(net, pair.conn.send.get(), slot(sendBuffer, g, t), kSize, t, sendReg.handle(), Deadline()));
    }
  }
  for (void* request : sends) REQUIRE_OK(waitRequest(net, request, nullptr, Deadline()));
  for (size_t g = 0; g < kGroups; ++g) {
    int sizes[kMaxRecvs];
    REQUIRE_OK(waitRequest(net, recvs[g], sizes, Deadline()));
    for (int t = 0; t < kMaxRecvs; ++t) {
      REQUIRE(sizes[t] == static_cast<int>(kSize), strf("receive %zu tag %d reported %d bytes", g, t, sizes[t]));
      REQUIRE(findMismatch(slot(recvBuffer, g, t), kSize, 1000 + g * kMaxRecvs + t) == SIZE_MAX,
              strf("receive %zu tag %d holds the wrong bytes", g, t));
    }
  }
}

TEST_CASE("grouped", "large_buffers", Scope::PerVersion) {
  // Buffers big enough to be split across data streams, with short sends and a random order.
  LinkedPair pair(*env.net, env.dev);
  Plan plan = eightTagPlan(3, 2 * MiB, 81, 8, 2);
  randomInterleave(plan, 82);
  runTransfer(*env.net, pair.conn, plan);
}

}  // namespace conformance

namespace conformance {

TEST_CASE("grouped", "member_missing", Scope::PerVersion) {
  // Multireceive aggregation may hold a small send for its group's other members (RAILNET_GROUP_WAIT_US), but a
  // member whose send never comes must not stall the others: each send completes alone, and the receive
  // completes once the late member is sent. Every n from 2 to 8, with the missing member anywhere in the group.
  NetApi& net = *env.net;
  constexpr size_t kSize = 100;
  HostBuffer sendBuffer(kMaxRecvs * kSize), recvBuffer(kMaxRecvs * kSize);  // outlive the comms on failure
  LinkedPair pair(net, env.dev);
  Registration sendReg(net, pair.conn.send.get(), sendBuffer.data(), sendBuffer.size());
  Registration recvReg(net, pair.conn.recv.get(), recvBuffer.data(), recvBuffer.size());
  constexpr int kMissing[kMaxRecvs + 1] = {0, 0, 1, 0, 3, 2, 0, 6, 4};  // first, middle and last members
  for (int n = 2; n <= kMaxRecvs; ++n) {
    const int missing = kMissing[n];
    const Deadline deadline(std::chrono::seconds(10));
    void* data[kMaxRecvs];
    size_t sizes[kMaxRecvs];
    int tags[kMaxRecvs];
    void* mhandles[kMaxRecvs];
    for (int t = 0; t < n; ++t) {
      data[t] = recvBuffer.data() + t * kSize;
      sizes[t] = kSize;
      tags[t] = 10 + t;
      mhandles[t] = recvReg.handle();
      fillPattern(sendBuffer.data() + t * kSize, kSize, 5000 + n * kMaxRecvs + t);
    }
    void* recv = postRecv(net, pair.conn.recv.get(), n, data, sizes, tags, mhandles, deadline);
    for (int t = 0; t < n; ++t) {
      if (t == missing) continue;
      void* send = postSend(net, pair.conn.send.get(), sendBuffer.data() + t * kSize, kSize, 10 + t,
                            sendReg.handle(), deadline);
      // Tested to completion before the next is posted: a transport that waits for the whole group hangs here.
      try {
        REQUIRE_OK(waitRequest(net, send, nullptr, deadline));
      } catch (const TestFailure& e) {
        throw TestFailure(strf("n = %d, member %d sent alone (member %d not sent yet): %s", n, t, missing, e.what()));
      }
    }
    int done = 0;
    REQUIRE_OK(net.test(recv, &done, nullptr));
    REQUIRE(done == 0, strf("n = %d: the grouped receive completed with member %d never sent", n, missing));
    void* late = postSend(net, pair.conn.send.get(), sendBuffer.data() + missing * kSize, kSize, 10 + missing,
                          sendReg.handle(), deadline);
    REQUIRE_OK(waitRequest(net, late, nullptr, deadline));
    int received[kMaxRecvs];
    REQUIRE_OK(waitRequest(net, recv, received, deadline));
    for (int t = 0; t < n; ++t) {
      REQUIRE(received[t] == static_cast<int>(kSize), strf("n = %d tag %d reported %d bytes", n, 10 + t, received[t]));
      REQUIRE(findMismatch(recvBuffer.data() + t * kSize, kSize, 5000 + n * kMaxRecvs + t) == SIZE_MAX,
              strf("n = %d tag %d holds the wrong bytes", n, 10 + t));
    }
  }
}

}  // namespace conformance
