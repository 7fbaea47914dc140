// The lost-host check's rules (proxy/protocol/host_silence.h): silence counts only while a socket waits for an
// acknowledgement, from the later of its last acknowledgement and the first look that saw it waiting; and
// TCP_INFO read on a real loopback connection. A silent host end to end is the conformance group "host_loss".
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <thread>
#include <vector>

#include "proxy/protocol/host_silence.h"

namespace {

using railnet::protocol::AckSilence;
using railnet::protocol::AckState;
using railnet::protocol::HostSilenceWatch;
using Clock = AckSilence::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

AckState waiting(uint32_t sinceLastAckMs) { return AckState{true, sinceLastAckMs, 3}; }

// A connected loopback TCP pair; closed on destruction.
struct LoopbackPair {
  int client = -1;
  int server = -1;
  LoopbackPair() {
    const int listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    REQUIRE(bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    REQUIRE(listen(listener, 1) == 0);
    REQUIRE(getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    client = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
    server = accept(listener, nullptr, nullptr);
    REQUIRE(server >= 0);
    close(listener);
  }
  ~LoopbackPair() {
    close(client);
    close(server);
  }
};

}  // namespace

TEST_CASE("a socket that waits for nothing is never silent, however old its last acknowledgement", "[host-silence]") {
  AckSilence silence;
  const auto start = Clock::now();
  CHECK(silence.look(AckState{false, 3'600'000, 0}, start) == Clock::duration::zero());
  CHECK(silence.look(AckState{false, 3'700'000, 0}, start + seconds(100)) == Clock::duration::zero());
}

TEST_CASE("waiting after a long idle time counts from the first look that saw it", "[host-silence]") {
  AckSilence silence;
  const auto start = Clock::now();
  // An hour-old last acknowledgement: data was just sent after a long quiet spell.
  CHECK(silence.look(waiting(3'600'000), start) == Clock::duration::zero());
  CHECK(silence.look(waiting(3'602'000), start + seconds(2)) == seconds(2));
  CHECK(silence.look(waiting(3'631'000), start + seconds(31)) == seconds(31));
}

TEST_CASE("an acknowledgement restarts the silence; a socket done waiting forgets it", "[host-silence]") {
  AckSilence silence;
  const auto start = Clock::now();
  CHECK(silence.look(waiting(0), start) == Clock::duration::zero());
  // Acknowledged 200 ms ago although we have watched for 10 s: a live host, however slow its process.
  CHECK(silence.look(waiting(200), start + seconds(10)) == milliseconds(200));
  CHECK(silence.look(AckState{}, start + seconds(11)) == Clock::duration::zero());
  // Waiting again: counted from this look, not from the first one.
  CHECK(silence.look(waiting(50'000), start + seconds(12)) == Clock::duration::zero());
  CHECK(silence.look(waiting(53'000), start + seconds(15)) == seconds(3));
}

TEST_CASE("the watch names the first socket silent for the limit", "[host-silence]") {
  HostSilenceWatch watch;
  const std::array<int, 3> fds{10, 11, 12};  // control, data stream 0, data stream 1
  std::array<AckState, 3> states{};
  auto read = [&](int fd, AckState* state) {
    *state = states[static_cast<size_t>(fd - 10)];
    return true;
  };
  const auto start = Clock::now();
  states[2] = waiting(0);
  CHECK_FALSE(watch.look(fds, start, milliseconds(4000), read));
  states[2] = waiting(3000);
  CHECK_FALSE(watch.look(fds, start + seconds(3), milliseconds(4000), read));
  states[2] = waiting(4500);
  const auto silent = watch.look(fds, start + milliseconds(4500), milliseconds(4000), read);
  REQUIRE(silent);
  CHECK(silent->socket == 2);
  CHECK(silent->silence == milliseconds(4500));
  CHECK(railnet::protocol::describeHostSilence(*silent) ==
        "the peer's host acknowledged nothing for 4.5 s on data stream 1 (3 segments unacknowledged): the host or "
        "the network path to it is gone");
  // Everything acknowledged: the next wait starts from zero.
  states[2] = AckState{};
  CHECK_FALSE(watch.look(fds, start + milliseconds(4600), milliseconds(4000), read));
  states[2] = waiting(5000);
  CHECK_FALSE(watch.look(fds, start + seconds(5), milliseconds(4000), read));
}

TEST_CASE("an unreadable socket is not judged silent", "[host-silence]") {
  HostSilenceWatch watch;
  const std::array<int, 1> fds{-1};
  const auto start = Clock::now();
  CHECK_FALSE(watch.look(fds, start, milliseconds(1)));
  CHECK_FALSE(watch.look(fds, start + seconds(60), milliseconds(1)));
}

TEST_CASE("TCP_INFO on a live loopback connection: data sent is acknowledged, so nothing waits", "[host-silence]") {
  LoopbackPair pair;
  std::vector<char> bytes(64 << 10, 'x');
  REQUIRE(write(pair.client, bytes.data(), bytes.size()) == static_cast<ssize_t>(bytes.size()));
  AckState state;
  // The receiving kernel acknowledges without its process reading: nothing stays unacknowledged for long.
  const auto deadline = Clock::now() + seconds(10);
  do {
    REQUIRE(railnet::protocol::readAckState(pair.client, &state));
    if (!state.waiting) break;
    std::this_thread::sleep_for(milliseconds(1));
  } while (Clock::now() < deadline);
  CHECK_FALSE(state.waiting);
  CHECK(state.unacknowledged == 0);
  CHECK(state.sinceLastAckMs < 10'000);
  AckState none;
  CHECK_FALSE(railnet::protocol::readAckState(-1, &none));
}
