// NIC fusion (group "fusion"): makeVDevice (ABI v9+) fuses physical devices, data must arrive intact through
// fused comms, and the per-NIC counters that railnet logs at the last close show which NICs carried it.
// Runs on either transport:
//  - TCP: emulated rails, which the meson test "conformance-fusion" sets up with
//    RAILNET_TCP_ADDRESSES=127.0.1.1,127.0.2.1,127.0.3.1 (the devices named lo@127.0.*);
//  - verbs (RAILNET_TRANSPORT=verbs): every physical RDMA port, e.g. the soft-RoCE guest's rxe0 and rxe1
//    (tests/rxe/run-in-guest.sh --rxe-count 2), with RAILNET_RAILS giving them distinct rails (rxe0:0,rxe1:1).
//    Parts that need three NICs use two when only two exist.
// The parts that need one NIC to reach another (cross-rail counters, fused <-> physical) can be switched off
// with RAILNET_TEST_CROSS_NIC=0 for a rig whose NICs reach only themselves.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comms.h"
#include "harness.h"
#include "fusion_load.h"
#include "log_capture.h"
#include "silenced_address.h"
#include "transfer.h"

namespace conformance {
namespace {

constexpr size_t kDefaultMinStripe = 256 * KiB;  // RAILNET_FUSION_MIN_STRIPE_BYTES' default
constexpr size_t kInlineBytes = 64 * KiB;         // RAILNET_TCP_INLINE_BYTES' default
constexpr size_t kEagerBytes = 224;               // verbs: a message this small travels inside its notice

int maxChildren(int version) { return version >= 12 ? 8 : 4; }

bool crossNicWorks() {
  const char* value = std::getenv("RAILNET_TEST_CROSS_NIC");
  return value == nullptr || std::strcmp(value, "0") != 0;
}

// Whether a connection from one rail's device to a NIC on another rail is routed to this host's NIC on that rail
// (RAILNET_FORWARD; docs/design.md "Routes"). Verbs ports that take GPU memory route only through the NVLink hop,
// which needs GPUs (decisions D85); the soft-RoCE guest's ports take host memory only.
bool routesAcrossRails(NetApi& net, int dev) {
  const char* forward = std::getenv("RAILNET_FORWARD");
  if (forward != nullptr && std::strcmp(forward, "0") == 0) return false;
  if (!verbsTransport()) return true;
  DeviceProps props;
  REQUIRE_OK(net.getProperties(dev, &props));
  return props.ptrSupport == NCCL_PTR_HOST;
}

// Counters after `body` minus before, per NIC, read from the lines logged when the last comm closed.
struct CounterDelta {
  std::map<std::string, NicLine> before, after;
  NicLine of(const std::string& nic) const {
    NicLine a = after.count(nic) ? after.at(nic) : NicLine{};
    NicLine b = before.count(nic) ? before.at(nic) : NicLine{};
    return NicLine{a.sent - b.sent, a.received - b.received, a.connections - b.connections, a.crossRail - b.crossRail,
                   a.routed - b.routed, a.hopped - b.hopped};
  }
};

std::string nameOf(NetApi& net, int dev) {
  DeviceProps props;
  REQUIRE_OK(net.getProperties(dev, &props));
  return props.name;
}

// A pair whose sender is on sendDev and whose receiver listens on recvDev (they may differ: cross-rail).
struct CrossPair {
  CrossPair(NetApi& net, int sendDev, int recvDev)
      : sendCtx(net, nextCommId()), recvCtx(net, nextCommId()) {
    ConnHandle handle;
    Comm listener = listenOn(net, recvCtx.get(), recvDev, &handle);
    ThreadGroup threads;
    const Deadline deadline(threads.abortFlag());
    ConnHandle remote = handle;
    threads.spawn([&] { conn.send = connectLoop(net, sendCtx.get(), sendDev, remote, deadline); });
    threads.spawn([&] {
      conn.recv = acceptLoop(net, listener.get(), deadline);
      REQUIRE_OK(listener.close());
    });
    threads.join();
  }
  NetContext sendCtx;
  NetContext recvCtx;
  Connection conn;
};

}  // namespace

TEST_CASE("fusion", "make_vdevice", Scope::PerVersionOwnLoad) {
  FusionLoad load(env);
  NetApi& net = *load.net;
  NetContext ctx(net, nextCommId());
  const std::vector<int> rails = railDevices(net);
  // Rails are distinct and defined: emulated rails take their position in the list; the rxe rig names the
  // RDMA ports' rails with RAILNET_RAILS.
  if (env.version >= 12) {
    for (size_t i = 0; i < rails.size(); ++i) {
      DeviceProps props;
      REQUIRE_OK(net.getProperties(rails[i], &props));
      REQUIRE(props.railId >= 0, strf("%s has no rail id", props.name));
      for (size_t j = 0; j < i; ++j) {
        DeviceProps other;
        REQUIRE_OK(net.getProperties(rails[j], &other));
        REQUIRE(other.railId != props.railId, strf("%s and %s share rail %d", props.name, other.name, props.railId));
      }
    }
  }
  if (env.version < 9) return;  // v8 has no makeVDevice
  DeviceProps a, b;
  REQUIRE_OK(net.getProperties(rails[0], &a));
  REQUIRE_OK(net.getProperties(rails[1], &b));
  const std::string expectedName = std::string(a.name) + "+" + b.name;
  const int d = fuse(load, env.version, {rails[0], rails[1]});
  DeviceProps v;
  REQUIRE_OK(net.getProperties(d, &v));
  REQUIRE(v.name != nullptr && expectedName == v.name, strf("virtual device named \"%s\", expected \"%s\"",
                                                            v.name ? v.name : "(null)", expectedName.c_str()));
  REQUIRE(v.vNdevs == 2 && v.vDevs[0] == rails[0] && v.vDevs[1] == rails[1],
          strf("vProps = %d {%d, %d}", v.vNdevs, v.vDevs[0], v.vDevs[1]));
  REQUIRE(v.speed == a.speed + b.speed, strf("speed %d, children %d + %d", v.speed, a.speed, b.speed));
  REQUIRE(v.ptrSupport == a.ptrSupport && v.maxRecvs == a.maxRecvs, "a virtual device keeps its children's abilities");
  // Physical devices keep their own one-device vProps.
  DeviceProps again;
  REQUIRE_OK(net.getProperties(rails[0], &again));
  REQUIRE(again.vNdevs == 1 && again.vDevs[0] == rails[0], "a child's vProps changed");
  // All rails (up to three; two in reverse order where only two exist): a second virtual device, indexed
  // after the first.
  std::vector<int> all = upToThree(rails);
  if (all.size() == 2) all = {rails[1], rails[0]};
  const int d3 = fuse(load, env.version, all);
  REQUIRE(d3 == d + 1, "virtual devices are indexed in creation order");
  REQUIRE_OK(net.getProperties(d3, &v));
  REQUIRE(v.vNdevs == static_cast<int>(all.size()) && v.vDevs[0] == all[0],
          strf("vProps.ndevs = %d, first %d", v.vNdevs, v.vDevs[0]));

  // Refusals: NCCL marks the devices unmergeable and goes on, so each must fail cleanly and add nothing.
  const int count = deviceCount(net);
  int out = -1;
  const uint64_t mark = logMark();
  REQUIRE(load.makeVDevice(env.version, {}, &out) != ncclSuccess, "zero children accepted");
  REQUIRE(load.makeVDevice(env.version, {rails[0], rails[0]}, &out) != ncclSuccess, "a duplicate child accepted");
  REQUIRE(load.makeVDevice(env.version, {rails[0], count + 5}, &out) != ncclSuccess, "a missing device accepted");
  REQUIRE(load.makeVDevice(env.version, {rails[0], d}, &out) != ncclSuccess, "a virtual child accepted");
  std::vector<int> tooMany(static_cast<size_t>(maxChildren(env.version) + 1), rails[0]);
  REQUIRE(load.makeVDevice(env.version, tooMany, &out) != ncclSuccess, "more children than vProps holds accepted");
  REQUIRE(deviceCount(net) == count, "a refused makeVDevice changed devices()");
  REQUIRE(warningsSince(mark).size() >= 5, "every refusal must be logged with its reason:\n" + describeWarnings(mark));
}

TEST_CASE("fusion", "data_sizes", Scope::PerVersionOwnLoad) {
  if (env.version < 9) return;
  FusionLoad load(env);
  NetApi& net = *load.net;
  NetContext ctx(net, nextCommId());
  const std::vector<int> rails = railDevices(net);
  const int d = fuse(load, env.version, {rails[0], rails[1]});
  size_t limit = options().maxSize;
  if (!env.heavy) limit = std::min(limit, 64 * MiB);
  std::vector<size_t> sizes = {0, 1, 127, 128, 129, kEagerBytes, kEagerBytes + 1, kInlineBytes, kInlineBytes + 1, 2 * kDefaultMinStripe - 1,
                               2 * kDefaultMinStripe, 2 * kDefaultMinStripe + 1, 3 * kDefaultMinStripe + 129,
                               MiB + 3, 8 * MiB + 4097, 64 * MiB - 3};
  if (env.heavy) sizes.push_back(size_t{1} << 30);
  std::vector<size_t> chosen;
  for (size_t s : sizes) {
    if (s <= limit) chosen.push_back(s);
  }
  {
    LinkedPair pair(net, d);
    runTransfer(net, pair.conn, simplePlan(chosen, 1, 91));
    std::vector<size_t> reversed(chosen.rbegin(), chosen.rend());
    runTransfer(net, pair.conn, simplePlan(reversed, 4, 92));
  }
  // A fused sender and a physical receiver (and the reverse): the single NIC's end carries every path.
  if (crossNicWorks()) {
    const std::vector<size_t> some = {0, 1, 2 * kDefaultMinStripe + 1, std::min(limit, 8 * MiB + 129)};
    {
      CrossPair mixed(net, d, rails[1]);
      runTransfer(net, mixed.conn, simplePlan(some, 2, 98));
    }
    CrossPair mixed(net, rails[0], d);
    runTransfer(net, mixed.conn, simplePlan(some, 2, 99));
  }
  // Three NICs (two where only two exist), random sizes up to 8 MiB, a deep window.
  const int d3 = fuse(load, env.version, upToThree(rails));
  LinkedPair pair(net, d3);
  std::mt19937_64 rng(93);
  std::vector<size_t> mixed;
  for (int i = 0; i < 200; ++i) mixed.push_back(randomSize(rng, std::min(limit, 8 * MiB)));
  runTransfer(net, pair.conn, simplePlan(mixed, 8, 94));
}

TEST_CASE("fusion", "grouped", Scope::PerVersionOwnLoad) {
  if (env.version < 9) return;
  FusionLoad load(env);
  NetApi& net = *load.net;
  NetContext ctx(net, nextCommId());
  const std::vector<int> rails = railDevices(net);
  const int d = fuse(load, env.version, upToThree(rails));
  DeviceProps props;
  REQUIRE_OK(net.getProperties(d, &props));
  const int n = std::min(props.maxRecvs, 8);
  REQUIRE(n > 1, "a fused device keeps grouped receives");
  // Grouped receives of n tags, buffers from tiny to a few stripes, sends no larger than their buffer.
  std::mt19937_64 rng(95);
  Plan plan;
  plan.seed = 95;
  plan.sendWindow = 4;
  plan.recvWindow = 2;
  const size_t capacities[] = {1, 4 * KiB, kInlineBytes + 1, 2 * kDefaultMinStripe, 3 * MiB + 5};
  for (int g = 0; g < 12; ++g) {
    RecvGroup group;
    for (int t = 0; t < n; ++t) {
      const size_t cap = capacities[static_cast<size_t>(g + t) % 5];
      group.push_back({t, cap});
      plan.sends.push_back({t, g % 3 == 0 ? cap : randomSize(rng, cap)});
    }
    plan.recvs.push_back(group);
  }
  LinkedPair pair(net, d);
  runTransfer(net, pair.conn, plan);
}

TEST_CASE("fusion", "nic_counters", Scope::PerVersionOwnLoad) {
  FusionLoad load(env);
  NetApi& net = *load.net;
  NetContext ctx(net, nextCommId());
  const std::vector<int> rails = railDevices(net);
  const std::string nic0 = nameOf(net, rails[0]);
  const std::string nic1 = nameOf(net, rails[1]);
  // Physical device, then (v9+) a fused one; the counters are read from the lines logged at each last close.
  auto measure = [&](int sendDev, int recvDev, const std::vector<size_t>& sizes) {
    CounterDelta delta;
    const uint64_t mark = logMark();
    {
      // One empty message, so that both transports have connected (verbs finishes its QP handshake on first
      // use) and log every NIC's counters so far at the close, without adding payload.
      CrossPair empty(net, sendDev, recvDev);
      runTransfer(net, empty.conn, simplePlan({0}, 1, 96));
    }
    delta.before = nicLinesSince(mark);
    REQUIRE(!delta.before.empty(), "no \"NET/railnet: NIC ...\" line logged when the last comm closed");
    const uint64_t mark2 = logMark();
    {
      CrossPair pair(net, sendDev, recvDev);
      runTransfer(net, pair.conn, simplePlan(sizes, 1, 97));
    }
    delta.after = nicLinesSince(mark2);
    return delta;
  };

  // Same rail on a physical device: one connection each way on NIC 0, nothing cross-rail, bytes exact.
  CounterDelta plain = measure(rails[0], rails[0], {3 * MiB});
  REQUIRE(plain.of(nic0).sent == 3 * MiB && plain.of(nic0).received == 3 * MiB,
          strf("%s sent %llu, received %llu", nic0.c_str(), plain.of(nic0).sent, plain.of(nic0).received));
  REQUIRE(plain.of(nic0).connections == 2 && plain.of(nic0).crossRail == 0,
          strf("%llu connections, %llu cross-rail", plain.of(nic0).connections, plain.of(nic0).crossRail));
  REQUIRE(plain.of(nic1).sent == 0 && plain.of(nic1).connections == 0, "NIC 1 counted traffic it did not carry");

  if (routesAcrossRails(net, rails[0])) {
    // Rail 0's device to a NIC on rail 1, routed: the connection leaves from NIC 1, so nothing crosses rails and
    // NIC 0 carries nothing.
    CounterDelta routed = measure(rails[0], rails[1], {MiB});
    REQUIRE(routed.of(nic0).sent == 0 && routed.of(nic0).received == 0 && routed.of(nic0).connections == 0,
            strf("%s carried %llu / %llu B in %llu connections of a routed connection", nic0.c_str(),
                 routed.of(nic0).sent, routed.of(nic0).received, routed.of(nic0).connections));
    REQUIRE(routed.of(nic1).sent == MiB && routed.of(nic1).received == MiB && routed.of(nic1).crossRail == 0 &&
                routed.of(nic1).routed == 1,
            strf("%s: sent %llu, received %llu, %llu cross-rail, %llu routed", nic1.c_str(), routed.of(nic1).sent,
                 routed.of(nic1).received, routed.of(nic1).crossRail, routed.of(nic1).routed));
  } else if (crossNicWorks()) {
    // Rail 0 to rail 1: both ends count one cross-rail connection; the bytes leave NIC 0 and arrive on NIC 1.
    CounterDelta cross = measure(rails[0], rails[1], {MiB});
    REQUIRE(cross.of(nic0).crossRail == 1 && cross.of(nic1).crossRail == 1,
            strf("cross-rail %llu / %llu", cross.of(nic0).crossRail, cross.of(nic1).crossRail));
    REQUIRE(cross.of(nic0).sent == MiB && cross.of(nic1).received == MiB && cross.of(nic0).received == 0 &&
                cross.of(nic1).sent == 0,
            strf("sent %llu/%llu received %llu/%llu", cross.of(nic0).sent, cross.of(nic1).sent, cross.of(nic0).received,
                 cross.of(nic1).received));
  }
  if (env.version < 9) return;

  const int d = fuse(load, env.version, {rails[0], rails[1]});
  // A small message (over the inline limit, under two stripes): one NIC carries all of it.
  const size_t small = 2 * kDefaultMinStripe - 128;
  CounterDelta one = measure(d, d, {small});
  const bool on0 = one.of(nic0).sent == small && one.of(nic1).sent == 0;
  const bool on1 = one.of(nic1).sent == small && one.of(nic0).sent == 0;
  REQUIRE(on0 || on1, strf("a %zu-byte message: %s sent %llu, %s sent %llu", small, nic0.c_str(), one.of(nic0).sent,
                           nic1.c_str(), one.of(nic1).sent));
  REQUIRE(one.of(nic0).received + one.of(nic1).received == small, "received bytes do not add up");
  REQUIRE(one.of(nic0).connections == 2 && one.of(nic1).connections == 2 && one.of(nic0).crossRail == 0,
          "a fused comm counts one connection per NIC at each end, none cross-rail (lane r to rail r)");
  // Two small messages in a row: round-robin puts them on different NICs.
  CounterDelta two = measure(d, d, {small, small});
  REQUIRE(two.of(nic0).sent == small && two.of(nic1).sent == small,
          strf("two small messages: %llu / %llu", two.of(nic0).sent, two.of(nic1).sent));
  // A large message: split evenly over both NICs.
  const size_t large = 8 * MiB;
  CounterDelta split = measure(d, d, {large});
  REQUIRE(split.of(nic0).sent == large / 2 && split.of(nic1).sent == large / 2,
          strf("an 8 MiB message: %s sent %llu, %s sent %llu", nic0.c_str(), split.of(nic0).sent, nic1.c_str(),
               split.of(nic1).sent));
  REQUIRE(split.of(nic0).received == large / 2 && split.of(nic1).received == large / 2, "received split differs");
}

TEST_CASE("fusion", "nvlink_hop_host_staging", Scope::PerVersionOwnLoad) {
  // The verbs NVLink hop's path with host staging (RAILNET_IB_NVLINK_HOP=2, a test feature): a routed connection's
  // messages are cut into 64 KiB pieces that take turns in two staging slots, leave from the slots, and land
  // where they belong. Everything but the CUDA copy of the GPU hop runs here (docs/design.md, "Routes"). TCP has
  // no hop: there the same traffic must count no hopped byte.
  ScopedEnv hop("RAILNET_IB_NVLINK_HOP", "2");
  ScopedEnv piece("RAILNET_IB_HOP_PIECE_BYTES", "65536");
  ScopedEnv slots("RAILNET_IB_HOP_SLOTS", "2");
  FusionLoad load(env);
  NetApi& net = *load.net;
  NetContext ctx(net, nextCommId());
  const std::vector<int> rails = railDevices(net);
  if (!routesAcrossRails(net, rails[0])) return;  // RAILNET_FORWARD=0: no route, so no hop (the nic_counters test)
  const std::string nic1 = nameOf(net, rails[1]);
  CounterDelta delta;
  const uint64_t mark = logMark();
  { CrossPair empty(net, rails[0], rails[1]); runTransfer(net, empty.conn, simplePlan({0}, 1, 98)); }
  delta.before = nicLinesSince(mark);
  const uint64_t mark2 = logMark();
  uint64_t bytes = 0;
  {
    CrossPair pair(net, rails[0], rails[1]);
    // Empty, one byte, piece edges, many pieces, and a random mix with 8 sends in flight.
    Plan edges = simplePlan({0, 1, 4095, 64 * KiB, 64 * KiB + 1, 3 * MiB + 5}, 4, 99);
    Plan mix = randomPlan(120, MiB, 8, 100);
    // Grouped receives: a hopped member is never held for its group, it goes on its own through the slots.
    Plan grouped = groupedPlan(20, [](int g, std::mt19937_64&) {
      std::vector<int> tags;
      for (int t = 0; t < 1 + g % 8; ++t) tags.push_back(t);
      return tags;
    }, [](int, std::mt19937_64& rng) { return 1 + static_cast<size_t>(rng() % (200 * KiB)); }, 101);
    for (Plan* plan : {&edges, &mix, &grouped}) {
      for (const SendSpec& send : plan->sends) bytes += send.size;
      runTransfer(net, pair.conn, *plan);
    }
  }
  delta.after = nicLinesSince(mark2);
  const NicLine routed = delta.of(nic1);
  REQUIRE(routed.sent == bytes && routed.received == bytes && routed.routed == 1 && routed.crossRail == 0,
          strf("%s: sent %llu, received %llu of %llu, %llu routed, %llu cross-rail", nic1.c_str(), routed.sent,
               routed.received, static_cast<unsigned long long>(bytes), routed.routed, routed.crossRail));
  const unsigned long long expectHopped = verbsTransport() ? routed.sent : 0;
  REQUIRE(routed.hopped == expectHopped, strf("%s counted %llu hopped bytes of %llu sent; expected %llu", nic1.c_str(),
                                              routed.hopped, routed.sent, expectHopped));
}

}  // namespace conformance

