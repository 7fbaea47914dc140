#include "proxy/nic_counters.h"

#include <deque>
#include <mutex>

#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet {
namespace {

struct Entry {
  std::string nic;
  int railId;
  NicCounters counters;
};

struct Registry {
  std::mutex mutex;
  std::deque<Entry> entries;  // deque: references stay valid as it grows
};

Registry& registry() {
  // Destroyed when the plugin is unloaded (NCCL dlcloses it after its last communicator), so LeakSanitizer sees
  // nothing left behind; no comm, and so no counting, outlives the plugin.
  static Registry instance;
  return instance;
}

}  // namespace

NicCounters& nicCounters(const std::string& nic, int railId) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  for (Entry& entry : r.entries) {
    if (entry.nic == nic) {
      entry.railId = railId;
      return entry.counters;
    }
  }
  Entry& added = r.entries.emplace_back();
  added.nic = nic;
  added.railId = railId;
  return added.counters;
}

void noteRoutedConnection(const std::string& from, int fromRail, int peerRail, const std::string& to, int toRail) {
  nicCounters(to, toRail).addRouted();
  RN_INFO(NCCL_NET, "NET/railnet: connection from %s (rail %d) to a NIC on rail %d leaves from %s, on that rail",
          from.c_str(), fromRail, peerRail, to.c_str());
}

std::vector<NicCounterSnapshot> nicCounterSnapshot() {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  std::vector<NicCounterSnapshot> out;
  for (const Entry& e : r.entries) {
    out.push_back({e.nic, e.railId, e.counters.bytesSent.load(std::memory_order_relaxed),
                   e.counters.bytesReceived.load(std::memory_order_relaxed),
                   e.counters.connections.load(std::memory_order_relaxed),
                   e.counters.crossRailConnections.load(std::memory_order_relaxed),
                   e.counters.routedConnections.load(std::memory_order_relaxed),
                   e.counters.bytesHopped.load(std::memory_order_relaxed),
                   e.counters.failures.load(std::memory_order_relaxed),
                   e.counters.bytesResent.load(std::memory_order_relaxed),
                   e.counters.degradedMs.load(std::memory_order_relaxed),
                   e.counters.movedConnections.load(std::memory_order_relaxed)});
  }
  return out;
}

std::vector<std::string> nicCounterLines() {
  std::vector<std::string> lines;
  for (const NicCounterSnapshot& s : nicCounterSnapshot()) {
    if (s.bytesSent == 0 && s.bytesReceived == 0 && s.connections == 0 && s.movedConnections == 0) continue;
    lines.push_back(s.nic + " rail " + std::to_string(s.railId) + ": sent " + std::to_string(s.bytesSent) +
                    " B, received " + std::to_string(s.bytesReceived) + " B, " + std::to_string(s.connections) +
                    " connection(s), " + std::to_string(s.crossRailConnections) + " cross-rail, " +
                    std::to_string(s.routedConnections) + " routed here from another rail's device" +
                    (s.bytesHopped != 0 ? ", " + std::to_string(s.bytesHopped) + " B of them over an NVLink hop" : "") +
                    (s.failures != 0 ? ", failed under " + std::to_string(s.failures) + " connection(s) (" +
                                           std::to_string(s.bytesResent) + " B sent again, " +
                                           textf("%.1f", static_cast<double>(s.degradedMs) / 1000) +
                                           " s degraded in all)"
                                     : "") +
                    (s.movedConnections != 0 ? ", " + std::to_string(s.movedConnections) +
                                                   " connection(s) moved here from a failed NIC"
                                             : ""));
  }
  return lines;
}

}  // namespace railnet
