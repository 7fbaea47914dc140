// What the fusion group's files share (test_fusion.cc, test_verbs_failover.cc): a load of the plugin of its own
// with a fused device, the rails it fuses, and the per-NIC counter lines railnet logs at the last close.
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"

namespace conformance {

// This pass's own load of the plugin (fusion state is per load), its API, and its raw makeVDevice.
struct FusionLoad {
  explicit FusionLoad(const TestEnv& env) : library(options().plugin), net(openApi(library, env.version)) {
    REQUIRE(net != nullptr, "symbol vanished on reload");
    raw = library.symbol(symbolName(env.version).c_str());
  }
  // makeVDevice through the version's own table and props struct; returns the result, *d the new index.
  ncclResult_t makeVDevice(int version, const std::vector<int>& devs, int* d) const {
    auto fill = [&](auto& props) {
      constexpr int kMax = static_cast<int>(sizeof(props.devs) / sizeof(props.devs[0]));
      props.ndevs = static_cast<int>(devs.size());
      for (int i = 0; i < static_cast<int>(devs.size()) && i < kMax; ++i) props.devs[i] = devs[static_cast<size_t>(i)];
    };
    switch (version) {
      case 9: { ncclNetVDeviceProps_v9_t p{}; fill(p); return static_cast<ncclNet_v9_t*>(raw)->makeVDevice(d, &p); }
      case 10: { ncclNetVDeviceProps_v10_t p{}; fill(p); return static_cast<ncclNet_v10_t*>(raw)->makeVDevice(d, &p); }
      case 11: { ncclNetVDeviceProps_v11_t p{}; fill(p); return static_cast<ncclNet_v11_t*>(raw)->makeVDevice(d, &p); }
      case 12: { ncclNetVDeviceProps_v12_t p{}; fill(p); return static_cast<ncclNet_v12_t*>(raw)->makeVDevice(d, &p); }
      default: fail(__FILE__, __LINE__, strf("v%d has no makeVDevice", version));
    }
  }
  PluginLibrary library;
  std::unique_ptr<NetApi> net;
  void* raw = nullptr;
};

inline int deviceCount(NetApi& net) {
  int n = 0;
  REQUIRE_OK(net.devices(&n));
  return n;
}

// The physical devices that serve as rails, in device order: the loopback rails on TCP, every RDMA port on
// verbs. At least two.
inline std::vector<int> railDevices(NetApi& net) {
  std::vector<int> rails;
  const int n = deviceCount(net);
  const bool verbs = verbsTransport();
  for (int dev = 0; dev < n; ++dev) {
    DeviceProps props;
    REQUIRE_OK(net.getProperties(dev, &props));
    const bool loopbackRail = props.name != nullptr && std::strncmp(props.name, "lo@127.0.", 9) == 0;
    if (props.vNdevs == 1 && (verbs || loopbackRail)) rails.push_back(dev);
  }
  if (verbs) {
    REQUIRE(rails.size() >= 2, strf("found %zu RDMA ports; verbs fusion needs two (tests/rxe/run-in-guest.sh "
                                    "--rxe-count 2)", rails.size()));
  } else {
    REQUIRE(rails.size() >= 3, strf("found %zu devices named lo@127.0.*; run with "
                                    "RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1,127.0.3.1", rails.size()));
  }
  return rails;
}

// Up to three rails for the parts that fuse "all" NICs.
inline std::vector<int> upToThree(const std::vector<int>& rails) {
  return std::vector<int>(rails.begin(), rails.begin() + static_cast<std::ptrdiff_t>(std::min<size_t>(3, rails.size())));
}

inline int fuse(const FusionLoad& load, int version, const std::vector<int>& devs) {
  const int before = deviceCount(*load.net);
  int d = -1;
  REQUIRE_OK(load.makeVDevice(version, devs, &d));
  REQUIRE(d == before, strf("the virtual device got index %d; NCCL expects it after the %d existing ones", d, before));
  REQUIRE(deviceCount(*load.net) == before + 1, "devices() must count the new virtual device");
  return d;
}

// One NIC's counters as logged at the last close ("NET/railnet: NIC <nic> rail <r>: sent X B, received Y B,
// N connection(s), M cross-rail, K routed here from another rail's device").
struct NicLine {
  unsigned long long sent = 0, received = 0, connections = 0, crossRail = 0, routed = 0, hopped = 0;
};

inline std::map<std::string, NicLine> nicLinesSince(uint64_t mark) {
  std::map<std::string, NicLine> out;
  for (const LogRecord& record : recordsSince(mark, NCCL_LOG_INFO)) {
    const std::string prefix = "NET/railnet: NIC ";
    const size_t at = record.text.find(prefix);
    if (at == std::string::npos) continue;
    const std::string rest = record.text.substr(at + prefix.size());
    const size_t space = rest.find(' ');
    NicLine line;
    int rail = 0;
    if (std::sscanf(rest.c_str() + space,
                    " rail %d: sent %llu B, received %llu B, %llu connection(s), %llu cross-rail, %llu routed",
                    &rail, &line.sent, &line.received, &line.connections, &line.crossRail, &line.routed) != 6) {
      fail(__FILE__, __LINE__, "unparsable NIC counter line: " + record.text);
    }
    // ", H B of them over an NVLink hop": only on a NIC that sent through the verbs hop.
    if (const size_t comma = rest.find("routed here from another rail's device, "); comma != std::string::npos) {
      std::sscanf(rest.c_str() + comma, "routed here from another rail's device, %llu B of them over an NVLink hop",
                  &line.hopped);
    }
    out[rest.substr(0, space)] = line;  // the latest line of each NIC wins
  }
  return out;
}

// A load of the plugin of its own (its settings read at init) with one device fused from three rails (two where only
// two exist), for the failover trials.
struct FusedLoad {
  explicit FusedLoad(const TestEnv& env)
      : load(env), ctx(*load.net, nextCommId()), device(fuse(load, env.version, upToThree(railDevices(*load.net)))) {}
  NetApi& net() { return *load.net; }
  FusionLoad load;
  NetContext ctx;
  int device;
};

}  // namespace conformance
