// The failure campaign (group "campaign", issue 20; docs/failover.md "Order of work", step 3): rails that really fail
// under checksummed transfers. It runs inside namespace A of tests/conformance/veth-rails.sh, whose veth pairs are the
// rails (rnA<i> 10.77.<i>.1 here, rnB<i> 10.77.<i>.2 in namespace B, RAILNET_TCP_ADDRESSES one device per rail). This
// process sends; the receiver is a child process in namespace B (--child-campaign-receiver, child_campaign.cc) with
// B's addresses, which checks every message against a pattern of its own and reports it.
//
// Cases: `fused2` and `fused4` fuse the first 2 or 4 rails on both ends (makeVDevice); `single` uses device 0 alone,
// whose host has the other rails as spares (a single-NIC device moving to another NIC: docs/failover.md, "Single-NIC
// devices"). Each case injects RAILNET_CAMPAIGN_FAILURES failures (6 by default), one at a time, each at a random
// point:
//   connect       the failure goes in, then a new connection is made (connect and accept during it);
//   mid-transfer  after a random number of messages, with up to 8 (of up to 4 MiB each) in flight;
//   close         every send complete, the failure goes in, the comms close, and a new connection goes on;
// of a random kind, on one rail (fused: one of its NICs; single: device 0's rail half the time, else a spare):
//   link-down     `ip -n A link set rnA<i> down` (its route goes with it), then up again;
//   drop          iptables DROPs everything in and out of rnA<i> in namespace A (a silent path), then removed;
//   reset         iptables REJECTs TCP in and out of rnA<i> with a reset (every segment is answered by an RST, new
//                 connections are refused), then removed;
//   kill          `ss -K` aborts namespace A's TCP sockets to or from rail i at once (RSTs to the peer), one shot (at
//                 the connect point 1-30 ms after the connect began, among its handshakes: before it, nothing to kill).
// Each is undone after a random 0.2-3 s (kill: nothing to undo; the next failure still waits as long), messages keep
// flowing meanwhile and for a few more after it, and only then does the next one go in: a path always survives.
// Messages: random sizes from 0 to 4 MiB (many small, some 0), 8 in flight, each with a pattern of its own. The case
// requires every message reported intact by the receiver exactly once, no request to fail, no connect to fail, and
// each message to complete within RAILNET_CAMPAIGN_DEADLINE_S (30 s) of being posted; a failure names the failure in
// effect (or the last one) and the plugin's WARNs. RAILNET_CAMPAIGN_SEED=N (printed otherwise) repeats a run's failures
// in the same order with the same settings (how many messages fit in each dwell varies). RAILNET_CAMPAIGN_POINTS and
// RAILNET_CAMPAIGN_KINDS (comma-separated names from the lists above) draw from some points or kinds only, to isolate
// or reproduce what a full campaign found; RAILNET_CAMPAIGN_AWAIT_FAILBACK=1 holds each failure back until every NIC
// the sender took out has answered again (the failback), so that the plugin, not only the wire, has a path left when
// the next one goes in.
// The summary NOTE: failures by kind and point, connections, messages, bytes, and the plugin's failover WARNs on each
// side by what they say. CI: meson test conformance-campaign; the long form: scripts/failover-campaign.sh.
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "child.h"
#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

long campaignSetting(const char* name, long fallback, long low, long high) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  REQUIRE(end != nullptr && *end == '\0' && value >= low && value <= high,
          strf("%s=%s: expected a whole number from %ld to %ld", name, text, low, high));
  return value;
}

// The indexes of `names` that the comma-separated list in `setting` names (all of them when it is unset): a campaign
// of some points or kinds only, to reproduce or isolate what a full one found.
std::vector<int> chosen(const char* setting, const std::vector<std::string>& names) {
  std::vector<int> out;
  const char* text = std::getenv(setting);
  const std::string list = text != nullptr ? text : "";
  for (size_t i = 0; i < names.size(); ++i) {
    if (list.empty() || ("," + list + ",").find("," + names[i] + ",") != std::string::npos) {
      out.push_back(static_cast<int>(i));
    }
  }
  std::string all;
  for (const std::string& n : names) all += (all.empty() ? "" : ",") + n;
  REQUIRE(!out.empty(), strf("%s=%s names none of %s", setting, list.c_str(), all.c_str()));
  return out;
}

struct CampaignSetup {
  std::vector<int> points;  // indexes into kPoints / kKinds that may be drawn
  std::vector<int> kinds;
  std::string nsA;
  std::string nsB;
  int rails = 0;
  uint64_t seed = 0;
  int failures = 6;
  int deadlineSec = 30;  // per message, from its isend
  bool awaitFailback = false;
  size_t maxSize = 4 * MiB;
  int window = 8;
};

