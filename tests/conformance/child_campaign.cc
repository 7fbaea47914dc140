// The failure campaign's receiver (--child-campaign-receiver, group "campaign", test_campaign.cc): a peer process,
// usually in the other network namespace of tests/conformance/veth-rails.sh, that receives whatever messages the
// parent announces on its stdin, connection after connection, and reports each one as intact or not. Its orders and
// reports are described at childCampaignReceiverArgs (child.h).
#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <sstream>

#include "child.h"
#include "comms.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

using Clock = std::chrono::steady_clock;

struct CampaignOptions {
  std::string plugin;
  int version = 12;
  int fuse = 1;  // > 1: a virtual device of devices 0..fuse-1; else device 0
  size_t maxSize = 4 * MiB;
  int window = 8;
  int deadlineSec = 60;
};

CampaignOptions parseCampaign(int argc, char** argv) {
  CampaignOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--child-campaign-receiver" || i + 1 >= argc) continue;
    const std::string value = argv[++i];
    if (arg == "--plugin")
      o.plugin = value;
    else if (arg == "--version")
      o.version = std::atoi(value.c_str());
    else if (arg == "--fuse")
      o.fuse = std::atoi(value.c_str());
    else if (arg == "--max-size")
      o.maxSize = std::strtoull(value.c_str(), nullptr, 10);
    else if (arg == "--window")
      o.window = std::atoi(value.c_str());
    else if (arg == "--deadline")
      o.deadlineSec = std::atoi(value.c_str());
  }
  REQUIRE(o.window >= 1 && o.window <= 32, "child: --window must be 1..32");
  REQUIRE(o.deadlineSec > 0, "child: --deadline must be positive");
  return o;
}

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Every WARN the plugin logged since *mark, one "WARN <text>" line each (on one line however the text is broken).
void reportWarnings(uint64_t* mark) {
  for (const LogRecord& warning : warningsSince(*mark)) {
    std::string text = warning.text;
    for (char& c : text) {
      if (c == '\n' || c == '\r') c = ' ';
    }
    say("WARN " + text);
    *mark = warning.seq + 1;
  }
}

// The parent's orders on stdin, read without blocking the receive loop.
class Orders {
 public:
  // The next whole line, waiting up to `waitMs` for one; false if none came. Throws once stdin is closed (the
  // parent is gone).
  bool next(std::string* line, int waitMs) {
    for (;;) {
      const size_t newline = pending_.find('\n');
      if (newline != std::string::npos) {
        *line = pending_.substr(0, newline);
        pending_.erase(0, newline + 1);
        return true;
      }
      pollfd pfd{STDIN_FILENO, POLLIN, 0};
      const int ready = poll(&pfd, 1, waitMs);
      if (ready < 0 && errno == EINTR) continue;
      if (ready <= 0) return false;
      char chunk[4096];
      const ssize_t n = read(STDIN_FILENO, chunk, sizeof(chunk));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) throw TestFailure("the parent closed our stdin");
      pending_.append(chunk, static_cast<size_t>(n));
      waitMs = 0;
    }
  }

 private:
  std::string pending_;
};

struct Announced {
  uint64_t index;
  size_t size;
};

struct Posted {
  Announced message;
  void* request;
  uint8_t* slot;
};