namespace conformance {

TEST_CASE("fusion", "nic_failure", Scope::PerVersionOwnLoad) {
  // Rail failover on a fused TCP device (docs/failover.md): the data streams of one NIC are cut mid-transfer
  // (RAILNET_FAULT_NIC_CUT, a test feature standing in for a NIC that fails). The sender sends that NIC's chunks of
  // every send not yet delivered again over the other NICs and stripes new messages over those; every message must
  // arrive intact, every request complete, and the failure be reported once, naming the NIC. Each NIC in turn; NIC 0
  // carries the control connection too, which goes with it and must be re-made through another NIC.
  if (env.version < 9 || verbsTransport()) return;  // TCP's failover; verbs is failover's step 5
  for (const char* nic : {"0", "1", "2"}) {
    ScopedEnv cut("RAILNET_FAULT_NIC_CUT", nic);
    ScopedEnv after("RAILNET_FAULT_NIC_CUT_BYTES", "6291456");  // 6 MiB queued on that NIC, then it fails
    FusedLoad fused(env);
    NetApi& net = fused.net();
    const uint64_t mark = logMark();
    {
      LinkedPair pair(net, fused.device);
      std::mt19937_64 rng(95);
      std::vector<size_t> sizes;
      for (int i = 0; i < 150; ++i) sizes.push_back(randomSize(rng, std::min(options().maxSize, 4 * MiB)));
      runTransfer(net, pair.conn, simplePlan(sizes, 8, 96));
    }
    std::string failedNic;
    std::string remade;
    std::string others;
    for (const LogRecord& record : warningsSince(mark)) {
      if (record.text.find("sent again over the other") != std::string::npos) {
        failedNic += record.text + "\n";
      } else if (record.text.find("the control connection") != std::string::npos &&
                 record.text.find("re-made") != std::string::npos) {
        remade += record.text + "\n";
      } else if (record.text.find("a data stream of") == std::string::npos &&
                 record.text.find("answers again") == std::string::npos) {  // failback, when the transfer lasts
        others += record.text + "\n";
      }
    }
    const std::string cutAddress = "127.0." + std::to_string(std::atoi(nic) + 1) + ".1";
    REQUIRE(!failedNic.empty(), strf("NIC %s was cut, but no send connection reported it", nic));
    REQUIRE(failedNic.find(cutAddress) != std::string::npos,
            "the failure WARN names another NIC than the one cut: " + failedNic);
    REQUIRE(others.empty(), "unexpected WARNs:\n" + others);
    if (std::string(nic) == "0") {
      // The sender's re-made control connection leaves from another NIC than the one cut ("now <local> to ...").
      REQUIRE(remade.find("send connection") != std::string::npos, "NIC 0 was cut, but no control connection was "
              "re-made; warnings:\n" + failedNic + remade);
      REQUIRE(remade.find("now " + cutAddress) == std::string::npos,
              "a control connection was re-made through the NIC that was cut:\n" + remade);
    } else {
      REQUIRE(remade.empty(), "a control connection was re-made though NIC 0 was fine:\n" + remade);
    }
  }
}

}  // namespace conformance

