// The receive buffer's ledger of placed bytes (proxy/protocol/chunk_ledger.h): every byte counted once, whatever
// the order, repeats and threads; contradictions refused; one completion per message.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "proxy/protocol/chunk_ledger.h"

using railnet::protocol::ChunkLedger;
using LedgerVerdict = ChunkLedger::Verdict;

namespace {

struct Chunk {
  uint64_t offset;
  uint64_t length;
};

// A message of `size` bytes cut the way a sender may cut it: pieces of varying length.
std::vector<Chunk> cut(uint64_t size, std::mt19937_64& rng) {
  std::vector<Chunk> chunks;
  for (uint64_t offset = 0; offset < size;) {
    const uint64_t length = std::min<uint64_t>(size - offset, 1 + rng() % 9000);
    chunks.push_back({offset, length});
    offset += length;
  }
  return chunks;
}

// Resets `ledger` for a message of a random size in [minimum, minimum + span) and returns its size and its chunks.
uint64_t nextMessage(ChunkLedger& ledger, std::mt19937_64& rng, uint64_t minimum, uint64_t span,
                     std::vector<Chunk>* chunks) {
  const uint64_t size = minimum + rng() % span;
  ledger.reset();
  *chunks = cut(size, rng);
  return size;
}

LedgerVerdict add(ChunkLedger& ledger, uint64_t offset, uint64_t length, uint64_t size) {
  std::string why;
  const LedgerVerdict verdict = ledger.add(offset, length, size, &why);
  if (verdict == LedgerVerdict::kConflict) UNSCOPED_INFO(why);
  return verdict;
}

}  // namespace

TEST_CASE("chunk ledger: in any order, with repeats, every byte counts once and the last new byte completes",
          "[chunk-ledger]") {
  std::mt19937_64 rng(11);
  ChunkLedger ledger;
  std::vector<Chunk> chunks;
  for (int round = 0; round < 50; ++round) {
    const uint64_t size = nextMessage(ledger, rng, 1, 200000, &chunks);
    // Every chunk once, a third of them twice, in a random order.
    std::vector<Chunk> arrivals = chunks;
    for (const Chunk& chunk : chunks) {
      if (rng() % 3 == 0) arrivals.push_back(chunk);
    }
    std::shuffle(arrivals.begin(), arrivals.end(), rng);
    int completions = 0;
    uint64_t lastPlaced = 0;
    for (const Chunk& chunk : arrivals) {
      const LedgerVerdict verdict = add(ledger, chunk.offset, chunk.length, size);
      REQUIRE(verdict != LedgerVerdict::kConflict);
      completions += verdict == LedgerVerdict::kComplete;
      REQUIRE(ledger.placed() >= lastPlaced);
      REQUIRE(ledger.placed() <= size);
      if (verdict == LedgerVerdict::kRepeated) REQUIRE(ledger.placed() == lastPlaced);
      lastPlaced = ledger.placed();
    }
    REQUIRE(completions == 1);
    REQUIRE(ledger.placed() == size);
    REQUIRE(ledger.rangeCount() == 1);
  }
}

TEST_CASE("chunk ledger: the completing chunk is the one that places the last new byte", "[chunk-ledger]") {
  ChunkLedger ledger;
  ledger.reset();
  CHECK(add(ledger, 8192, 4096, 12288) == LedgerVerdict::kCounted);
  CHECK(add(ledger, 0, 4096, 12288) == LedgerVerdict::kCounted);
  CHECK(ledger.rangeCount() == 2);
  CHECK(add(ledger, 0, 4096, 12288) == LedgerVerdict::kRepeated);  // would have made a byte counter read 12288
  CHECK(add(ledger, 4096, 4096, 12288) == LedgerVerdict::kComplete);
  CHECK(ledger.rangeCount() == 1);
  CHECK(add(ledger, 4096, 4096, 12288) == LedgerVerdict::kRepeated);
  CHECK(add(ledger, 0, 12288, 12288) == LedgerVerdict::kRepeated);  // a larger chunk over placed bytes only
}