CampaignSetup campaignSetup() {
  CampaignSetup s;
  s.nsA = std::getenv("RAILNET_CAMPAIGN_NETNS_A");
  s.nsB = std::getenv("RAILNET_CAMPAIGN_NETNS_B");
  s.rails = static_cast<int>(campaignSetting("RAILNET_CAMPAIGN_RAILS", 0, 1, 32));
  s.failures = static_cast<int>(campaignSetting("RAILNET_CAMPAIGN_FAILURES", 6, 0, 1000000));
  s.deadlineSec = static_cast<int>(campaignSetting("RAILNET_CAMPAIGN_DEADLINE_S", 30, 1, 3600));
  s.awaitFailback = campaignSetting("RAILNET_CAMPAIGN_AWAIT_FAILBACK", 0, 0, 1) == 1;
  // One seed per run (every case derives its own draws from it), so that one number repeats the whole run.
  static const uint64_t seed = [] {
    const char* text = std::getenv("RAILNET_CAMPAIGN_SEED");
    return text != nullptr && *text != '\0' ? std::strtoull(text, nullptr, 10) : uint64_t{std::random_device{}()};
  }();
  s.seed = seed;
  s.maxSize = std::min(s.maxSize, options().maxSize);
  s.points = chosen("RAILNET_CAMPAIGN_POINTS", {"connect", "mid-transfer", "close"});
  s.kinds = chosen("RAILNET_CAMPAIGN_KINDS", {"link-down", "drop", "reset", "kill"});
  return s;
}

std::string campaignUnmet() {
  const char* a = std::getenv("RAILNET_CAMPAIGN_NETNS_A");
  const char* b = std::getenv("RAILNET_CAMPAIGN_NETNS_B");
  if (a == nullptr || b == nullptr || std::getenv("RAILNET_CAMPAIGN_RAILS") == nullptr) {
    return "needs rails that can fail: run it through tests/conformance/veth-rails.sh N (it sets "
           "RAILNET_CAMPAIGN_NETNS_A, _B and _RAILS)";
  }
  struct stat self {};
  struct stat named {};
  if (stat("/proc/self/ns/net", &self) != 0 || stat((std::string("/var/run/netns/") + a).c_str(), &named) != 0 ||
      self.st_ino != named.st_ino || self.st_dev != named.st_dev) {
    return std::string("this process is not in network namespace ") + a + " (RAILNET_CAMPAIGN_NETNS_A)";
  }
  if (std::system("iptables -w -L INPUT -n >/dev/null 2>&1") != 0) return "iptables does not work here";
  if (verbsTransport()) return "TCP only: the rails are veth pairs";
  return "";
}
GROUP_REQUIRES("campaign", campaignUnmet);

// ---- failures ----------------------------------------------------------------------------------------------------

enum class Point { Connect, Mid, Close };
enum class Kind { LinkDown, Drop, Reset, Kill };
constexpr Point kPoints[] = {Point::Connect, Point::Mid, Point::Close};
constexpr Kind kKinds[] = {Kind::LinkDown, Kind::Drop, Kind::Reset, Kind::Kill};

const char* pointName(Point p) {
  switch (p) {
    case Point::Connect: return "connect";
    case Point::Mid: return "mid-transfer";
    case Point::Close: return "close";
  }
  return "?";
}

const char* kindName(Kind k) {
  switch (k) {
    case Kind::LinkDown: return "link-down";
    case Kind::Drop: return "drop";
    case Kind::Reset: return "reset";
    case Kind::Kill: return "kill";
  }
  return "?";
}

struct Failure {
  int id = 0;
  Point point = Point::Mid;
  Kind kind = Kind::Drop;
  int rail = 1;  // 1-based: rnA<rail>, 10.77.<rail>.1
  std::chrono::milliseconds dwell{0};
  std::string describe() const {
    return strf("#%d %s of rail %d (rnA%d) at %s, undone after %.2f s", id, kindName(kind), rail, rail,
                pointName(point), static_cast<double>(dwell.count()) / 1000.0);
  }
};

