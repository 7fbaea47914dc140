#include "proxy/progress/watchdog.h"

#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::progress {
namespace {

std::mutex gWatchdogMutex;
std::weak_ptr<Watchdog> gWatchdog;

std::string expandPid(const std::string& pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size() && pattern[i + 1] == 'p') {
      out += std::to_string(getpid());
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}

// Several looks per limit, so a stall or a lost host is reported within 1.25 x its limit; at least once a second
// (the dump trigger), at most 50 times a second.
std::chrono::milliseconds tickFor(std::chrono::milliseconds limit, std::chrono::milliseconds hostSilenceLimit,
                                  std::chrono::milliseconds pathSilenceLimit) {
  std::chrono::milliseconds shortest = std::chrono::seconds(4);
  if (limit.count() > 0) shortest = std::min(shortest, limit);
  if (hostSilenceLimit.count() > 0) shortest = std::min(shortest, hostSilenceLimit);
  if (pathSilenceLimit.count() > 0) shortest = std::min(shortest, pathSilenceLimit);
  return std::max<std::chrono::milliseconds>(shortest / 4, std::chrono::milliseconds(20));
}

}  // namespace

void reportMovesAgain(const std::string& what, const ProgressMark& mark) noexcept {
  RN_WARN("NET/railnet: watchdog: %s moves again after a stall of %.1f s", what.c_str(),
          std::chrono::duration<double>(mark.stalledFor()).count());
}

void reportCompletedAfterStall(const std::string& what, const ProgressMark& mark) noexcept {
  RN_WARN("NET/railnet: watchdog: %s completed after a stall of %.1f s", what.c_str(),
          mark.quietFor(WatchClock::now()));
}

std::shared_ptr<Watchdog> Watchdog::acquire() {
  std::lock_guard<std::mutex> lock(gWatchdogMutex);
  std::shared_ptr<Watchdog> watchdog = gWatchdog.lock();
  if (!watchdog) {
    const Settings& config = settings();
    watchdog = std::make_shared<Watchdog>(std::chrono::milliseconds(config.watchdogMs),
                                          std::chrono::milliseconds(config.peerTimeoutMs), expandPid(config.dumpFile),
                                          std::chrono::milliseconds(config.failover != 0 ? config.failoverSilenceMs : 0));
    gWatchdog = watchdog;
  }
  return watchdog;
}

Watchdog::Watchdog(std::chrono::milliseconds limit, std::chrono::milliseconds hostSilenceLimit, std::string dumpFile,
                   std::chrono::milliseconds pathSilenceLimit)
    : limit_(limit), hostSilenceLimit_(hostSilenceLimit), pathSilenceLimit_(pathSilenceLimit), dumpFile_(std::move(dumpFile)) {
  if (limit_.count() == 0 && hostSilenceLimit_.count() == 0 && pathSilenceLimit_.count() == 0 && dumpFile_.empty()) {
    return;  // nothing to do: no thread
  }
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "railnet-watch");
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: watchdog: requests with no progress for %lld ms are reported; "
          "connections whose peer host acknowledges nothing for %lld ms fail%s%s", static_cast<long long>(limit_.count()),
          static_cast<long long>(hostSilenceLimit_.count()), dumpFile_.empty() ? "" : "; state dump on creating ",
          dumpFile_.c_str());
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::add(Watched* watched) {
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.push_back(watched);
}

void Watchdog::remove(Watched* watched) {
  // A round holds mutex_ throughout, so taking it waits for any round that may be inside `watched`.
  std::lock_guard<std::mutex> lock(mutex_);
  watched_.erase(std::remove(watched_.begin(), watched_.end(), watched), watched_.end());
}

void Watchdog::lookNow() {
  std::lock_guard<std::mutex> lock(mutex_);
  lookLocked(WatchClock::now());
}

void Watchdog::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  const auto tick = tickFor(limit_, hostSilenceLimit_, pathSilenceLimit_);
  while (!stop_) {
    wake_.wait_for(lock, tick, [this] { return stop_; });
    if (stop_) break;
    lookLocked(WatchClock::now());
  }
}

void Watchdog::lookLocked(WatchClock::time_point now) {
  if (limit_.count() > 0) {
    for (Watched* watched : watched_) watched->watch(now, limit_);
  }
  if (pathSilenceLimit_.count() > 0) {
    for (Watched* watched : watched_) watched->watchPaths(now, pathSilenceLimit_);
  }
  if (hostSilenceLimit_.count() > 0) {
    for (Watched* watched : watched_) watched->watchPeerHost(now, hostSilenceLimit_);
  }
  dumpIfAsked(now);
}

void Watchdog::dumpIfAsked(WatchClock::time_point now) {
  if (dumpFile_.empty() || dumpTriggerBroken_ || access(dumpFile_.c_str(), F_OK) != 0) return;
  // Deleted first: a trigger created again while this dump runs asks for another one.
  if (unlink(dumpFile_.c_str()) != 0) {
    const int err = errno;
    RN_WARN("NET/railnet: dump: cannot delete %s (%s): the trigger is off for this process, so a file that stays "
            "cannot ask for a dump every second", dumpFile_.c_str(), errnoText(err).c_str());
    dumpTriggerBroken_ = true;
    return;
  }
  RN_WARN("NET/railnet: dump (asked by %s): %zu open comms", dumpFile_.c_str(), watched_.size());
  std::vector<std::string> lines;
  for (size_t i = 0; i < watched_.size(); ++i) {
    lines.clear();
    watched_[i]->describe(now, &lines);
    for (const std::string& line : lines) RN_WARN("NET/railnet: dump [%zu] %s", i, line.c_str());
  }
  RN_WARN("NET/railnet: dump end");
}

void WatchRegistration::start(Watched* watched) {
  reset();
  watchdog_ = Watchdog::acquire();
  watched_ = watched;
  watchdog_->add(watched_);
}

void WatchRegistration::reset() noexcept {
  if (!watchdog_) return;
  watchdog_->remove(watched_);
  watchdog_.reset();  // the last comm's reset stops the thread
}

}  // namespace railnet::progress
