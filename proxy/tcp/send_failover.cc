// Rail failover on a fused TCP send comm (docs/failover.md, decisions D88-D90): chunks of a failed NIC sent again
// over the others, a silent NIC taken out, failed NICs probed and brought back, and the fault injection that
// tests them. The rest of the comm is in send_comm.cc.
#include <algorithm>
#include <bit>
#include <string>

#include "proxy/protocol/host_silence.h"
#include "proxy/tcp/send_comm.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::tcp {

using protocol::FrameHeader;
using protocol::FrameType;
using protocol::kMaxStripeNics;

void TcpSendComm::cutIfDue(int stream, uint64_t bytes) {
  if (cutNic_ < 0 || nicOf(stream) != cutNic_) return;
  queuedOnCutNic_ += bytes;
  if (queuedOnCutNic_ < cutAfterBytes_) return;
  RN_INFO(NCCL_NET, "NET/railnet: send comm to %s: RAILNET_FAULT_NIC_CUT cuts the data streams of NIC %d%s",
          control_.peerName().c_str(), cutNic_, cutNic_ == 0 ? " and the control connection" : "");
  takeNicOut(cutNic_);
  cutNic_ = -1;
}

void TcpSendComm::takeNicOut(int nic) {
  // Failed from now on, before its helpers see the shutdown: no new chunk goes there, and the next isend or test
  // sends its chunks again (those its streams still hold are released when their helpers fail them).
  failedNics_.fetch_or(uint64_t{1} << nic, std::memory_order_acq_rel);
  failoverDue_.store(true, std::memory_order_release);
  if (nic == 0) {
    // NIC 0 carries the control connection too: it goes with the NIC, and is re-made through another one (unless
    // it already leaves from another: it stood in there at connect).
    control_.avoidNic(0);
    if (control_.leavesFrom(0)) control_.cut();
  }
  for (int s = nic; s < streams_.count(); s += nics_) streams_[s].cut();
}

void TcpSendComm::sendAgainFromFailedNics() {
  failoverDue_.store(false, std::memory_order_release);
  const uint64_t failed = failedNics_.load(std::memory_order_acquire);
  const uint64_t newly = failed & ~handledNics_;
  handledNics_ |= newly;
  const int alive = std::popcount(liveNics());
  const auto now = std::chrono::steady_clock::now();
  const bool allJustFailed = alive == 0 && !movable_ && !allDown_.load(std::memory_order_acquire);
  if (allJustFailed) {
    // Perhaps one NIC's path failed while another's had not been probed back yet: probe them all now (below), and
    // fail only when none answers in time. Chunks wait for them (kParked), new sends too.
    allDown_.store(true, std::memory_order_release);
    allDownSince_ = now;
    RN_WARN("NET/railnet: send connection with %s: the data streams of every NIC failed; each is probed now, and "
            "the connection fails if none answers within %lld ms", control_.peerName().c_str(),
            static_cast<long long>(resumeLimit_.count()));
  }
  // Every chunk queued on a failed NIC goes again, whenever it was queued there (a stream of a NIC already handled
  // may die later, with chunks on it meanwhile; a chunk taken by a sibling stream of its NIC is recorded under the
  // stream it was queued on, so the NIC, not the stream, decides). A single-NIC connection's chunks go again once
  // it has moved (moveFinished).
  uint64_t resent[kMaxStripeNics] = {};
  const uint64_t sends = alive == 0 ? 0 : sendChunksAgain(failed, resent);
  // GPU sends keep no chunk records: any in flight when a NIC fails may have lost bytes that are gone from the
  // staging slots.
  bool unsendable = false;
  if (newly != 0) {
    requests_.forEachInFlight([&](SendRequest& request) {
      if (!request.resendable_ && request.awaitingDone_.load(std::memory_order_acquire)) unsendable = true;
    });
  }
  if (unsendable) {
    control_.recordFailure("a NIC's data streams failed while sends staged from GPU memory were in flight; their "
                           "bytes are no longer in the staging slots, so they cannot be sent again");
  }
  for (int nic = 0; nic < nics_; ++nic) {
    NicCounters* counters = static_cast<size_t>(nic) < nicCounters_.size() ? nicCounters_[nic] : nullptr;
    if (counters != nullptr) counters->addResent(resent[nic]);
    if ((newly >> nic & 1) == 0) continue;
    // A re-made control connection tries this NIC last; a moved one, the path it was on as well.
    control_.avoidNic(nic);
    if (movable_ && dataRoute_.local > 0) control_.avoidNic(dataRoute_.local);
    // The receiver shuts the NIC's streams down on its side too: nothing still on its way there lands later.
    const FrameHeader nicFailed{static_cast<uint8_t>(FrameType::kNicFailed), static_cast<uint8_t>(nic), 0,
                                ++nicFailures_[nic], 0};
    control_.send(&nicFailed, sizeof(nicFailed));
    NicProbe& probe = probes_[static_cast<size_t>(nic)];
    const bool wasOut = movable_ && dataRoute_ != Route{};  // moved already: out since the first failure
    const auto failedAt = probe.failedAt;
    probe = NicProbe{};
    probe.failedAt = wasOut ? failedAt : now;
    probe.nextProbe = probe.failedAt + probe.wait;
    // Every stream of the NIC goes, not only the one that failed: the NIC is out until a probe makes them all again.
    for (int s = nic; s < streams_.count(); s += nics_) streams_[s].cut();
    if (counters != nullptr && !wasOut) counters->addFailure();
    const std::string name = nicName(nic);
    if (movable_) {
      // Its only NIC: new sends wait until the streams are made again over another path (advanceMove).
      returning_ = false;
      moving_.store(true, std::memory_order_release);
      const std::string path = dataRoute_ == Route{} ? name : "the path it had moved to (" + localNicName(dataRoute_) + ")";
      RN_WARN("NET/railnet: send connection with %s: the data streams of %s failed; the connection moves to another "
              "NIC, and its sends in flight go again from there", control_.peerName().c_str(), path.c_str());
      continue;
    }
    RN_WARN("NET/railnet: send connection with %s: the data streams of %s failed; %llu B of %llu send(s) in flight "
            "sent again over the other %d NIC(s), and new messages stripe over those", control_.peerName().c_str(),
            name.c_str(), static_cast<unsigned long long>(resent[nic]), static_cast<unsigned long long>(sends), alive);
  }
  if (allJustFailed) {
    // Every NIC is probed at once, then every 250 ms doubling, rather than at each one's own backoff.
    for (NicProbe& probe : probes_) {
      if (probe.probing) continue;
      probe.nextProbe = now;
      probe.wait = std::chrono::milliseconds(250);
    }
  }
}

