#include "railnet/settings.h"

#include <cerrno>
#include <cstdlib>

#include "railnet/log.h"

namespace railnet {
namespace {

bool parseInt(const char* text, int64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  long long value = strtoll(text, &end, 0);
  if (errno != 0 || end == text) return false;
  // Accept the k/m/g suffixes users write for sizes.
  switch (*end) {
    case 'k': case 'K': value <<= 10; ++end; break;
    case 'm': case 'M': value <<= 20; ++end; break;
    case 'g': case 'G': value <<= 30; ++end; break;
    default: break;
  }
  if (*end != '\0') return false;
  *out = value;
  return true;
}

void assignString(std::string* field, const char* env, const char* value) {
  (void)env;
  *field = value;
}

void assignInt(int64_t* field, const char* env, const char* value) {
  int64_t parsed = 0;
  if (parseInt(value, &parsed)) {
    *field = parsed;
  } else {
    RN_WARN("NET/railnet: %s=\"%s\" is not an integer; using the default %lld", env, value,
            static_cast<long long>(*field));
  }
}

#define RAILNET_STRINGIFY_String(def) def
#define RAILNET_STRINGIFY_Int(def) #def

constexpr SettingInfo kTable[] = {
#define RAILNET_SETTING_ROW(type, field, env, def, doc) {#type, env, RAILNET_STRINGIFY_##type(def), doc},
    RAILNET_SETTINGS(RAILNET_SETTING_ROW)
#undef RAILNET_SETTING_ROW
};

const char* processEnv(const char* name) { return getenv(name); }

}  // namespace

Settings loadSettings(const char* (*lookup)(const char* name)) {
  Settings result;
#define RAILNET_SETTING_LOAD(type, field, env, def, doc) \
  if (const char* value = lookup(env)) assign##type(&result.field, env, value);
  RAILNET_SETTINGS(RAILNET_SETTING_LOAD)
#undef RAILNET_SETTING_LOAD
  return result;
}

const Settings& settings() {
  static const Settings instance = loadSettings(processEnv);
  return instance;
}

std::span<const SettingInfo> settingsTable() { return kTable; }

}  // namespace railnet
