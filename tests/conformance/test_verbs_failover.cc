// Verbs path failover on a device fused from the soft-RoCE guest's two ports (group "fusion"; docs/failover.md
// "Verbs"): a path whose link fails, every path gone, and the control socket moved off a NIC that fails across hosts.
// Only in the soft-RoCE guest, which names the ports' netdevs (scripts/test.sh --rxe); they skip elsewhere.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comms.h"
#include "fusion_load.h"
#include "harness.h"
#include "log_capture.h"
#include "silenced_address.h"
#include "transfer.h"

namespace conformance {

namespace {
// The links under the soft-RoCE guest's rxe0 and rxe1 (RAILNET_TEST_RXE_NETDEVS="veth0,veth1", set by
// scripts/test.sh --rxe; SKIP elsewhere), set down and up by the verbs failover trials; both are up again when the
// trial ends, however it ends.
struct GuestLinks {
  GuestLinks() {
    const char* netdevs = std::getenv("RAILNET_TEST_RXE_NETDEVS");
    if (netdevs == nullptr) SKIP("needs the soft-RoCE guest's links to fail (RAILNET_TEST_RXE_NETDEVS)");
    const std::string list = netdevs;
    netdev[0] = list.substr(0, list.find(','));
    netdev[1] = list.substr(list.find(',') + 1);
  }
  ~GuestLinks() {
    for (int nic = 0; nic < 2; ++nic) (void)!set(nic, true);
  }
  GuestLinks(const GuestLinks&) = delete;
  GuestLinks& operator=(const GuestLinks&) = delete;
  // ip link set <netdev of rxe<nic>> up|down; true when it worked.
  bool set(int nic, bool up) const {
    return std::system(("ip link set " + netdev[nic] + (up ? " up" : " down")).c_str()) == 0;
  }
  // The IPv4 address of rxe<nic>'s netdev (its RoCE GID's, where its connections meet).
  std::string address(int nic) const {
    ifaddrs* list = nullptr;
    REQUIRE(getifaddrs(&list) == 0, "getifaddrs failed");
    std::string found;
    for (ifaddrs* entry = list; entry != nullptr && found.empty(); entry = entry->ifa_next) {
      if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != AF_INET || netdev[nic] != entry->ifa_name) continue;
      char text[INET_ADDRSTRLEN] = {};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text, sizeof(text));
      found = text;
    }
    freeifaddrs(list);
    REQUIRE(!found.empty(), netdev[nic] + " has no IPv4 address");
    return found;
  }
  std::string netdev[2];
};

// How many WARNs since `since` hold every needle.
size_t countWarnings(uint64_t since, const std::vector<std::string>& needles) {
  size_t count = 0;
  for (const LogRecord& record : warningsSince(since)) {
    bool all = true;
    for (const std::string& needle : needles) all = all && record.text.find(needle) != std::string::npos;
    count += all ? 1 : 0;
  }
  return count;
}

// A WARN the verbs failover trials expect: a port's event, a path failed over or back, the control connection re-made.
bool expectedFailoverWarning(const std::string& text) {
  return text.find("async event") != std::string::npos || text.find("sent again over") != std::string::npos ||
         text.find("answers again") != std::string::npos || text.find("moved to its standby path") != std::string::npos ||
         (text.find("the control connection") != std::string::npos && text.find("re-made") != std::string::npos);
}
// 16 checksummed messages of up to 512 KiB, 8 in flight: the traffic the trials keep up through failures. Returns the
// count.
size_t checksummedBatch(NetApi& net, LinkedPair& pair, std::mt19937_64& rng) {
  std::vector<size_t> sizes;
  for (int i = 0; i < 16; ++i) sizes.push_back(randomSize(rng, std::min(options().maxSize, 512 * KiB)));
  runTransfer(net, pair.conn, simplePlan(sizes, 8, rng()));
  return sizes.size();
}

// No WARN since `mark` but the expected ones.
void requireOnlyExpectedWarnings(uint64_t mark) {
  std::string others;
  for (const LogRecord& record : warningsSince(mark)) {
    if (!expectedFailoverWarning(record.text)) others += record.text + "\n";
  }
  REQUIRE(others.empty(), "unexpected WARNs:\n" + others);
}

