#include <catch2/catch.hpp>

#include <cstring>
#include <vector>

#include "proxy/protocol/clear_to_send.h"

using railnet::protocol::ClearToSendEntry;
using railnet::protocol::ClearToSendQueue;
using railnet::protocol::FrameHeader;
using railnet::protocol::FrameType;

namespace {
// Appends one clear-to-send frame as a receiver would write it.
void appendFrame(std::vector<char>* bytes, uint32_t recvId, std::vector<std::pair<int, uint64_t>> buffers) {
  FrameHeader header{static_cast<uint8_t>(FrameType::kClearToSend), static_cast<uint8_t>(buffers.size()), 0, recvId, 0};
  const char* raw = reinterpret_cast<const char*>(&header);
  bytes->insert(bytes->end(), raw, raw + sizeof(header));
  for (auto [tag, capacity] : buffers) {
    ClearToSendEntry entry{tag, 0, capacity, 0x1000u + capacity};
    raw = reinterpret_cast<const char*>(&entry);
    bytes->insert(bytes->end(), raw, raw + sizeof(entry));
  }
}

void feed(ClearToSendQueue* queue, const std::vector<char>& bytes) {
  std::string why;
  REQUIRE(queue->parse(bytes.data(), bytes.size(), &why) == static_cast<long>(bytes.size()));
}
}  // namespace

TEST_CASE("single receives match in posting order", "[matching]") {
  ClearToSendQueue queue;
  std::vector<char> bytes;
  appendFrame(&bytes, 0, {{3, 100}});
  appendFrame(&bytes, 1, {{3, 200}});
  feed(&queue, bytes);
  auto first = queue.claim(3);
  auto second = queue.claim(3);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->recvId == 0);
  CHECK(first->capacity == 100);
  CHECK(first->address == 0x1000u + 100);
  CHECK(second->recvId == 1);
  CHECK(second->capacity == 200);
  CHECK_FALSE(queue.claim(3));
  CHECK(queue.empty());
}

TEST_CASE("the k-th send of a tag takes that tag's buffer in the k-th receive listing it", "[matching]") {
  ClearToSendQueue queue;
  std::vector<char> bytes;
  appendFrame(&bytes, 7, {{1, 10}, {2, 20}, {3, 30}});
  appendFrame(&bytes, 8, {{2, 21}, {3, 31}});
  appendFrame(&bytes, 9, {{1, 12}});
  feed(&queue, bytes);
  // Tag 3 twice before anyone else: receive 7 then receive 8.
  auto a = queue.claim(3);
  auto b = queue.claim(3);
  REQUIRE((a && b));
  CHECK((a->recvId == 7 && a->slot == 2));
  CHECK((b->recvId == 8 && b->slot == 1));
  // Tag 1: receive 7 then receive 9, skipping 8 which does not list it.
  auto c = queue.claim(1);
  auto d = queue.claim(1);
  REQUIRE((c && d));
  CHECK((c->recvId == 7 && c->slot == 0));
  CHECK((d->recvId == 9 && d->slot == 0));
  CHECK(queue.openTags() == "2 2");
  CHECK_FALSE(queue.claim(4));
}

TEST_CASE("a tag never takes another tag's buffer", "[matching]") {
  ClearToSendQueue queue;
  std::vector<char> bytes;
  appendFrame(&bytes, 0, {{5, 64}});
  feed(&queue, bytes);
  CHECK_FALSE(queue.claim(6));
  CHECK(queue.openTags() == "5");
  CHECK(queue.claim(5));
}

TEST_CASE("partial frames wait for the rest of their bytes", "[framing]") {
  ClearToSendQueue queue;
  std::vector<char> bytes;
  appendFrame(&bytes, 4, {{1, 1}, {2, 2}});
  std::string why;
  for (size_t cut : {size_t{0}, size_t{5}, sizeof(FrameHeader), bytes.size() - 1}) {
    INFO(cut);
    CHECK(queue.parse(bytes.data(), cut, &why) == 0);
  }
  CHECK(queue.empty());
  CHECK(queue.parse(bytes.data(), bytes.size(), &why) == static_cast<long>(bytes.size()));
  CHECK_FALSE(queue.empty());
}

