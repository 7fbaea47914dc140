// The watchdog: one process-wide thread that looks at every open comm a few times per RAILNET_WATCHDOG_MS and
// reports, once and at WARN, a request that moved no byte for that long (the peer, the request, the bytes done,
// when the last byte moved), without failing it: a slow or stopped peer is not a dead one (docs/reliability.md).
// The same looks fail a connection whose peer host acknowledged nothing for RAILNET_PEER_TIMEOUT_MS.
// It also serves the on-demand dump: when the file RAILNET_DUMP_FILE names appears, every comm's state goes to
// NCCL's log at WARN and the file is deleted. Runs while at least one comm is open, so no railnet thread outlives
// the last comm (NCCL may dlclose the plugin then).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace railnet::progress {

using WatchClock = std::chrono::steady_clock;

// What one request's watch remembers between looks; kept in the request, touched under its comm's lock. Posting a
// request reads no clock: the watchdog's first look at it stamps the time, so a stall is reported between one and
// 1.25 limits after the last progress (looks come every limit/4).
class ProgressMark {
 public:
  enum class Verdict { kQuiet, kStalled, kResumed };
  // The request starts (or is reused): no byte done, no look yet.
  void start() noexcept {
    bytes_ = 0;
    stamped_ = false;
    reported_ = false;
  }
  // A look at `bytes` done at `now`: kStalled the first time no byte moved for `limit` (once per stall),
  // kResumed on the first progress after a report.
  Verdict look(uint64_t bytes, WatchClock::time_point now, std::chrono::milliseconds limit) noexcept {
    if (!stamped_) {
      stamped_ = true;
      bytes_ = bytes;
      since_ = now;
      return Verdict::kQuiet;
    }
    if (bytes != bytes_) {
      bytes_ = bytes;
      stalledFor_ = now - since_;
      since_ = now;
      const bool wasReported = reported_;
      reported_ = false;
      return wasReported ? Verdict::kResumed : Verdict::kQuiet;
    }
    if (reported_ || now - since_ < limit) return Verdict::kQuiet;
    reported_ = true;
    return Verdict::kStalled;
  }
  // Seconds without progress at `now`, as far as the looks saw (0 before the first look).
  double quietFor(WatchClock::time_point now) const noexcept {
    return stamped_ ? std::chrono::duration<double>(now - since_).count() : 0.0;
  }
  // A stall of this request was reported and no progress seen since: its completion is worth a line too.
  bool reported() const noexcept { return reported_; }
  // After kResumed: how long the stall lasted.
  WatchClock::duration stalledFor() const noexcept { return stalledFor_; }

 private:
  uint64_t bytes_ = 0;
  WatchClock::time_point since_{};
  WatchClock::duration stalledFor_{};
  bool stamped_ = false;
  bool reported_ = false;
};

// The lines that end a reported stall (WARN, as the report was): `what` is e.g. "send #12 to 10.0.0.2:4000".
void reportMovesAgain(const std::string& what, const ProgressMark& mark) noexcept;
void reportCompletedAfterStall(const std::string& what, const ProgressMark& mark) noexcept;

// One look at one request that has made `progress` so far: reportStalled() when a stall is due; the closing line,
// naming the request by name(), when a reported request moves again.
template <class Name, class ReportStalled>
void lookAt(ProgressMark& mark, uint64_t progress, WatchClock::time_point now, std::chrono::milliseconds limit,
            Name&& name, ReportStalled&& reportStalled) {
  switch (mark.look(progress, now, limit)) {
    case ProgressMark::Verdict::kStalled: reportStalled(); break;
    case ProgressMark::Verdict::kResumed: reportMovesAgain(name(), mark); break;
    case ProgressMark::Verdict::kQuiet: break;
  }
}

// A comm the watchdog looks at. The calls come from the watchdog thread and must not wait long: they take the
// comm's lock with try_lock and skip this round when the data path holds it.
class Watched {
 public:
  virtual void watch(WatchClock::time_point now, std::chrono::milliseconds limit) noexcept = 0;
  // Fails the connection when the peer's host acknowledged nothing for `silenceLimit` while data or probes were in
  // flight (protocol/host_silence.h). Comms whose transport notices a lost host by itself keep this default.
  virtual void watchPeerHost(WatchClock::time_point, std::chrono::milliseconds /*silenceLimit*/) noexcept {}
  // Rail failover: takes a NIC out of the connection when its sockets have waited `silenceLimit` for an
  // acknowledgement while another NIC's answer (RAILNET_FAILOVER_SILENCE_MS). Comms without failover keep this.
  virtual void watchPaths(WatchClock::time_point, std::chrono::milliseconds /*silenceLimit*/) noexcept {}
  // The comm's state for the dump, one or more lines (not ended by newlines).
  virtual void describe(WatchClock::time_point now, std::vector<std::string>* lines) noexcept = 0;

 protected:
  ~Watched() = default;
};

class Watchdog {
 public:
  // The shared watchdog, started on first use and stopped when its last user releases it.
  static std::shared_ptr<Watchdog> acquire();
  // limit: stall reports (0: none); hostSilenceLimit: lost-host checks (0: none); dumpFile: "" for no trigger.
  // pathSilenceLimit: rail failover's per-NIC check (0: none).
  Watchdog(std::chrono::milliseconds limit, std::chrono::milliseconds hostSilenceLimit, std::string dumpFile,
           std::chrono::milliseconds pathSilenceLimit = std::chrono::milliseconds(0));
  ~Watchdog();

  void add(Watched* watched);
  // Synchronous: once it returns, the watchdog thread does not touch `watched` again.
  void remove(Watched* watched);
  // One round now, on the calling thread (tests): watch() every comm, and dump if the file is there.
  void lookNow();
  // The dump file's path with %p replaced by this process's id; empty when the trigger is off.
  const std::string& dumpFile() const noexcept { return dumpFile_; }

 private:
  void run();
  void lookLocked(WatchClock::time_point now);  // holds mutex_
  void dumpIfAsked(WatchClock::time_point now);  // holds mutex_

  const std::chrono::milliseconds limit_;             // 0: no stall reports
  const std::chrono::milliseconds hostSilenceLimit_;  // 0: no lost-host checks
  const std::chrono::milliseconds pathSilenceLimit_;  // 0: no per-NIC failover checks
  const std::string dumpFile_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;               // guarded by mutex_
  std::vector<Watched*> watched_;   // guarded by mutex_
  bool dumpTriggerBroken_ = false;  // guarded by mutex_: the file could not be deleted
  std::thread thread_;
};

// A comm's registration: start() at the end of its constructor (once it can answer watch()); reset() first thing
// in its destructor, before it tears down what watch() reads (destruction also resets).
class WatchRegistration {
 public:
  WatchRegistration() = default;
  ~WatchRegistration() { reset(); }
  void start(Watched* watched);
  WatchRegistration(const WatchRegistration&) = delete;
  WatchRegistration& operator=(const WatchRegistration&) = delete;
  void reset() noexcept;

 private:
  std::shared_ptr<Watchdog> watchdog_;
  Watched* watched_ = nullptr;
};

}  // namespace railnet::progress