uint64_t TcpSendComm::sendChunksAgain(uint64_t nics, uint64_t resent[kMaxStripeNics]) {
  // The copy's count goes up before it is queued, so its send cannot complete (and its buffer be reused) before the
  // copy has left. Sends whose done frame came are complete at the receiver and keep their chunks as they are.
  uint64_t sends = 0;
  requests_.forEachInFlight([&](SendRequest& request) {
    if (!request.awaitingDone_.load(std::memory_order_acquire)) return;
    bool touched = false;
    for (SendRequest::QueuedChunk& queued : request.chunks_) {
      const int nic = nicOf(queued.stream);
      if ((nics >> nic & 1) == 0) continue;
      touched = true;
      request.pendingChunks_.fetch_add(1, std::memory_order_acq_rel);
      const int stream = placeChunk(queued.op, 0, 1);
      if (stream == kParked) {  // the streams just made died too: it goes at the next move
        request.pendingChunks_.fetch_sub(1, std::memory_order_acq_rel);
        continue;
      }
      if (stream < 0) {
        request.pendingChunks_.fetch_sub(1, std::memory_order_acq_rel);
        return;
      }
      queued.stream = stream;
      resent[nic] += queued.op.header.length;
    }
    sends += touched ? 1 : 0;
  });
  return sends;
}

void TcpSendComm::whileAllNicsDown(std::chrono::steady_clock::time_point now) {
  if (control_.failed()) return;
  if (now - allDownSince_ > resumeLimit_) {
    std::string tried;
    for (int nic = 0; nic < nics_; ++nic) tried += (nic == 0 ? "" : ", ") + nicName(nic);
    control_.recordFailure(textf("the data streams of every NIC failed, and none answered a probe within %lld ms "
                                 "(NICs: %s)", static_cast<long long>(resumeLimit_.count()), tried.c_str()));
    return;
  }
  probeFailedNics(now);
}

void TcpSendComm::countDegraded(int nic, std::chrono::steady_clock::time_point now) {
  NicCounters* counters = static_cast<size_t>(nic) < nicCounters_.size() ? nicCounters_[nic] : nullptr;
  const auto failedAt = probes_[static_cast<size_t>(nic)].failedAt;
  if (counters == nullptr || failedAt == std::chrono::steady_clock::time_point{}) return;
  counters->addDegraded(static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(now - failedAt).count()));
}

