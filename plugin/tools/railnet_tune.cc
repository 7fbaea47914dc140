// railnet-tune: the tuner's decisions, offline.
//   railnet-tune table --nodes N --gpus-per-node G [--nics K] --nic-gbps X [--calibration FILE] [--no-model]
//                      [--colls allreduce,allgather,...] [--min 8] [--max 1G]
//       prints collective x size -> algorithm, protocol, channels, where the choice comes from, estimate (us)
//   railnet-tune calibrate LOG... -o FILE [--nodes N] [--ranks R]
//       builds a calibration file from nccl-tests logs run with one algorithm/protocol forced; each log names its
//       combination in a "# railnet-tune: coll=C algo=A proto=P [channels=N]" line or in its file name COLL__ALGO_PROTO.log
//   railnet-tune bench --plugin PATH [--calibration FILE] [--calls N]
//       cost per getCollInfo call of the real .so's ncclTunerPlugin_v5 (NCCL 2.28's), through dlopen
#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "plugin/tools/tests_log.h"
#include "plugin/tuner/calibration.h"
#include "plugin/tuner/decide.h"
#include "plugin/tuner/names.h"
#include "railnet/nccl/tuner.h"
#include "railnet/version.h"

using namespace railnet::tuner;

namespace {

constexpr const char* kUsage =
    "usage: railnet-tune table --nodes N --gpus-per-node G [--nics K] --nic-gbps X [--calibration FILE]\n"
    "                          [--no-model] [--colls allreduce,...] [--min BYTES] [--max BYTES]\n"
    "       railnet-tune calibrate LOG... -o FILE [--nodes N] [--ranks R]\n"
    "       railnet-tune bench --plugin PATH [--calibration FILE] [--calls N]\n"
    "       railnet-tune --help | --version\n";

// A usage error: the reason and the usage on stderr, exit status 2.
[[noreturn]] void usage(const char* why) {
  std::fprintf(stderr, "railnet-tune: %s\n%s", why, kUsage);
  std::exit(2);
}

uint64_t parseBytes(const std::string& text) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || value < 0) usage(("bad size " + text).c_str());
  std::string suffix(end);
  double scale = 1;
  if (suffix == "K" || suffix == "k") scale = 1024.0;
  else if (suffix == "M" || suffix == "m") scale = 1024.0 * 1024;
  else if (suffix == "G" || suffix == "g") scale = 1024.0 * 1024 * 1024;
  else if (!suffix.empty()) usage(("bad size " + text).c_str());
  return static_cast<uint64_t>(value * scale);
}

double parseNumber(const std::string& text, const char* what) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || *end != '\0' || !std::isfinite(value)) usage((std::string("bad ") + what).c_str());
  return value;
}

Calibration loadOrExit(const std::string& path) {
  Calibration calibration;
  if (path.empty()) return calibration;
  std::string error;
  if (!loadCalibration(path, &calibration, &error)) {
    std::fprintf(stderr, "railnet-tune: %s\n", error.c_str());
    std::exit(1);
  }
  return calibration;
}

// The entries NCCL offers for a collective on a multi-node communicator without CollNet/NVLS: Ring x all
// protocols, Tree for allreduce, PAT (Simple) for allgather/reducescatter with one GPU per node.
bool offeredByNccl(const Shape& shape, int coll, int algo, int proto) {
  if (algo == NCCL_ALGO_RING) return true;
  if (algo == NCCL_ALGO_TREE) return coll == ncclFuncAllReduce;
  if (algo == NCCL_ALGO_PAT) {
    return proto == NCCL_PROTO_SIMPLE && shape.gpusPerNode() == 1 &&
           (coll == ncclFuncAllGather || coll == ncclFuncReduceScatter);
  }
  return false;
}

