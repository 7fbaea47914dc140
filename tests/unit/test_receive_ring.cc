// The receive ring both transports complete receives with (proxy/protocol/receive_ring.h): its window of posted
// receives, wrap-around of receive ids, oversize frames, chunks that complete out of order, and chunks that repeat
// or contradict placed bytes.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "proxy/protocol/receive_ring.h"

using railnet::protocol::ChunkHeader;
using railnet::protocol::ClearToSendEntry;
using railnet::protocol::FrameHeader;
using railnet::protocol::FrameType;
using railnet::protocol::kMaxRecvs;
using railnet::protocol::PostedReceive;
using railnet::protocol::ReceiveRing;

namespace {

struct Entry : PostedReceive {};
using Ring = ReceiveRing<Entry>;

ChunkHeader chunk(uint32_t recvId, int buffer, uint64_t messageSize, uint64_t offset, uint64_t length) {
  ChunkHeader header{};
  header.recvId = recvId;
  header.slot = static_cast<uint8_t>(buffer);
  header.messageSize = messageSize;
  header.offset = offset;
  header.length = length;
  return header;
}

// The ring's addBytes; a refusal's reason goes into the test's report.
bool addBytes(Ring& ring, const ChunkHeader& header) {
  std::string why;
  const bool accepted = ring.addBytes(header, &why);
  if (!accepted) UNSCOPED_INFO(why);
  return accepted;
}

// Posts one single-buffer receive of `capacity` bytes into `memory`.
Entry* postOne(Ring& ring, std::vector<char>& memory, int tag = 0) {
  void* data[1] = {memory.data()};
  size_t sizes[1] = {memory.size()};
  int tags[1] = {tag};
  return ring.post(1, data, sizes, tags);
}

}  // namespace

TEST_CASE("the ring holds a window of posted receives and says when it is full", "[receive-ring]") {
  Ring ring;
  std::vector<char> memory(64);
  for (uint32_t i = 0; i < Ring::kEntries; ++i) {
    REQUIRE(!ring.full());
    REQUIRE(ring.nextId() == i);
    REQUIRE(postOne(ring, memory) != nullptr);
  }
  CHECK(ring.full());
  CHECK(postOne(ring, memory) == nullptr);  // irecv answers "not yet"
  CHECK(ring.nextId() == Ring::kEntries);
  // Completing and finishing the oldest frees exactly its entry.
  Entry* oldest = ring.find(0, 0);
  REQUIRE(oldest != nullptr);
  Ring::completeBuffer(*oldest, 0, 0);
  REQUIRE(oldest->complete());
  int sizes[kMaxRecvs] = {-1};
  CHECK(Ring::finish(*oldest, sizes) == ncclSuccess);
  CHECK(sizes[0] == 0);
  CHECK(ring.find(0, 0) == nullptr);
  CHECK(!ring.full());
  CHECK(postOne(ring, memory) == oldest);
}

TEST_CASE("receive ids wrap around the ring; an id of an earlier lap is not posted", "[receive-ring]") {
  Ring ring;
  std::vector<char> memory(256);
  for (uint32_t id = 0; id < 5 * Ring::kEntries + 3; ++id) {
    Entry* entry = postOne(ring, memory);
    REQUIRE(entry != nullptr);
    REQUIRE(ring.find(id, 0) == entry);
    if (id >= Ring::kEntries) CHECK(ring.find(id - Ring::kEntries, 0) == nullptr);  // the same entry, another lap
    const ChunkHeader header = chunk(id, 0, 100, 0, 100);
    REQUIRE(ring.destination(header) == memory.data());
    REQUIRE(addBytes(ring, header));
    REQUIRE(entry->complete());
    int size = 0;
    REQUIRE(Ring::finish(*entry, &size) == ncclSuccess);
    CHECK(size == 100);
  }
  // Close to the end of the 32-bit id space the ring keeps working (ids compare for equality only).
  CHECK(ring.find(UINT32_MAX - 1, 0) == nullptr);
}

