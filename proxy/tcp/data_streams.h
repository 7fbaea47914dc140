// The data streams of one TCP connection (RAILNET_TCP_STREAMS sockets per local NIC) and their place in the
// progress engine, plus which NIC's counters each stream adds to.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/progress/engine.h"
#include "proxy/protocol/host_silence.h"
#include "proxy/shaping/fabric_shaper.h"
#include "proxy/tcp/stream.h"

namespace railnet::tcp {

// The local NICs of a comm's device and their counters. Data stream s uses NIC s % nics.size(); the control
// channel uses NIC 0. One NIC for a physical device, one per child for a fused one.
struct NicLayout {
  std::vector<NicCounters*> nics;  // empty: one NIC, nothing counted
  std::vector<shaping::EgressShaping> shaping;  // per NIC, parallel to nics (empty: unshaped); fabric_shaper.h
  uint64_t minStripeBytes = 0;     // sender of a fused device: planStripes' threshold (protocol/stripe_plan.h)
  std::vector<std::string> names;  // per NIC, parallel to nics (for failover's WARNs)
  // A single-NIC device's sender (rail failover): the host's other NICs it may move to, nearest first, parallel to
  // ResumeOptions::locals[1..]. Their counters count the moved connection (cross-rail when the rails differ).
  struct Spare {
    std::string name;
    NicCounters* counters = nullptr;
    int16_t railId = -1;
    shaping::EgressShaping shaping;  // fabric emulation: its bucket (and the spine's when its rail is not the peer's)
  };
  std::vector<Spare> spares;
  int16_t peerRail = -1;  // the peer NIC's rail (the connection's control rail), for cross-rail counting
  // Sender of a fused device: NICs that could not connect (protocol::PeerInfo::nicsDownAtConnect), and why.
  uint64_t nicsDownAtConnect = 0;
  std::string whyDown;
};

class DataStreams {
 public:
  explicit DataStreams(std::vector<Fd> sockets) : pending_(std::move(sockets)) {}
  ~DataStreams() { stop(); }
  DataStreams(const DataStreams&) = delete;
  DataStreams& operator=(const DataStreams&) = delete;

  // Stream s counts on layout.nics[s % nics] and draws from layout.shaping[s % nics]; call before start().
  void setCounters(const NicLayout& layout);
  // Hands the streams to the progress engine; call once the owner is fully constructed. releaseOnFailure: see
  // Stream::releaseOnFailure (a sender that sends a failed NIC's chunks again).
  void start(StreamOwner* owner, bool releaseOnFailure = false);
  // Takes the streams back; after it returns no helper calls the owner.
  void stop();
  // Failback: stream `index` starts again on `socket` (detached, restarted, attached, revived). True when it was
  // dead before (a live one, whose path went silent, is replaced as well).
  bool rejoin(int index, Fd socket);
  // The same, counting on `counters` and drawing from `shaping` from now on (a single-NIC connection moved to another
  // NIC, or back).
  bool rejoin(int index, Fd socket, NicCounters* counters, const shaping::EgressShaping& shaping);

  int count() const { return static_cast<int>(started_ ? streams_.size() : pending_.size()); }
  // Distinct helper threads serving the streams, fixed at start(): pieces of one message beyond this many run
  // one after another on the same helper, so a message is not split finer (docs/performance.md §7).
  int helpersServing() const { return helpersServing_; }
  Stream& operator[](int index) { return *streams_[static_cast<size_t>(index)]; }

  // The lost-host look over the connection's control socket and these streams (protocol/host_silence.h): the
  // failure to record when one of them waited `limit` for an acknowledgement. From the watchdog thread only, on
  // every look (a socket with nothing unacknowledged costs one getsockopt and starts no clock).
  std::optional<std::string> peerHostLost(int controlFd, std::chrono::steady_clock::time_point now,
                                          std::chrono::milliseconds limit);

 private:
  std::vector<Fd> pending_;  // sockets until start()
  std::vector<NicCounters*> counters_;
  std::vector<shaping::EgressShaping> shaping_;  // per pending stream, when shaped
  std::shared_ptr<progress::Engine> engine_;
  std::vector<std::unique_ptr<Stream>> streams_;
  bool started_ = false;
  int helpersServing_ = 1;
  protocol::HostSilenceWatch hostSilence_;  // the watchdog thread's
  std::vector<int> silenceFds_;             // the watchdog thread's: control, then the streams
};

}  // namespace railnet::tcp