TEST_CASE("bytes that are not a clear-to-send frame are a protocol error", "[framing]") {
  ClearToSendQueue queue;
  std::string why;
  SECTION("wrong type") {
    FrameHeader inline_{static_cast<uint8_t>(FrameType::kInline), 0, 0, 0, 8};
    CHECK(queue.parse(reinterpret_cast<const char*>(&inline_), sizeof(inline_), &why) == -1);
  }
  SECTION("too many buffers") {
    FrameHeader many{static_cast<uint8_t>(FrameType::kClearToSend), 9, 0, 0, 0};
    CHECK(queue.parse(reinterpret_cast<const char*>(&many), sizeof(many), &why) == -1);
  }
  SECTION("no buffers") {
    FrameHeader none{static_cast<uint8_t>(FrameType::kClearToSend), 0, 0, 0, 0};
    CHECK(queue.parse(reinterpret_cast<const char*>(&none), sizeof(none), &why) == -1);
  }
  CHECK(why.find("protocol error") != std::string::npos);
}

TEST_CASE("a fused verbs receiver's frame carries one rkey per path for each buffer", "[framing][fusion]") {
  // Two buffers, three paths: entries carry path 0's key, then buffer 0's keys for paths 1..2, then buffer 1's.
  FrameHeader header{static_cast<uint8_t>(FrameType::kClearToSend), 2, 2, 7, 0};
  std::vector<char> bytes(reinterpret_cast<const char*>(&header), reinterpret_cast<const char*>(&header) + sizeof(header));
  const ClearToSendEntry entries[2] = {{5, 0xa0, 4096, 0x10000}, {6, 0xb0, 8192, 0x20000}};
  bytes.insert(bytes.end(), reinterpret_cast<const char*>(entries), reinterpret_cast<const char*>(entries) + sizeof(entries));
  const uint32_t keys[4] = {0xa1, 0xa2, 0xb1, 0xb2};
  bytes.insert(bytes.end(), reinterpret_cast<const char*>(keys), reinterpret_cast<const char*>(keys) + sizeof(keys));

  ClearToSendQueue queue;
  std::string why;
  // Everything but the last key: the frame waits for the rest.
  REQUIRE(queue.parse(bytes.data(), bytes.size() - 1, &why) == 0);
  REQUIRE(queue.parse(bytes.data(), bytes.size(), &why) == static_cast<long>(bytes.size()));
  auto second = queue.claim(6);
  auto first = queue.claim(5);
  REQUIRE(first);
  REQUIRE(second);
  CHECK(first->rkey == 0xa0);
  CHECK(first->pathKeys[0] == 0xa0);
  CHECK(first->pathKeys[1] == 0xa1);
  CHECK(first->pathKeys[2] == 0xa2);
  CHECK(first->pathKeys[3] == 0xa0);  // beyond the frame's paths: path 0's key
  CHECK(second->pathKeys[0] == 0xb0);
  CHECK(second->pathKeys[1] == 0xb1);
  CHECK(second->pathKeys[2] == 0xb2);
  CHECK(second->address == 0x20000);

  // A frame claiming more keys per buffer than paths can exist is refused.
  FrameHeader bad{static_cast<uint8_t>(FrameType::kClearToSend), 1, railnet::protocol::kMaxKeysPerBuffer, 8, 0};
  ClearToSendQueue other;
  CHECK(other.parse(reinterpret_cast<const char*>(&bad), sizeof(bad), &why) == -1);
  CHECK(why.find("keys per buffer") != std::string::npos);
}

TEST_CASE("a claim tells how many buffers of its receive still wait for a send", "[matching]") {
  // Multireceive aggregation holds a group's small sends until groupUnclaimed reaches 0.
  ClearToSendQueue queue;
  std::vector<char> bytes;
  appendFrame(&bytes, 4, {{5, 10}, {6, 10}, {7, 10}});
  appendFrame(&bytes, 5, {{6, 10}});
  feed(&queue, bytes);
  auto six = queue.claim(6);
  REQUIRE(six);
  CHECK(six->groupSize == 3);
  CHECK(six->groupUnclaimed == 2);
  auto sixAgain = queue.claim(6);  // the next receive listing tag 6: a group of one
  REQUIRE(sixAgain);
  CHECK(sixAgain->recvId == 5);
  CHECK(sixAgain->groupSize == 1);
  CHECK(sixAgain->groupUnclaimed == 0);
  auto seven = queue.claim(7);
  REQUIRE(seven);
  CHECK(seven->groupUnclaimed == 1);
  auto five = queue.claim(5);
  REQUIRE(five);
  CHECK(five->recvId == 4);
  CHECK(five->groupUnclaimed == 0);
  CHECK(queue.empty());
}