// The commands that put a failure in effect and take it away (this process runs in namespace A: iptables and ss act
// on A; ip names it).
// inject: the failure goes in; else it comes out (a kill has nothing to undo).
std::vector<std::string> failureCommands(const Failure& f, const std::string& nsA, bool inject) {
  const std::string dev = "rnA" + std::to_string(f.rail);
  const std::string subnet = strf("10.77.%d.0/24", f.rail);
  const std::string rule = inject ? "-I" : "-D";
  auto bothWays = [&](const std::string& match) {
    return std::vector<std::string>{"iptables -w " + rule + " INPUT -i " + dev + match,
                                    "iptables -w " + rule + " OUTPUT -o " + dev + match};
  };
  switch (f.kind) {
    case Kind::LinkDown: return {"ip -n " + nsA + " link set " + dev + (inject ? " down" : " up")};
    case Kind::Drop: return bothWays(" -j DROP");
    case Kind::Reset: return bothWays(" -p tcp -j REJECT --reject-with tcp-reset");
    case Kind::Kill:
      if (!inject) return {};
      return {"ss -K -t src " + subnet + " >/dev/null", "ss -K -t dst " + subnet + " >/dev/null"};
  }
  return {};
}

std::string runCommands(const std::vector<std::string>& commands) {
  std::string errors;
  for (const std::string& command : commands) {
    const int rc = std::system((command + " 2>&1").c_str());
    if (rc != 0) errors += strf("`%s` exited %d; ", command.c_str(), rc);
  }
  return errors;
}

// Puts one failure in effect at a time and takes it away after its dwell, from a thread of its own, while the test
// keeps moving messages. Whatever is in effect when it is destroyed is undone at once.
class Injector {
 public:
  explicit Injector(std::string nsA) : nsA_(std::move(nsA)), thread_([this] { run(); }) {}
  ~Injector() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  Injector(const Injector&) = delete;
  Injector& operator=(const Injector&) = delete;

  // Puts `f` in effect: now, or `delay` from now on the injector's thread (so that it lands while the caller is busy,
  // e.g. a kill during a connect). It is undone f.dwell after it went in.
  void inject(const Failure& f, std::chrono::milliseconds delay = std::chrono::milliseconds(0)) {
    std::unique_lock<std::mutex> lock(mu_);
    REQUIRE(!current_ && !pending_, "a failure is already in effect");
    history_.push_back(strf("%s (%s at +%.2f s)", f.describe().c_str(), delay.count() > 0 ? "scheduled" : "injected",
                            secondsSince(start_)));
    if (history_.size() > 4) history_.pop_front();
    if (delay.count() > 0) {
      pending_ = f;
      pendingAt_ = Clock::now() + delay;
    } else {
      lock.unlock();
      const std::string errors = runCommands(failureCommands(f, nsA_, true));
      REQUIRE(errors.empty(), "could not inject failure " + f.describe() + ": " + errors);
      lock.lock();
      current_ = f;
      injectedAt_ = Clock::now();
    }
    cv_.notify_all();
  }
  // True while a failure is scheduled or in effect.
  bool active() const {
    std::lock_guard<std::mutex> lock(mu_);
    if (!errors_.empty()) fail(__FILE__, __LINE__, errors_);
    return current_.has_value() || pending_.has_value();
  }
  // What is in effect now, and the last few failures, for a failure report.
  std::string state() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::string out = current_   ? strf("in effect: %s, injected %.2f s ago", current_->describe().c_str(),
                                        secondsSince(injectedAt_))
                      : pending_ ? "scheduled: " + pending_->describe()
                                 : strf("none in effect (the last was undone %.2f s ago)", secondsSince(undoneAt_));
    out += strf("; now +%.2f s | latest failures:", secondsSince(start_));
    for (const std::string& h : history_) out += " " + h + ";";
    return out;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || current_.has_value() || pending_.has_value(); });
      if (pending_) {
        cv_.wait_until(lock, pendingAt_, [&] { return stop_; });
        if (stop_) return;
        const Failure f = *pending_;
        lock.unlock();
        const std::string errors = runCommands(failureCommands(f, nsA_, true));
        lock.lock();
        pending_.reset();  // only now: active() holds from the schedule until the undo
        if (!errors.empty()) {
          errors_ += "could not inject failure " + f.describe() + ": " + errors;
          continue;
        }
        current_ = f;
        injectedAt_ = Clock::now();
      }
      if (current_) {
        cv_.wait_until(lock, injectedAt_ + current_->dwell, [&] { return stop_; });
        const Failure f = *current_;
        lock.unlock();
        const std::string errors = runCommands(failureCommands(f, nsA_, false));
        lock.lock();
        if (!errors.empty()) errors_ += "could not undo failure " + f.describe() + ": " + errors;
        current_.reset();
        undoneAt_ = Clock::now();
      }
      if (stop_) return;
    }
  }

  const std::string nsA_;
  const Clock::time_point start_ = Clock::now();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::optional<Failure> pending_;  // to go in at pendingAt_
  Clock::time_point pendingAt_{};
  std::optional<Failure> current_;  // in effect since injectedAt_
  Clock::time_point injectedAt_{};
  Clock::time_point undoneAt_ = Clock::now();
  std::deque<std::string> history_;
  std::string errors_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once everything above is built
};

