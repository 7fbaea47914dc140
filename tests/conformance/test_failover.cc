// Rail failover (docs/failover.md), group "failover": what a broken path may cost a connection (a new socket, frames
// sent again) and what it must not (a byte, a request). Today: resumable control channels, checked by cutting
// control sockets mid-stream with the test feature RAILNET_FAULT_CONTROL_CUT; and single-NIC devices that move to
// another NIC of their host when theirs fails, and back when it answers again (RAILNET_FAULT_NIC_CUT, iptables).
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "silenced_address.h"
#include "transfer.h"

namespace conformance {
namespace {

// Resume WARNs since `mark`; every other WARN is a failure of the test.
size_t countResumes(uint64_t mark, std::string* others) {
  size_t resumes = 0;
  for (const LogRecord& record : warningsSince(mark)) {
    if (record.text.find("the control connection") != std::string::npos &&
        (record.text.find("re-made") != std::string::npos)) {
      ++resumes;
    } else {
      *others += record.text + "\n";
    }
  }
  return resumes;
}

// Runs transfers of random messages over `pair` until a WARN since `mark` holds `needle`, or `limit` passes.
void transferUntilWarning(NetApi& net, LinkedPair& pair, uint64_t mark, const std::string& needle,
                          std::chrono::seconds limit, uint64_t seed) {
  std::mt19937_64 rng(seed);
  bool seen = false;
  for (const Deadline deadline(limit); !seen; deadline.check(needle.c_str())) {
    std::vector<size_t> sizes;
    for (int i = 0; i < 16; ++i) sizes.push_back(randomSize(rng, std::min(options().maxSize, 2 * MiB)));
    runTransfer(net, pair.conn, simplePlan(sizes, 8, rng()));
    for (const LogRecord& record : warningsSince(mark)) seen = seen || record.text.find(needle) != std::string::npos;
  }
}

// The WARNs a single-NIC move and its return may give; anything else is listed.
std::string unexpectedMoveWarnings(uint64_t mark) {
  std::string others;
  for (const LogRecord& record : warningsSince(mark)) {
    const std::string& text = record.text;
    const bool expected = text.find("the connection moves to another NIC") != std::string::npos ||
                          text.find("moved to ") != std::string::npos ||
                          text.find("answers again") != std::string::npos ||
                          text.find("acknowledged nothing for") != std::string::npos ||
                          text.find("went down") != std::string::npos ||
                          text.find("a data stream of") != std::string::npos ||
                          (text.find("the control connection") != std::string::npos &&
                           text.find("re-made") != std::string::npos);
    if (!expected) others += text + "\n";
  }
  return others;
}

constexpr const char* kThreeRails = "127.0.1.1,127.0.2.1,127.0.3.1";

}  // namespace

TEST_CASE("failover", "control_cuts", Scope::PerVersionOwnLoad) {
  // Every third control frame each side sends leaves half written and its socket is cut. The sending side re-makes
  // the socket through the receiver's session listener and each side sends again what the other had not processed:
  // clear-to-sends, inline messages (cut inside their payload), oversize notices. Every message must arrive intact
  // and in order, every request complete, and nothing be reported but the resumes themselves.
  OwnLoad load(*env.pluginPath, env.version, "RAILNET_FAULT_CONTROL_CUT", "3");
  NetApi& net = *load.net;
  const uint64_t mark = logMark();
  {
    LinkedPair pair(net, env.dev);
    // Mostly inline-sized messages (the control path), some on the data streams, 32 in flight.
    runTransfer(net, pair.conn, randomPlan(400, 96 * KiB, NCCL_NET_MAX_REQUESTS, 401));
    LinkedPair reverse(net, env.dev);
    ThreadGroup threads;
    threads.spawn([&] { runTransfer(net, pair.conn, randomPlan(150, 64 * KiB, 8, 402)); });
    threads.spawn([&] { runTransfer(net, reverse.conn, randomPlan(150, 300 * KiB, 8, 403)); });
    threads.join();
  }
  std::string others;
  const size_t resumes = countResumes(mark, &others);
  REQUIRE(others.empty(), "WARNs other than resumes:\n" + others);
  // 700 messages take well over 700 frames each way; one in three cut makes far more resumes than this (each is
  // logged by both ends; frames written while a socket is down ride on the next resume, so fewer than the cuts).
  REQUIRE(resumes >= 50, strf("only %zu control connections were re-made", resumes));
}

TEST_CASE("failover", "control_cut_every_frame", Scope::PerVersionOwnLoad) {
  // The harshest cut: every frame breaks its socket, so each one arrives only through a re-made socket.
  OwnLoad load(*env.pluginPath, env.version, "RAILNET_FAULT_CONTROL_CUT", "1");
  NetApi& net = *load.net;
  const uint64_t mark = logMark();
  {
    LinkedPair pair(net, env.dev);
    runTransfer(net, pair.conn, randomPlan(120, 80 * KiB, 8, 404));
  }
  std::string others;
  const size_t resumes = countResumes(mark, &others);
  REQUIRE(others.empty(), "WARNs other than resumes:\n" + others);
  REQUIRE(resumes >= 20, strf("only %zu control connections were re-made", resumes));
}

TEST_CASE("failover", "single_nic_move", Scope::PerVersionOwnLoad) {
  // A single-NIC device whose NIC fails (RAILNET_FAULT_NIC_CUT=0 shuts its data streams and control socket down after
  // 6 MiB) moves to another NIC of the host, nearest first (on lo: the next address listed): the control connection
  // is re-made through it, the data streams follow, the sends in flight go again. A second later a probe finds the
  // original path and the connection moves back. Every message must arrive intact and every request complete.
  if (env.version < 12 || verbsTransport()) return;  // one version: the probes take seconds; verbs is step 5
  ScopedEnv rails("RAILNET_TCP_ADDRESSES", kThreeRails);
  ScopedEnv after("RAILNET_FAULT_NIC_CUT_BYTES", "6291456");
  const uint64_t mark = logMark();
  {
    OwnLoad load(*env.pluginPath, env.version, "RAILNET_FAULT_NIC_CUT", "0");
    NetApi& net = *load.net;
    LinkedPair pair(net, 0);  // lo@127.0.1.1 alone
    transferUntilWarning(net, pair, mark, "lo@127.0.1.1 answers again", std::chrono::seconds(20), 501);
    runTransfer(net, pair.conn, simplePlan(std::vector<size_t>(8, std::min(options().maxSize, 8 * MiB)), 4, 502));
  }
  REQUIRE(waitForWarning(mark, {"the data streams of lo@127.0.1.1 failed", "moves to another NIC"},
                         std::chrono::seconds(1)),
          "the NIC's failure was not reported; warnings:\n" + describeWarnings(mark));
  REQUIRE(waitForWarning(mark, {"moved to lo@127.0.2.1", "degraded"}, std::chrono::seconds(1)),
          "the connection did not move to the nearest other NIC; warnings:\n" + describeWarnings(mark));
  const std::string others = unexpectedMoveWarnings(mark);
  REQUIRE(others.empty(), "unexpected WARNs:\n" + others);
  bool movedLine = false;
  for (const LogRecord& record : recordsSince(mark, NCCL_LOG_INFO)) {
    movedLine = movedLine || (record.text.find("lo@127.0.2.1") != std::string::npos &&
                              record.text.find("1 connection(s) moved here from a failed NIC") != std::string::npos);
  }
  REQUIRE(movedLine, "no NIC counter line counts the move on lo@127.0.2.1");
}

TEST_CASE("failover", "single_nic_silent", Scope::PerVersionOwnLoad) {
  // A single-NIC device whose path goes dark mid-transfer (iptables drops every segment to or from its address):
  // after RAILNET_FAILOVER_SILENCE_MS without an acknowledgement it moves to another NIC and sends what was in flight
  // again; its probes of the original path fail while the rule stands (two seconds more), and once the rule is gone a
  // probe brings it back. Needs a network namespace of its own (tests/conformance/in-netns.sh).
  if (env.version < 12 || verbsTransport()) return;
  if (std::getenv("RAILNET_TEST_NETNS") == nullptr) {
    SKIP("needs a network namespace of its own for its iptables rule (tests/conformance/in-netns.sh)");
  }
  ScopedEnv rails("RAILNET_TCP_ADDRESSES", kThreeRails);
  const uint64_t mark = logMark();
  {
    OwnLoad load(*env.pluginPath, env.version, "RAILNET_FAILOVER_SILENCE_MS", "1000");
    NetApi& net = *load.net;
    LinkedPair pair(net, 0);
    SilencedAddress silenced("127.0.1.1");
    std::thread dropper([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // while transfers run
      silenced.drop();
    });
    struct Join {
      std::thread& thread;
      ~Join() { thread.join(); }
    } join{dropper};
    transferUntilWarning(net, pair, mark, "moved to lo@127.0.2.1", std::chrono::seconds(20), 503);
    REQUIRE(silenced.active(), "iptables could not drop the NIC's address");
    const auto stands = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - stands < std::chrono::seconds(2)) {
      runTransfer(net, pair.conn, randomPlan(16, 2 * MiB, 8, 505));  // over the NIC moved to, while probes fail
    }
    silenced.lift();
    transferUntilWarning(net, pair, mark, "lo@127.0.1.1 answers again", std::chrono::seconds(40), 504);
  }
  REQUIRE(waitForWarning(mark, {"acknowledged nothing for", "moves to another NIC"}, std::chrono::seconds(1)),
          "no WARN saw the silent NIC; warnings:\n" + describeWarnings(mark));
  const std::string others = unexpectedMoveWarnings(mark);
  REQUIRE(others.empty(), "unexpected WARNs:\n" + others);
}

