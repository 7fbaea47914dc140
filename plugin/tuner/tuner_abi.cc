// The tuner's ABI: ncclTunerPlugin_v6, _v5, _v4 and _v3 as thin adapters over one core. Every entry is
// guarded: getCollInfo never returns an error (NCCL 2.30 propagates one) and on any doubt leaves NCCL's
// table as it is; init never fails a communicator (a tuner that cannot start leaves every table alone).
#include <cstdlib>
#include <memory>
#include <string>

#include "plugin/guard.h"
#include "plugin/net_core.h"
#include "plugin/tuner/decide.h"
#include "railnet/nccl/tuner.h"
#include "railnet/settings.h"

namespace railnet::tuner {
namespace {

struct Context {
  uint64_t commId = 0;
  Tuner tuner;
};

bool envSet(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && value[0] != '\0';
}

// Builds a context; nullptr when the tuner should leave every table alone.
Context* create(int abiVersion, uint64_t commId, size_t nRanks, size_t nNodes, const ncclNvlDomainInfo_v5_t* nvl,
                const Settings& config) {
  TunerOptions options;
  options.enabled = config.tuner;
  // The model is opt-in (docs/decisions.md D63): RAILNET_TUNER_MODEL=on turns it on.
  options.useModel = config.tunerModel;
  options.forced = envSet("NCCL_ALGO") || envSet("NCCL_PROTO");
  if (!options.enabled) {
    RN_INFO(NCCL_INIT | NCCL_TUNING, "TUNER/railnet: RAILNET_TUNER=off: NCCL's choices are kept");
    return nullptr;
  }
  if (options.forced) {
    RN_INFO(NCCL_INIT | NCCL_TUNING, "TUNER/railnet: NCCL_ALGO/NCCL_PROTO set by the user: NCCL's choices are kept");
    return nullptr;
  }
  Shape shape;
  shape.nRanks = static_cast<int>(nRanks);
  shape.nNodes = nNodes > 0 ? static_cast<int>(nNodes) : 1;
  if (nvl != nullptr) {
    shape.nvlDomains = nvl->nNvlDomains;
    shape.maxRanksPerNvlDomain = nvl->maxRanksPerNvlDomain;
  }
  int devices = 0, totalMbps = 0;
  const char* nicSource = "RAILNET_TUNER_NIC_GBPS";
  if (config.tunerNicGbps > 0) {
    shape.nicsPerNode = 1;
    shape.nicGbps = static_cast<double>(config.tunerNicGbps);
  } else if (net::deviceSummary(&devices, &totalMbps) && devices > 0 && totalMbps > 0) {
    shape.nicsPerNode = devices;
    shape.nicGbps = totalMbps / 1000.0 / devices;
    nicSource = "railnet's devices";
  } else {
    nicSource = "a default (railnet's net plugin not initialised)";
  }
  Calibration calibration;
  bool fileRead = false;
  if (!config.tunerFile.empty()) {
    std::string error;
    fileRead = loadCalibration(config.tunerFile, &calibration, &error);
    if (!fileRead) {
      RN_WARN("TUNER/railnet: RAILNET_TUNER_FILE: %s; ignoring the file", error.c_str());
      calibration = Calibration{};
    }
  }
  auto context = std::make_unique<Context>(Context{commId, Tuner(shape, calibration, options)});
  // Which mode this communicator is in, once (docs/decisions.md D63).
  const size_t measurements = context->tuner.measurementCount(), rules = context->tuner.ruleCount();
  const char* gaps = options.useModel ? "the model decides (RAILNET_TUNER_MODEL=on)" : "NCCL's choice stands";
  std::string mode;
  if (measurements + rules > 0) {
    mode = "calibrated from " + config.tunerFile + " (" + std::to_string(measurements) + " measurements, " +
           std::to_string(rules) + " rules for this shape); where they cover nothing, " + gaps;
  } else {
    mode = std::string("no calibration for this shape: ") + gaps;
    if (fileRead) {
      mode += " (" + config.tunerFile + " has no row for " + std::to_string(shape.nRanks) + " ranks on " +
              std::to_string(shape.nNodes) + " nodes)";
    } else if (!config.tunerFile.empty()) {
      mode += " (RAILNET_TUNER_FILE unreadable, ignored)";
    }
  }
  RN_INFO(NCCL_INIT | NCCL_TUNING,
          "TUNER/railnet: tuner ABI v%d, comm %lx: %d ranks on %d nodes, %d NIC(s) x %.0f Gb/s per node (%s), "
          "NVLink domains %d; %s",
          abiVersion, static_cast<unsigned long>(commId), shape.nRanks, shape.nNodes, shape.nicsPerNode,
          shape.nicGbps, nicSource, shape.nvlDomains, mode.c_str());
  // Nothing for any call to act on: no context at all, so every getCollInfo returns at once.
  if (!context->tuner.acts()) return nullptr;
  return context.release();
}

ncclResult_t initCore(int abiVersion, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logger,
                      const ncclNvlDomainInfo_v5_t* nvl, void** ctx) {
  if (logger != nullptr) log::setLogger(logger);
  if (ctx == nullptr) return ncclSuccess;
  *ctx = nullptr;
  LoadedSettings config;
  ncclResult_t result = guarded("tuner init", [&] {
    // Read per communicator (not the process-wide cache) so a changed RAILNET_TUNER_FILE applies to new comms.
    config = loadSettings([](const char* name) -> const char* { return std::getenv(name); });
    for (const std::string& error : config.errors) RN_WARN("TUNER/railnet: %s", error.c_str());
    if (!config.errors.empty()) {
      fail(ncclInvalidUsage, "TUNER/railnet: %zu invalid RAILNET_* setting(s); see the warnings above",
           config.errors.size());
    }
    return ncclSuccess;
  });
  if (result != ncclSuccess) return result;  // a bad value fails init, like the net plugin's (docs/decisions.md D59)
  result = guarded("tuner init", [&] {
    *ctx = create(abiVersion, commId, nRanks, nNodes, nvl, config.values);
    return ncclSuccess;
  });
  if (result != ncclSuccess) RN_WARN("TUNER/railnet: init failed; NCCL's choices are kept for this communicator");
  return ncclSuccess;  // a tuner that cannot start must not fail the communicator
}

ncclResult_t getCollInfoCore(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** collCostTable,
                             int numAlgo, int numProto, int regBuff, int* nChannels) noexcept {
  if (ctx == nullptr || collCostTable == nullptr) return ncclSuccess;
  // NCCL passes a float[numAlgo][numProto] cast to float**.
  float* table = reinterpret_cast<float*>(collCostTable);
  static_cast<Context*>(ctx)->tuner.apply(static_cast<int>(collType), nBytes, numPipeOps, regBuff, table, numAlgo,
                                          numProto, nChannels);
  return ncclSuccess;
}

ncclResult_t finalizeCore(void* ctx) {
  delete static_cast<Context*>(ctx);
  return ncclSuccess;
}

// v6 / v5
ncclResult_t initV6(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logger,
                    ncclNvlDomainInfo_v6_t* nvl, ncclTunerConstants_v6_t*) {
  return initCore(6, commId, nRanks, nNodes, logger, nvl, ctx);
}
ncclResult_t initV5(void** ctx, uint64_t commId, size_t nRanks, size_t nNodes, ncclDebugLogger_t logger,
                    ncclNvlDomainInfo_v5_t* nvl, ncclTunerConstants_v5_t*) {
  return initCore(5, commId, nRanks, nNodes, logger, nvl, ctx);
}
ncclResult_t getCollInfoV5(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                           int numProto, int regBuff, int* nChannels) {
  return getCollInfoCore(ctx, collType, nBytes, numPipeOps, table, numAlgo, numProto, regBuff, nChannels);
}
ncclResult_t getChunkSizeV6(void* ctx, ncclFunc_t collType, size_t nBytes, int algo, int proto, int /*nChannels*/,
                            size_t* chunkSize) {
  if (ctx == nullptr || chunkSize == nullptr) return ncclSuccess;
  static_cast<Context*>(ctx)->tuner.chunkSize(static_cast<int>(collType), nBytes, algo, proto, chunkSize);
  return ncclSuccess;
}

// v4 / v3: no commId, no NVLink info, context last.
ncclResult_t initV4(size_t nRanks, size_t nNodes, ncclDebugLogger_t logger, void** ctx) {
  return initCore(4, 0, nRanks, nNodes, logger, nullptr, ctx);
}
ncclResult_t initV3(size_t nRanks, size_t nNodes, ncclDebugLogger_t logger, void** ctx) {
  return initCore(3, 0, nRanks, nNodes, logger, nullptr, ctx);
}
ncclResult_t getCollInfoV3(void* ctx, ncclFunc_t collType, size_t nBytes, int numPipeOps, float** table, int numAlgo,
                           int numProto, int* nChannels) {
  // v3 has no regBuff: -1 matches only rows that accept any.
  return getCollInfoCore(ctx, collType, nBytes, numPipeOps, table, numAlgo, numProto, -1, nChannels);
}

}  // namespace
}  // namespace railnet::tuner

using namespace railnet::tuner;

extern "C" {
__attribute__((visibility("default"))) ncclTuner_v6_t ncclTunerPlugin_v6 = {"railnet", initV6, getCollInfoV5,
                                                                            finalizeCore, getChunkSizeV6};
__attribute__((visibility("default"))) ncclTuner_v5_t ncclTunerPlugin_v5 = {"railnet", initV5, getCollInfoV5,
                                                                            finalizeCore};
__attribute__((visibility("default"))) ncclTuner_v4_t ncclTunerPlugin_v4 = {"railnet", initV4, getCollInfoV5,
                                                                            finalizeCore};
__attribute__((visibility("default"))) ncclTuner_v3_t ncclTunerPlugin_v3 = {"railnet", initV3, getCollInfoV3,
                                                                            finalizeCore};
}  // extern "C"
