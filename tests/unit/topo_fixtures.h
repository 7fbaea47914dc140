// The topology fixtures (tests/fixtures/topo/) the topo unit tests read.
#pragma once

#include <string>

inline std::string fixture(const char* name) {
  return std::string(RAILNET_SOURCE_DIR "/tests/fixtures/topo/") + name;
}