TEST_CASE("done frames: taken between clear-to-sends only when asked for, else a protocol error", "[matching]") {
  std::vector<char> bytes;
  appendFrame(&bytes, 0, {{1, 64}});
  FrameHeader done{static_cast<uint8_t>(FrameType::kDone), 1, 0, 7, 0};  // buffer 1 of receive 7
  const char* raw = reinterpret_cast<const char*>(&done);
  bytes.insert(bytes.end(), raw, raw + sizeof(done));
  appendFrame(&bytes, 1, {{1, 64}});
  done.recvId = 8;
  done.slot = 0;
  bytes.insert(bytes.end(), raw, raw + sizeof(done));
  bytes.insert(bytes.end(), raw, raw + 5);  // part of a third: waits for the rest

  ClearToSendQueue asked;
  std::vector<railnet::protocol::DoneFrame> delivered;
  std::string why;
  CHECK(asked.parse(bytes.data(), bytes.size(), &why, &delivered) == static_cast<long>(bytes.size() - 5));
  CHECK(delivered == std::vector<railnet::protocol::DoneFrame>{{7, 1}, {8, 0}});
  CHECK(asked.claim(1));
  CHECK(asked.claim(1));

  ClearToSendQueue notAsked;
  CHECK(notAsked.parse(bytes.data(), bytes.size(), &why) == -1);
  CHECK(why.find("protocol error") != std::string::npos);

  ClearToSendQueue badSlot;
  done.slot = 8;  // buffers are 0..7
  CHECK(badSlot.parse(raw, sizeof(done), &why, &delivered) == -1);
}

TEST_CASE("verbs path failover: a clear-to-send sent again is dropped, a new one is taken", "[matching]") {
  // A receiver whose clear-to-send path failed sends again, in order, every clear-to-send whose SEND did not
  // complete; some had arrived.
  ClearToSendQueue queue;
  queue.dropRepeatedReceives();
  std::vector<char> bytes;
  appendFrame(&bytes, 0, {{1, 100}});
  appendFrame(&bytes, 1, {{1, 200}});
  appendFrame(&bytes, 1, {{1, 200}});  // sent again: it had arrived
  appendFrame(&bytes, 2, {{1, 300}});
  feed(&queue, bytes);
  for (uint64_t capacity : {100u, 200u, 300u}) {
    auto next = queue.claim(1);
    REQUIRE(next);
    CHECK(next->capacity == capacity);
  }
  CHECK(queue.empty());
  // Without the setting (TCP, whose control socket never repeats one) every frame is a receive.
  ClearToSendQueue plain;
  feed(&plain, bytes);
  int count = 0;
  while (plain.claim(1)) ++count;
  CHECK(count == 4);
}

TEST_CASE("verbs path failover: a clear-to-send read ahead of an earlier one waits for it", "[matching]") {
  // The sender reads its paths' completion queues one after another: a clear-to-send sent again over the new path
  // (receive 2) can be read before the original of receive 1, which arrived on the old path first. Sends must still
  // match receives in order (a send matched to the wrong receive lands with the wrong size: the campaign's bug).
  ClearToSendQueue queue;
  queue.dropRepeatedReceives();
  std::vector<char> bytes;
  appendFrame(&bytes, 0, {{1, 100}});
  appendFrame(&bytes, 2, {{1, 300}});  // sent again over path 0, read first
  appendFrame(&bytes, 3, {{1, 400}});  // new, over path 0
  feed(&queue, bytes);
  auto first = queue.claim(1);
  REQUIRE(first);
  CHECK(first->capacity == 100);
  CHECK(!queue.claim(1));  // receive 1 is not announced yet: 2 and 3 wait
  CHECK(queue.heldAhead() == 2);
  bytes.clear();
  appendFrame(&bytes, 1, {{1, 200}});  // the original, read from path 1's queue
  appendFrame(&bytes, 2, {{1, 300}});  // the original of the one sent again
  feed(&queue, bytes);
  CHECK(queue.heldAhead() == 0);
  for (uint64_t capacity : {200u, 300u, 400u}) {
    auto next = queue.claim(1);
    REQUIRE(next);
    CHECK(next->capacity == capacity);
  }
  CHECK(queue.empty());
}

TEST_CASE("verbs path failover: clear-to-sends held ahead are bounded", "[matching]") {
  ClearToSendQueue queue;
  queue.dropRepeatedReceives();
  std::string why;
  long result = 0;
  for (uint32_t recvId = 1; recvId < 1000 && result >= 0; ++recvId) {
    std::vector<char> bytes;
    appendFrame(&bytes, recvId, {{1, 100}});
    result = queue.parse(bytes.data(), bytes.size(), &why);
  }
  CHECK(result == -1);
  CHECK(why.find("ahead of receive 0") != std::string::npos);
}
