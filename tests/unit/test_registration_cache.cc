#include <catch2/catch.hpp>

#include <atomic>
#include <thread>
#include <vector>

#include "proxy/verbs/registration_cache.h"

namespace {
struct FakeNic {
  int registered = 0;
  int deregistered = 0;
  std::vector<std::pair<uintptr_t, size_t>> ranges;
  int next = 1;
};

railnet::verbs::RegistrationCache<int> makeCache(FakeNic* nic) {
  return railnet::verbs::RegistrationCache<int>(
      [nic](void* start, size_t length) {
        ++nic->registered;
        nic->ranges.emplace_back(reinterpret_cast<uintptr_t>(start), length);
        return nic->next++;
      },
      [nic](int) { ++nic->deregistered; }, 4096);
}
}  // namespace

TEST_CASE("a buffer registered twice is registered once and released on the last release", "[mrcache]") {
  FakeNic nic;
  auto cache = makeCache(&nic);
  alignas(4096) static char buffer[3 * 4096];
  int a = cache.acquire(buffer, sizeof(buffer));
  int b = cache.acquire(buffer, sizeof(buffer));
  CHECK(a == b);
  CHECK(nic.registered == 1);
  cache.release(a);
  CHECK(nic.deregistered == 0);
  cache.release(b);
  CHECK(nic.deregistered == 1);
  CHECK(cache.size() == 0);
}

TEST_CASE("a sub-range reuses the covering registration; ranges are whole pages", "[mrcache]") {
  FakeNic nic;
  auto cache = makeCache(&nic);
  alignas(4096) static char buffer[4 * 4096];
  int whole = cache.acquire(buffer + 100, 3 * 4096);  // spans pages 0..3
  REQUIRE(nic.ranges.size() == 1);
  CHECK(nic.ranges[0].first == reinterpret_cast<uintptr_t>(buffer));
  CHECK(nic.ranges[0].second == 4 * 4096);
  int part = cache.acquire(buffer + 5000, 1000);
  CHECK(part == whole);
  CHECK(nic.registered == 1);
  int beyond = cache.acquire(buffer + 4096, 4 * 4096);  // reaches past the first registration
  CHECK(beyond != whole);
  CHECK(nic.registered == 2);
  cache.release(part);
  cache.release(whole);
  cache.release(beyond);
  CHECK(nic.deregistered == 2);
}

TEST_CASE("zero-byte registrations still get a key", "[mrcache]") {
  FakeNic nic;
  auto cache = makeCache(&nic);
  alignas(4096) static char buffer[4096];
  int key = cache.acquire(buffer, 0);
  CHECK(key != 0);
  REQUIRE(nic.ranges.size() == 1);
  CHECK(nic.ranges[0].second == 4096);
  cache.release(key);
}

TEST_CASE("concurrent acquire and release from several threads keep the counts right", "[mrcache]") {
  FakeNic nic;
  auto cache = makeCache(&nic);
  alignas(4096) static char buffer[16 * 4096];
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&cache, t] {
      for (int i = 0; i < 1000; ++i) {
        int key = cache.acquire(buffer + (t % 2) * 4096, 4096);
        cache.release(key);
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  CHECK(cache.size() == 0);
  CHECK(nic.registered == nic.deregistered);
}
