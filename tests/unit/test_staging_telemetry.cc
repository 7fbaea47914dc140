// The per-comm staging telemetry (proxy/staging/telemetry.h): what it sums and the line it logs.
#include <catch2/catch.hpp>

#include <chrono>
#include <string>
#include <thread>

#include "proxy/staging/telemetry.h"

using railnet::staging::StagingTelemetry;
using namespace std::chrono_literals;

TEST_CASE("telemetry sums spans into mean and max, and counts pieces and bytes", "[staging]") {
  StagingTelemetry telemetry;
  telemetry.add(StagingTelemetry::kCopy, 10us);
  telemetry.add(StagingTelemetry::kCopy, 30us);
  telemetry.add(StagingTelemetry::kWaitForSlot, -5us);  // a clock that went back counts as 0, never as a huge wait
  telemetry.countPiece(1 << 20);
  telemetry.countPiece(1 << 20);
  CHECK(telemetry.pieces() == 2);
  const std::string line = telemetry.describe("copy down");
  CHECK(line.find("2 pieces (2.0 MiB)") == 0);
  CHECK(line.find("copy down mean 20.0 us max 30 us") != std::string::npos);
  CHECK(line.find("waiting for a slot mean 0.0 us max 0 us") != std::string::npos);
  CHECK(line.find("gap between polls with pieces pending: none") != std::string::npos);
}

TEST_CASE("telemetry counts poll gaps only while work was pending", "[staging]") {
  StagingTelemetry telemetry;
  telemetry.polled(false);
  std::this_thread::sleep_for(2ms);
  telemetry.polled(true);  // nothing was pending before: no gap yet
  CHECK(telemetry.describe("copy").find("pending: none") != std::string::npos);
  std::this_thread::sleep_for(2ms);
  telemetry.polled(true);  // a gap of >= 2 ms with work pending
  const std::string line = telemetry.describe("copy");
  CHECK(line.find("pending: none") == std::string::npos);
  CHECK(line.find("gap between polls with pieces pending mean") != std::string::npos);
  telemetry.polled(false);  // idle: the next pending poll starts afresh
  std::this_thread::sleep_for(5ms);
  telemetry.polled(true);
  CHECK(telemetry.describe("copy") == line);
}
