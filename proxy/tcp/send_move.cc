// Rail failover for a single-NIC device's TCP send comm (docs/failover.md "Single-NIC devices", decision D91): when
// its NIC fails, the connection moves to another NIC of the host, nearest first, and moves back when a probe finds the
// original path again. The control connection finds the new path (a resumable channel re-made over the pairs of NICs
// in turn, the failed one last); the data streams follow it, then every chunk of the sends in flight goes again.
#include <algorithm>
#include <string>

#include "proxy/tcp/send_comm.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::tcp {

using protocol::kMaxStripeNics;

const NicLayout::Spare* TcpSendComm::spareOf(const Route& route) const {
  // Local index 0 is the device's own NIC; 1.. are the spares, nearest first (ResumeOptions::locals).
  if (route.local < 1 || static_cast<size_t>(route.local) > spares_.size()) return nullptr;
  return &spares_[static_cast<size_t>(route.local) - 1];
}

NicCounters* TcpSendComm::countersOf(const Route& route) const {
  if (const NicLayout::Spare* spare = spareOf(route)) return spare->counters;
  return nicCounters_.empty() ? nullptr : nicCounters_[0];
}

shaping::EgressShaping TcpSendComm::shapingOf(const Route& route) const {
  if (const NicLayout::Spare* spare = spareOf(route)) return spare->shaping;
  return ownShaping_;
}

std::string TcpSendComm::localNicName(const Route& route) const {
  if (const NicLayout::Spare* spare = spareOf(route)) return spare->name;
  return nicName(0);
}

bool TcpSendComm::sendsDelivered() {
  if (!pieces_.empty() || !copying_.empty()) return false;
  bool delivered = true;
  requests_.forEachInFlight([&](SendRequest& request) {
    if (request.pendingChunks_.load(std::memory_order_acquire) != 0 ||
        request.awaitingDone_.load(std::memory_order_acquire)) {
      delivered = false;
    }
  });
  return delivered;
}

void TcpSendComm::advanceMove() {
  NicProbe& probe = probes_[0];
  if (!moving_.load(std::memory_order_acquire) || returning_ || probe.probing || control_.failed()) return;
  // The re-made control connection finds a path that works (pairs of NICs in turn, the failed one last); until it
  // is made, and while a stream's helper has not let go of what it held, there is nothing to follow.
  if (control_.broken() || !control_.knowsListeners()) return;
  // A live stream made since this failure (an earlier try of this move) stays; any other live one is still dying.
  int made = 0;
  for (int s = 0; s < streams_.count(); ++s) {
    if (streams_[s].dead()) continue;
    if (streamMadeFor_[static_cast<size_t>(s)] != nicFailures_[0]) return;
    ++made;
  }
  const Route route = control_.route();
  if (route.local < 0) return;  // an address this side did not list: cannot bind the streams to it
  targetRoute_ = route;
  probe.probing = true;
  probe.rejoined = made;
  for (int s = 0; s < streams_.count(); ++s) {
    if (streams_[s].dead() && !control_.rejoinVia(s, streams_.count(), route, nicFailures_[0])) {
      probe.probing = false;  // no listener for that path: the next call looks again
      return;
    }
  }
}

void TcpSendComm::probeOriginalPath(std::chrono::steady_clock::time_point now) {
  NicProbe& probe = probes_[0];
  if (dataRoute_ == Route{} || moving_.load(std::memory_order_acquire) || now < probe.nextProbe) return;
  if (probeCap_ != 0 && probe.probes >= probeCap_) return;
  if (links_.down(progress::interfaceOfNic(nicName(0)))) return;  // its link is down: probed when it comes back
  probe.nextProbe = now + probe.wait;
  probe.wait = std::min(probe.wait * 2, kLongestProbeWait);
  ++probe.probes;
  // New sends wait while the sends in flight are delivered: a stream made again drops what its old socket held.
  returning_ = true;
  moving_.store(true, std::memory_order_release);
  advanceReturn();
}

void TcpSendComm::advanceReturn() {
  NicProbe& probe = probes_[0];
  if (!returning_ || probe.probing || !sendsDelivered()) return;
  targetRoute_ = Route{};
  probe.probing = true;
  probe.rejoined = 0;
  int asked = 0;
  for (int s = 0; s < streams_.count(); ++s) {
    if (streamRoutes_[static_cast<size_t>(s)] == Route{}) {
      ++probe.rejoined;  // made over the original path by an earlier probe
    } else if (control_.rejoinVia(s, streams_.count(), Route{}, nicFailures_[0])) {
      ++asked;
    }
  }
  if (asked == 0) {
    probe.probing = false;
    if (probe.rejoined == streams_.count()) moveFinished(Route{});
    returning_ = false;
    moving_.store(false, std::memory_order_release);
  }
}