// ---- the receiver child --------------------------------------------------------------------------------------------

// What the plugin's WARNs say, by the failover events they name (docs/failover.md), for the summary.
std::string warningKind(const std::string& text) {
  if (text.find("acknowledged nothing for") != std::string::npos) return "nic-silent";
  if (text.find("went down") != std::string::npos) return "nic-link-down";
  if (text.find("answers again") != std::string::npos || text.find("answered") != std::string::npos) return "failback";
  if (text.find("could not connect") != std::string::npos) return "nic-down-at-connect";
  if (text.find("every NIC failed") != std::string::npos) return "all-nics-failed";
  if (text.find(": moved to ") != std::string::npos) return "moved";  // a single-NIC device's connection
  if (text.find("the data streams of") != std::string::npos) return "nic-failed";
  if (text.find("the control connection") != std::string::npos) return "control-remade";
  if (text.find("a data stream of") != std::string::npos) return "stream-failed";
  if (text.find("data stream") != std::string::npos && text.find("again failed") != std::string::npos) {
    return "stream-remake-failed";
  }
  if (text.find("watchdog:") != std::string::npos) return "watchdog";
  if (text.find(" failed: ") != std::string::npos) return "connection-failed";
  return "other";
}

std::string describeKinds(const std::map<std::string, int>& counts) {
  std::string out;
  for (const auto& [kind, n] : counts) out += strf("%s%s %d", out.empty() ? "" : ", ", kind.c_str(), n);
  return out.empty() ? "none" : out;
}

// The NICs this process's send connection took out since `mark` (WARN "the data streams of NIC failed") and that have
// not answered again since (WARN "NIC answers again": the failback). A single-NIC device's connection that moved on
// from a spare ("the data streams of the path it had moved to (NIC) failed") waits for its own NIC only.
std::vector<std::string> nicsOut(uint64_t mark) {
  std::vector<std::string> out;
  auto word = [](const std::string& text, size_t from) { return text.substr(from, text.find(' ', from) - from); };
  for (const LogRecord& w : warningsSince(mark)) {
    const std::string failed = "the data streams of ";
    if (const size_t at = w.text.find(failed); at != std::string::npos) {
      const std::string nic = word(w.text, at + failed.size());
      if (nic != "the" && std::find(out.begin(), out.end(), nic) == out.end()) out.push_back(nic);
    } else if (const size_t again = w.text.find(" answers again "); again != std::string::npos) {
      const size_t start = w.text.rfind(' ', again - 1) + 1;
      out.erase(std::remove(out.begin(), out.end(), w.text.substr(start, again - start)), out.end());
    }
  }
  return out;
}

// The child receiver and a thread that reads its reports as they come (it must never block on a full pipe).
class Receiver {
 public:
  explicit Receiver(const std::vector<std::string>& args) : child_(args, /*withInput=*/true) {
    thread_ = std::thread([this] { read(); });
  }
  ~Receiver() {
    stop_.store(true);
    child_.kill();
    thread_.join();
  }
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  void announce(uint64_t index, size_t size) {
    child_.writeLine(strf("MSG %llu %zu", static_cast<unsigned long long>(index), size));
  }
  void end(bool quit) { child_.writeLine(quit ? "QUIT" : "END"); }