void TcpSendComm::watchPaths(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept {
  if (!dataFailover_) return;
  std::unique_lock<std::mutex> lock(mutex_, std::try_to_lock);
  if (!lock.owns_lock() || control_.failed()) return;
  try {
    // Per NIC: has a socket waited the limit for an acknowledgement? A live peer's kernel acknowledges even while
    // the process is stopped, so a silent socket is a silent path; and another NIC answering says the host is up.
    const int streams = streams_.count();
    if (pathSilence_.size() != static_cast<size_t>(streams) + 1) pathSilence_.assign(static_cast<size_t>(streams) + 1, {});
    uint64_t silentNics = 0;
    std::chrono::steady_clock::duration longest[kMaxStripeNics] = {};
    auto judge = [&](size_t index, int fd, int nic) {
      protocol::AckState state;
      if (!protocol::readAckState(fd, &state)) state = protocol::AckState{};
      const auto silence = pathSilence_[index].look(state, now);
      longest[nic] = std::max(longest[nic], silence);
      if (silence >= silenceLimit) silentNics |= uint64_t{1} << nic;
    };
    judge(0, control_.fd(), 0);
    for (int s = 0; s < streams; ++s) {
      if (!streams_[s].dead()) judge(static_cast<size_t>(s) + 1, streams_[s].fd(), nicOf(s));
    }
    const uint64_t live = liveNics();
    const uint64_t answering = live & ~silentNics;
    probeFailedNics(now);
    // Every NIC silent: the host, not a path (the lost-host check's to judge). A single-NIC connection tries to move:
    // when no other path reaches the peer either, re-making its control connection fails within
    // RAILNET_FAILOVER_RESUME_MS, which fails the connection naming the peer.
    if (answering == 0 && !movable_) return;
    for (int nic = 0; nic < nics_; ++nic) {
      if ((live & silentNics) >> nic & 1) {
        RN_WARN("NET/railnet: send connection with %s: %s acknowledged nothing for %.1f s%s",
                control_.peerName().c_str(),
                movable_ ? localNicName(dataRoute_).c_str()
                         : nicName(nic).c_str(),
                std::chrono::duration<double>(longest[nic]).count(),
                movable_ ? ": the connection moves to another NIC" : " while other NICs answer: taken out of the connection");
        takeNicOut(nic);
      }
    }
  } catch (...) {
    // Out of memory for the silence table: look again next round.
  }
}

void TcpSendComm::linkChanged(const std::string& interface, bool up) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  if (control_.failed()) return;
  try {
    const auto now = std::chrono::steady_clock::now();
    bool probeNow = false;
    for (int nic = 0; nic < nics_; ++nic) {
      // A moved single-NIC connection runs over the NIC it moved to: that link is the one that matters now.
      const bool moved = movable_ && dataRoute_ != Route{};
      const std::string carrying = progress::interfaceOfNic(moved ? localNicName(dataRoute_) : nicName(nic));
      if (!up && carrying == interface && nicAlive(nic) && !moving_.load(std::memory_order_acquire)) {
        RN_WARN("NET/railnet: send connection with %s: the link of %s (%s) went down: %s", control_.peerName().c_str(),
                moved ? localNicName(dataRoute_).c_str() : nicName(nic).c_str(), interface.c_str(),
                movable_ ? "the connection moves to another NIC" : "taken out of the connection");
        takeNicOut(nic);
      }
      if (up && progress::interfaceOfNic(nicName(nic)) == interface && !probes_[static_cast<size_t>(nic)].probing) {
        probes_[static_cast<size_t>(nic)].nextProbe = now;  // its own link is back: probe it now, not at the backoff's
        probeNow = true;
      }
    }
    if (probeNow) probeFailedNics(now);
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: send connection with %s: acting on link %s going %s failed: %s", control_.peerName().c_str(),
            interface.c_str(), up ? "up" : "down", error.what());
  }
}