int table(int argc, char** argv) {
  Shape shape;
  int gpusPerNode = 1;
  std::string calibrationPath;
  TunerOptions options;
  std::vector<int> colls = {ncclFuncAllReduce, ncclFuncAllGather, ncclFuncReduceScatter, ncclFuncBroadcast};
  uint64_t minBytes = 8, maxBytes = 1ULL << 30;
  bool haveGbps = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    if (arg == "--nodes") shape.nNodes = static_cast<int>(parseNumber(value(), "--nodes"));
    else if (arg == "--gpus-per-node") gpusPerNode = static_cast<int>(parseNumber(value(), "--gpus-per-node"));
    else if (arg == "--nics") shape.nicsPerNode = static_cast<int>(parseNumber(value(), "--nics"));
    else if (arg == "--nic-gbps") shape.nicGbps = parseNumber(value(), "--nic-gbps"), haveGbps = true;
    else if (arg == "--calibration") calibrationPath = value();
    else if (arg == "--no-model") options.useModel = false;
    else if (arg == "--min") minBytes = parseBytes(value());
    else if (arg == "--max") maxBytes = parseBytes(value());
    else if (arg == "--colls") {
      colls.clear();
      std::stringstream list(value());
      std::string name;
      while (std::getline(list, name, ',')) {
        int coll = parseColl(name);
        if (coll < 0) usage(("unknown collective " + name).c_str());
        colls.push_back(coll);
      }
    } else usage(("unknown option " + arg).c_str());
  }
  if (shape.nNodes < 1 || gpusPerNode < 1 || shape.nicsPerNode < 1 || shape.nicGbps <= 0 || !haveGbps) {
    usage("table needs --nodes >= 1, --gpus-per-node >= 1 and --nic-gbps > 0");
  }
  if (minBytes < 1 || maxBytes < minBytes) usage("need 1 <= --min <= --max");
  shape.nRanks = shape.nNodes * gpusPerNode;
  Calibration calibration = loadOrExit(calibrationPath);
  Tuner tuner(shape, calibration, options);
  std::printf("# %d node(s) x %d GPU(s), %d NIC(s) x %.0f Gb/s per node; calibration: %s (%zu measurements, %zu "
              "rules for this shape)\n",
              shape.nNodes, gpusPerNode, shape.nicsPerNode, shape.nicGbps,
              calibrationPath.empty() ? "none" : calibrationPath.c_str(), tuner.measurementCount(), tuner.ruleCount());
  std::printf("# NCCL's own costs are stood in by railnet's model: 'model' rows are the model's pick, 'calibration'\n"
              "# rows the fastest measured (interpolated) combination, 'rule' rows a rule of the file.\n");
  std::printf("%-14s %12s %-6s %-7s %8s %-12s %12s\n", "collective", "bytes", "algo", "proto", "channels", "source",
              "estimate_us");
  for (int coll : colls) {
    for (uint64_t bytes = minBytes; bytes <= maxBytes; bytes *= 2) {
      float costs[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
      for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a) {
        for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
          double model = offeredByNccl(shape, coll, a, p) ? tuner.modelUs(coll, bytes, a, p) : -1;
          costs[a][p] = model > 0 ? static_cast<float>(model) : NCCL_ALGO_PROTO_IGNORE;
        }
      }
      Decision decision = tuner.decide(coll, bytes, 1, 0, &costs[0][0], NCCL_NUM_ALGORITHMS, NCCL_NUM_PROTOCOLS);
      if (decision.source == Source::Nccl) {
        // The stand-in's pick: the smallest modelled cost.
        float best = -1;
        for (int a = 0; a < NCCL_NUM_ALGORITHMS; ++a) {
          for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) {
            if (costs[a][p] >= 0 && (best < 0 || costs[a][p] < best)) {
              best = costs[a][p];
              decision = Decision{Source::Model, a, p, 0, best};
            }
          }
        }
      }
      if (decision.algo < 0) continue;
      std::printf("%-14s %12llu %-6s %-7s %8s %-12s %12.1f\n", collName(coll), static_cast<unsigned long long>(bytes),
                  algoName(decision.algo), protoName(decision.proto),
                  decision.channels > 0 ? std::to_string(decision.channels).c_str() : "nccl", sourceName(decision.source),
                  decision.estimateUs);
      if (bytes > maxBytes / 2) break;
    }
  }
  return 0;
}

int calibrate(int argc, char** argv) {
  std::vector<std::string> logs;
  std::string output;
  int nodes = -1, ranks = -1;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    if (arg == "-o" || arg == "--output") output = value();
    else if (arg == "--nodes") nodes = static_cast<int>(parseNumber(value(), "--nodes"));
    else if (arg == "--ranks") ranks = static_cast<int>(parseNumber(value(), "--ranks"));
    else if (arg.rfind("-", 0) == 0) usage(("unknown option " + arg).c_str());
    else logs.push_back(arg);
  }
  if (logs.empty() || output.empty()) usage("calibrate needs logs and -o FILE");
  std::ostringstream text;
  text << calibrationHeader();
  size_t written = 0, used = 0;
  for (const std::string& path : logs) {
    TestsLog log;
    std::string why;
    if (!readTestsLog(path, &log, &why)) {
      std::fprintf(stderr, "railnet-tune: skipping %s: %s\n", path.c_str(), why.c_str());
      continue;
    }
    ++used;
    for (CalRow row : log.rows) {
      row.coll = log.coll;
      row.algo = log.algo;
      row.proto = log.proto;
      row.channels = log.channels;
      row.nNodes = nodes;
      row.nRanks = ranks > 0 ? ranks : (log.ranks > 0 ? log.ranks : -1);
      text << formatRow(row) << "\n";
      ++written;
    }
  }
  if (written == 0) {
    std::fprintf(stderr, "railnet-tune: no usable log; %s not written\n", output.c_str());
    return 1;
  }
  std::ofstream out(output);
  out << text.str();
  if (!out.flush()) {
    std::fprintf(stderr, "railnet-tune: cannot write %s\n", output.c_str());
    return 1;
  }
  std::printf("railnet-tune: %zu measurements from %zu log(s) written to %s\n", written, used, output.c_str());
  return 0;
}

