// Scale (issue 11, group "scale"): 1024 connections open at once in one process, each moving checked messages
// with every connection's requests in flight together; what each connection costs in file descriptors, memory
// and threads; everything returned at close; and running out of file descriptors as a clear error. Both ends are
// in this process, so it holds twice what one rank of a job would. RAILNET_TEST_CONNECTIONS sets the count.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

// Resident memory in KiB and threads, from /proc/self/status.
long statusField(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string wanted = std::string(field) + ":";
  while (std::getline(status, line)) {
    if (line.compare(0, wanted.size(), wanted) == 0) return std::atol(line.c_str() + wanted.size());
  }
  return -1;
}

int connectionCount() {
  const char* set = std::getenv("RAILNET_TEST_CONNECTIONS");
  return set != nullptr ? std::atoi(set) : 1024;
}

// Sockets per railnet TCP connection at one end: control + data streams (RAILNET_TCP_STREAMS, default 8).
int socketsPerEnd() {
  const char* set = std::getenv("RAILNET_TCP_STREAMS");
  return 1 + (set != nullptr ? std::atoi(set) : 8);
}

}  // namespace

TEST_CASE("scale", "connections", Scope::PerVersion) {
  // The ABI version does not matter here: the newest carries it.
  if (!env.heavy) SKIP("runs on the newest version only");
  const int connections = connectionCount();
  NetApi& net = *env.net;
  FileLimit limit;
  const size_t filesBefore = openFileCount();
  const size_t needed = filesBefore + static_cast<size_t>(connections) * 2 * socketsPerEnd() + 256;
  if (limit.hard() != RLIM_INFINITY && limit.hard() < needed) {
    SKIP(strf("%d connections need about %zu file descriptors; RLIMIT_NOFILE's hard limit is %llu", connections,
              needed, static_cast<unsigned long long>(limit.hard())));
  }
  REQUIRE(limit.setSoft(limit.hard() == RLIM_INFINITY ? needed : limit.hard()), "cannot raise RLIMIT_NOFILE");
  const long rssBefore = statusField("VmRSS");
  const long threadsBefore = statusField("Threads");
  constexpr size_t kLarge = 128 << 10;  // over the 64 KiB inline limit: travels on the data streams
  const size_t sizes[] = {0, 4096, kLarge};
  HostBuffer source(kLarge);
  fillPattern(source.data(), kLarge, 7001);
  {
    NetContext sendCtx(net, nextCommId());
    NetContext recvCtx(net, nextCommId());
    std::vector<Connection> conns;
    conns.reserve(static_cast<size_t>(connections));
    const auto openStart = std::chrono::steady_clock::now();
    for (int c = 0; c < connections; ++c) conns.push_back(connectPair(net, sendCtx.get(), recvCtx.get(), env.dev));
    const double openSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - openStart).count();
    const size_t filesOpen = openFileCount();
    const long rssOpen = statusField("VmRSS");
    std::vector<std::unique_ptr<HostBuffer>> targets;
    std::vector<std::unique_ptr<Registration>> registrations;
    for (int c = 0; c < connections; ++c) {
      targets.push_back(std::make_unique<HostBuffer>(kLarge));
      registrations.push_back(std::make_unique<Registration>(net, conns[c].recv.get(), targets.back()->data(), kLarge));
      registrations.push_back(std::make_unique<Registration>(net, conns[c].send.get(), source.data(), kLarge));
    }
    const auto moveStart = std::chrono::steady_clock::now();
    for (size_t size : sizes) {
      // Every connection's receive and send in flight at once, then all waited for.
      std::vector<void*> receives(static_cast<size_t>(connections));
      std::vector<void*> sends(static_cast<size_t>(connections));
      for (int c = 0; c < connections; ++c) {
        receives[c] = postRecv(net, conns[c].recv.get(), targets[c]->data(), kLarge, registrations[2 * c]->handle(),
                               Deadline());
        sends[c] = postSend(net, conns[c].send.get(), source.data(), size, 0, registrations[2 * c + 1]->handle(),
                            Deadline());
      }
      for (int c = 0; c < connections; ++c) {
        int received = -1;
        REQUIRE_OK(waitRequest(net, sends[c], nullptr, Deadline()));
        REQUIRE_OK(waitRequest(net, receives[c], &received, Deadline()));
        REQUIRE(static_cast<size_t>(received) == size, strf("connection %d: %d bytes of %zu", c, received, size));
        REQUIRE(findMismatch(targets[c]->data(), size, 7001) == SIZE_MAX,
                strf("connection %d: a %zu-byte message arrived changed", c, size));
      }
    }
    const double moveSeconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - moveStart).count();
    note(strf("%d connections: opened in %.1f s (%.1f ms each), %zu file descriptors (%.1f per connection, both "
              "ends), %ld KiB resident (%.0f KiB per connection, both ends, before buffers), %ld threads (%ld "
              "before); 3 rounds of 0 B / 4 KiB / 128 KiB on every connection at once in %.2f s",
              connections, openSeconds, 1000 * openSeconds / connections, filesOpen - filesBefore,
              static_cast<double>(filesOpen - filesBefore) / connections, rssOpen - rssBefore,
              static_cast<double>(rssOpen - rssBefore) / connections, statusField("Threads"), threadsBefore,
              moveSeconds));
    for (auto& registration : registrations) REQUIRE_OK(registration->release());
  }
  // Every socket and railnet thread is gone once the last comm is closed.
  const size_t filesAfter = openFileCount();
  REQUIRE(filesAfter == filesBefore, strf("%zu file descriptors open after closing everything, %zu before",
                                          filesAfter, filesBefore));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (statusField("Threads") > threadsBefore && std::chrono::steady_clock::now() < deadline) usleep(10000);
  REQUIRE(statusField("Threads") == threadsBefore,
          strf("%ld threads after closing everything, %ld before", statusField("Threads"), threadsBefore));
}