namespace conformance {

// A path that goes dark: iptables drops every segment to or from one NIC's address (a bad cable or optic that
// loses frames without taking the link down). Needs its own network namespace (tests/conformance/in-netns.sh).
TEST_CASE("fusion", "silent_nic", Scope::PerVersionOwnLoad) {
  if (env.version < 9 || verbsTransport()) return;
  if (std::getenv("RAILNET_TEST_NETNS") == nullptr) {
    SKIP("needs a network namespace of its own for its iptables rule (tests/conformance/in-netns.sh)");
  }
  ScopedEnv silenceLimit("RAILNET_FAILOVER_SILENCE_MS", "1000");
  FusedLoad fused(env);
  NetApi& net = fused.net();
  const uint64_t mark = logMark();
  {
    LinkedPair pair(net, fused.device);
    // NIC 1 goes silent once the connection is up: its data streams' chunks are never acknowledged. The sender must
    // see that within the limit and a look (about a second each), take the NIC out while the others answer, and
    // send its chunks again over them; every message must arrive.
    SilencedAddress silenced("127.0.2.1");
    REQUIRE(silenced.drop(), "iptables could not drop NIC 1's address");
    std::mt19937_64 rng(97);
    std::vector<size_t> sizes;
    for (int i = 0; i < 60; ++i) sizes.push_back(randomSize(rng, std::min(options().maxSize, 4 * MiB)));
    runTransfer(net, pair.conn, simplePlan(sizes, 8, 98));
  }
  REQUIRE(waitForWarning(mark, {"lo@127.0.2.1", "acknowledged nothing for", "taken out"}, std::chrono::seconds(2)),
          "no WARN took the silent NIC out; warnings:\n" + describeWarnings(mark));
  REQUIRE(waitForWarning(mark, {"the data streams of lo@127.0.2.1 failed", "sent again"}, std::chrono::seconds(2)),
          "the silent NIC's chunks were not sent again; warnings:\n" + describeWarnings(mark));
}

}  // namespace conformance

