// Every RAILNET_* value a user can set: the first byte picks the setting, the rest is its text. A value parses
// into range or is refused with a reason; never a crash, never a silent default.
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz_quiet.h"
#include "railnet/settings.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const railnet::SettingInfo& info : railnet::settingsTable()) all.push_back(info.env);
    return all;
  }();
  if (size == 0 || names.empty()) return 0;
  const std::string& name = names[data[0] % names.size()];
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  railnet::Settings settings;
  std::string error;
  if (!railnet::parseSetting(name.c_str(), text.c_str(), &settings, &error) && error.empty()) __builtin_trap();
  return 0;
}
