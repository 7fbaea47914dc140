// Process-wide traffic counters per physical NIC: bytes each way, connections, and connections whose two ends
// sit on different rails (the ones that cross the spine on a rail-optimized fabric). Transports add to them on
// their data paths (relaxed atomics, no locks after lookup); railnet logs them when the last comm closes and
// railnet-bench / tests read snapshots.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace railnet {

struct NicCounters {
  std::atomic<uint64_t> bytesSent{0};
  std::atomic<uint64_t> bytesReceived{0};
  std::atomic<uint64_t> connections{0};
  std::atomic<uint64_t> crossRailConnections{0};
  std::atomic<uint64_t> routedConnections{0};  // connections NCCL asked of another rail's device, routed here
  std::atomic<uint64_t> bytesHopped{0};  // sent bytes that crossed NVLink into this NIC's GPU first (verbs hop)
  std::atomic<uint64_t> failures{0};     // connections whose data streams on this NIC failed (rail failover)
  std::atomic<uint64_t> bytesResent{0};  // bytes sent again over other NICs after this NIC failed
  std::atomic<uint64_t> degradedMs{0};   // summed over connections: time this NIC was out of one (failed or moved)
  std::atomic<uint64_t> movedConnections{0};  // single-NIC connections that moved here when their own NIC failed

  void addRouted() { routedConnections.fetch_add(1, std::memory_order_relaxed); }
  void addHopped(uint64_t bytes) { bytesHopped.fetch_add(bytes, std::memory_order_relaxed); }
  void addFailure() { failures.fetch_add(1, std::memory_order_relaxed); }
  void addResent(uint64_t bytes) { bytesResent.fetch_add(bytes, std::memory_order_relaxed); }
  void addDegraded(uint64_t ms) { degradedMs.fetch_add(ms, std::memory_order_relaxed); }
  // A single-NIC connection whose NIC failed now runs here; cross-rail when the rails differ (as addConnection).
  void addMoved(int localRail, int remoteRail) {
    movedConnections.fetch_add(1, std::memory_order_relaxed);
    if (localRail >= 0 && remoteRail >= 0 && localRail != remoteRail) {
      crossRailConnections.fetch_add(1, std::memory_order_relaxed);
    }
  }
  void addSent(uint64_t bytes) { bytesSent.fetch_add(bytes, std::memory_order_relaxed); }
  void addReceived(uint64_t bytes) { bytesReceived.fetch_add(bytes, std::memory_order_relaxed); }
  // One established connection (either side); railIds use NCCL_NET_ID_UNDEF (-1) when unknown, which never
  // counts as cross-rail.
  void addConnection(int localRail, int remoteRail) {
    connections.fetch_add(1, std::memory_order_relaxed);
    if (localRail >= 0 && remoteRail >= 0 && localRail != remoteRail) {
      crossRailConnections.fetch_add(1, std::memory_order_relaxed);
    }
  }
};

struct NicCounterSnapshot {
  std::string nic;
  int railId;
  uint64_t bytesSent;
  uint64_t bytesReceived;
  uint64_t connections;
  uint64_t crossRailConnections;
  uint64_t routedConnections;
  uint64_t bytesHopped;
  uint64_t failures;
  uint64_t bytesResent;
  uint64_t degradedMs;
  uint64_t movedConnections;
};

// The counters of the NIC named `nic` (created on first use; the reference stays valid for the process's life).
NicCounters& nicCounters(const std::string& nic, int railId);
std::vector<NicCounterSnapshot> nicCounterSnapshot();
// A connection routed (topo/route.h) from device `from` to a peer NIC on `peerRail` leaves from NIC `to`: counted
// as "routed here" on `to` and logged at INFO. Both transports call it on a connection's first connect.
void noteRoutedConnection(const std::string& from, int fromRail, int peerRail, const std::string& to, int toRail);
// One line per NIC that carried traffic: "<nic> rail <r>: sent X B, received Y B, N connection(s), M cross-rail,
// K routed here from another rail's device".
std::vector<std::string> nicCounterLines();

}  // namespace railnet