// After a trial: no WARN but the expected ones, and both NICs carried traffic (the last transfer alone stripes 16 MiB
// over the two paths).
void requireCleanFailover(uint64_t mark) {
  requireOnlyExpectedWarnings(mark);
  const std::map<std::string, NicLine> lines = nicLinesSince(mark);
  for (const char* nic : {"rxe0", "rxe1"}) {
    REQUIRE(lines.count(nic) == 1 && lines.at(nic).sent >= 4 * MiB, strf("%s sent too little in all", nic));
  }
}
// The long form's knobs (tests/rxe/failover-campaign.sh): RAILNET_TEST_PATH_FAILURES (at least `minimum`) and
// RAILNET_TEST_PATH_SEED.
struct Campaign {
  Campaign(int minimum, uint64_t defaultSeed) {
    const char* failuresText = std::getenv("RAILNET_TEST_PATH_FAILURES");
    failures = std::max(minimum, failuresText != nullptr ? std::atoi(failuresText) : minimum);
    const char* seedText = std::getenv("RAILNET_TEST_PATH_SEED");
    seed = seedText != nullptr ? std::strtoull(seedText, nullptr, 10) : defaultSeed;
  }
  int failures = 0;
  uint64_t seed = 0;
};

// Takes rxe<nic>'s link down `after` from now, on a thread of its own, while the caller keeps transfers running;
// joined when it goes out of scope.
class LinkDownLater {
 public:
  LinkDownLater(const GuestLinks& links, int nic, std::chrono::milliseconds after)
      : thread_([&links, nic, after] {
          std::this_thread::sleep_for(after);
          (void)!links.set(nic, false);
        }) {}
  ~LinkDownLater() { thread_.join(); }
  LinkDownLater(const LinkDownLater&) = delete;
  LinkDownLater& operator=(const LinkDownLater&) = delete;

 private:
  std::thread thread_;
};

// What the sender's WARNs since `mark` say the receivers answered: chunks asked about, those missing (sent again),
// their bytes.
struct ResentTally {
  unsigned long long asked = 0, lacked = 0, bytes = 0;
};
ResentTally tallyResent(uint64_t mark) {
  ResentTally tally;
  for (const LogRecord& record : warningsSince(mark)) {
    const size_t at = record.text.find("the receiver lacked ");
    unsigned long long missing = 0, of = 0, bytes = 0;
    if (at != std::string::npos &&
        std::sscanf(record.text.c_str() + at, "the receiver lacked %llu of %llu chunks in flight on it, %llu B",
                    &missing, &of, &bytes) == 3) {
      tally.lacked += missing;
      tally.asked += of;
      tally.bytes += bytes;
    }
  }
  return tally;
}
}  // namespace

