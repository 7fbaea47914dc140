#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

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

namespace {
// The errors of loading exactly {env=value}.
std::vector<std::string> errorsFor(const std::string& env, const std::string& value) {
  gEnv = {{env, value}};
  return railnet::loadSettings(fakeEnv).errors;
}

bool namesVariable(const std::vector<std::string>& errors, const std::string& env, const std::string& value) {
  return errors.size() == 1 && errors[0].rfind(env + "=\"" + value + "\": ", 0) == 0 &&
         errors[0].find("; allowed: ") != std::string::npos;
}
}  // namespace

TEST_CASE("the defaults, spelled as the table shows them, parse without errors", "[settings]") {
  gEnv.clear();
  CHECK(railnet::loadSettings(fakeEnv).errors.empty());
  for (const railnet::SettingInfo& row : railnet::settingsTable()) {
    INFO(row.env << "=" << row.defaultValue);
    gEnv = {{row.env, row.defaultValue}};
    railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
    CHECK(loaded.errors.empty());
    CHECK(!row.allowed.empty());
  }
  railnet::Settings defaults;
  CHECK(defaults.transport == railnet::TransportChoice::kAuto);
  CHECK(defaults.ibFlush == railnet::FlushMode::kAuto);
  CHECK(defaults.socketFamily == railnet::AddressFamily::kAny);
  CHECK(defaults.ibAddrFamily == railnet::AddressFamily::kInet);
  CHECK(defaults.tuner);
  CHECK(!defaults.tunerModel);  // opt-in (D63)
}

TEST_CASE("every enum setting rejects a bogus value, naming the variable, the value and what is allowed",
          "[settings]") {
  int enums = 0;
  for (const railnet::SettingInfo& row : railnet::settingsTable()) {
    if (std::string(row.type) != "Enum") continue;
    ++enums;
    INFO(row.env);
    std::vector<std::string> errors = errorsFor(row.env, "bogus");
    CHECK(namesVariable(errors, row.env, "bogus"));
    if (!errors.empty()) CHECK(errors[0].find(row.allowed) != std::string::npos);
  }
  CHECK(enums == 7);
  CHECK(errorsFor("RAILNET_TRANSPORT", "bogus") ==
        std::vector<std::string>{"RAILNET_TRANSPORT=\"bogus\": not a known value; allowed: auto, tcp, verbs"});
  // Empty is a value only where it was accepted before.
  CHECK(errorsFor("RAILNET_SOCKET_FAMILY", "").empty());
  CHECK(errorsFor("RAILNET_IB_FLUSH", "").empty());
  CHECK(namesVariable(errorsFor("RAILNET_TRANSPORT", ""), "RAILNET_TRANSPORT", ""));
  CHECK(namesVariable(errorsFor("RAILNET_IB_ADDR_FAMILY", ""), "RAILNET_IB_ADDR_FAMILY", ""));
  CHECK(namesVariable(errorsFor("RAILNET_TUNER", ""), "RAILNET_TUNER", ""));
}

TEST_CASE("enum settings parse every spelling users have", "[settings]") {
  gEnv = {{"RAILNET_TRANSPORT", "verbs"}, {"RAILNET_IB_FLUSH", "1"},     {"RAILNET_SOCKET_FAMILY", "ipv6"},
          {"RAILNET_IB_ADDR_FAMILY", "AF_INET6"}, {"RAILNET_TUNER", "off"}, {"RAILNET_TUNER_MODEL", "0"}};
  railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.errors.empty());
  CHECK(loaded.values.transport == railnet::TransportChoice::kVerbs);
  CHECK(loaded.values.ibFlush == railnet::FlushMode::kAlways);
  CHECK(loaded.values.socketFamily == railnet::AddressFamily::kInet6);
  CHECK(loaded.values.ibAddrFamily == railnet::AddressFamily::kInet6);
  CHECK(!loaded.values.tuner);
  CHECK(!loaded.values.tunerModel);
  gEnv = {{"RAILNET_TRANSPORT", "tcp"}, {"RAILNET_IB_FLUSH", "0"}, {"RAILNET_SOCKET_FAMILY", "AF_INET"},
          {"RAILNET_TUNER", "yes"}, {"RAILNET_TUNER_MODEL", "false"}};
  loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.errors.empty());
  CHECK(loaded.values.transport == railnet::TransportChoice::kTcp);
  CHECK(loaded.values.ibFlush == railnet::FlushMode::kNever);
  CHECK(loaded.values.socketFamily == railnet::AddressFamily::kInet);
  CHECK(loaded.values.tuner);
  CHECK(!loaded.values.tunerModel);
}

