#include "proxy/staging/telemetry.h"

#include <cstdio>

namespace railnet::staging {

std::string StagingTelemetry::describe(const char* copyName) const {
  auto span = [&](const char* name, Span which) {
    const Sum& sum = sums_[static_cast<size_t>(which)];
    char text[160];
    if (sum.count == 0) {
      std::snprintf(text, sizeof(text), "; %s: none", name);
    } else {
      std::snprintf(text, sizeof(text), "; %s mean %.1f us max %.0f us", name,
                    static_cast<double>(sum.ns) / static_cast<double>(sum.count) / 1e3, static_cast<double>(sum.maxNs) / 1e3);
    }
    return std::string(text);
  };
  char head[96];
  std::snprintf(head, sizeof(head), "%llu pieces (%.1f MiB)", static_cast<unsigned long long>(pieces_),
                static_cast<double>(bytes_) / (1024.0 * 1024.0));
  return head + span("waiting for a slot", kWaitForSlot) + span(copyName, kCopy) +
         span("gap between polls with pieces pending", kPollGap);
}

}  // namespace railnet::staging
