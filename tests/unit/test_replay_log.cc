// The replay log of a resumable control channel (proxy/protocol/replay_log.h): numbered frames kept until
// acknowledged, sent again from any point the peer names, across 2^32 wrap-around; acks and resume answers never
// kept; bytes that are not whole frames refused.
#include <catch2/catch.hpp>

#include <sys/uio.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "proxy/protocol/replay_log.h"
#include "proxy/protocol/wire.h"

using railnet::protocol::FrameHeader;
using railnet::protocol::FrameType;
using railnet::protocol::ReplayLog;
using railnet::protocol::frameLength;

namespace {

// An inline frame whose payload is `size` bytes of `fill`, its header's recvId naming it.
std::vector<char> inlineFrame(uint32_t name, size_t size, char fill) {
  FrameHeader header{static_cast<uint8_t>(FrameType::kInline), 0, 0, name, size};
  std::vector<char> bytes(sizeof(header) + size, fill);
  memcpy(bytes.data(), &header, sizeof(header));
  return bytes;
}

std::vector<char> headerOnly(FrameType type, uint64_t size) {
  FrameHeader header{static_cast<uint8_t>(type), 0, 0, 0, size};
  std::vector<char> bytes(sizeof(header));
  memcpy(bytes.data(), &header, sizeof(header));
  return bytes;
}

int append(ReplayLog& log, const std::vector<char>& bytes) {
  std::string why;
  iovec piece{const_cast<char*>(bytes.data()), bytes.size()};
  return log.append(&piece, 1, &why);
}

// The names (recvIds) of the frames in `bytes`, in order.
std::vector<uint32_t> names(const std::vector<char>& bytes) {
  std::vector<uint32_t> found;
  size_t at = 0;
  while (at < bytes.size()) {
    FrameHeader header;
    REQUIRE(bytes.size() - at >= sizeof(header));
    memcpy(&header, bytes.data() + at, sizeof(header));
    found.push_back(header.recvId);
    at += frameLength(header);
  }
  REQUIRE(at == bytes.size());
  return found;
}

}  // namespace

TEST_CASE("frame lengths cover each frame's payload; unknown types have none", "[replay-log]") {
  FrameHeader clearToSend{static_cast<uint8_t>(FrameType::kClearToSend), 3, 2, 0, 0};
  CHECK(frameLength(clearToSend) == 16 + 3 * 24 + 3 * 2 * 4);
  CHECK(frameLength(FrameHeader{static_cast<uint8_t>(FrameType::kInline), 0, 0, 0, 100}) == 116);
  CHECK(frameLength(FrameHeader{static_cast<uint8_t>(FrameType::kSession), 0, 0, 0, 16}) == 32);
  CHECK(frameLength(FrameHeader{static_cast<uint8_t>(FrameType::kAck), 0, 0, 0, 1u << 31}) == 16);
  CHECK(frameLength(FrameHeader{99, 0, 0, 0, 0}) == 0);
}

TEST_CASE("the log keeps numbered frames until acknowledged and replays from any point it holds", "[replay-log]") {
  ReplayLog log;
  for (uint32_t i = 0; i < 10; ++i) REQUIRE(append(log, inlineFrame(i, i * 7, static_cast<char>('a' + i))) == 1);
  CHECK(log.frames() == 10);
  CHECK(log.next() == 10);
  std::vector<char> again;
  REQUIRE(log.replayFrom(4, &again));
  CHECK(names(again) == std::vector<uint32_t>{4, 5, 6, 7, 8, 9});
  // Payloads come back as they were.
  CHECK(again[sizeof(FrameHeader)] == 'e');
  REQUIRE(log.acknowledge(6));
  CHECK(log.first() == 6);
  again.clear();
  CHECK_FALSE(log.replayFrom(5, &again));  // acknowledged: gone
  CHECK_FALSE(log.replayFrom(11, &again));  // never sent
  REQUIRE(log.replayFrom(10, &again));
  CHECK(again.empty());
  REQUIRE(log.replayFrom(6, &again));
  CHECK(names(again) == std::vector<uint32_t>{6, 7, 8, 9});
  CHECK_FALSE(log.acknowledge(5));   // backwards
  CHECK_FALSE(log.acknowledge(12));  // beyond what was sent
  REQUIRE(log.acknowledge(10));
  CHECK(log.frames() == 0);
  CHECK(log.bytes() == 0);
}