TEST_CASE("scale", "out_of_file_descriptors", Scope::PerVersion) {
  // The ABI version does not matter here: the newest carries it.
  if (!env.heavy) SKIP("runs on the newest version only");
  // A connection that cannot get its sockets fails with an error that says so, and nothing leaks.
  NetApi& net = *env.net;
  NetContext sendCtx(net, nextCommId());
  NetContext recvCtx(net, nextCommId());
  ConnHandle handle;
  Comm listener = listenOn(net, recvCtx.get(), env.dev, &handle);
  FileLimit limit;
  const size_t filesBefore = openFileCount();
  // Room for the control socket and a few data streams, not for all of them.
  REQUIRE(limit.setSoft(filesBefore + 3), "cannot lower RLIMIT_NOFILE");
  const uint64_t mark = logMark();
  ncclResult_t result = ncclSuccess;
  void* sendComm = nullptr;
  DevComm* devComm = nullptr;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (std::chrono::steady_clock::now() < deadline) {
    result = net.connect(sendCtx.get(), env.dev, handle.bytes, &sendComm, &devComm);
    if (result != ncclSuccess || sendComm != nullptr) break;
    void* recvComm = nullptr;
    (void)net.accept(listener.get(), &recvComm, &devComm);  // may fail too: the same limit
    REQUIRE(recvComm == nullptr, "accept completed a connection whose sender cannot exist");
    usleep(1000);
  }
  limit.setSoft(limit.hard());
  REQUIRE(sendComm == nullptr, "connect succeeded with 3 file descriptors to spare");
  REQUIRE(result == ncclSystemError, strf("connect returned %d, not ncclSystemError", static_cast<int>(result)));
  REQUIRE(waitForWarning(mark, {"Too many open files", "RLIMIT_NOFILE", "RAILNET_TCP_STREAMS"}, std::chrono::seconds(1)),
          "no WARN naming the file limit; warnings:\n" + describeWarnings(mark));
  REQUIRE_OK(listener.close());
  REQUIRE(openFileCount() <= filesBefore, strf("%zu file descriptors open after the failed connect, %zu before",
                                           openFileCount(), filesBefore));
}

}  // namespace conformance
