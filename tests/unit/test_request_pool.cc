#include <catch2/catch.hpp>

#include <set>

#include "proxy/protocol/request_pool.h"

namespace {
struct FakeRequest {
  int owner = 0;
};
}  // namespace

TEST_CASE("the pool hands out every request once, then nothing, and takes them back", "[pool]") {
  railnet::protocol::RequestPool<FakeRequest> pool(4, [](FakeRequest& request) { request.owner = 42; });
  CHECK(pool.capacity() == 4);
  std::set<FakeRequest*> taken;
  for (int i = 0; i < 4; ++i) {
    FakeRequest* request = pool.acquire();
    REQUIRE(request != nullptr);
    CHECK(request->owner == 42);
    taken.insert(request);
  }
  CHECK(taken.size() == 4);
  CHECK(pool.acquire() == nullptr);
  CHECK(pool.available() == 0);
  FakeRequest* back = *taken.begin();
  pool.release(back);
  CHECK(pool.available() == 1);
  CHECK(pool.acquire() == back);
}

TEST_CASE("a send pool covers NCCL's 32 receives of 8 buffers", "[pool]") {
  railnet::protocol::RequestPool<FakeRequest> pool(2 * 32 * 8, [](FakeRequest&) {});
  for (int i = 0; i < 32 * 8; ++i) REQUIRE(pool.acquire() != nullptr);
  CHECK(pool.available() == 32 * 8);
}

TEST_CASE("the pool walks exactly the requests in flight", "[pool]") {
  railnet::protocol::RequestPool<FakeRequest> pool(6, [](FakeRequest&) {});
  std::set<FakeRequest*> held;
  for (int i = 0; i < 4; ++i) held.insert(pool.acquire());
  FakeRequest* returned = *held.begin();
  pool.release(returned);
  held.erase(returned);
  std::set<FakeRequest*> seen;
  pool.forEachInFlight([&](FakeRequest& request) { seen.insert(&request); });
  CHECK(seen == held);
}
