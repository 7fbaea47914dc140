// The NVLink hop's piece bookkeeping (proxy/staging/piece_pipeline.h): messages cut into pieces that take staging
// slots in order and give them back in any order.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <vector>

#include "proxy/staging/piece_pipeline.h"

using Pipeline = railnet::staging::PiecePipeline<int>;

TEST_CASE("a message is cut into pieces of the piece size, the last one shorter", "[piece-pipeline]") {
  Pipeline pipeline(4, 100);
  CHECK(pipeline.add(7, 250) == 3);
  CHECK(pipeline.add(8, 0) == 0);  // an empty message takes no slot
  auto a = pipeline.start(), b = pipeline.start(), c = pipeline.start();
  REQUIRE((a && b && c));
  CHECK((a->message == 7 && a->offset == 0 && a->bytes == 100 && !a->last));
  CHECK((b->offset == 100 && b->bytes == 100 && !b->last));
  CHECK((c->offset == 200 && c->bytes == 50 && c->last));
  CHECK((a->slot != b->slot && b->slot != c->slot && a->slot != c->slot));
  CHECK(!pipeline.start());  // nothing waits
  CHECK(pipeline.slotsHeld() == 3);
  CHECK(pipeline.release(b->slot));
  CHECK(!pipeline.release(b->slot));  // not held any more
  CHECK(!pipeline.release(9));        // no such slot
  CHECK(pipeline.release(a->slot));
  CHECK(pipeline.release(c->slot));
  CHECK(pipeline.idle());
}

TEST_CASE("pieces wait for a free slot and never overtake an earlier message", "[piece-pipeline]") {
  Pipeline pipeline(2, 10);
  pipeline.add(1, 30);
  pipeline.add(2, 5);
  auto first = pipeline.start(), second = pipeline.start();
  REQUIRE((first && second));
  CHECK(!pipeline.start());  // both slots held
  CHECK(pipeline.messagesWaiting() == 2);
  pipeline.release(second->slot);  // the later piece leaves first: its slot takes the next piece
  auto third = pipeline.start();
  REQUIRE(third);
  CHECK((third->message == 1 && third->offset == 20 && third->last && third->slot == second->slot));
  CHECK(!pipeline.start());
  pipeline.release(first->slot);
  auto fourth = pipeline.start();
  REQUIRE(fourth);
  CHECK((fourth->message == 2 && fourth->offset == 0 && fourth->bytes == 5 && fourth->last));
}

TEST_CASE("random messages and releases in random order: every byte in exactly one piece, in order",
          "[piece-pipeline]") {
  for (uint32_t seed = 1; seed <= 20; ++seed) {
    std::mt19937 rng(seed);
    const int slots = 1 + static_cast<int>(rng() % 8);
    const uint64_t piece = 1 + rng() % 64;
    Pipeline pipeline(slots, piece);
    std::map<int, uint64_t> size, covered;  // per message: its size, bytes given to pieces so far
    std::vector<int> held;
    int nextMessage = 0, lastStarted = -1;
    for (int step = 0; step < 3000; ++step) {
      const uint32_t what = rng() % 3;
      if (what == 0) {
        const uint64_t bytes = rng() % 300;
        size[nextMessage] = bytes;
        pipeline.add(nextMessage++, bytes);
      } else if (what == 1) {
        if (auto p = pipeline.start()) {
          CHECK(p->message >= lastStarted);  // never an earlier message after a later one
          lastStarted = p->message;
          CHECK(p->offset == covered[p->message]);  // a message's pieces come in order, back to back
          CHECK((p->bytes > 0 && p->bytes <= piece));
          covered[p->message] += p->bytes;
          CHECK(p->last == (covered[p->message] == size[p->message]));
          held.push_back(p->slot);
          CHECK(static_cast<int>(held.size()) <= slots);
        } else {
          CHECK((static_cast<int>(held.size()) == slots || pipeline.messagesWaiting() == 0));
        }
      } else if (!held.empty()) {
        const size_t at = rng() % held.size();
        CHECK(pipeline.release(held[at]));
        held.erase(held.begin() + static_cast<long>(at));
      }
    }
    while (!held.empty() || pipeline.messagesWaiting() != 0) {
      for (int slot : held) CHECK(pipeline.release(slot));
      held.clear();
      while (auto p = pipeline.start()) {
        CHECK(p->offset == covered[p->message]);
        covered[p->message] += p->bytes;
        held.push_back(p->slot);
      }
    }
    CHECK(pipeline.idle());
    for (const auto& [message, bytes] : size) CHECK(covered[message] == bytes);
  }
}