TEST_CASE("chunk ledger: partial overlaps, other message sizes and out-of-bounds chunks are refused, counting nothing",
          "[chunk-ledger]") {
  ChunkLedger ledger;
  ledger.reset();
  std::string why;
  REQUIRE(add(ledger, 0, 10, 100) == LedgerVerdict::kCounted);
  REQUIRE(add(ledger, 20, 10, 100) == LedgerVerdict::kCounted);
  // Touches [0, 10) and reaches into [20, 30): the overlap with a later range must not go unseen.
  CHECK(ledger.add(10, 15, 100, &why) == LedgerVerdict::kConflict);
  CHECK(why.find("overlaps placed bytes 20-30 in part") != std::string::npos);
  CHECK(ledger.add(5, 10, 100, &why) == LedgerVerdict::kConflict);   // straddles the end of [0, 10)
  CHECK(ledger.add(15, 20, 100, &why) == LedgerVerdict::kConflict);  // covers [20, 30) and more
  CHECK(ledger.add(30, 10, 99, &why) == LedgerVerdict::kConflict);   // another message size
  CHECK(why.find("100 and 99") != std::string::npos);
  CHECK(ledger.add(95, 10, 100, &why) == LedgerVerdict::kConflict);  // runs past the message
  CHECK(ledger.add(101, 0, 100, &why) == LedgerVerdict::kConflict);  // starts past it
  CHECK(ledger.add(UINT64_MAX, 2, UINT64_MAX, &why) == LedgerVerdict::kConflict);  // the end would wrap
  CHECK(ledger.placed() == 20);
  // The gaps still take their own bytes, and the message completes.
  CHECK(add(ledger, 10, 10, 100) == LedgerVerdict::kCounted);
  CHECK(add(ledger, 30, 70, 100) == LedgerVerdict::kComplete);
  CHECK(ledger.placed() == 100);
}

TEST_CASE("chunk ledger: an empty message completes once; an empty chunk of a longer one counts nothing",
          "[chunk-ledger]") {
  ChunkLedger ledger;
  ledger.reset();
  CHECK(add(ledger, 0, 0, 0) == LedgerVerdict::kComplete);
  CHECK(add(ledger, 0, 0, 0) == LedgerVerdict::kRepeated);
  ledger.reset();
  CHECK(add(ledger, 0, 0, 50) == LedgerVerdict::kRepeated);
  CHECK(add(ledger, 0, 50, 50) == LedgerVerdict::kComplete);
  // reset() starts the next message afresh: its size, its ranges, its count.
  ledger.reset();
  CHECK(ledger.placed() == 0);
  CHECK(add(ledger, 0, 7, 7) == LedgerVerdict::kComplete);
}

TEST_CASE("chunk ledger: helper threads adding chunks and repeats at once complete the message exactly once",
          "[chunk-ledger]") {
  constexpr int kThreads = 4;
  std::mt19937_64 rng(5);
  ChunkLedger ledger;
  std::vector<Chunk> chunks;
  for (int round = 0; round < 20; ++round) {
    const uint64_t size = nextMessage(ledger, rng, 50000, 500000, &chunks);
    // Each chunk goes to one thread, and a repeat of it to another, as a failed-over NIC and its survivor would.
    std::vector<std::vector<Chunk>> work(kThreads);
    for (size_t i = 0; i < chunks.size(); ++i) {
      work[i % kThreads].push_back(chunks[i]);
      if (i % 2 == 0) work[(i + 1) % kThreads].push_back(chunks[i]);
    }
    std::atomic<int> completions{0};
    std::atomic<int> conflicts{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      std::shuffle(work[static_cast<size_t>(t)].begin(), work[static_cast<size_t>(t)].end(), rng);
      threads.emplace_back([&, t] {
        std::string why;
        for (const Chunk& chunk : work[static_cast<size_t>(t)]) {
          const LedgerVerdict verdict = ledger.add(chunk.offset, chunk.length, size, &why);
          completions += verdict == LedgerVerdict::kComplete;
          conflicts += verdict == LedgerVerdict::kConflict;
        }
      });
    }
    for (std::thread& thread : threads) thread.join();
    REQUIRE(conflicts.load() == 0);
    REQUIRE(completions.load() == 1);
    REQUIRE(ledger.placed() == size);
  }
}

TEST_CASE("claims: one stream writes a chunk at a time, copies of placed chunks are dropped", "[chunk-ledger]") {
  using Claim = ChunkLedger::Claim;
  ChunkLedger ledger;
  std::string why;
  CHECK(ledger.claim(0, 100) == Claim::kGo);
  CHECK(ledger.claim(0, 100) == Claim::kBusy);   // a copy while the first is being written waits
  CHECK(ledger.claim(100, 100) == Claim::kGo);   // another chunk is free
  REQUIRE(ledger.add(0, 100, 300, &why) == ChunkLedger::Verdict::kCounted);
  CHECK(ledger.claim(0, 100) == Claim::kPlaced);  // the copy after it landed: dropped
  ledger.release(100, 100);                       // its stream failed mid-payload
  CHECK(ledger.claim(100, 100) == Claim::kGo);    // the copy takes it over
  REQUIRE(ledger.add(100, 100, 300, &why) == ChunkLedger::Verdict::kCounted);
  CHECK(ledger.claim(200, 100) == Claim::kGo);
  REQUIRE(ledger.add(200, 100, 300, &why) == ChunkLedger::Verdict::kComplete);
  CHECK(ledger.claim(50, 10) == Claim::kPlaced);  // inside placed bytes
  ledger.reset();
  CHECK(ledger.claim(0, 100) == Claim::kGo);      // a new message: nothing placed, nothing claimed
}
