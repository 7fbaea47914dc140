// Tells a peer host that vanished (powered off, cable pulled, a firewall that drops silently) from a peer process
// that is only slow or stopped: a live peer's kernel acknowledges data and window probes even while the process
// does not run, so only a lost host or path leaves a socket waiting for an acknowledgement that never comes.
// Keepalive covers idle connections; this covers connections with data in flight, which Linux would otherwise only
// give up after tcp_retries2 (~15 min). The watchdog thread runs it (docs/reliability.md "Host loss", D78).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace railnet::protocol {

// What TCP_INFO says about a socket's acknowledgements.
struct AckState {
  bool waiting = false;            // data sent and not acknowledged, or window probes unanswered
  uint32_t sinceLastAckMs = 0;     // since the peer's last acknowledgement of anything
  uint32_t unacknowledged = 0;     // segments
};

// False when TCP_INFO cannot be read (not a TCP socket, or already shut down).
bool readAckState(int fd, AckState* state);

// How long one socket has waited for an acknowledgement: from the later of its last acknowledgement and the first
// look that saw it waiting (a socket idle for an hour has an hour-old last acknowledgement but waited for nothing).
class AckSilence {
 public:
  using Clock = std::chrono::steady_clock;
  Clock::duration look(const AckState& state, Clock::time_point now) noexcept {
    if (!state.waiting) {
      waitingSince_.reset();
      return Clock::duration::zero();
    }
    if (!waitingSince_) waitingSince_ = now;
    return std::min<Clock::duration>(now - *waitingSince_, std::chrono::milliseconds(state.sinceLastAckMs));
  }
  void reset() noexcept { waitingSince_.reset(); }

 private:
  std::optional<Clock::time_point> waitingSince_;
};

// The silence watch over a connection's sockets, by index: 0 is the control connection, 1.. the data streams.
class HostSilenceWatch {
 public:
  using Clock = AckSilence::Clock;
  struct Silent {
    size_t socket = 0;
    Clock::duration silence{};
    AckState state;
  };
  // One look at every socket: the first that has waited at least `limit` for an acknowledgement, if any. `read`
  // fills a socket's AckState (readAckState in production; tests give their own).
  template <class ReadAckState>
  std::optional<Silent> look(std::span<const int> fds, Clock::time_point now, std::chrono::milliseconds limit,
                             ReadAckState&& read) {
    if (sockets_.size() != fds.size()) sockets_.assign(fds.size(), AckSilence{});
    std::optional<Silent> found;
    for (size_t i = 0; i < fds.size(); ++i) {
      AckState state;
      if (!read(fds[i], &state)) state = AckState{};  // unreadable: judged by the data path's own errors
      const Clock::duration silence = sockets_[i].look(state, now);
      if (!found && silence >= limit) found = Silent{i, silence, state};
    }
    return found;
  }
  std::optional<Silent> look(std::span<const int> fds, Clock::time_point now, std::chrono::milliseconds limit) {
    return look(fds, now, limit, readAckState);
  }

 private:
  std::vector<AckSilence> sockets_;
};

// The failure a silent host records: "the peer's host acknowledged nothing for 30.4 s on data stream 2 (7 segments
// unacknowledged): the host or the network path to it is gone".
std::string describeHostSilence(const HostSilenceWatch::Silent& silent);

}  // namespace railnet::protocol