TEST_CASE("acks and resume answers pass through the log without a number", "[replay-log]") {
  ReplayLog log;
  std::vector<char> mixed = inlineFrame(1, 3, 'x');
  for (const auto& part : {headerOnly(FrameType::kAck, 5), inlineFrame(2, 0, 0), headerOnly(FrameType::kResume, 9),
                           inlineFrame(3, 40, 'y')}) {
    mixed.insert(mixed.end(), part.begin(), part.end());
  }
  // Split over two pieces in the middle of a header, as a frame and its payload may be.
  std::string why;
  const size_t cut = 21;
  iovec pieces[2] = {{mixed.data(), cut}, {mixed.data() + cut, mixed.size() - cut}};
  REQUIRE(log.append(pieces, 2, &why) == 3);
  std::vector<char> again;
  REQUIRE(log.replayFrom(0, &again));
  CHECK(names(again) == std::vector<uint32_t>{1, 2, 3});
  CHECK(again.size() == mixed.size() - 32);
}

TEST_CASE("bytes that are not whole frames are refused and nothing is kept", "[replay-log]") {
  ReplayLog log;
  REQUIRE(append(log, inlineFrame(1, 8, 'q')) == 1);
  std::string why;
  std::vector<char> partial = inlineFrame(2, 100, 'r');
  partial.resize(partial.size() - 1);
  iovec piece{partial.data(), partial.size()};
  CHECK(log.append(&piece, 1, &why) == -1);
  CHECK(why.find("whole frames") != std::string::npos);
  std::vector<char> unknown = headerOnly(static_cast<FrameType>(42), 0);
  iovec strange{unknown.data(), unknown.size()};
  CHECK(log.append(&strange, 1, &why) == -1);
  CHECK(log.frames() == 1);
  std::vector<char> again;
  REQUIRE(log.replayFrom(0, &again));
  CHECK(names(again) == std::vector<uint32_t>{1});
}

TEST_CASE("numbers wrap at 2^32 and random acknowledgements keep the rest intact", "[replay-log]") {
  ReplayLog log;
  // Start just below the wrap: acknowledge frames one by one, without keeping them, up to there.
  std::mt19937 random(7);
  uint32_t sent = 0;
  uint32_t acked = 0;
  for (int round = 0; round < 2000; ++round) {
    const int burst = static_cast<int>(random() % 5);
    for (int i = 0; i < burst; ++i) {
      REQUIRE(append(log, inlineFrame(sent, random() % 64, static_cast<char>(sent))) == 1);
      ++sent;
    }
    if (random() % 3 == 0 && sent != acked) {
      acked += static_cast<uint32_t>(random() % (sent - acked + 1));
      REQUIRE(log.acknowledge(acked));
    }
    std::vector<char> again;
    REQUIRE(log.replayFrom(acked, &again));
    std::vector<uint32_t> expected;
    for (uint32_t name = acked; name != sent; ++name) expected.push_back(name);
    REQUIRE(names(again) == expected);
  }
  // Across the wrap: numbers from 2^32 - 3 on.
  ReplayLog wrapping(0xfffffffdu);
  for (uint32_t i = 0; i < 6; ++i) REQUIRE(append(wrapping, inlineFrame(i, i, 'w')) == 1);
  CHECK(wrapping.next() == 3u);
  std::vector<char> again;
  REQUIRE(wrapping.replayFrom(0xfffffffeu, &again));
  CHECK(names(again) == std::vector<uint32_t>{1, 2, 3, 4, 5});
  CHECK_FALSE(wrapping.acknowledge(4u));            // past what was sent
  CHECK_FALSE(wrapping.acknowledge(0xfffffff0u));   // before what is kept
  REQUIRE(wrapping.acknowledge(1u));                // four frames, across the wrap
  again.clear();
  REQUIRE(wrapping.replayFrom(1u, &again));
  CHECK(names(again) == std::vector<uint32_t>{4, 5});
}
