// The receive side's landing ring for GPU memory on TCP (proxy/staging/landing_ring.h): where staged chunks land,
// when they wait, what is refused, and that no interleaving of in-order streams can deadlock it.
#include <catch2/catch.hpp>

#include <deque>
#include <random>
#include <vector>

#include "proxy/staging/landing_ring.h"

using railnet::protocol::ChunkHeader;
using railnet::protocol::kChunkStaged;
using railnet::staging::LandingRing;
using Verdict = railnet::staging::LandingRing::Verdict;

namespace {
constexpr uint64_t kPiece = 1 << 16;

ChunkHeader chunk(uint16_t seq, uint64_t messageSize, uint64_t offset, uint64_t length, uint32_t recvId = 7) {
  ChunkHeader header{};
  header.recvId = recvId;
  header.slot = 0;
  header.flags = kChunkStaged;
  header.pieceSeq = seq;
  header.messageSize = messageSize;
  header.offset = offset;
  header.length = length;
  return header;
}
}  // namespace

TEST_CASE("staged chunks land at their piece's slot and offset; a piece completes with its last byte", "[staging]") {
  LandingRing ring(4, kPiece);
  std::string why;
  uint64_t at = 0;
  // A 2.5-piece message: pieces 0, 1 and a half piece 2, numbered 10, 11, 12.
  const uint64_t size = 2 * kPiece + kPiece / 2;
  REQUIRE(ring.place(chunk(10, size, kPiece + 4096, 4096), &at, &why) == Verdict::kWait);  // slot 3 expects 3
  LandingRing fresh(16, kPiece);
  REQUIRE(fresh.place(chunk(10, size, kPiece + 4096, 4096), &at, &why) == Verdict::kLand);
  CHECK(at == 10 * kPiece + 4096);
  CHECK_FALSE(fresh.landed(chunk(10, size, kPiece + 4096, 4096)));
  REQUIRE(fresh.place(chunk(10, size, kPiece, 4096), &at, &why) == Verdict::kLand);
  CHECK(at == 10 * kPiece);
  REQUIRE(fresh.place(chunk(10, size, kPiece + 8192, kPiece - 8192), &at, &why) == Verdict::kLand);
  CHECK_FALSE(fresh.landed(chunk(10, size, kPiece, 4096)));
  std::vector<LandingRing::LandedPiece> taken;
  fresh.takeLanded(&taken, 16);
  CHECK(taken.empty());  // piece 10 is not whole, and pieces go up in order from 0 anyway
  CHECK(fresh.landed(chunk(10, size, kPiece + 8192, kPiece - 8192)));
  CHECK(fresh.anyLanded());
  // The last piece is half as long.
  REQUIRE(fresh.place(chunk(11, size, 2 * kPiece, kPiece / 2), &at, &why) == Verdict::kLand);
  CHECK(fresh.landed(chunk(11, size, 2 * kPiece, kPiece / 2)));
}

TEST_CASE("a piece waits for its slot, takes it once the older piece is copied out, and is taken in order",
          "[staging]") {
  LandingRing ring(2, kPiece);
  std::string why;
  uint64_t at = 0;
  const uint64_t size = 4 * kPiece;
  for (uint16_t seq = 0; seq < 2; ++seq) {
    const ChunkHeader header = chunk(seq, size, seq * kPiece, kPiece);
    REQUIRE(ring.place(header, &at, &why) == Verdict::kLand);
    CHECK(ring.landed(header));
  }
  REQUIRE(ring.place(chunk(2, size, 2 * kPiece, kPiece), &at, &why) == Verdict::kWait);
  std::vector<LandingRing::LandedPiece> taken;
  ring.takeLanded(&taken, 1);  // one copy may start: piece 0
  REQUIRE(taken.size() == 1);
  CHECK(taken[0].slot == 0);
  CHECK(taken[0].piece.offset == 0);
  CHECK(taken[0].piece.length == kPiece);
  CHECK(ring.anyTaken());
  REQUIRE(ring.place(chunk(2, size, 2 * kPiece, kPiece), &at, &why) == Verdict::kWait);  // still being copied
  ring.release(0);
  REQUIRE(ring.place(chunk(2, size, 2 * kPiece, kPiece), &at, &why) == Verdict::kLand);
  CHECK(at == 0);
  ring.takeLanded(&taken, 4);
  REQUIRE(taken.size() == 2);
  CHECK(taken[1].piece.offset == kPiece);  // piece 1; piece 2 is not whole yet
}

