#include <catch2/catch.hpp>

#include "proxy/protocol/wire.h"

using namespace railnet::protocol;

namespace {
Hello validHello(const uint64_t secret[2]) {
  Hello hello{};
  hello.magic = kHelloMagic;
  hello.version = kWireVersion;
  hello.role = static_cast<uint16_t>(StreamRole::kData);
  hello.secret[0] = secret[0];
  hello.secret[1] = secret[1];
  hello.streamIndex = 3;
  hello.streamCount = 8;
  return hello;
}
}  // namespace

TEST_CASE("a hello with the listener's secret is accepted", "[wire]") {
  const uint64_t secret[2] = {0x1234, 0x5678};
  CHECK(validateHello(validHello(secret), secret) == nullptr);
  Hello delivered = validHello(secret);
  delivered.features = kFeatureDeliveredCompletion;
  CHECK(validateHello(delivered, secret) == nullptr);
}

TEST_CASE("hellos that are wrong in any field are rejected with a reason", "[wire]") {
  const uint64_t secret[2] = {0x1234, 0x5678};
  Hello hello = validHello(secret);
  SECTION("bad magic") { hello.magic = 0x47455420; }  // "GET " from a stray HTTP client
  SECTION("wrong secret") { hello.secret[1] ^= 1; }
  SECTION("wire version") { hello.version = kWireVersion + 1; }
  SECTION("stream index past count") { hello.streamIndex = 8; }
  SECTION("a data stream of a control-only connection") { hello.streamCount = 0; }
  SECTION("too many streams") { hello.streamCount = kMaxStreams + 1; }
  SECTION("unknown role") { hello.role = 7; }
  SECTION("a feature this build does not know") { hello.features = kKnownFeatures + 1; }
  SECTION("a resume count on a first hello") { hello.resumeProcessed = 1; }
  SECTION("a re-made control socket sent to a listen comm") { hello.role = static_cast<uint16_t>(StreamRole::kResume); }
  const char* why = validateHello(hello, secret);
  REQUIRE(why != nullptr);
  CHECK(std::string(why).size() > 5);
}

TEST_CASE("chunk sizes are 4 KiB multiples, at least the minimum, and cover the message", "[wire]") {
  CHECK(chunkSizeFor(1 << 20, 8, 65536) == 131072);
  CHECK(chunkSizeFor(100000, 8, 65536) == 65536);
  CHECK(chunkSizeFor(10000, 1, 4096) == 12288);
  for (uint64_t size : {1ull, 4095ull, 65537ull, 1ull << 30, (1ull << 30) + 3}) {
    for (int streams : {1, 3, 8, 64}) {
      uint64_t chunk = chunkSizeFor(size, streams, 65536);
      CHECK(chunk % 4096 == 0);
      CHECK(chunk >= 65536);
      CHECK((size + chunk - 1) / chunk <= static_cast<uint64_t>(streams) + 1);
    }
  }
}

TEST_CASE("a control-only connection (verbs) has a control hello with zero data streams", "[wire]") {
  const uint64_t secret[2] = {1, 2};
  Hello hello = validHello(secret);
  hello.role = static_cast<uint16_t>(StreamRole::kControl);
  hello.streamIndex = 0;
  hello.streamCount = 0;
  CHECK(validateHello(hello, secret) == nullptr);
}

TEST_CASE("the handle keeps the layout other tools rely on", "[wire]") {
  CHECK(sizeof(Handle) == 128);
  CHECK(offsetof(Handle, address) == 8);
}
