// railnet-bench: railnet's loopback bandwidth and latency next to raw TCP measured in the same run, over a sweep
// of message sizes; with --gpu, GPU memory next to raw copy engines + TCP. It loads the plugin as NCCL does (it
// does not link it) and drives it as NCCL's proxy does. The table goes to stdout, progress and plugin warnings to
// stderr. Exit status 1 only for errors (a failed call, wrong data, a stall); a missed goal is reported but is not
// an error. Exit status 2 for a bad command line or what cannot be measured here (--gpu without a GPU, or with a
// device that does not take GPU memory).

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "plugin/tools/buffers.h"
#include "plugin/tools/gpu_buffers.h"
#include "plugin/tools/gin_peer.h"
#include "plugin/tools/harness.h"
#include "plugin/tools/net_plugin.h"
#include "plugin/tools/options.h"
#include "plugin/tools/railnet_peer.h"
#include "plugin/tools/raw_ce_tcp.h"
#include "plugin/tools/raw_tcp.h"
#include "plugin/tools/report.h"
#include "railnet/settings.h"

namespace railnet::bench {
namespace {

// Beyond this, messages in flight share slots instead of needing window x size bytes per buffer.
constexpr size_t kArenaCap = 512 * MiB;
// A median over more round trips than this would not change; it only costs time at small sizes.
constexpr uint64_t kMaxRoundTrips = 10000;
constexpr uint64_t kMaxMessages = uint64_t{1} << 32;
// The timed bandwidth time is split into this many runs and the median kept: on a small shared machine one
// run can be hit by an unrelated burst of load, and railnet and raw TCP are measured at different moments.
constexpr size_t kBandwidthTrials = 3;

// Checks every slot of `received` against `sent` after a run that filled `messages` slots. On the GPU the received
// bytes are first copied down into the buffer's host memory (the sent pattern is still there, as it was uploaded).
void compareSlots(const Peer& peer, const char* direction, size_t size, size_t messages, const BenchBuffer& sent,
                  BenchBuffer& received) {
  received.collect(messages * size);
  for (size_t k = 0; k < messages; ++k) {
    const std::byte* from = sent.host().data() + k * size;
    const std::byte* to = received.host().data() + k * size;
    const uint64_t expected = checksum(from, size);
    const uint64_t got = checksum(to, size);
    if (got != expected) {
      size_t offset = 0;
      while (offset < size && from[offset] == to[offset]) ++offset;
      fail("%s %s, %s: wrong data in message %zu of %zu: checksum %016llx, expected %016llx (first bad byte at "
           "offset %zu)", peer.name().c_str(), sizeText(size).c_str(), direction, k, messages,
           static_cast<unsigned long long>(got), static_cast<unsigned long long>(expected), offset);
    }
  }
}

// Moves one message into each slot of the receive buffer (cleared first) and compares every slot with the
// bytes that were sent, so a fast transport that delivers wrong, misplaced or no data cannot pass.
void verify(Peer& peer, size_t size, BenchBuffers& buffers) {
  size_t messages = buffers.slots(size);
  buffers.recv.clear(messages * size);
  peer.stream(size, messages);
  compareSlots(peer, "one way", size, messages, buffers.send, buffers.recv);
}

// Both directions at once into cleared slots, then every slot of both directions compared with what was sent.
void verifyBothWays(Peer& peer, size_t size, BenchBuffers& buffers) {
  const size_t messages = buffers.slots(size);
  buffers.recv.clear(messages * size);
  buffers.echoRecv.clear(messages * size);
  peer.streamBothWays(size, messages);
  compareSlots(peer, "forward", size, messages, buffers.send, buffers.recv);
  compareSlots(peer, "back", size, messages, buffers.echoSend, buffers.echoRecv);
}

// The median GB/s of kBandwidthTrials runs of `run(count)` (after a calibrated warm-up), and the process's CPU
// seconds per GB moved over those runs (`directions` x count x size bytes each).
PeerResult timedStreaming(const std::function<double(uint64_t)>& run, size_t size, int directions,
                          const Options& options) {
  const double warmup = std::clamp(options.seconds / 10, 0.02, 0.2);
  auto gbps = [&](uint64_t count, double seconds) {
    return static_cast<double>(count) * static_cast<double>(size) / seconds / 1e9;
  };
  uint64_t firstCount = std::clamp<uint64_t>(16 * MiB / size, 1, static_cast<uint64_t>(options.window));
  TimedRun first = runCalibrated(run, firstCount, 2, kMaxMessages, warmup, options.seconds / kBandwidthTrials);
  std::vector<double> trials = {gbps(first.count, first.seconds)};
  const double cpuBefore = processCpuSeconds();
  while (trials.size() < kBandwidthTrials) trials.push_back(gbps(first.count, run(first.count)));
  const double cpuSeconds = processCpuSeconds() - cpuBefore;
  const double gigabytes = static_cast<double>(kBandwidthTrials - 1) * static_cast<double>(directions) *
                           static_cast<double>(first.count) * static_cast<double>(size) / 1e9;
  PeerResult result;
  result.gbps = median(trials);
  result.cpuPerGB = gigabytes > 0 ? cpuSeconds / gigabytes : 0;
  return result;
}

// Both directions at once: verify, then per-direction bandwidth and CPU per GB.
PeerResult measureBothWays(Peer& peer, size_t size, const Options& options, BenchBuffers& buffers,
                           StallGuard& guard, const std::function<void(const std::string&)>& announce) {
  guard.setPhase(peer.name() + " " + sizeText(size) + " both ways, verify");
  announce(peer.name() + " both ways, verify");
  verifyBothWays(peer, size, buffers);
  guard.setPhase(peer.name() + " " + sizeText(size) + " both ways, bandwidth");
  announce(peer.name() + " both ways, bandwidth");
  return timedStreaming([&](uint64_t count) { return peer.streamBothWays(size, count); }, size, 2, options);
}

// Verify, then bandwidth (one way, window in flight; median of kBandwidthTrials runs), then latency (ping-pong,
// median half round trip), each calibrated to last about options.seconds in all after its warm-up.
PeerResult measure(Peer& peer, size_t size, const Options& options, BenchBuffers& buffers, StallGuard& guard,
                   const std::function<void(const std::string&)>& announce) {
  const double warmup = std::clamp(options.seconds / 10, 0.02, 0.2);
  auto phase = [&](const char* what) {
    guard.setPhase(peer.name() + " " + sizeText(size) + " " + what);
    announce(peer.name() + " " + what);
  };
  PeerResult result;

  phase("verify");
  verify(peer, size, buffers);

  phase("bandwidth");
  result = timedStreaming([&](uint64_t count) { return peer.stream(size, count); }, size, 1, options);

  phase("latency");
  std::vector<double> halfRttUs;
  auto pingPong = [&](uint64_t count) {
    halfRttUs.clear();  // only the timed run's samples count
    return peer.pingPong(size, count, &halfRttUs);
  };
  runCalibrated(pingPong, 1, 3, kMaxRoundTrips, warmup, options.seconds);
  result.latencyUs = median(halfRttUs);
  return result;
}

std::unique_ptr<NetPlugin> openPlugin(const Options& options) {
  if (!options.plugin.empty()) return std::make_unique<NetPlugin>(options.plugin);
  std::string tried;
  for (const std::string& candidate : NetPlugin::defaultCandidates()) {
    if (candidate.find('/') == std::string::npos) {
      // A bare name: the loader searches its path; if that fails too, list everything that was tried.
      try {
        return std::make_unique<NetPlugin>(candidate);
      } catch (const BenchError& error) {
        tried += "\n  " + std::string(error.what());
      }
    } else if (access(candidate.c_str(), F_OK) == 0) {
      return std::make_unique<NetPlugin>(candidate);  // it exists: its own load error is the one to report
    } else {
      tried += "\n  " + candidate + " (absent)";
    }
  }
  fail("libnccl-net-railnet.so not found; build it or pass --plugin PATH. Tried:%s", tried.c_str());
}

// Prints the error and ends the process without unwinding: the plugin may be mid-transfer, and closing its
// comms then could block on exactly what failed.
[[noreturn]] void die(const std::exception& error) {
  fflush(stdout);
  fprintf(stderr, "\nrailnet-bench: error: %s\n", error.what());
  fflush(stderr);
  std::_Exit(1);
}

// What --gpu measures on: device 0 with its primary context current on this thread. Unsupported (exit 2) when
// there is no GPU to measure.
std::unique_ptr<GpuDevice> openGpu() {
  std::string why;
  std::unique_ptr<GpuDevice> gpu = GpuDevice::open(&why);
  if (!gpu) throw Unsupported("--gpu: no usable GPU: " + why);
  return gpu;
}

int run(const Options& options) {
  // Loopback benchmark; a user's own RAILNET_IFNAME wins. Set before the plugin reads its settings.
  setenv("RAILNET_IFNAME", "lo", 0);
  // --gpu measures the TCP transport's GPU staging, which is offered only on request (D70); a user's 0 wins.
  if (options.gpu) setenv("RAILNET_TCP_GPU", "1", 0);
  NetPlugin::setVerbose(options.verbose);
  // The same validated value the plugin uses (1..64); a bad one fails the plugin's init.
  const int streams = static_cast<int>(railnet::settings().tcpStreams);
  const std::vector<size_t> sizes = sweepSizes(options);

  StallGuard guard(options.timeout);
  // Before anything that uses GPU memory, and released after it (declared first, destroyed last).
  if (options.gpu) guard.setPhase("opening the GPU");
  const std::unique_ptr<GpuDevice> gpu = options.gpu ? openGpu() : nullptr;
  const BaselineKind baselineKind = !options.againstRaw() || options.group > 1 || options.gin
                                        ? BaselineKind::kRailnetDevice
                                    : options.gpu         ? BaselineKind::kRawCopyEnginesTcp
                                                          : BaselineKind::kRawTcp;
  RowFile csv(options.csv, RowFile::Format::kCsv, baselineKind);
  RowFile json(options.json, RowFile::Format::kJsonLines, baselineKind);
  guard.setPhase("loading the plugin");
  std::unique_ptr<NetPlugin> net = openPlugin(options);
  guard.setPhase("allocating buffers");
  // With --group, window x group messages are in flight: as many distinct slots.
  BenchBuffers buffers(options.maxSize, options.window * options.group, kArenaCap, gpu.get());
  const bool named = !options.device.empty();
  const std::string label = named ? options.device : "railnet";
  RailnetPeer::Options peerOptions;
  peerOptions.exact = named;
  peerOptions.label = options.group > 1 ? label + ", irecv of " + std::to_string(options.group)
                      : options.to.empty() ? label
                                           : label + " -> " + options.to;
  peerOptions.group = options.group;
  peerOptions.toDevice = options.to;
  RailnetPeer railnet(*net, named ? options.device : "lo", options.window, buffers, guard, peerOptions);
  if (options.maxSize > railnet.device().maxP2pBytes) {
    fail("--max-size %zu exceeds the device's maxP2pBytes %zu", options.maxSize, railnet.device().maxP2pBytes);
  }
  // The baseline measured next to it: raw TCP over lo (raw copy engines + TCP for GPU memory), or another railnet
  // device (e.g. one rail vs two fused).
  std::unique_ptr<Peer> baseline;
  size_t ceTcpPieceBytes = 0;
  // --gin: the GIN puts are measured, railnet's own isend/irecv on the same device is the baseline.
  std::unique_ptr<GinPeer> gin;
  if (options.gin) {
    gin = std::make_unique<GinPeer>(*net, railnet.deviceIndex(), options.window, buffers, guard, gpu.get());
  } else switch (options.group > 1 ? BaselineKind::kRailnetDevice : baselineKind) {
    case BaselineKind::kRawTcp:
      baseline = std::make_unique<RawTcpPeer>(streams, options.window, buffers, guard);
      break;
    case BaselineKind::kRawCopyEnginesTcp: {
      auto ceTcp = std::make_unique<RawCeTcpPeer>(streams, options.window, options.maxSize, buffers, guard, *gpu);
      ceTcpPieceBytes = ceTcp->pieceBytes();
      baseline = std::move(ceTcp);
      break;
    }
    case BaselineKind::kRailnetDevice:
      if (options.group > 1) {
        // The same device and sizes, each group member its own irecv: what grouping gains.
        RailnetPeer::Options single;
        single.exact = named;
        single.label = label + ", " + std::to_string(options.group) + " irecvs of 1";
        single.group = options.group;
        single.groupedReceives = false;
        baseline = std::make_unique<RailnetPeer>(*net, named ? options.device : "lo", options.window, buffers, guard,
                                                 single);
      } else {
        RailnetPeer::Options against;
        against.exact = true;
        against.label = options.against;
        baseline = std::make_unique<RailnetPeer>(*net, options.against, options.window, buffers, guard, against);
      }
      break;
  }
  Peer& measured = gin ? static_cast<Peer&>(*gin) : railnet;
  Peer& against = gin ? static_cast<Peer&>(railnet) : *baseline;
  RunDescription description{net->path(), net->symbol(), net->name(), railnet.deviceIndex(), railnet.device().name,
                             streams, options.window, options.seconds};
  description.baseline = gin ? railnet.device().name + "\" isend/irecv, vs \"" + railnet.device().name + "\" GIN puts"
                             : against.name();
  description.baselineKind = baselineKind;
  description.oneWayTable = options.oneWay;
  description.everySize = options.group > 1;
  if (gpu) {
    description.gpu = "GPU 0" + (gpu->pciBusId().empty() ? std::string() : " (PCI " + gpu->pciBusId() + ")") +
                      (gpu->api().cuMemCreate != nullptr ? " as cuMem allocations (as NCCL allocates)"
                                                         : " from cuMemAlloc (the driver has no cuMem API)");
    description.comparison = gin ? "GPU memory: railnet GIN puts vs isend/irecv"
                             : baselineKind == BaselineKind::kRawCopyEnginesTcp
                                 ? "GPU memory: railnet vs raw copy engines + TCP"
                                 : "GPU memory: railnet device \"" + railnet.device().name +
                                       "\" vs railnet device \"" + baseline->name() + "\"";
    description.ceTcpSlots = RawCeTcpPeer::kSlots;
    description.ceTcpPieceBytes = ceTcpPieceBytes;
  }
  printHeader(description);
  json.describe(description);
  if (options.timeline > 0) {
    // Slices of about 100 ms: as many messages as the last slice's rate moves in that time.
    FILE* out = options.csv.empty() ? nullptr : fopen(options.csv.c_str(), "w");
    if (out != nullptr) fprintf(out, "t_s,gbps\n");
    printf("timeline: %s messages one way, %.1f s; t_s GB/s per slice\n", sizeText(options.maxSize).c_str(),
           options.timeline);
    const auto start = std::chrono::steady_clock::now();
    uint64_t count = 4;
    try {
      for (;;) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (elapsed >= options.timeline) break;
        guard.setPhase("timeline");
        const double seconds = measured.stream(options.maxSize, count);
        const double at = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        const double gbps = static_cast<double>(options.maxSize) * static_cast<double>(count) / seconds / 1e9;
        printf("%.3f %.3f\n", at, gbps);
        if (out != nullptr) fprintf(out, "%.3f,%.3f\n", at, gbps);
        count = std::max<uint64_t>(1, static_cast<uint64_t>(gbps * 1e9 * 0.1 / static_cast<double>(options.maxSize)));
      }
      if (out != nullptr) fclose(out);
      baseline.reset();
      railnet.shutdown();
    } catch (const std::exception& error) {
      die(error);
    }
    return 0;
  }
  if (gin) {
    // NCCL's device-API signal (a put of 0 bytes) has no payload: the round trip that matters most for GIN.
    std::vector<double> halfRttUs;
    guard.setPhase("GIN: signal-only round trips");
    gin->pingPong(0, 2000, &halfRttUs);
    printf("GIN signal only (a 0-byte iputSignal each way, signal words in %s): round trip median %.1f us\n\n",
           gpu ? "GPU memory, polled by copy" : "host memory", 2 * median(halfRttUs));
  }