TEST_CASE("chunks complete a buffer in any order; a grouped receive completes when every buffer has", "[receive-ring]") {
  Ring ring;
  std::vector<std::vector<char>> memory(kMaxRecvs, std::vector<char>(1 << 16));
  void* data[kMaxRecvs];
  size_t sizes[kMaxRecvs];
  int tags[kMaxRecvs];
  for (int i = 0; i < kMaxRecvs; ++i) {
    data[i] = memory[static_cast<size_t>(i)].data();
    sizes[i] = memory[static_cast<size_t>(i)].size();
    tags[i] = 100 + i;
  }
  const uint32_t id = ring.nextId();
  Entry* entry = ring.post(kMaxRecvs, data, sizes, tags);
  REQUIRE(entry != nullptr);
  // Every buffer gets a message of a different size, cut into 4 KiB chunks delivered in a shuffled order.
  std::vector<ChunkHeader> chunks;
  for (int i = 0; i < kMaxRecvs; ++i) {
    const uint64_t message = 4096 * static_cast<uint64_t>(i + 1) + static_cast<uint64_t>(i) * 17;
    for (uint64_t offset = 0; offset < message; offset += 4096) {
      chunks.push_back(chunk(id, i, message, offset, std::min<uint64_t>(4096, message - offset)));
    }
  }
  std::mt19937 rng(7);
  std::shuffle(chunks.begin(), chunks.end(), rng);
  for (size_t k = 0; k < chunks.size(); ++k) {
    REQUIRE(!entry->complete());
    char* destination = ring.destination(chunks[k]);
    REQUIRE(destination == static_cast<char*>(data[chunks[k].slot]) + chunks[k].offset);
    REQUIRE(addBytes(ring, chunks[k]));
  }
  REQUIRE(entry->complete());
  int received[kMaxRecvs] = {};
  REQUIRE(Ring::finish(*entry, received) == ncclSuccess);
  for (int i = 0; i < kMaxRecvs; ++i) CHECK(received[i] == 4096 * (i + 1) + i * 17);
}

TEST_CASE("a chunk outside the posted buffer or receive has no destination", "[receive-ring]") {
  Ring ring;
  std::vector<char> memory(1000);
  const uint32_t id = ring.nextId();
  REQUIRE(postOne(ring, memory) != nullptr);
  CHECK(ring.destination(chunk(id, 0, 1001, 0, 1)) == nullptr);       // message larger than the buffer
  CHECK(ring.destination(chunk(id, 0, 1000, 999, 2)) == nullptr);     // runs past the message
  CHECK(ring.destination(chunk(id, 0, 1000, 1001, 0)) == nullptr);    // starts past the message
  CHECK(ring.destination(chunk(id, 1, 10, 0, 10)) == nullptr);        // a buffer the receive does not have
  CHECK(ring.destination(chunk(id + 1, 0, 10, 0, 10)) == nullptr);    // a receive not posted yet
  CHECK(ring.destination(chunk(id, 0, 1000, 0, 1000)) == memory.data());
}

TEST_CASE("an oversize frame completes its buffer with 0 bytes and fails the receive", "[receive-ring]") {
  Ring ring;
  std::vector<char> small(16), large(4096);
  void* data[2] = {small.data(), large.data()};
  size_t sizes[2] = {small.size(), large.size()};
  int tags[2] = {1, 2};
  const uint32_t id = ring.nextId();
  Entry* entry = ring.post(2, data, sizes, tags);
  REQUIRE(entry != nullptr);
  FrameHeader oversize{static_cast<uint8_t>(FrameType::kOversize), 0, 0, id, 17};
  REQUIRE(ring.applyOversize(oversize, "peer"));
  CHECK(!entry->complete());  // the other buffer is still open
  const ChunkHeader header = chunk(id, 1, 4096, 0, 4096);
  REQUIRE(ring.destination(header) != nullptr);
  REQUIRE(addBytes(ring, header));
  REQUIRE(entry->complete());
  int received[2] = {-1, -1};
  CHECK(Ring::finish(*entry, received) == ncclInvalidUsage);
  CHECK(received[0] == 0);
  CHECK(received[1] == 4096);
  // The entry is free again and later receives still match.
  CHECK(ring.find(id, 0) == nullptr);
  FrameHeader stray{static_cast<uint8_t>(FrameType::kOversize), 0, 0, id + 5, 17};
  CHECK(!ring.applyOversize(stray, "peer"));  // not posted: the caller records a protocol error
}