TEST_CASE("integer settings are rejected below and above their range, never clamped", "[settings]") {
  struct Case {
    const char* env;
    const char* below;
    const char* lowest;
    const char* highest;
    const char* above;  // nullptr: no upper end short of 64 bits
  };
  const Case cases[] = {
      {"RAILNET_TCP_STREAMS", "0", "1", "64", "65"},
      {"RAILNET_TCP_THREADS", "-1", "0", "64", "65"},
      {"RAILNET_TCP_SPIN_US", "-1", "0", "1000000", "1000001"},
      {"RAILNET_IB_TIMEOUT", "0", "1", "31", "32"},
      {"RAILNET_IB_RETRY_CNT", "-1", "0", "7", "8"},
      {"RAILNET_IB_QPS_PER_CONNECTION", "0", "1", "8", "9"},
      {"RAILNET_IB_GID_INDEX", "-2", "-1", "255", "256"},
      {"RAILNET_IB_TC", "-1", "0", "255", "256"},
      {"RAILNET_IB_SL", "-1", "0", "15", "16"},
      {"RAILNET_WRITE_NCCL_TOPO", "-1", "0", "1", "2"},
      {"RAILNET_STRAY_TIMEOUT_MS", "0", "1", "2147483647", "2147483648"},
      {"RAILNET_PEER_TIMEOUT_MS", "-1", "0", "2g-1", "2g"},
      {"RAILNET_TCP_SOCKET_BUFFER_BYTES", "-1", "0", "2147483647", "2g"},
      {"RAILNET_TCP_MIN_CHUNK_BYTES", "4095", "4k", "1g", nullptr},
      {"RAILNET_TCP_INLINE_BYTES", "-1", "0", "8g", nullptr},
      {"RAILNET_FUSION_MIN_STRIPE_BYTES", "-1k", "0", "1g", nullptr},
  };
  for (const Case& c : cases) {
    INFO(c.env);
    CHECK(namesVariable(errorsFor(c.env, c.below), c.env, c.below));
    if (std::string(c.highest) != "2g-1") CHECK(errorsFor(c.env, c.highest).empty());
    CHECK(errorsFor(c.env, c.lowest).empty());
    if (c.above != nullptr) CHECK(namesVariable(errorsFor(c.env, c.above), c.env, c.above));
  }
  CHECK(errorsFor("RAILNET_TCP_STREAMS", "65") ==
        std::vector<std::string>{"RAILNET_TCP_STREAMS=\"65\": out of range; allowed: 1..64"});
  CHECK(errorsFor("RAILNET_TCP_MIN_CHUNK_BYTES", "1k") ==
        std::vector<std::string>{"RAILNET_TCP_MIN_CHUNK_BYTES=\"1k\": out of range; allowed: >= 4096"});
  // A rejected value is reported, and the field is left at its default (which init then refuses to run with).
  gEnv = {{"RAILNET_TCP_STREAMS", "100"}};
  railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.values.tcpStreams == 8);
  CHECK(loaded.errors.size() == 1);
}

TEST_CASE("integer settings take k, m and g suffixes and reject other text", "[settings]") {
  gEnv = {{"RAILNET_TCP_INLINE_BYTES", "8k"}, {"RAILNET_TCP_MIN_CHUNK_BYTES", "2M"},
          {"RAILNET_FUSION_MIN_STRIPE_BYTES", "1g"}, {"RAILNET_TCP_SPIN_US", "0x10"}};
  railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.errors.empty());
  CHECK(loaded.values.tcpInlineBytes == 8 * 1024);
  CHECK(loaded.values.tcpMinChunkBytes == 2 * 1024 * 1024);
  CHECK(loaded.values.fusionMinStripeBytes == 1024LL * 1024 * 1024);
  CHECK(loaded.values.tcpSpinUs == 16);
  for (const char* bad : {"", "many", "12x", "4kb", "1t", " ", "99999999999999999999", "9000000000000g"}) {
    INFO(bad);
    std::vector<std::string> errors = errorsFor("RAILNET_TCP_INLINE_BYTES", bad);
    CHECK(namesVariable(errors, "RAILNET_TCP_INLINE_BYTES", bad));
    if (!errors.empty()) CHECK(errors[0].find("not an integer") != std::string::npos);
  }
}

