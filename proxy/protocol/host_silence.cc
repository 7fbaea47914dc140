#include "proxy/protocol/host_silence.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "railnet/text.h"

namespace railnet::protocol {

bool readAckState(int fd, AckState* state) {
  tcp_info info{};
  socklen_t length = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &length) != 0) return false;
  state->unacknowledged = info.tcpi_unacked;
  state->sinceLastAckMs = info.tcpi_last_ack_recv;
  // tcpi_probes: zero-window (or keepalive) probes sent and not answered; any acknowledgement clears it.
  state->waiting = info.tcpi_unacked > 0 || info.tcpi_probes > 0;
  return true;
}

std::string describeHostSilence(const HostSilenceWatch::Silent& silent) {
  const std::string socket =
      silent.socket == 0 ? std::string("the control connection") : textf("data stream %zu", silent.socket - 1);
  return textf("the peer's host acknowledged nothing for %.1f s on %s (%u segments unacknowledged): the host or the "
               "network path to it is gone", std::chrono::duration<double>(silent.silence).count(), socket.c_str(),
               silent.state.unacknowledged);
}

}  // namespace railnet::protocol
