#include "plugin/tools/options.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>

#include "plugin/tools/harness.h"
#include "railnet/nccl/common.h"
#include "railnet/version.h"

namespace railnet::bench {
namespace {

// test() reports received sizes as int: keep every message well inside that.
constexpr size_t kLargestMessage = 1 * GiB;
// NCCL keeps at most NCCL_NET_MAX_REQUESTS requests in flight per comm.
constexpr int kLargestWindow = NCCL_NET_MAX_REQUESTS;

constexpr const char* kUsage =
    "usage: railnet-bench [options]\n"
    "  --plugin PATH     net plugin to dlopen (default: libnccl-net-railnet.so beside this program or the build\n"
    "                    root, else from the loader path)\n"
    "  --min-size B      smallest message (default 8); sizes take k/m/g suffixes (binary)\n"
    "  --max-size B      largest message (default 256m, --quick 64m)\n"
    "  --step F          size factor between points, a power of two (default 4, --quick 16)\n"
    "  --seconds S       timed duration of each measurement (default 0.5, --quick 0.25)\n"
    "  --window W        messages in flight per connection, 1..32 (default 8, like NCCL_STEPS)\n"
    "  --timeout S       report a stall after S seconds without progress (default 30)\n"
    "  --csv FILE        also write the rows as CSV\n"
    "  --json FILE       also write the run and its rows as JSON Lines (one object per line, keys as the CSV's)\n"
    "  --quick           fewer, smaller points (CI)\n"
    "  --device NAME     railnet device to measure (default: \"lo\", else device 0); \"A+B\" fuses the named\n"
    "                    devices through makeVDevice, e.g. lo@127.0.1.1+lo@127.0.2.1 with RAILNET_TCP_ADDRESSES\n"
    "  --against PEER    the baseline measured in the same run: raw (default: raw TCP, and the goal applies;\n"
    "                    with --gpu, raw copy engines + TCP) or a railnet device name as for --device (fused vs\n"
    "                    one rail: scripts/rails-tc.sh)\n"
    "  --gpu             GPU memory: every buffer on GPU 0 (libcuda, its primary context), registered as\n"
    "                    NCCL_PTR_CUDA, checked by copying it back. raw then means raw copy engines + TCP: per\n"
    "                    socket and side a CUDA stream and 4 pinned slots of RAILNET_TCP_STAGING_PIECE_BYTES,\n"
    "                    copies overlapping send/recv. Ratios only, no goal yet. Exit status 2 when there is no\n"
    "                    GPU or the device does not take NCCL_PTR_CUDA\n"
    "  --bidir           only the table of both directions at once (every rank of an all_reduce sends and\n"
    "                    receives together); by default it follows the one-way table\n"
    "  --one-way         only the one-way table\n"
    "  --group N         multireceive: every receive is one irecv of N buffers (tags 0..N-1, N = 2..8, like\n"
    "                    NCCL's grouped receives), N sends each; the baseline is the same device with N single\n"
    "                    irecvs, so the ratio is what grouping (and railnet's aggregation, RAILNET_GROUP_WAIT_US)\n"
    "                    gains. One way only; sizes up to 64 KiB unless --max-size says otherwise\n"
    "  --to DEVICE       railnet's sender connects from --device to a receiver listening on DEVICE (and back the\n"
    "                    reverse way): with two loopback rails (RAILNET_TCP_ADDRESSES), a cross-rail connection,\n"
    "                    e.g. for fabric shaping (docs/fabric-shaping.md)\n"
    "  --timeline S      railnet's bandwidth over time instead of the tables: --max-size messages one way through\n"
    "                    --device for S seconds, one row per ~100 ms slice (t_s, GB/s; --csv writes them too):\n"
    "                    a NIC's failure and failback seen as they happen (docs/failover.md)\n"
    "  --gin             railnet's GIN backend (ncclGinPlugin_v11, NCCL's device API path, no NCCL): two ranks in\n"
    "                    this process put the buffers with iput, the last of each stream with iputSignal, as NCCL's\n"
    "                    GIN progress thread does; the baseline is the same device's isend/irecv. Ping-pong is a\n"
    "                    put+signal round trip (signal words in host memory, polled). With --gpu, GPU windows\n"
    "  --version         print railnet's version and git revision\n"
    "  -v, --verbose     forward the plugin's INFO lines to stderr (WARN always goes there)\n"
    "Environment: RAILNET_IFNAME defaults to lo here; RAILNET_TCP_STREAMS sets the streams of railnet and of\n"
    "the raw TCP (or raw CE+TCP) peer alike.\n";

[[noreturn]] void usageError(const std::string& message) {
  fprintf(stderr, "railnet-bench: %s\n%s", message.c_str(), kUsage);
  exit(2);
}

size_t parseSize(const char* text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno != 0 || end == text) usageError(format("not a size: %s", text));
  switch (*end) {
    case 'k': case 'K': value *= KiB; ++end; break;
    case 'm': case 'M': value *= MiB; ++end; break;
    case 'g': case 'G': value *= GiB; ++end; break;
    default: break;
  }
  if (strcmp(end, "") != 0 && strcmp(end, "B") != 0 && strcmp(end, "iB") != 0) {
    usageError(format("not a size: %s", text));
  }
  return static_cast<size_t>(value);
}

double parseSeconds(const char* text) {
  char* end = nullptr;
  double value = strtod(text, &end);
  if (end == text || *end != '\0' || !(value > 0)) usageError(format("not a positive number of seconds: %s", text));
  return value;
}

int parseWindow(const char* text) {
  char* end = nullptr;
  long value = strtol(text, &end, 10);
  if (end == text || *end != '\0' || value < 1 || value > kLargestWindow) {
    usageError(format("--window must be 1..%d, not %s", kLargestWindow, text));
  }
  return static_cast<int>(value);
}

}  // namespace