TEST_CASE("fusion", "verbs_path_failover", Scope::PerVersionOwnLoad) {
  // Verbs path failover (docs/failover.md "Verbs"): on a device fused from two soft-RoCE ports, the link under one
  // port goes down mid-transfer (ip link set down on its netdev: its QPs' work fails, the port's PORT_ERR event). The
  // path through it is taken out, the receiver says which of its chunks in flight landed, the rest go again over the
  // other path, and every message arrives intact; while the link is down no probe brings the path back; once it is up
  // (PORT_ACTIVE) the path is made again with new QPs and carries traffic. One connection through every failure:
  // NIC 1's port first, then NIC 0's (whose path also carries the clear-to-sends), then (the long form,
  // RAILNET_TEST_PATH_FAILURES=N; tests/rxe/failover-campaign.sh) either, at random moments, for random times. Only
  // in the soft-RoCE guest, which names the ports' netdevs (scripts/test.sh --rxe). NIC 0's path carries the
  // control socket too (both ends meet at rxe0's address): the sender moves it to NIC 1's addresses (D94).
  if (env.version < 12 || !verbsTransport()) return;
  const GuestLinks links;
  const Campaign campaign(2, 2000);
  const int failures = campaign.failures;
  const uint64_t seed = campaign.seed;
  const uint64_t mark = logMark();
  std::mt19937_64 rng(seed);
  size_t messages = 0;
  {
    FusedLoad fused(env);
    NetApi& net = fused.net();
    LinkedPair pair(net, fused.device);
    auto transfer = [&] { messages += checksummedBatch(net, pair, rng); };
    for (int failure = 0; failure < failures; ++failure) {
      const int nic = failure == 0 ? 1 : failure == 1 ? 0 : static_cast<int>(rng() % 2);
      const std::string path = strf("path %d (", nic);
      const size_t failedBefore = countWarnings(mark, {path, "sent again over"});
      const size_t backBefore = countWarnings(mark, {path, "answers again"});
      const LinkDownLater down(links, nic, std::chrono::milliseconds(100 + rng() % 700));  // while transfers run
      for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, {path, "sent again over"}) == failedBefore;
           deadline.check(("the failure of " + path + "to be handled").c_str())) {
        transfer();
      }
      // The first two keep the link down for two seconds, where the first probe would come at one: none may bring
      // the path back. Later ones: 0.2 to 3 s.
      const auto downFor = std::chrono::milliseconds(failure < 2 ? 2000 : 200 + rng() % 2800);
      for (const auto since = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - since < downFor;) {
        transfer();
      }
      REQUIRE(countWarnings(mark, {path, "answers again"}) == backBefore,
              "the path came back while its link was down; warnings:\n" + describeWarnings(mark));
      REQUIRE(links.set(nic, true), "could not bring " + links.netdev[nic] + " up");
      for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, {path, "answers again"}) == backBefore;
           deadline.check(("the return of " + path).c_str())) {
        transfer();
      }
    }
    // Back: both paths carry a transfer again.
    runTransfer(net, pair.conn, simplePlan(std::vector<size_t>(8, 2 * MiB), 4, rng()));
  }
  requireCleanFailover(mark);
  // NIC 0's path failed (the second failure): the control socket, which ran through NIC 0, was re-made off it (D94).
  // Not asked when a test feature cuts the socket every few frames: it may be broken already when the path fails.
  REQUIRE(std::getenv("RAILNET_FAULT_CONTROL_CUT") != nullptr ||
              countWarnings(mark, {"send connection with", "the control connection broke (path 0 (rxe0) failed"}) >= 1,
          "the control connection was not moved off NIC 0 when its path failed; warnings:\n" + describeWarnings(mark));
  const ResentTally resent = tallyResent(mark);
  std::printf("verbs path failover: %d failures (seed %llu), %zu checksummed messages and the last 16 MiB, all "
              "arrived; %llu chunks in flight on failed paths, %llu of them missing and sent again (%llu B), %llu "
              "had landed\n", failures, static_cast<unsigned long long>(seed), messages, resent.asked, resent.lacked,
              resent.bytes, resent.asked - resent.lacked);
}

}  // namespace conformance

