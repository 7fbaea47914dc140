// The one-sided (GIN) protocol's pure parts (proxy/rma/control_record.h) and the signal writer's host path
// (proxy/rma/target_writer.h): record checks, window bounds without overflow, signal arithmetic, and inline
// payloads and signals applied in queue order.
#include <catch2/catch.hpp>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "proxy/rma/control_record.h"
#include "proxy/rma/target_writer.h"

using railnet::rma::applySignal;
using railnet::rma::ControlRecord;
using railnet::rma::fitsWindow;
using railnet::rma::malformedReason;
using railnet::rma::RecordKind;
using railnet::rma::SignalOp;
using railnet::rma::TargetWriter;

TEST_CASE("control records are checked", "[rma]") {
  ControlRecord record;
  CHECK(malformedReason(record).empty());
  record.signalOp = static_cast<SignalOp>(7);
  CHECK(malformedReason(record) == "unknown signal op 7");
  record.signalOp = SignalOp::kAdd;
  record.kind = static_cast<RecordKind>(9);
  CHECK(malformedReason(record) == "unknown record kind 9");
  record.kind = RecordKind::kPut;
  record.flags = railnet::rma::kInlinePayload;
  record.size = railnet::rma::kInlinePutBytes + 1;
  CHECK(malformedReason(record) == "inline payload of 4033 bytes");
  record.size = railnet::rma::kInlinePutBytes;
  CHECK(malformedReason(record).empty());
  record.kind = RecordKind::kWindow;
  record.magic = 0;
  CHECK(malformedReason(record) == "bad magic");
}

TEST_CASE("window bounds hold for every offset and size", "[rma]") {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  CHECK(fitsWindow(0, 0, 0));
  CHECK(fitsWindow(0, 4096, 4096));
  CHECK(fitsWindow(4096, 0, 4096));
  CHECK_FALSE(fitsWindow(4096, 1, 4096));
  CHECK_FALSE(fitsWindow(4097, 0, 4096));
  CHECK_FALSE(fitsWindow(1, 4096, 4096));
  CHECK_FALSE(fitsWindow(8, kMax - 4, 4096));  // offset + size wraps around: still outside
  CHECK_FALSE(fitsWindow(kMax, 1, kMax));
}

TEST_CASE("signals add one or the value, wrapping at 64 bits", "[rma]") {
  CHECK(applySignal(41, SignalOp::kInc, 1000) == 42);
  CHECK(applySignal(41, SignalOp::kAdd, 1000) == 1041);
  CHECK(applySignal(41, SignalOp::kNone, 1000) == 41);
  CHECK(applySignal(std::numeric_limits<uint64_t>::max(), SignalOp::kInc, 0) == 0);
}

TEST_CASE("host signals are applied in queue order", "[rma]") {
  TargetWriter writer;
  uint64_t words[2] = {10, 0};
  writer.queueSignal(&words[0], -1, SignalOp::kInc, 0);
  writer.queueSignal(&words[0], -1, SignalOp::kAdd, 0x100000000ULL);
  writer.queueSignal(&words[1], -1, SignalOp::kNone, 5);  // no signal: nothing queued
  CHECK_FALSE(writer.idle());
  CHECK(words[0] == 10);  // nothing happens before progress
  std::string why;
  REQUIRE(writer.progress(&why));
  CHECK(writer.idle());
  CHECK(words[0] == 10 + 1 + 0x100000000ULL);
  CHECK(words[1] == 0);
}

TEST_CASE("a GPU signal no window prepared fails progress", "[rma]") {
  TargetWriter writer;
  uint64_t host = 0;
  uint64_t word = 0;
  writer.queueSignal(&word, 3, SignalOp::kInc, 0);
  writer.queueSignal(&host, -1, SignalOp::kInc, 0);  // behind the failing one: stays queued, order is kept
  std::string why;
  CHECK_FALSE(writer.progress(&why));
  CHECK(why.find("GPU 3") != std::string::npos);
  CHECK(host == 0);
}

TEST_CASE("an inline payload lands before the signal queued after it", "[rma]") {
  TargetWriter writer;
  char window[16] = {};
  uint64_t word = 0;
  writer.queueCopy(window + 4, -1, std::vector<char>{'a', 'b', 'c'});
  writer.queueSignal(&word, -1, SignalOp::kInc, 0);
  writer.queueCopy(window, -1, {});  // nothing to write: nothing queued
  std::string why;
  REQUIRE(writer.progress(&why));
  CHECK(std::string(window + 4, 3) == "abc");
  CHECK(window[0] == 0);
  CHECK(word == 1);
  CHECK(writer.idle());
}
