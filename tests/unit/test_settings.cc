#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "railnet/settings.h"

namespace {
std::map<std::string, std::string> gEnv;
const char* fakeEnv(const char* name) {
  auto it = gEnv.find(name);
  return it == gEnv.end() ? nullptr : it->second.c_str();
}
}  // namespace

TEST_CASE("settings take their defaults when the environment is empty", "[settings]") {
  gEnv.clear();
  railnet::Settings loaded = railnet::loadSettings(fakeEnv);
  railnet::Settings defaults;
  CHECK(loaded.tcpStreams == defaults.tcpStreams);
  CHECK(loaded.ifname == defaults.ifname);
  CHECK(loaded.tcpInlineBytes == 65536);
}

TEST_CASE("settings parse integers with size suffixes and strings verbatim", "[settings]") {
  gEnv = {{"RAILNET_TCP_STREAMS", "16"}, {"RAILNET_TCP_MIN_CHUNK_BYTES", "128k"}, {"RAILNET_IFNAME", "^docker,lo"},
          {"RAILNET_TCP_SOCKET_BUFFER_BYTES", "4M"}};
  railnet::Settings loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.tcpStreams == 16);
  CHECK(loaded.tcpMinChunkBytes == 128 * 1024);
  CHECK(loaded.tcpSocketBufferBytes == 4 * 1024 * 1024);
  CHECK(loaded.ifname == "^docker,lo");
}

TEST_CASE("a malformed integer keeps the default", "[settings]") {
  gEnv = {{"RAILNET_TCP_STREAMS", "many"}, {"RAILNET_TCP_SPIN_US", "12x"}};
  railnet::Settings loaded = railnet::loadSettings(fakeEnv);
  railnet::Settings defaults;
  CHECK(loaded.tcpStreams == defaults.tcpStreams);
  CHECK(loaded.tcpSpinUs == defaults.tcpSpinUs);
}

TEST_CASE("every setting is named RAILNET_*, documented, and listed in the README", "[settings]") {
  std::ifstream readme(RAILNET_SOURCE_DIR "/README.md");
  REQUIRE(readme.good());
  std::stringstream text;
  text << readme.rdbuf();
  for (const railnet::SettingInfo& row : railnet::settingsTable()) {
    INFO(row.env);
    CHECK(std::strncmp(row.env, "RAILNET_", 8) == 0);
    CHECK(std::strlen(row.doc) > 20);
    CHECK(text.str().find(row.env) != std::string::npos);
  }
}