  // The next connection's listen handle (after a close: once the child received every message and closed).
  ConnHandle nextHandle(const Deadline& deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    waitFor(lock, deadline, "the receiver's next listen handle", [&] { return !handles_.empty(); });
    const std::string hex = handles_.front();
    handles_.pop_front();
    ConnHandle handle;
    REQUIRE(fromHex(hex, handle.bytes, sizeof(handle.bytes)), "the receiver printed a bad handle: " + hex);
    return handle;
  }
  void waitDone(const Deadline& deadline) {
    std::unique_lock<std::mutex> lock(mu_);
    waitFor(lock, deadline, "the receiver to finish (DONE)", [&] { return done_; });
  }
  // Every message 0..count-1 reported: intact, once, with the size sent.
  void checkReports(const std::vector<size_t>& sizes) {
    std::lock_guard<std::mutex> lock(mu_);
    REQUIRE(bad_.empty(), strf("%zu message(s) arrived damaged; the first: %s", bad_.size(), bad_.front().c_str()));
    REQUIRE(duplicates_.empty(), "messages reported twice: " + duplicates_);
    REQUIRE(reported_.size() == sizes.size(),
            strf("%zu messages sent, %zu reported received", sizes.size(), reported_.size()));
    for (const auto& [index, size] : reported_) {
      REQUIRE(index < sizes.size() && sizes[index] == size,
              strf("message %llu reported with %zu bytes", static_cast<unsigned long long>(index), size));
    }
  }
  // Fails at once when the child reported a damaged message, failed or exited (so that the failure in effect is named).
  void checkHealthy() const {
    std::lock_guard<std::mutex> lock(mu_);
    REQUIRE(bad_.empty(), "the receiver got a damaged message: " + bad_.front());
    REQUIRE(failed_.empty(), "the receiver child failed: " + failed_);
    REQUIRE(!gone_, "the receiver child exited");
  }
  std::map<std::string, int> warningKinds() const {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<std::string, int> counts;
    for (const std::string& w : warnings_) ++counts[warningKind(w)];
    return counts;
  }
  std::vector<std::string> warnings() const {
    std::lock_guard<std::mutex> lock(mu_);
    return warnings_;
  }
  // The child's failure line, if it fails within `grace` (after ours: its end of the connection may fail a moment
  // later), for reports.
  std::string failure(std::chrono::milliseconds grace) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait_for(lock, grace, [&] { return !failed_.empty() || gone_; });
    return failed_;
  }
  size_t reportedCount() const {
    std::lock_guard<std::mutex> lock(mu_);
    return reported_.size();
  }

 private:
  template <typename Ready>
  void waitFor(std::unique_lock<std::mutex>& lock, const Deadline& deadline, const char* what, Ready ready) {
    while (!ready()) {
      if (!failed_.empty()) fail(__FILE__, __LINE__, "the receiver child failed: " + failed_);
      if (gone_) fail(__FILE__, __LINE__, strf("the receiver child exited while we waited for %s", what));
      deadline.check(what);
      cv_.wait_for(lock, std::chrono::milliseconds(50));
    }
  }

  void read() {
    const Deadline forever(std::chrono::hours(24), &stop_);
    try {
      for (;;) handleLine(child_.readLine(forever));
    } catch (const std::exception&) {
      std::lock_guard<std::mutex> lock(mu_);
      gone_ = true;
    }
    cv_.notify_all();
  }

  void handleLine(const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    if (line.rfind("RECEIVED OK ", 0) == 0) {
      unsigned long long index = 0;
      size_t size = 0;
      if (std::sscanf(line.c_str(), "RECEIVED OK %llu %zu", &index, &size) == 2) {
        if (!reported_.emplace(index, size).second) duplicates_ += strf("%llu ", index);
      } else {
        bad_.push_back("unparsable: " + line);
      }
    } else if (line.rfind("RECEIVED BAD", 0) == 0) {
      bad_.push_back(line);
    } else if (line.rfind("HANDLE ", 0) == 0) {
      handles_.push_back(line.substr(7));
    } else if (line.rfind("WARN ", 0) == 0) {
      warnings_.push_back(line.substr(5));
    } else if (line.rfind("FAILED", 0) == 0) {
      failed_ = line;
    } else if (line == "DONE") {
      done_ = true;
    }
    cv_.notify_all();
  }

  ChildProcess child_;
  std::atomic<bool> stop_{false};
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> handles_;
  std::map<uint64_t, size_t> reported_;
  std::vector<std::string> bad_;
  std::string duplicates_;
  std::vector<std::string> warnings_;
  std::string failed_;
  bool done_ = false;
  bool gone_ = false;
  std::thread thread_;
};

// ---- the sending side ----------------------------------------------------------------------------------------------

// This process's send comm to the child, one connection after another, with up to `window` isends in flight, each
// from a buffer slot of its own filled with its message's pattern.
class Sender {
 public:
  Sender(NetApi& net, void* ctx, int dev, Receiver& receiver, const CampaignSetup& setup)
      : net_(net), ctx_(ctx), dev_(dev), receiver_(receiver), setup_(setup),
        buffers_(setup.maxSize * static_cast<size_t>(setup.window)) {}
  ~Sender() {
    reg_.reset();  // deregMr before the comm closes (Comm's destructor)
  }
  Sender(const Sender&) = delete;
  Sender& operator=(const Sender&) = delete;

