// The watchdog's rules (proxy/progress/watchdog.h): one report per stall, a line when the request moves again, and
// the dump file that asks once and is deleted. The reports on real stalled peers are checked by the conformance
// group "failure" (stopped_receiver, stopped_sender, dump_on_demand).
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <fstream>
#include <string>
#include <vector>

#include "proxy/progress/watchdog.h"

namespace {

using railnet::progress::ProgressMark;
using railnet::progress::WatchClock;
using Verdict = ProgressMark::Verdict;
using std::chrono::milliseconds;

bool exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

class CountingComm final : public railnet::progress::Watched {
 public:
  void watch(WatchClock::time_point, milliseconds limit) noexcept override {
    ++watches;
    lastLimit = limit;
  }
  void watchPeerHost(WatchClock::time_point, milliseconds silenceLimit) noexcept override {
    ++hostLooks;
    lastSilenceLimit = silenceLimit;
  }
  void describe(WatchClock::time_point, std::vector<std::string>* lines) noexcept override {
    ++describes;
    lines->push_back("counting comm");
  }
  std::atomic<int> watches{0};
  std::atomic<int> describes{0};
  std::atomic<int> hostLooks{0};
  milliseconds lastLimit{0};
  milliseconds lastSilenceLimit{0};
};

}  // namespace

TEST_CASE("a request that stops moving is reported once, and once more when it moves again", "[watchdog]") {
  const auto t0 = WatchClock::now();
  const milliseconds limit(1000);
  ProgressMark mark;
  mark.start();
  CHECK(mark.look(0, t0, limit) == Verdict::kQuiet);  // the first look stamps the time
  CHECK(mark.look(0, t0 + milliseconds(999), limit) == Verdict::kQuiet);
  CHECK(mark.look(0, t0 + milliseconds(1000), limit) == Verdict::kStalled);
  CHECK(mark.reported());
  CHECK(mark.look(0, t0 + milliseconds(5000), limit) == Verdict::kQuiet);  // reported already
  CHECK(mark.look(4096, t0 + milliseconds(6000), limit) == Verdict::kResumed);
  CHECK(mark.stalledFor() == milliseconds(6000));
  CHECK(!mark.reported());
  // Progress re-arms it: a second stall is a second report.
  CHECK(mark.look(4096, t0 + milliseconds(6999), limit) == Verdict::kQuiet);
  CHECK(mark.look(4096, t0 + milliseconds(7000), limit) == Verdict::kStalled);
}

TEST_CASE("steady progress is never a stall, however long the request takes", "[watchdog]") {
  const auto t0 = WatchClock::now();
  ProgressMark mark;
  mark.start();
  CHECK(mark.look(0, t0, milliseconds(1000)) == Verdict::kQuiet);
  for (int second = 1; second <= 100; ++second) {
    REQUIRE(mark.look(static_cast<uint64_t>(second), t0 + milliseconds(900 * second), milliseconds(1000)) ==
            Verdict::kQuiet);
  }
  // A reused request starts over: its first look stamps it, and the limit counts from there.
  mark.start();
  CHECK(mark.look(0, t0 + milliseconds(200000), milliseconds(1000)) == Verdict::kQuiet);
  CHECK(mark.look(0, t0 + milliseconds(200500), milliseconds(1000)) == Verdict::kQuiet);
  CHECK(mark.look(0, t0 + milliseconds(201000), milliseconds(1000)) == Verdict::kStalled);
}

TEST_CASE("the dump file asks for one dump of every watched comm and is deleted", "[watchdog]") {
  const std::string path = "/tmp/railnet-unit-dump." + std::to_string(getpid());
  unlink(path.c_str());
  railnet::progress::Watchdog watchdog(milliseconds(250), milliseconds(0), path);
  CountingComm a;
  CountingComm b;
  watchdog.add(&a);
  watchdog.add(&b);
  watchdog.lookNow();
  CHECK(a.describes == 0);
  CHECK(a.watches >= 1);
  CHECK(a.lastLimit == milliseconds(250));
  { std::ofstream(path.c_str()) << "x"; }
  watchdog.lookNow();
  CHECK(!exists(path));
  // The watchdog's own thread may have seen the file first; either way, exactly one dump each.
  CHECK(a.describes == 1);
  CHECK(b.describes == 1);
  watchdog.lookNow();
  CHECK(a.describes == 1);
  watchdog.remove(&a);
  { std::ofstream(path.c_str()) << "x"; }
  watchdog.lookNow();
  CHECK(a.describes == 1);
  CHECK(b.describes == 2);
  watchdog.remove(&b);
}

TEST_CASE("a limit of 0 watches nothing; an empty dump path asks for nothing", "[watchdog]") {
  railnet::progress::Watchdog quiet(milliseconds(0), milliseconds(0), "");
  CountingComm comm;
  quiet.add(&comm);
  quiet.lookNow();
  CHECK(comm.watches == 0);
  CHECK(comm.hostLooks == 0);
  CHECK(comm.describes == 0);
  quiet.remove(&comm);
}

TEST_CASE("the lost-host look has its own limit and runs without stall reports", "[watchdog]") {
  railnet::progress::Watchdog hostOnly(milliseconds(0), milliseconds(3000), "");
  CountingComm comm;
  hostOnly.add(&comm);
  hostOnly.lookNow();
  CHECK(comm.watches == 0);
  CHECK(comm.hostLooks == 1);
  CHECK(comm.lastSilenceLimit == milliseconds(3000));
  hostOnly.remove(&comm);
}

TEST_CASE("the watchdog thread looks on its own, several times per limit", "[watchdog]") {
  railnet::progress::Watchdog watchdog(milliseconds(100), milliseconds(0), "");
  CountingComm comm;
  watchdog.add(&comm);
  const auto start = WatchClock::now();
  while (comm.watches < 3 && WatchClock::now() - start < std::chrono::seconds(10)) usleep(5000);
  watchdog.remove(&comm);
  CHECK(comm.watches >= 3);
  const int after = comm.watches;
  usleep(100000);
  CHECK(comm.watches == after);  // removed: never touched again
}
