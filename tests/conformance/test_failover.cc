// Rail failover (docs/failover.md), group "failover": what a broken path may cost a connection (a new socket, frames
// sent again) and what it must not (a byte, a request). Today: resumable control channels, checked by cutting
// control sockets mid-stream with the test feature RAILNET_FAULT_CONTROL_CUT.
#include <string>
#include <thread>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
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

}  // namespace conformance
