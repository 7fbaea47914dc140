// Hang diagnosis (issue 11, group "failure"): the on-demand dump of every comm's state, triggered by creating
// RAILNET_DUMP_FILE. The watchdog's stall reports are checked where a peer really stalls (test_stopped_peer.cc).
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

// The trigger path as railnet expands it: RAILNET_DUMP_FILE (its default when unset), %p the process id.
std::string dumpPath() {
  const char* set = std::getenv("RAILNET_DUMP_FILE");
  const std::string pattern = set != nullptr ? set : "/tmp/railnet-dump.%p";
  std::string path;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      path += std::to_string(getpid());
      ++i;
    } else {
      path += pattern[i];
    }
  }
  return path;
}

bool exists(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0;
}

}  // namespace

TEST_CASE("failure", "dump_on_demand", Scope::PerVersion) {
  // The ABI version does not matter here: the newest carries it.
  if (!env.heavy) SKIP("runs on the newest version only");
  const std::string path = dumpPath();
  if (path.empty()) SKIP("RAILNET_DUMP_FILE is set empty: the trigger is off");
  NetApi& net = *env.net;
  LinkedPair pair(net, env.dev);
  constexpr size_t kBytes = 1 << 20;
  HostBuffer buffer(kBytes);
  Registration reg(net, pair.conn.recv.get(), buffer.data(), kBytes);
  // A receive that nothing will fill: the dump must show it posted, with no byte in.
  void* request = postRecv(net, pair.conn.recv.get(), buffer.data(), kBytes, reg.handle(), Deadline());
  REQUIRE(request != nullptr, "irecv gave no request");

  const uint64_t mark = logMark();
  { std::ofstream(path.c_str()) << "dump\n"; }
  REQUIRE(exists(path), strf("could not create %s", path.c_str()));
  // The watchdog looks at least once a second.
  REQUIRE(waitForWarning(mark, {"dump end"}, std::chrono::seconds(5)),
          strf("no dump within 5 s of creating %s; warnings:\n%s", path.c_str(), describeWarnings(mark).c_str()));
  REQUIRE(!exists(path), strf("%s is still there after the dump", path.c_str()));
  const std::string dump = describeWarnings(mark);
  for (const char* needle : {"dump (asked by", "receive comm from", "send comm to", "receive #", "0 of 1048576 B"}) {
    REQUIRE(dump.find(needle) != std::string::npos, strf("the dump lacks \"%s\":\n%s", needle, dump.c_str()));
  }
  // One trigger, one dump: the file is gone, so the next looks stay silent.
  const uint64_t after = logMark();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  for (const LogRecord& record : warningsSince(after)) {
    REQUIRE(record.text.find("dump") == std::string::npos, "a second dump without a second trigger: " + record.text);
  }
}

}  // namespace conformance