  // The receiver's next listen handle (after a close: once it received every message and closed).
  ConnHandle nextHandle() { return receiver_.nextHandle(Deadline(std::chrono::seconds(setup_.deadlineSec))); }
  void open() { open(nextHandle()); }
  // A new connection to `handle`.
  void open(ConnHandle handle) {
    const Clock::time_point start = Clock::now();
    send_ = connectLoop(net_, ctx_, dev_, handle, Deadline(std::chrono::seconds(setup_.deadlineSec)));
    connectSeconds_ = std::max(connectSeconds_, secondsSince(start));
    reg_ = std::make_unique<Registration>(net_, send_.get(), buffers_.data(), buffers_.size());
    ++connections_;
    openMark_ = logMark();
  }

  // One message of `size` bytes: waits for a free slot (completing older sends), announces it, posts it.
  void sendOne(size_t size) {
    receiver_.checkHealthy();
    while (inflight_.size() >= static_cast<size_t>(setup_.window)) pump(true);
    const uint64_t index = sizes_.size();
    uint8_t* slot = buffers_.data() + (index % static_cast<uint64_t>(setup_.window)) * setup_.maxSize;
    fillPattern(slot, size, campaignPatternSeed(index));
    receiver_.announce(index, size);
    sizes_.push_back(size);
    bytes_ += size;
    const Clock::time_point posted = Clock::now();
    for (Backoff backoff;; backoff.idle()) {
      void* request = nullptr;
      const ncclResult_t rc = net_.isend(send_.get(), slot, size, 0, reg_->handle(), &request);
      REQUIRE(rc == ncclSuccess, strf("isend of message %llu (%zu B) returned %s",
                                      static_cast<unsigned long long>(index), size, ncclResultName(rc)));
      if (request != nullptr) {
        inflight_.push_back({index, size, request, posted});
        return;
      }
      REQUIRE(secondsSince(posted) < setup_.deadlineSec,
              strf("isend of message %llu (%zu B) still answered \"not yet\" after %d s",
                   static_cast<unsigned long long>(index), size, setup_.deadlineSec));
      if (pump(false)) backoff.progressed();
    }
  }

  // Every send complete.
  void drain() {
    while (!inflight_.empty()) pump(true);
  }

  // Every send complete, then the receiver told to close (or to quit), then our comm closed.
  void close(bool quit) {
    drain();
    receiver_.end(quit);
    reg_.reset();
    REQUIRE_OK(send_.close());
  }

  size_t messages() const { return sizes_.size(); }
  uint64_t bytes() const { return bytes_; }
  int connections() const { return connections_; }
  uint64_t openMark() const { return openMark_; }
  double slowestConnect() const { return connectSeconds_; }
  double slowestMessage() const { return slowest_; }
  const std::vector<size_t>& sizes() const { return sizes_; }

 private:
  struct InFlight {
    uint64_t index;
    size_t size;
    void* request;
    Clock::time_point posted;
  };

  // Tests the oldest send (they complete in order); true when it completed. `wait`: idles a little when not.
  bool pump(bool wait) {
    if (inflight_.empty()) return false;
    const InFlight& oldest = inflight_.front();
    int done = 0;
    const ncclResult_t rc = net_.test(oldest.request, &done, nullptr);
    REQUIRE(rc == ncclSuccess, strf("the send of message %llu (%zu B) failed: %s",
                                    static_cast<unsigned long long>(oldest.index), oldest.size, ncclResultName(rc)));
    const double age = secondsSince(oldest.posted);
    if (done) {
      slowest_ = std::max(slowest_, age);
      inflight_.pop_front();
      backoff_.progressed();
      return true;
    }
    REQUIRE(age < setup_.deadlineSec, strf("the send of message %llu (%zu B) is not complete %d s after its isend",
                                           static_cast<unsigned long long>(oldest.index), oldest.size,
                                           setup_.deadlineSec));
    if (wait) backoff_.idle();
    return false;
  }

  NetApi& net_;
  void* ctx_;
  int dev_;
  Receiver& receiver_;
  const CampaignSetup& setup_;
  HostBuffer buffers_;
  Comm send_;
  std::unique_ptr<Registration> reg_;
  std::deque<InFlight> inflight_;
  std::vector<size_t> sizes_;
  uint64_t bytes_ = 0;
  int connections_ = 0;
  uint64_t openMark_ = 0;  // the log's position when the current connection was made
  double connectSeconds_ = 0;
  double slowest_ = 0;
  Backoff backoff_;
};

// ---- the campaign --------------------------------------------------------------------------------------------------

enum class Shape { Fused, Single };

std::string railAddresses(int rails, int host) {
  std::string out;
  for (int i = 1; i <= rails; ++i) out += strf("%s10.77.%d.%d", out.empty() ? "" : ",", i, host);
  return out;
}