TEST_CASE("the malformed values of the test above are errors, not silent defaults", "[settings]") {
  gEnv = {{"RAILNET_TCP_STREAMS", "many"}, {"RAILNET_TCP_SPIN_US", "12x"}};
  railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
  REQUIRE(loaded.errors.size() == 2);
  CHECK(loaded.errors[0].rfind("RAILNET_TCP_STREAMS=\"many\": not an integer", 0) == 0);
  CHECK(loaded.errors[1].rfind("RAILNET_TCP_SPIN_US=\"12x\": not an integer", 0) == 0);
}

TEST_CASE("parseSetting parses one variable and refuses names that are not settings", "[settings]") {
  railnet::Settings parsed;
  std::string error;
  CHECK(railnet::parseSetting("RAILNET_IFNAME", "eth0", &parsed, &error));
  CHECK(parsed.ifname == "eth0");
  CHECK(!railnet::parseSetting("RAILNET_NO_SUCH_THING", "1", &parsed, &error));
  CHECK(error == "RAILNET_NO_SUCH_THING is not a railnet setting");
}

TEST_CASE("NCCL's name decides a setting railnet's leaves unset; railnet's wins", "[settings]") {
  gEnv = {{"NCCL_SOCKET_IFNAME", "=eth1"}, {"NCCL_IB_HCA", "mlx5_0:1"}, {"NCCL_IB_TC", "106"},
          {"NCCL_SOCKET_FAMILY", "AF_INET6"}, {"NCCL_IB_SL", "3"}, {"RAILNET_IB_SL", "5"}};
  const railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.errors.empty());
  CHECK(loaded.warnings.empty());
  CHECK(loaded.values.ifname == "=eth1");
  CHECK(loaded.values.ibHca == "mlx5_0:1");
  CHECK(loaded.values.ibTrafficClass == 106);
  CHECK(loaded.values.socketFamily == railnet::AddressFamily::kInet6);
  CHECK(loaded.values.ibServiceLevel == 5);  // RAILNET_IB_SL wins over NCCL_IB_SL
  auto source = [&](const std::string& setting) {
    for (const railnet::SettingSource& s : loaded.sources) {
      if (s.setting == setting) return s.variable + "=" + s.value;
    }
    return std::string("(default)");
  };
  CHECK(source("RAILNET_IFNAME") == "NCCL_SOCKET_IFNAME==eth1");
  CHECK(source("RAILNET_IB_SL") == "RAILNET_IB_SL=5");
  CHECK(source("RAILNET_TCP_STREAMS") == "(default)");
}

TEST_CASE("NCCL values outside railnet's range are clamped, unreadable ones ignored, with warnings", "[settings]") {
  gEnv = {{"NCCL_IB_QPS_PER_CONNECTION", "16"}, {"NCCL_IB_GID_INDEX", "three"}, {"NCCL_IB_ADDR_FAMILY", "AF_UNIX"}};
  const railnet::LoadedSettings loaded = railnet::loadSettings(fakeEnv);
  CHECK(loaded.errors.empty());  // a job valid for NCCL must not fail railnet's init
  REQUIRE(loaded.warnings.size() == 3);
  CHECK(loaded.values.ibQpsPerConnection == 8);  // clamped to railnet's 1..8
  auto warned = [&](const char* variable) {
    for (const std::string& warning : loaded.warnings) {
      if (warning.find(variable) != std::string::npos) return true;
    }
    return false;
  };
  CHECK(warned("NCCL_IB_QPS_PER_CONNECTION"));
  CHECK(warned("NCCL_IB_GID_INDEX"));
  CHECK(warned("NCCL_IB_ADDR_FAMILY"));
  CHECK(loaded.values.ibGidIndex == -1);  // default kept
  CHECK(loaded.values.ibAddrFamily == railnet::AddressFamily::kInet);
}

TEST_CASE("every NCCL fallback names a railnet setting that exists", "[settings]") {
#define CHECK_FALLBACK(railnetName, ncclName)                                  \
  {                                                                            \
    railnet::Settings scratch;                                                 \
    std::string error;                                                         \
    CHECK(std::string(railnet::ncclFallbackFor(railnetName)) == (ncclName));  \
    railnet::parseSetting(railnetName, "", &scratch, &error);                  \
    CHECK(error.find("is not a railnet setting") == std::string::npos);        \
  }
  RAILNET_NCCL_FALLBACKS(CHECK_FALLBACK)
#undef CHECK_FALLBACK
  CHECK(railnet::ncclFallbackFor("RAILNET_TCP_STREAMS") == nullptr);
}
