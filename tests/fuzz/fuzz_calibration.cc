// The tuner's calibration CSV (RAILNET_TUNER_FILE), written by users or by railnet-tune.
#include <cstdint>
#include <sstream>
#include <string>

#include "fuzz_quiet.h"
#include "plugin/tuner/calibration.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  railnet::tuner::Calibration calibration;
  std::string error;
  if (!railnet::tuner::parseCalibration(in, &calibration, &error) && error.empty()) __builtin_trap();
  return 0;
}