TEST_CASE("the clear-to-send lists each buffer's tag and capacity in order", "[receive-ring]") {
  Ring ring;
  std::vector<char> a(10), b(20), c(30);
  void* data[3] = {a.data(), b.data(), c.data()};
  size_t sizes[3] = {a.size(), b.size(), c.size()};
  int tags[3] = {7, 8, 9};
  const uint32_t id = ring.nextId();
  Entry* entry = ring.post(3, data, sizes, tags);
  REQUIRE(entry != nullptr);
  ClearToSendEntry entries[kMaxRecvs];
  const FrameHeader header = Ring::clearToSend(*entry, id, 2, entries);
  CHECK(header.type == static_cast<uint8_t>(FrameType::kClearToSend));
  CHECK(header.slot == 3);
  CHECK(header.extraKeys == 2);
  CHECK(header.recvId == id);
  for (int i = 0; i < 3; ++i) {
    CHECK(entries[i].tag == 7 + i);
    CHECK(entries[i].capacity == 10u * static_cast<unsigned>(i + 1));
    CHECK(entries[i].address == 0);
    CHECK(entries[i].rkey == 0);
  }
  // A receive whose clear-to-send could not leave is taken back and its id reused.
  ring.unpost(*entry);
  CHECK(ring.nextId() == id);
  CHECK(ring.find(id, 0) == nullptr);
}

TEST_CASE("a chunk that repeats placed bytes counts once; one that contradicts them is refused", "[receive-ring]") {
  Ring ring;
  std::vector<char> memory(1 << 16);
  const uint32_t id = ring.nextId();
  Entry* entry = postOne(ring, memory);
  REQUIRE(entry != nullptr);
  constexpr uint64_t kMessage = 3 * 4096;
  REQUIRE(addBytes(ring, chunk(id, 0, kMessage, 0, 4096)));
  // Sent again (failover re-sends a chunk whose NIC failed): harmless, and it does not complete the buffer, where a
  // byte counter would have reached the message size with the last 4 KiB missing.
  REQUIRE(addBytes(ring, chunk(id, 0, kMessage, 0, 4096)));
  REQUIRE(addBytes(ring, chunk(id, 0, kMessage, 4096, 4096)));
  CHECK(!entry->complete());
  CHECK(entry->receivedBytes() == 2 * 4096);
  std::string why;
  CHECK(!ring.addBytes(chunk(id, 0, kMessage, 6000, 4096), &why));  // overlaps placed bytes in part
  CHECK(why.find("in part") != std::string::npos);
  CHECK(why.find("receive " + std::to_string(id) + " buffer 0") != std::string::npos);
  why.clear();
  CHECK(!ring.addBytes(chunk(id, 0, kMessage + 1, 2 * 4096, 4096), &why));  // another message size
  CHECK(why.find("message") != std::string::npos);
  CHECK(!entry->complete());
  REQUIRE(addBytes(ring, chunk(id, 0, kMessage, 2 * 4096, 4096)));
  REQUIRE(entry->complete());
  REQUIRE(addBytes(ring, chunk(id, 0, kMessage, 4096, 8192 - 4096)));  // late repeat after completion: nothing
  int size = 0;
  REQUIRE(Ring::finish(*entry, &size) == ncclSuccess);
  CHECK(size == static_cast<int>(kMessage));
}

TEST_CASE("verbs path failover: a queried chunk is placed when its bytes are, or when its receive is finished",
          "[receive-ring]") {
  // The receiver's answer to a kPathQuery (wire.h): only a chunk answered "missing" is sent again, so a copy never
  // lands in a buffer NCCL may have reused.
  Ring ring;
  std::vector<char> memory(1000);
  Entry* entry = postOne(ring, memory);
  REQUIRE(entry != nullptr);
  CHECK_FALSE(ring.placed(chunk(0, 0, 1000, 0, 400)));
  REQUIRE(addBytes(ring, chunk(0, 0, 1000, 0, 400)));
  CHECK(ring.placed(chunk(0, 0, 1000, 0, 400)));
  CHECK(ring.placed(chunk(0, 0, 1000, 100, 200)));   // inside placed bytes
  CHECK_FALSE(ring.placed(chunk(0, 0, 1000, 300, 200)));  // half of it missing
  CHECK_FALSE(ring.placed(chunk(0, 0, 1000, 400, 600)));
  REQUIRE(addBytes(ring, chunk(0, 0, 1000, 400, 600)));
  int size = 0;
  REQUIRE(Ring::finish(*entry, &size) == ncclSuccess);
  CHECK(ring.placed(chunk(0, 0, 1000, 400, 600)));  // finished: every byte arrived
  // An empty message is placed once it completed.
  std::vector<char> none(16);
  Entry* empty = postOne(ring, none);
  REQUIRE(empty != nullptr);
  CHECK_FALSE(ring.placed(chunk(1, 0, 0, 0, 0)));
  REQUIRE(addBytes(ring, chunk(1, 0, 0, 0, 0)));
  CHECK(ring.placed(chunk(1, 0, 0, 0, 0)));
}