namespace conformance {

TEST_CASE("fusion", "nic_failback", Scope::PerVersionOwnLoad) {
  // Failback (docs/failover.md): NIC 1's data streams are cut after 2 MiB; a second later the sender probes the NIC,
  // makes its streams again through it, and the NIC carries traffic again. Messages keep flowing throughout and
  // must all arrive; after the NIC answers again, it must carry a share of a large transfer.
  if (env.version < 12 || verbsTransport()) return;  // one version: the probes take seconds
  ScopedEnv cut("RAILNET_FAULT_NIC_CUT", "1");
  ScopedEnv after("RAILNET_FAULT_NIC_CUT_BYTES", "2097152");
  const uint64_t mark = logMark();
  {
    FusedLoad fused(env);
    NetApi& net = fused.net();
    LinkedPair pair(net, fused.device);
    std::mt19937_64 rng(99);
    bool back = false;
    for (const Deadline deadline(std::chrono::seconds(20)); !back; deadline.check("NIC 1 to answer again")) {
      std::vector<size_t> sizes;
      for (int i = 0; i < 16; ++i) sizes.push_back(randomSize(rng, 2 * MiB));
      runTransfer(net, pair.conn, simplePlan(sizes, 8, rng()));
      for (const LogRecord& record : warningsSince(mark)) {
        back = back || record.text.find("lo@127.0.2.1 answers again") != std::string::npos;
      }
    }
    // Back: a transfer striped over every NIC again.
    runTransfer(net, pair.conn, simplePlan(std::vector<size_t>(16, 8 * MiB), 4, 100));
  }
  REQUIRE(waitForWarning(mark, {"the data streams of lo@127.0.2.1 failed"}, std::chrono::seconds(1)),
          "NIC 1's failure was not reported; warnings:\n" + describeWarnings(mark));
  const std::map<std::string, NicLine> lines = nicLinesSince(mark);
  REQUIRE(lines.count("lo@127.0.2.1") == 1, "no counter line for lo@127.0.2.1");
  // 2 MiB before the cut; the last transfer alone stripes 128 MiB over three NICs, about 42 MiB each.
  REQUIRE(lines.at("lo@127.0.2.1").sent >= 20 * MiB,
          strf("NIC 1 sent %llu bytes in all: it did not carry traffic again", lines.at("lo@127.0.2.1").sent));
}

}  // namespace conformance