void TcpSendComm::movedStreamRejoined(int stream, Fd socket, uint32_t failure) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  try {
    NicProbe& probe = probes_[0];
    // A socket of an earlier attempt (another failure came since) closes: nothing wants it.
    if (!probe.probing || failure != nicFailures_[0] || stream < 0 || stream >= streams_.count()) return;
    // The move replaces dead streams; the return replaces live ones, whose sends are all delivered.
    streams_.rejoin(stream, std::move(socket), countersOf(targetRoute_), shapingOf(targetRoute_));
    streamRoutes_[static_cast<size_t>(stream)] = targetRoute_;
    streamMadeFor_[static_cast<size_t>(stream)] = nicFailures_[0];
    if (++probe.rejoined < streams_.count()) return;
    probe.probing = false;
    moveFinished(targetRoute_);
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: send connection with %s: making data stream %d over %s failed: %s",
            control_.peerName().c_str(), stream, localNicName(targetRoute_).c_str(), error.what());
  }
}

void TcpSendComm::movedRejoinFailed(int stream, uint32_t failure, const std::string& why) noexcept {
  std::lock_guard<std::mutex> lock(mutex_);
  NicProbe& probe = probes_[0];
  if (!probe.probing || failure != nicFailures_[0]) return;
  probe.probing = false;
  if (returning_) {
    // The original path does not answer yet: carry on over the one moved to (streams made back already stay there,
    // a working path too) until the next probe.
    returning_ = false;
    moving_.store(false, std::memory_order_release);
    RN_INFO(NCCL_NET, "NET/railnet: send connection with %s: probe %llu of %s failed (stream %d: %s); next in %lld ms",
            control_.peerName().c_str(), static_cast<unsigned long long>(probe.probes),
            nicName(0).c_str(), stream, why.c_str(),
            static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       probe.nextProbe - std::chrono::steady_clock::now()).count()));
    return;
  }
  // The move's path stopped answering between the control connection's resume and the streams: the streams made
  // over it stay, the rest are tried again at the next call (over whatever path the control connection has then).
  RN_INFO(NCCL_NET, "NET/railnet: send connection with %s: making data stream %d over %s failed (%s); trying again",
          control_.peerName().c_str(), stream, localNicName(targetRoute_).c_str(), why.c_str());
}

void TcpSendComm::moveFinished(const Route& route) {
  const bool afterFailure = !returning_;
  const Route from = dataRoute_;
  dataRoute_ = route;
  returning_ = false;
  const auto now = std::chrono::steady_clock::now();
  NicProbe& probe = probes_[0];
  control_.setCounters(countersOf(route));
  controlShaping_ = shapingOf(route);
  // The NIC counts as alive again (its streams are the ones just made); after a failure, every chunk of the sends
  // still waiting for their done frames goes again over them (the receiver counts each byte once).
  failedNics_.fetch_and(~uint64_t{1}, std::memory_order_acq_rel);
  handledNics_ &= ~uint64_t{1};
  for (auto& silence : pathSilence_) silence.reset();
  uint64_t resent[kMaxStripeNics] = {};
  const uint64_t sends = afterFailure ? sendChunksAgain(1, resent) : 0;
  if (NicCounters* original = nicCounters_.empty() ? nullptr : nicCounters_[0]) original->addResent(resent[0]);
  const double outFor = std::chrono::duration<double>(now - probe.failedAt).count();
  const std::string own = nicName(0);
  if (route == Route{}) {
    // On the original path again: the control connection follows (re-made with NIC 0 first again).
    countDegraded(0, now);
    probe.failedAt = {};
    control_.stopAvoiding(0);
    if (control_.route() != Route{}) control_.cut();
    moving_.store(false, std::memory_order_release);
    RN_WARN("NET/railnet: send connection with %s: %s answers again %.1f s after it failed%s: the connection is on it "
            "again; %llu B of %llu send(s) in flight sent again", control_.peerName().c_str(), own.c_str(), outFor,
            afterFailure ? "" : textf(" (probe %llu)", static_cast<unsigned long long>(probe.probes)).c_str(),
            static_cast<unsigned long long>(resent[0]), static_cast<unsigned long long>(sends));
    return;
  }
  const NicLayout::Spare* spare = spareOf(route);  // null: its own NIC to another of the peer's
  const bool crossRail = spare != nullptr && spare->railId >= 0 && peerRail_ >= 0 && spare->railId != peerRail_;
  if (spare != nullptr && spare->counters != nullptr && from != route) spare->counters->addMoved(spare->railId, peerRail_);
  probe.wait = std::chrono::milliseconds(1000);
  probe.nextProbe = now + probe.wait;
  probe.probes = 0;
  moving_.store(false, std::memory_order_release);
  RN_WARN("NET/railnet: send connection with %s: moved to %s (%s), degraded%s, %.1f s after %s failed; %llu B of "
          "%llu send(s) in flight sent again; the original path is probed from 1 s on",
          control_.peerName().c_str(), localNicName(route).c_str(), control_.describeRoute(route).c_str(),
          crossRail ? " and cross-rail" : "", outFor, own.c_str(), static_cast<unsigned long long>(resent[0]),
          static_cast<unsigned long long>(sends));
}

}  // namespace railnet::tcp