  // One table: for each size, railnet then the baseline, each measured by `measurePeer`; rows printed as they come.
  using MeasureFn = PeerResult (*)(Peer&, size_t, const Options&, BenchBuffers&, StallGuard&,
                                   const std::function<void(const std::string&)>&);
  auto table = [&](const std::vector<size_t>& points, MeasureFn measurePeer, void (*print)(const Row&),
                   const char* direction) {
    std::vector<Row> rows;
    Progress progress;
    for (size_t i = 0; i < points.size(); ++i) {
      auto announce = [&](const std::string& what) { progress.show(i, points.size(), points[i], what); };
      Row row{points[i], measurePeer(measured, points[i], options, buffers, guard, announce),
              measurePeer(against, points[i], options, buffers, guard, announce)};
      progress.finish();
      print(row);
      csv.write(row, direction);
      json.write(row, direction);
      rows.push_back(row);
    }
    return rows;
  };

  try {
    std::vector<Row> rows;
    if (options.oneWay) rows = table(sizes, measure, printRow, "one-way");
    std::vector<Row> bothWaysRows;
    if (options.bothWays) {
      printBothWaysHeader(description);
      bothWaysRows = table(bothWaysSizes(options), measureBothWays, printBothWaysRow, "both-ways");
    }
    printSummary(rows, bothWaysRows, description);
    baseline.reset();
    gin.reset();
    railnet.shutdown();
  } catch (const std::exception& error) {
    die(error);
  }
  return 0;  // ~NetPlugin: dlclose, still under the stall guard
}

}  // namespace
}  // namespace railnet::bench

int main(int argc, char** argv) {
  using namespace railnet::bench;
  Options options = parseOptions(argc, argv);
  try {
    return run(options);
  } catch (const Unsupported& error) {
    // Nothing is in flight yet (only set-up can find this), so run() unwound normally.
    fflush(stdout);
    fprintf(stderr, "railnet-bench: %s\n", error.what());
    return 2;
  } catch (const std::exception& error) {
    die(error);
  }
}