int bench(int argc, char** argv) {
  std::string plugin, calibrationPath;
  long calls = 2000000;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) usage((arg + " needs a value").c_str());
      return argv[++i];
    };
    if (arg == "--plugin") plugin = value();
    else if (arg == "--calibration") calibrationPath = value();
    else if (arg == "--calls") calls = static_cast<long>(parseNumber(value(), "--calls"));
    else usage(("unknown option " + arg).c_str());
  }
  if (plugin.empty() || calls < 1) usage("bench needs --plugin PATH");
  if (!calibrationPath.empty()) setenv("RAILNET_TUNER_FILE", calibrationPath.c_str(), 1);
  void* library = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return std::fprintf(stderr, "railnet-tune: %s\n", dlerror()), 1;
  auto* tuner = static_cast<ncclTuner_v5_t*>(dlsym(library, "ncclTunerPlugin_v5"));
  if (tuner == nullptr) return std::fprintf(stderr, "railnet-tune: no ncclTunerPlugin_v5 in %s\n", plugin.c_str()), 1;
  void* ctx = nullptr;
  ncclNvlDomainInfo_v5_t nvl{2, 1, 1};
  ncclTunerConstants_v5_t constants{};
  if (tuner->init(&ctx, 1, 2, 2, nullptr, &nvl, &constants) != ncclSuccess || ctx == nullptr) {
    std::fprintf(stderr, "railnet-tune: the tuner did not start (see its warnings)\n");
    return 1;
  }
  // A table like NCCL's for 2 ranks on 2 nodes: Tree and Ring x 3 protocols, PAT Simple, the rest -1.
  float base[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
  for (auto& row : base) {
    for (float& cost : row) cost = NCCL_ALGO_PROTO_IGNORE;
  }
  for (int p = 0; p < NCCL_NUM_PROTOCOLS; ++p) base[NCCL_ALGO_TREE][p] = base[NCCL_ALGO_RING][p] = 10.0f + p;
  base[NCCL_ALGO_PAT][NCCL_PROTO_SIMPLE] = 12.5f;
  const ncclFunc_t colls[] = {ncclFuncAllReduce, ncclFuncAllGather, ncclFuncReduceScatter, ncclFuncBroadcast};
  auto run = [&](bool callTuner) {
    float table[NCCL_NUM_ALGORITHMS][NCCL_NUM_PROTOCOLS];
    volatile float sink = 0;
    auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) {
      std::memcpy(table, base, sizeof(table));
      int channels = 0;
      size_t bytes = size_t{8} << (i % 28);
      if (callTuner) {
        tuner->getCollInfo(ctx, colls[i & 3], bytes, 1, reinterpret_cast<float**>(table), NCCL_NUM_ALGORITHMS,
                           NCCL_NUM_PROTOCOLS, 0, &channels);
      }
      sink = sink + table[1][2] + static_cast<float>(channels);
    }
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count() / calls;
  };
  run(true);  // warm up
  double loop = run(false);
  double withTuner = run(true);
  std::printf("getCollInfo (ncclTunerPlugin_v5, %s): %.1f ns per call (%ld calls, sizes 8 B..1 GiB, 4 collectives; "
              "loop overhead %.1f ns subtracted)\n",
              calibrationPath.empty() ? "no calibration" : calibrationPath.c_str(), withTuner - loop, calls, loop);
  tuner->finalize(ctx);
  dlclose(library);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::fputs(kUsage, stdout);  // asked for, with or without a command: stdout, success
      return 0;
    }
    if (std::strcmp(argv[i], "--version") == 0) {
      std::printf("railnet-tune %s (revision %s)\n", railnet::kVersion, railnet::revision());
      return 0;
    }
  }
  if (argc < 2) usage("no command");
  std::string command = argv[1];
  if (command == "table") return table(argc - 2, argv + 2);
  if (command == "calibrate") return calibrate(argc - 2, argv + 2);
  if (command == "bench") return bench(argc - 2, argv + 2);
  usage(("unknown command " + command).c_str());
}