int parseGroup(const char* text) {
  char* end = nullptr;
  const long group = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || group < 1 || group > 8) usageError(format("--group must be 1..8, not %s", text));
  return static_cast<int>(group);
}

Options parseOptions(int argc, char** argv) {
  Options options;
  bool quick = false;
  std::optional<size_t> maxSize, step;
  std::optional<double> seconds;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usageError(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--plugin") options.plugin = value();
    else if (arg == "--min-size") options.minSize = parseSize(value());
    else if (arg == "--max-size") maxSize = parseSize(value());
    else if (arg == "--step") step = parseSize(value());
    else if (arg == "--seconds") seconds = parseSeconds(value());
    else if (arg == "--timeout") options.timeout = parseSeconds(value());
    else if (arg == "--window") options.window = parseWindow(value());
    else if (arg == "--csv") options.csv = value();
    else if (arg == "--json") options.json = value();
    else if (arg == "--quick") quick = true;
    else if (arg == "--device") options.device = value();
    else if (arg == "--against") options.against = value();
    else if (arg == "--bidir") options.oneWay = false;
    else if (arg == "--one-way") options.bothWays = false;
    else if (arg == "--gpu") options.gpu = true;
    else if (arg == "--group") options.group = parseGroup(value());
    else if (arg == "--to") options.to = value();
    else if (arg == "--gin") options.gin = true;
    else if (arg == "--timeline") options.timeline = parseSeconds(value());
    else if (arg == "-v" || arg == "--verbose") options.verbose = true;
    else if (arg == "--version") {
      printf("railnet-bench %s (revision %s)\n", railnet::kVersion, railnet::revision());
      exit(0);
    }
    else if (arg == "-h" || arg == "--help") {
      fputs(kUsage, stdout);
      exit(0);
    } else {
      usageError("unknown option " + arg);
    }
  }
  if (!options.oneWay && !options.bothWays) usageError("--bidir and --one-way leave no table to measure");
  // Explicit values win over --quick's, whatever their order on the command line.
  if (options.group > 1) {
    // Multireceive: one way only, small messages (the ones aggregation carries), against single receives.
    if (!options.againstRaw()) usageError("--group compares with single receives of the same device: no --against");
    options.bothWays = false;
    if (!options.oneWay) usageError("--group measures one way only: no --bidir");
    if (!maxSize) maxSize = 64 * KiB;
  }
  if (options.gin && (options.group > 1 || !options.againstRaw() || !options.to.empty())) {
    usageError("--gin compares GIN puts with isend/irecv of the same device: no --group, --against or --to");
  }
  options.maxSize = maxSize.value_or(quick ? 64 * MiB : options.maxSize);
  options.step = step.value_or(quick ? 16 : options.step);
  options.seconds = seconds.value_or(quick ? 0.25 : options.seconds);

  if (!std::has_single_bit(options.minSize) || !std::has_single_bit(options.maxSize) ||
      options.minSize > options.maxSize) {
    usageError("--min-size and --max-size must be powers of two, min <= max");
  }
  if (options.maxSize > kLargestMessage) usageError("--max-size is limited to " + sizeText(kLargestMessage));
  if (!std::has_single_bit(options.step) || options.step < 2) usageError("--step must be a power of two >= 2");
  return options;
}

std::vector<size_t> sweepSizes(const Options& options) {
  std::vector<size_t> sizes;
  for (size_t size = options.maxSize; size > options.minSize; size /= options.step) sizes.push_back(size);
  sizes.push_back(options.minSize);
  std::reverse(sizes.begin(), sizes.end());
  return sizes;
}

std::string sizeText(size_t size) {
  if (size >= GiB && size % GiB == 0) return format("%zu GiB", size / GiB);
  if (size >= MiB && size % MiB == 0) return format("%zu MiB", size / MiB);
  if (size >= KiB && size % KiB == 0) return format("%zu KiB", size / KiB);
  return format("%zu B", size);
}

std::vector<size_t> bothWaysSizes(const Options& options) {
  std::vector<size_t> sizes;
  for (size_t size : sweepSizes(options)) {
    if (size >= 64 * KiB) sizes.push_back(size);
  }
  for (size_t goal : {512 * KiB, 4 * MiB}) {
    if (goal >= options.minSize && goal <= options.maxSize && std::find(sizes.begin(), sizes.end(), goal) == sizes.end()) {
      sizes.push_back(goal);
    }
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

}  // namespace railnet::bench