namespace conformance {

namespace {
// Every path of a verbs connection on `device` gone (both ports' links down mid-transfer): the send and the receive in
// flight fail within 2 s with ncclRemoteError, and a WARN names the peer and says every path failed.
void allPathsDownTrial(NetApi& net, int device, const GuestLinks& links, const char* what) {
  constexpr size_t kBytes = 64 * MiB;
  HostBuffer sendBuffer(kBytes), recvBuffer(kBytes);
  const uint64_t mark = logMark();
  std::chrono::steady_clock::time_point downAt;
  {
    LinkedPair pair(net, device);
    Registration sendReg(net, pair.conn.send.get(), sendBuffer.data(), kBytes);
    Registration recvReg(net, pair.conn.recv.get(), recvBuffer.data(), kBytes);
    ncclResult_t sendResult = ncclSuccess, recvResult = ncclSuccess;
    std::chrono::steady_clock::time_point sendFailed, recvFailed;
    ThreadGroup threads;
    const Deadline deadline(std::chrono::seconds(30));
    // A receive waits for its message; the links go once its clear-to-send is with the sender, which then sends.
    threads.spawn([&] {
      void* request = postRecv(net, pair.conn.recv.get(), recvBuffer.data(), kBytes, recvReg.handle(), deadline);
      recvResult = waitRequest(net, request, nullptr, deadline);
      recvFailed = std::chrono::steady_clock::now();
    });
    threads.spawn([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      downAt = std::chrono::steady_clock::now();
      REQUIRE(links.set(0, false) && links.set(1, false), "could not take the links down");
      void* request = nullptr;
      for (Backoff backoff; !request; backoff.idle()) {
        deadline.check("isend of 64 MiB");
        sendResult = net.isend(pair.conn.send.get(), sendBuffer.data(), kBytes, 0, sendReg.handle(), &request);
        if (sendResult != ncclSuccess) break;
      }
      if (request != nullptr) sendResult = waitRequest(net, request, nullptr, deadline);
      sendFailed = std::chrono::steady_clock::now();
    });
    threads.join();
    auto after = [&](std::chrono::steady_clock::time_point at) { return std::chrono::duration<double>(at - downAt).count(); };
    REQUIRE(sendResult == ncclRemoteError && recvResult == ncclRemoteError,
            strf("%s: the send ended with %d and the receive with %d; expected ncclRemoteError (%d) for both", what,
                 static_cast<int>(sendResult), static_cast<int>(recvResult), static_cast<int>(ncclRemoteError)));
    REQUIRE(after(sendFailed) < 2.0 && after(recvFailed) < 2.0,
            strf("%s: the send failed %.1f s and the receive %.1f s after the links went down; 2 s allowed", what,
                 after(sendFailed), after(recvFailed)));
  }
  REQUIRE(waitForWarning(mark, {"send connection with", "every path failed"}, std::chrono::seconds(1)),
          std::string(what) + ": no WARN said every path failed; warnings:\n" + describeWarnings(mark));
  REQUIRE(links.set(0, true) && links.set(1, true), "could not bring the links up");
}
}  // namespace

TEST_CASE("fusion", "verbs_all_paths_down", Scope::PerVersionOwnLoad) {
  // Every path of a verbs connection gone (both ports' links down mid-transfer, docs/failover.md "Verbs"): on a fused
  // device, and on a single-NIC device with its standby path (D96). Only in the soft-RoCE guest (scripts/test.sh
  // --rxe).
  if (env.version < 12 || !verbsTransport()) return;
  const GuestLinks links;
  {
    FusedLoad fused(env);
    const uint64_t mark = logMark();
    allPathsDownTrial(fused.net(), fused.device, links, "fused rxe0+rxe1");
    REQUIRE(countWarnings(mark, {"send connection with", "every path failed (NICs tried: rxe0, rxe1)"}) >= 1,
            "no WARN named the NICs tried; warnings:\n" + describeWarnings(mark));
  }
  // The links came back: wait for both ports before the single-NIC trial (its standby needs rxe1's).
  std::this_thread::sleep_for(std::chrono::seconds(2));
  FusionLoad load(env);
  NetContext ctx(*load.net, nextCommId());
  allPathsDownTrial(*load.net, railDevices(*load.net)[0], links, "single-NIC rxe0 with its standby path on rxe1");
}

}  // namespace conformance
namespace conformance {

TEST_CASE("fusion", "verbs_control_moves", Scope::PerVersionOwnLoad) {
  // Across hosts both ends of a fused verbs connection meet at NIC 0's address, so NIC 0's failure silences the
  // control socket as well as NIC 0's path. Unless the sender moves the socket to another NIC's addresses, the path
  // frames that fail the path over are stranded and the connection fails (D94). In the guest both ends share a host
  // and rxe's traffic between its ports bypasses netfilter, so the two halves of that failure are made one after the
  // other: iptables drops every segment to or from NIC 0's address (the control socket falls silent; RDMA goes on),
  // then NIC 0's link goes down (its path fails). The sender must see the silence within RAILNET_FAILOVER_SILENCE_MS
  // and a watchdog look, re-make the socket through NIC 1 with no frame lost, fail the path over through it, and
  // bring the path back once the link and the address are back: every message intact, no other WARN.
  if (env.version < 12 || !verbsTransport()) return;
  const GuestLinks links;
  const std::string nic0 = links.address(0);
  const std::string nic1 = links.address(1);
  ScopedEnv silenceLimit("RAILNET_FAILOVER_SILENCE_MS", "1000");
  using Clock = std::chrono::steady_clock;
  const uint64_t mark = logMark();
  std::mt19937_64 rng(3801);
  size_t messages = 0;
  double movedAfter = 0;
  {
    FusedLoad fused(env);
    NetApi& net = fused.net();
    LinkedPair pair(net, fused.device);
    auto transfer = [&] { messages += checksummedBatch(net, pair, rng); };
    transfer();
    SilencedAddress silenced(nic0);
    REQUIRE(silenced.drop(), "iptables could not drop " + nic0);
    const Clock::time_point silentFrom = Clock::now();
    const std::vector<std::string> remade = {"send connection with", "the control connection broke (it acknowledged nothing"};
    for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, remade) == 0;
         deadline.check("the sender to re-make its silent control connection")) {
      transfer();
    }
    movedAfter = std::chrono::duration<double>(Clock::now() - silentFrom).count();
    REQUIRE(countWarnings(mark, {"send connection with", "now " + nic1}) >= 1,
            "the control connection was not re-made through " + nic1 + "; warnings:\n" + describeWarnings(mark));
    REQUIRE(links.set(0, false), "could not take " + links.netdev[0] + " down");
    for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, {"path 0 (", "sent again over"}) == 0;
         deadline.check("the failure of path 0 to be handled")) {
      transfer();
    }
    for (const Clock::time_point since = Clock::now(); Clock::now() - since < std::chrono::seconds(2);) transfer();
    silenced.lift();
    REQUIRE(links.set(0, true), "could not bring " + links.netdev[0] + " up");
    for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, {"path 0 (", "answers again"}) == 0;
         deadline.check("the return of path 0")) {
      transfer();
    }
    // Back: both paths carry a transfer again.
    runTransfer(net, pair.conn, simplePlan(std::vector<size_t>(8, 2 * MiB), 4, rng()));
  }
  requireCleanFailover(mark);
  std::printf("verbs control moves: the control connection, silent from %s, was re-made through %s %.1f s later "
              "(limit 1 s); %zu checksummed messages and the last 16 MiB all arrived across path 0's failure and "
              "return\n", nic0.c_str(), nic1.c_str(), movedAfter, messages);
}

}  // namespace conformance