void TcpSendComm::probeFailedNics(std::chrono::steady_clock::time_point now) {
  if (movable_) {
    // An idle comm moves too (nothing else calls it), and a moved one probes its original path.
    if (failoverDue_.load(std::memory_order_acquire)) sendAgainFromFailedNics();
    advanceMove();
    advanceReturn();
    probeOriginalPath(now);
    return;
  }
  const uint64_t failed = failedNics_.load(std::memory_order_acquire) & handledNics_;
  for (int nic = 0; nic < nics_; ++nic) {
    NicProbe& probe = probes_[static_cast<size_t>(nic)];
    if ((failed >> nic & 1) == 0 || probe.probing || now < probe.nextProbe) continue;
    if (probeCap_ != 0 && probe.probes >= probeCap_) continue;
    if (links_.down(progress::interfaceOfNic(nicName(nic)))) continue;  // probed when its link comes back
    // Streams still live were made by an earlier probe; the dead ones are made again now. One still dying (its
    // helper has not released what it held) waits for the next probe.
    int dead = 0;
    bool dying = false;
    for (int s = nic; s < streams_.count(); s += nics_) {
      if (streams_[s].dead()) {
        ++dead;
      } else if (probe.probes == 0) {
        dying = true;  // shut down when the NIC failed; its helper has not failed it yet
      }
    }
    probe.nextProbe = now + probe.wait;
    probe.wait = std::min(probe.wait * 2, kLongestProbeWait);
    if (dying) continue;
    ++probe.probes;
    probe.probing = true;
    probe.rejoined = 0;
    int asked = 0;
    for (int s = nic; s < streams_.count(); s += nics_) {
      if (!streams_[s].dead()) {
        ++probe.rejoined;
      } else if (control_.rejoin(s, streams_.count(), nic, nicFailures_[nic])) {
        ++asked;
      }
    }
    if (asked == 0 && dead > 0) {
      probe.probing = false;  // no address to probe from (the kernel chose the source): failback needs bound NICs
      probe.probes = probeCap_ != 0 ? probeCap_ : UINT64_MAX;
    }
  }
}

void TcpSendComm::streamRejoined(int stream, Fd socket) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    const int nic = nicOf(stream);
    NicProbe& probe = probes_[static_cast<size_t>(nic)];
    if (!probe.probing || !streams_[stream].dead()) return;  // the socket closes: nothing wants it
    streams_.rejoin(stream, std::move(socket));
    const int ofNic = (streams_.count() - nic + nics_ - 1) / nics_;
    if (++probe.rejoined < ofNic) return;
    // Every stream of the NIC made again: it carries traffic from the next message on. Chunks still due to go
    // again leave first, while the NIC still counts as failed.
    if (failoverDue_.load(std::memory_order_acquire)) sendAgainFromFailedNics();
    probe.probing = false;
    countDegraded(nic, std::chrono::steady_clock::now());
    handledNics_ &= ~(uint64_t{1} << nic);
    failedNics_.fetch_and(~(uint64_t{1} << nic), std::memory_order_acq_rel);
    if (allDown_.exchange(false, std::memory_order_acq_rel)) {
      // Every NIC was out: chunks waited (kParked) under whichever NIC they were meant for. All of them go now, over
      // the NIC that answered (the receiver counts each byte once).
      uint64_t resent[kMaxStripeNics] = {};
      const uint64_t sends = sendChunksAgain((uint64_t{1} << nics_) - 1, resent);
      uint64_t bytes = 0;
      for (int n = 0; n < nics_; ++n) bytes += resent[n];
      RN_WARN("NET/railnet: send connection with %s: %s answered %.1f s after every NIC had failed; %llu B of %llu "
              "send(s) in flight sent again over it", control_.peerName().c_str(), nicName(nic).c_str(),
              std::chrono::duration<double>(std::chrono::steady_clock::now() - allDownSince_).count(),
              static_cast<unsigned long long>(bytes), static_cast<unsigned long long>(sends));
    }
    control_.stopAvoiding(nic);
    for (int s = nic; s < streams_.count(); s += nics_) {
      if (pathSilence_.size() > static_cast<size_t>(s) + 1) pathSilence_[static_cast<size_t>(s) + 1].reset();
    }
    const std::string name = nicName(nic);
    RN_WARN("NET/railnet: send connection with %s: %s answers again %.1f s after it failed (probe %llu): its %d data "
            "stream(s) are made again and it carries traffic again", control_.peerName().c_str(), name.c_str(),
            std::chrono::duration<double>(std::chrono::steady_clock::now() - probe.failedAt).count(),
            static_cast<unsigned long long>(probe.probes), ofNic);
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: send connection with %s: making data stream %d again failed: %s", control_.peerName().c_str(),
            stream, error.what());
  }
}

void TcpSendComm::rejoinFailed(int stream, const std::string& why) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  NicProbe& probe = probes_[static_cast<size_t>(nicOf(stream))];
  if (!probe.probing) return;
  probe.probing = false;  // the next probe, after its wait, tries the streams still dead
  RN_INFO(NCCL_NET, "NET/railnet: send connection with %s: probe %llu of NIC %d failed (stream %d: %s); next in %lld ms",
          control_.peerName().c_str(), static_cast<unsigned long long>(probe.probes), nicOf(stream), stream, why.c_str(),
          static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                     probe.nextProbe - std::chrono::steady_clock::now()).count()));
}

}  // namespace railnet::tcp