TEST_CASE("the landing ring refuses chunks that contradict their piece", "[staging]") {
  LandingRing ring(4, kPiece);
  std::string why;
  uint64_t at = 0;
  const uint64_t size = 2 * kPiece;
  REQUIRE(ring.place(chunk(0, size, 0, 4096), &at, &why) == Verdict::kLand);
  SECTION("another message in the same piece number") {
    CHECK(ring.place(chunk(0, size, 4096, 4096, 8), &at, &why) == Verdict::kReject);
    CHECK(why.find("mixes") != std::string::npos);
  }
  SECTION("bytes past the piece's end") {
    CHECK(ring.place(chunk(0, size, kPiece - 100, 4096), &at, &why) == Verdict::kReject);
    CHECK(why.find("does not fit") != std::string::npos);
  }
  SECTION("more bytes than the piece holds") {
    REQUIRE(ring.place(chunk(0, size, 4096, kPiece - 4096), &at, &why) == Verdict::kLand);
    CHECK(ring.place(chunk(0, size, 0, 4096), &at, &why) == Verdict::kReject);
  }
  SECTION("a piece number that was already used") {
    ring.landed(chunk(0, size, 0, 4096));
    REQUIRE(ring.place(chunk(0, size, 4096, kPiece - 4096), &at, &why) == Verdict::kLand);
    ring.landed(chunk(0, size, 4096, kPiece - 4096));
    std::vector<LandingRing::LandedPiece> taken;
    ring.takeLanded(&taken, 4);
    ring.release(taken.at(0).slot);
    CHECK(ring.place(chunk(0, size, 0, 4096), &at, &why) == Verdict::kReject);
    CHECK(why.find("moved on") != std::string::npos);
  }
}

TEST_CASE("piece numbers wrap at 2^16", "[staging]") {
  LandingRing ring(2, kPiece);
  std::string why;
  uint64_t at = 0;
  std::vector<LandingRing::LandedPiece> taken;
  for (uint32_t n = 0; n < 70000; ++n) {
    const ChunkHeader header = chunk(static_cast<uint16_t>(n), kPiece, 0, kPiece, n);
    REQUIRE(ring.place(header, &at, &why) == Verdict::kLand);
    REQUIRE(ring.landed(header));
    taken.clear();
    ring.takeLanded(&taken, 2);
    REQUIRE(taken.size() == 1);
    ring.release(taken[0].slot);
  }
}

TEST_CASE("no interleaving of in-order streams deadlocks the landing ring", "[staging]") {
  // Pieces are split into chunks spread over streams; each stream delivers its chunks in queue order (as the
  // sender queued them: piece order). A random scheduler reads stream heads and copies pieces out at random
  // moments; every piece must land and be taken, whatever the order.
  std::mt19937 random(12345);
  for (int trial = 0; trial < 200; ++trial) {
    const int slots = 1 << (trial % 4);
    const int streams = 1 + static_cast<int>(random() % 8);
    const int pieces = 50;
    LandingRing ring(slots, kPiece);
    std::vector<std::deque<ChunkHeader>> queues(static_cast<size_t>(streams));
    for (int p = 0; p < pieces; ++p) {
      const int chunks = 1 + static_cast<int>(random() % 6);
      const uint64_t part = kPiece / static_cast<uint64_t>(chunks);
      for (int c = 0; c < chunks; ++c) {
        const uint64_t length = c + 1 == chunks ? kPiece - part * static_cast<uint64_t>(c) : part;
        const ChunkHeader header = chunk(static_cast<uint16_t>(p), static_cast<uint64_t>(pieces) * kPiece,
                                         static_cast<uint64_t>(p) * kPiece + part * static_cast<uint64_t>(c), length);
        queues[random() % queues.size()].push_back(header);
      }
    }
    std::vector<LandingRing::LandedPiece> taken;
    std::deque<int> copying;
    int released = 0;
    int idle = 0;
    while (released < pieces) {
      bool moved = false;
      const size_t first = random() % queues.size();
      for (size_t k = 0; k < queues.size(); ++k) {
        std::deque<ChunkHeader>& queue = queues[(first + k) % queues.size()];
        if (queue.empty()) continue;
        uint64_t at = 0;
        std::string why;
        const Verdict verdict = ring.place(queue.front(), &at, &why);
        REQUIRE(verdict != Verdict::kReject);
        if (verdict == Verdict::kWait) continue;
        ring.landed(queue.front());
        queue.pop_front();
        moved = true;
        break;
      }
      if (random() % 3 == 0 || !moved) {
        taken.clear();
        ring.takeLanded(&taken, 4);
        for (const auto& piece : taken) copying.push_back(piece.slot);
        if (!copying.empty() && (random() % 2 == 0 || !moved)) {
          ring.release(copying.front());
          copying.pop_front();
          ++released;
          moved = true;
        }
      }
      idle = moved ? 0 : idle + 1;
      REQUIRE(idle < 3);  // nothing could move: a deadlock
    }
  }
}