// One connection's messages, as announced, until END or QUIT and the last of them arrived. Returns true after QUIT.
bool receiveConnection(NetApi& net, void* recvComm, const CampaignOptions& o, HostBuffer& buffer, Orders& orders,
                       uint64_t* warnMark) {
  Registration reg(net, recvComm, buffer.data(), buffer.size());
  std::deque<Announced> announced;  // not yet posted
  std::deque<Posted> inflight;      // posted, oldest first (they complete in this order)
  uint64_t posted = 0;
  bool ended = false;
  bool quit = false;
  Clock::time_point lastProgress = Clock::now();
  Clock::time_point lastWarnings = lastProgress;
  Backoff backoff;
  while (!ended || !announced.empty() || !inflight.empty()) {
    if (Clock::now() - lastWarnings > std::chrono::milliseconds(100)) {  // the plugin's WARNs as they come
      reportWarnings(warnMark);
      lastWarnings = Clock::now();
    }
    // Orders: block briefly only when there is nothing else to do.
    const bool idle = announced.empty() && inflight.empty();
    std::string line;
    for (int wait = idle ? 100 : 0; orders.next(&line, wait); wait = 0) {
      std::istringstream words(line);
      std::string verb;
      words >> verb;
      if (verb == "MSG") {
        Announced a{};
        words >> a.index >> a.size;
        REQUIRE(!words.fail() && a.size <= o.maxSize, "child: bad order: " + line);
        REQUIRE(!ended, "child: a message announced after END");
        announced.push_back(a);
      } else if (verb == "END" || verb == "QUIT") {
        ended = true;
        quit = quit || verb == "QUIT";
      } else {
        REQUIRE(false, "child: unknown order: " + line);
      }
    }
    bool progressed = false;
    while (!announced.empty() && inflight.size() < static_cast<size_t>(o.window)) {
      uint8_t* slot = buffer.data() + (posted % static_cast<uint64_t>(o.window)) * o.maxSize;
      void* data = slot;
      size_t size = o.maxSize;
      int tag = 0;
      void* mhandle = reg.handle();
      void* request = nullptr;
      const ncclResult_t rc = net.irecv(recvComm, 1, &data, &size, &tag, &mhandle, &request);
      if (rc != ncclSuccess) {
        throw TestFailure(strf("irecv for message %llu returned %s", static_cast<unsigned long long>(
                                   announced.front().index), ncclResultName(rc)));
      }
      if (request == nullptr) break;  // not yet: again after a test
      inflight.push_back({announced.front(), request, slot});
      announced.pop_front();
      ++posted;
      progressed = true;
    }
    if (!inflight.empty()) {
      const Posted& oldest = inflight.front();
      int done = 0;
      int received = 0;
      const ncclResult_t rc = net.test(oldest.request, &done, &received);
      if (rc != ncclSuccess) {
        throw TestFailure(strf("the receive of message %llu (%zu B) failed: %s",
                               static_cast<unsigned long long>(oldest.message.index), oldest.message.size,
                               ncclResultName(rc)));
      }
      if (done) {
        const Announced m = oldest.message;
        if (static_cast<size_t>(received) != m.size) {
          say(strf("RECEIVED BAD %llu size %d, %zu announced", static_cast<unsigned long long>(m.index), received,
                   m.size));
        } else if (const size_t bad = findMismatch(oldest.slot, m.size, campaignPatternSeed(m.index));
                   bad != SIZE_MAX) {
          say(strf("RECEIVED BAD %llu size %zu, first wrong byte at %zu", static_cast<unsigned long long>(m.index),
                   m.size, bad));
        } else {
          say(strf("RECEIVED OK %llu %zu", static_cast<unsigned long long>(m.index), m.size));
        }
        inflight.pop_front();
        progressed = true;
      }
    }
    if (progressed) {
      lastProgress = Clock::now();
      backoff.progressed();
      continue;
    }
    if (!inflight.empty() && Clock::now() - lastProgress > std::chrono::seconds(o.deadlineSec)) {
      throw TestFailure(strf("the receive of message %llu (%zu B) made no progress for %d s",
                             static_cast<unsigned long long>(inflight.front().message.index),
                             inflight.front().message.size, o.deadlineSec));
    }
    if (!idle) backoff.idle();
  }
  return quit;
}

}  // namespace

bool isCampaignReceiverInvocation(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--child-campaign-receiver") == 0) return true;
  }
  return false;
}

uint64_t campaignPatternSeed(uint64_t index) { return (index + 1) * 0x9E3779B97F4A7C15ULL; }

std::vector<std::string> childCampaignReceiverArgs(int version, int fuse, size_t maxSize, int window, int deadlineSec) {
  return {"--child-campaign-receiver", "--plugin",   options().plugin,         "--version",
          std::to_string(version),     "--fuse",     std::to_string(fuse),     "--max-size",
          std::to_string(maxSize),     "--window",   std::to_string(window),   "--deadline",
          std::to_string(deadlineSec)};
}

void runCampaignReceiver(int argc, char** argv) {
  const CampaignOptions o = parseCampaign(argc, argv);
  PluginLibrary library(o.plugin);
  std::unique_ptr<NetApi> net = openApi(library, o.version);
  REQUIRE(net != nullptr, "child: version not exported");
  NetContext ctx(*net, 0xCA3B);
  int dev = 0;
  if (o.fuse > 1) {
    std::vector<int> children;
    for (int i = 0; i < o.fuse; ++i) children.push_back(i);
    REQUIRE_OK(net->makeVDevice(&dev, children));
  }
  HostBuffer buffer(o.maxSize * static_cast<size_t>(o.window));
  Orders orders;
  uint64_t warnMark = 0;
  for (;;) {
    ConnHandle handle;
    Comm listener = listenOn(*net, ctx.get(), dev, &handle);
    say("HANDLE " + toHex(handle.bytes, sizeof(handle.bytes)));
    Comm recv = acceptLoop(*net, listener.get(), Deadline(std::chrono::seconds(o.deadlineSec)));
    REQUIRE_OK(listener.close());
    const bool quit = receiveConnection(*net, recv.get(), o, buffer, orders, &warnMark);
    REQUIRE_OK(recv.close());
    reportWarnings(&warnMark);
    if (quit) {
      say("DONE");
      return;
    }
    say("CLOSED");
  }
}

}  // namespace conformance