TEST_CASE("failover", "single_nic_link_down", Scope::PerVersionOwnLoad) {
  // The OS says the link is down (netlink): a single-NIC device moves at once, without waiting for silence, is not
  // probed back while the link stays down, and is probed at once when it comes back up. Two veth interfaces (each with
  // its peer end up beside it) in a network namespace of its own stand in for two NICs (tests/conformance/in-netns.sh).
  if (env.version < 12 || verbsTransport()) return;
  if (std::getenv("RAILNET_TEST_NETNS") == nullptr) {
    SKIP("needs a network namespace of its own for its veth interfaces (tests/conformance/in-netns.sh)");
  }
  for (int rail = 1; rail <= 2; ++rail) {
    const std::string name = strf("rnd%d", rail);
    REQUIRE(std::system(strf("ip link add %s type veth peer name %sp && ip addr add 10.88.%d.1/24 dev %s && "
                             "ip link set %sp up && ip link set %s up", name.c_str(), name.c_str(), rail, name.c_str(),
                             name.c_str(), name.c_str()).c_str()) == 0,
            "could not make veth interface " + name);
  }
  struct Remove {
    ~Remove() { (void)!std::system("ip link del rnd1 2>/dev/null; ip link del rnd2 2>/dev/null"); }
  } remove;
  ScopedEnv rails("RAILNET_TCP_ADDRESSES", "10.88.1.1,10.88.2.1");
  const uint64_t mark = logMark();
  {
    OwnLoad load(*env.pluginPath, env.version, "RAILNET_FAILOVER_SILENCE_MS", "30000");  // the link, not silence
    NetApi& net = *load.net;
    LinkedPair pair(net, 0);  // rnd1@10.88.1.1 alone
    std::thread down([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // while transfers run
      (void)!std::system("ip link set rnd1 down");
    });
    struct Join {
      std::thread& thread;
      ~Join() { thread.join(); }
    } join{down};
    transferUntilWarning(net, pair, mark, "moved to rnd2@10.88.2.1", std::chrono::seconds(10), 511);
    REQUIRE(waitForWarning(mark, {"the link of rnd1@10.88.1.1 (rnd1) went down"}, std::chrono::seconds(1)),
            "the move did not come from the link's notification; warnings:\n" + describeWarnings(mark));
    // Three seconds with the link down: probes would come at 1 s and 3 s; none may bring the connection back.
    const auto since = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - since < std::chrono::seconds(3)) {
      runTransfer(net, pair.conn, randomPlan(16, 2 * MiB, 8, 512));
    }
    for (const LogRecord& record : warningsSince(mark)) {
      REQUIRE(record.text.find("answers again") == std::string::npos,
              "the connection moved back while the link was down: " + record.text);
    }
    const auto up = std::chrono::steady_clock::now();
    REQUIRE(std::system("ip link set rnd1 up") == 0, "could not bring rnd1 up again");
    transferUntilWarning(net, pair, mark, "rnd1@10.88.1.1 answers again", std::chrono::seconds(10), 513);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - up).count();
    // The probe runs on the notification, not at the backoff's next turn (which is 4 s after the last).
    REQUIRE(took < 2.5, strf("the connection came back %.1f s after the link did", took));
  }
  const std::string others = unexpectedMoveWarnings(mark);
  REQUIRE(others.empty(), "unexpected WARNs:\n" + others);
}

}  // namespace conformance