void runCampaign(TestEnv& env, Shape shape, int nics) {
  skipUnlessHeavy(env);
  if (shape == Shape::Fused && env.version < 9) SKIP("fusion needs makeVDevice (v9+)");
  const CampaignSetup setup = campaignSetup();
  const int needed = shape == Shape::Fused ? nics : 2;  // single: device 0 and at least one spare
  if (setup.rails < needed) {
    SKIP(strf("needs %d rails, veth-rails.sh made %d (RAILNET_CAMPAIGN_RAILS)", needed, setup.rails));
  }
  PluginLibrary library(options().plugin);
  std::unique_ptr<NetApi> net = openApi(library, env.version);
  REQUIRE(net != nullptr, "symbol vanished on reload");
  NetContext ctx(*net, nextCommId());
  int count = 0;
  REQUIRE_OK(net->devices(&count));
  REQUIRE(count >= setup.rails, strf("%d devices for %d rails: is RAILNET_TCP_ADDRESSES the rails'?", count,
                                     setup.rails));
  for (int i = 0; i < setup.rails; ++i) {
    DeviceProps props;
    REQUIRE_OK(net->getProperties(i, &props));
    const std::string address = strf("@10.77.%d.1", i + 1);
    REQUIRE(props.name != nullptr && std::strstr(props.name, address.c_str()) != nullptr,
            strf("device %d is %s, not rail %d's", i, props.name ? props.name : "(null)", i + 1));
  }
  int dev = 0;
  if (shape == Shape::Fused) {
    std::vector<int> children;
    for (int i = 0; i < nics; ++i) children.push_back(i);
    REQUIRE_OK(net->makeVDevice(&dev, children));
  }

  // The receiver in namespace B, with B's end of every rail as its devices (device 0 and the same fusion there).
  std::vector<std::string> args = childCampaignReceiverArgs(env.version, shape == Shape::Fused ? nics : 1,
                                                            setup.maxSize, setup.window, 2 * setup.deadlineSec);
  const std::vector<std::string> placement =
      childPlacementArgs(setup.nsB, {"RAILNET_TCP_ADDRESSES=" + railAddresses(setup.rails, 2)});
  args.insert(args.end(), placement.begin(), placement.end());
  if (options().verbose) setLogEcho(true);

  // Two streams from the seed: the failures (point, kind, rail, dwell, messages before each) repeat exactly with it;
  // how many messages fit in a dwell depends on timing, so their sizes come from a stream of their own.
  const uint64_t seed = setup.seed ^ (static_cast<uint64_t>(shape) * 1000003u + static_cast<uint64_t>(nics));
  std::mt19937_64 rng(seed);
  std::mt19937_64 sizeRng(seed ^ 0x5EED5EED5EEDULL);
  auto uniform = [&](int low, int high) { return std::uniform_int_distribution<int>(low, high)(rng); };
  const uint64_t mark = logMark();
  std::map<std::string, int> byKind;
  std::map<std::string, int> byPoint;
  const Clock::time_point start = Clock::now();
  {
    Receiver receiver(args);
    Injector injector(setup.nsA);
    Sender sender(*net, ctx.get(), dev, receiver, setup);
    auto some = [&](int low, int high) {
      for (int n = uniform(low, high); n > 0; --n) sender.sendOne(randomSize(sizeRng, setup.maxSize));
    };
    try {
      sender.open();
      some(1, 8);
      for (int id = 1; id <= setup.failures; ++id) {
        // One failure at a time: messages keep flowing while the last is in effect, and a few after it was undone.
        while (injector.active()) sender.sendOne(randomSize(sizeRng, setup.maxSize));
        some(2, 10);
        if (setup.awaitFailback) {
          // Each NIC taken out must answer again (the failback probes: 1 s, doubling to 30 s) before the next failure.
          const Clock::time_point since = Clock::now();
          for (std::vector<std::string> out = nicsOut(sender.openMark()); !out.empty();
               out = nicsOut(sender.openMark())) {
            REQUIRE(secondsSince(since) < 65, strf("%s did not answer again within 65 s of its path coming back",
                                                   out.front().c_str()));
            sender.sendOne(randomSize(sizeRng, setup.maxSize));
          }
        }
        Failure f;
        f.id = id;
        f.point = kPoints[setup.points[static_cast<size_t>(uniform(0, static_cast<int>(setup.points.size()) - 1))]];
        f.kind = kKinds[setup.kinds[static_cast<size_t>(uniform(0, static_cast<int>(setup.kinds.size()) - 1))]];
        // Fused: one of its NICs. Single: device 0's own rail half the time (its connection must move to a spare),
        // else another (a spare the connection may have moved to, or an idle rail).
        f.rail = shape == Shape::Fused ? uniform(1, nics) : (uniform(0, 1) == 0 ? 1 : uniform(2, setup.rails));
        f.dwell = std::chrono::milliseconds(uniform(200, 3000));
        ++byKind[kindName(f.kind)];
        ++byPoint[pointName(f.point)];
        if (options().verbose) std::fprintf(stderr, "campaign: failure %s\n", f.describe().c_str());
        switch (f.point) {
          case Point::Connect: {  // a clean close, the failure, and a connect (and accept) during it
            sender.close(false);
            const ConnHandle handle = sender.nextHandle();  // the receiver listens again
            // A kill before the connect would find nothing to kill: it lands 1-30 ms into the connect instead, among
            // the connection's handshakes.
            injector.inject(f, std::chrono::milliseconds(f.kind == Kind::Kill ? uniform(1, 30) : 0));
            sender.open(handle);
            break;
          }
          case Point::Mid:  // a few messages more, and the failure while up to `window` are in flight
            some(0, 12);
            injector.inject(f);
            break;
          case Point::Close:  // every send complete, the failure, and the close (a new connection goes on)
            sender.drain();
            injector.inject(f);
            sender.close(false);
            sender.open();
            break;
        }
      }
      while (injector.active()) sender.sendOne(randomSize(sizeRng, setup.maxSize));
      some(2, 10);
      sender.close(true);
      receiver.waitDone(Deadline(std::chrono::seconds(setup.deadlineSec)));
      receiver.checkReports(sender.sizes());
    } catch (const TestFailure& e) {
      // One line (the runner joins lines): what failed, where the campaign stood, what was in effect, the receiver's
      // state and its latest WARNs. This process's WARNs follow on stderr (the runner prints them).
      const std::string state = injector.state();  // now, before the wait for the child
      const std::string child = receiver.failure(std::chrono::seconds(2));
      std::string childWarnings;
      const std::vector<std::string> warnings = receiver.warnings();
      for (size_t i = warnings.size() > 4 ? warnings.size() - 4 : 0; i < warnings.size(); ++i) {
        childWarnings += " | receiver WARN: " + warnings[i];
      }
      fail(__FILE__, __LINE__,
           strf("%s | campaign seed %llu (RAILNET_CAMPAIGN_SEED), connection %d, %zu messages sent, %zu reported | "
                "failure %s | receiver child: %s%s",
                e.what(), static_cast<unsigned long long>(setup.seed), sender.connections(), sender.messages(),
                receiver.reportedCount(), state.c_str(), child.empty() ? "running" : child.c_str(),
                childWarnings.c_str()));
    }
    std::map<std::string, int> here;
    for (const LogRecord& w : warningsSince(mark)) ++here[warningKind(w.text)];
    // The settings that narrow a campaign, so that a log says what it ran.
    std::string narrowed;
    for (const char* name : {"RAILNET_CAMPAIGN_POINTS", "RAILNET_CAMPAIGN_KINDS", "RAILNET_CAMPAIGN_AWAIT_FAILBACK",
                             "RAILNET_CAMPAIGN_RATE"}) {
      if (const char* value = std::getenv(name); value != nullptr && *value != '\0') {
        narrowed += strf(" %s=%s", name, value);
      }
    }
    note(strf("seed %llu%s; %s over %d of %d rails: %d failures (%s; at %s), %d connections, %zu messages, %.1f MiB, "
              "every one intact; slowest message %.2f s, slowest connect %.2f s, %.1f s in all; failover WARNs: "
              "sender %s; receiver %s",
              static_cast<unsigned long long>(setup.seed), narrowed.c_str(),
              shape == Shape::Fused ? "fused device" : "device 0",
              shape == Shape::Fused ? nics : 1, setup.rails, setup.failures, describeKinds(byKind).c_str(),
              describeKinds(byPoint).c_str(), sender.connections(), sender.messages(),
              static_cast<double>(sender.bytes()) / static_cast<double>(MiB), sender.slowestMessage(),
              sender.slowestConnect(), secondsSince(start), describeKinds(here).c_str(),
              describeKinds(receiver.warningKinds()).c_str()));
  }
}

}  // namespace

TEST_CASE("campaign", "fused2", Scope::PerVersionOwnLoad) { runCampaign(env, Shape::Fused, 2); }
TEST_CASE("campaign", "fused4", Scope::PerVersionOwnLoad) { runCampaign(env, Shape::Fused, 4); }
TEST_CASE("campaign", "single", Scope::PerVersionOwnLoad) { runCampaign(env, Shape::Single, 1); }

}  // namespace conformance
