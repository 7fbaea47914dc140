// Times one unfinished operation, named by a serial number (requests are reused, so not by address), and says
// once when it has waited long enough to be worth a report.
#pragma once

#include <chrono>
#include <cstdint>

namespace railnet::protocol {

class StallWatch {
 public:
  static constexpr std::chrono::seconds kAfter{10};

  // True exactly once per operation, on the first look at least kAfter after the first look at it.
  bool due(uint64_t serial) {
    const auto now = std::chrono::steady_clock::now();
    if (serial != serial_) {
      serial_ = serial;
      since_ = now;
      reported_ = false;
      return false;
    }
    if (reported_ || now - since_ < kAfter) return false;
    reported_ = true;
    return true;
  }

 private:
  uint64_t serial_ = 0;
  std::chrono::steady_clock::time_point since_{};
  bool reported_ = false;
};

}  // namespace railnet::protocol