namespace conformance {

TEST_CASE("fusion", "verbs_single_nic_move", Scope::PerVersionOwnLoad) {
  // A single-NIC verbs device keeps a standby path on its host's nearest other NIC (D96; docs/failover.md "Single-NIC
  // devices on verbs"). rxe0's link goes down mid-transfer: the connection from rxe0 to rxe0 moves to its standby
  // path (rxe1 to rxe1; every checksummed message arrives, what the receiver lacked goes again there), stays there
  // while the link is down (2 s; the first probe would come at one), and hands its traffic back once rxe0 answers
  // again; the standby rests once more. The long form (RAILNET_TEST_PATH_FAILURES=N, tests/rxe/failover-campaign.sh
  // N SEED build single) repeats it at random moments, the link down for 0.2-3 s. Only in the soft-RoCE guest
  // (scripts/test.sh --rxe).
  if (env.version < 12 || !verbsTransport()) return;
  const GuestLinks links;
  const Campaign campaign(1, 9601);
  std::mt19937_64 rng(campaign.seed);
  const uint64_t mark = logMark();
  size_t messages = 0;
  {
    FusionLoad load(env);
    NetApi& net = *load.net;
    NetContext ctx(net, nextCommId());
    const int device = railDevices(net)[0];
    DeviceProps props;
    REQUIRE_OK(net.getProperties(device, &props));
    REQUIRE(props.name != nullptr && std::string(props.name) == "rxe0", "device 0 is not rxe0");
    LinkedPair pair(net, device);
    auto transfer = [&] { messages += checksummedBatch(net, pair, rng); };
    // How many INFO records since the mark hold every needle (the standby resting is INFO).
    const auto infos = [&](const std::vector<std::string>& needles) {
      size_t count = 0;
      for (const LogRecord& record : recordsSince(mark, NCCL_LOG_INFO)) {
        bool all = true;
        for (const std::string& needle : needles) all = all && record.text.find(needle) != std::string::npos;
        count += all ? 1 : 0;
      }
      return count;
    };
    transfer();
    for (int failure = 0; failure < campaign.failures; ++failure) {
      const std::vector<std::string> moved = {"send connection with", "moved to its standby path 1 (rxe1"};
      const std::vector<std::string> back = {"send connection with", "path 0 (rxe0) answers again"};
      const std::vector<std::string> rested = {"send connection with", "standby path 1 (rxe1) rests again"};
      const size_t movedBefore = countWarnings(mark, moved), backBefore = countWarnings(mark, back);
      const size_t restedBefore = infos(rested);
      const LinkDownLater down(links, 0, std::chrono::milliseconds(100 + rng() % 700));  // while transfers run
      for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, moved) == movedBefore;
           deadline.check("the move to the standby path")) {
        transfer();
      }
      const auto downFor = std::chrono::milliseconds(failure == 0 ? 2000 : 200 + rng() % 2800);
      for (const auto since = std::chrono::steady_clock::now(); std::chrono::steady_clock::now() - since < downFor;) {
        transfer();
      }
      REQUIRE(countWarnings(mark, back) == backBefore,
              "path 0 came back while its link was down; warnings:\n" + describeWarnings(mark));
      REQUIRE(links.set(0, true), "could not bring " + links.netdev[0] + " up");
      for (const Deadline deadline(std::chrono::seconds(30)); countWarnings(mark, back) == backBefore;
           deadline.check("the return to path 0")) {
        transfer();
      }
      // The standby rests once it has handed its traffic back (INFO, both ends).
      for (const Deadline deadline(std::chrono::seconds(10)); infos(rested) == restedBefore;
           deadline.check("the standby path to rest")) {
        transfer();
      }
    }
    runTransfer(net, pair.conn, simplePlan(std::vector<size_t>(8, 2 * MiB), 4, rng()));
  }
  requireOnlyExpectedWarnings(mark);
  REQUIRE(countWarnings(mark, {"path 0 (rxe0) failed", "sent again over"}) == static_cast<size_t>(campaign.failures),
          "not one WARN per failure naming the failed path and what went again; warnings:\n" + describeWarnings(mark));
  // The close-time counters: rxe1 carried the moved connection (both ends count each move) and bytes while it did.
  const std::map<std::string, NicLine> lines = nicLinesSince(mark);
  REQUIRE(lines.count("rxe1") == 1 && lines.at("rxe1").sent >= 1 * MiB, "rxe1 carried too little while rxe0 was out");
  const std::string movedCount = strf("%d connection(s) moved here from a failed NIC", 2 * campaign.failures);
  bool movedCounted = false;
  for (const LogRecord& record : recordsSince(mark, NCCL_LOG_INFO)) {
    movedCounted = movedCounted || (record.text.find("NIC rxe1 ") != std::string::npos &&
                                    record.text.find(movedCount) != std::string::npos);
  }
  REQUIRE(movedCounted, "rxe1's counter line does not say \"" + movedCount + "\"");
  const ResentTally resent = tallyResent(mark);
  std::printf("verbs single-NIC move: %d failures of rxe0 (seed %llu), each a move to the standby path on rxe1 and "
              "back; %zu checksummed messages and the last 16 MiB all arrived; %llu chunks in flight on the failed "
              "path, %llu missing and sent again (%llu B)\n", campaign.failures,
              static_cast<unsigned long long>(campaign.seed), messages,
              resent.asked, resent.lacked, resent.bytes);
}

}  // namespace conformance
