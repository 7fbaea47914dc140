// iflush decisions of the verbs transport (proxy/verbs/flush.h). The READ itself runs on soft-RoCE in the
// conformance check verbs.iflush (tests/conformance/test_verbs.cc).
#include <catch2/catch.hpp>

#include <string>

#include "proxy/verbs/flush.h"
#include "railnet/settings.h"

using namespace railnet::verbs;

namespace {
// RAILNET_IB_FLUSH is parsed by the settings table now (docs/decisions.md D59): an unknown value is an error
// that fails init, no longer a WARN and auto.
FlushMode parseFlushMode(const char* text, std::string* why) {
  railnet::Settings parsed;
  railnet::parseSetting("RAILNET_IB_FLUSH", text, &parsed, why);
  return parsed.ibFlush;
}
}  // namespace

TEST_CASE("flush: RAILNET_IB_FLUSH values", "[verbs][flush]") {
  std::string why;
  CHECK(parseFlushMode("auto", &why) == FlushMode::kAuto);
  CHECK(parseFlushMode("", &why) == FlushMode::kAuto);
  CHECK(parseFlushMode("0", &why) == FlushMode::kNever);
  CHECK(parseFlushMode("1", &why) == FlushMode::kAlways);
  CHECK(why.empty());
  CHECK(parseFlushMode("yes", &why) == FlushMode::kAuto);
  CHECK(why == "RAILNET_IB_FLUSH=\"yes\": not a known value; allowed: auto, 0, 1, \"\" (empty)");
}

TEST_CASE("flush: the READ targets the last non-empty buffer", "[verbs][flush]") {
  int one[] = {5};
  CHECK(flushTarget(1, one) == 0);
  int trailingEmpty[] = {5, 7, 0, 0};
  CHECK(flushTarget(4, trailingEmpty) == 1);
  int gaps[] = {0, 9, 0, 3};
  CHECK(flushTarget(4, gaps) == 3);
  int empty[] = {0, 0, 0};
  CHECK(flushTarget(3, empty) == -1);
  int negative[] = {4, -1};  // v8's int sizes: never read a negative as a size
  CHECK(flushTarget(2, negative) == 0);
}
