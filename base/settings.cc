#include "railnet/settings.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstddef>
#include <cstring>
#include <limits>

namespace railnet {
namespace {

template <class T>
struct Spelling {
  const char* text;
  T value;
};

// Decimal, 0x hex or 0 octal, with an optional k/m/g suffix (KiB, MiB, GiB). False when it does not parse or
// does not fit in 64 bits.
bool parseInt(const char* text, int64_t* out) {
  if (text == nullptr || *text == '\0') return false;
  errno = 0;
  char* end = nullptr;
  long long value = strtoll(text, &end, 0);
  if (errno != 0 || end == text) return false;
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; ++end; break;
    case 'm': case 'M': shift = 20; ++end; break;
    case 'g': case 'G': shift = 30; ++end; break;
    default: break;
  }
  if (*end != '\0') return false;
  const long long limit = std::numeric_limits<long long>::max() >> shift;
  if (value > limit || value < -limit) return false;
  *out = value * (1LL << shift);
  return true;
}

std::string quoted(const char* env, const char* text) { return std::string(env) + "=\"" + text + "\""; }

std::string rangeText(int64_t min, int64_t max) {
  if (max == kSizeMax) return ">= " + std::to_string(min);
  return std::to_string(min) + ".." + std::to_string(max);
}

template <class T, std::size_t N>
std::string spellingsText(const Spelling<T> (&spellings)[N]) {
  std::string text;
  for (const Spelling<T>& spelling : spellings) {
    if (!text.empty()) text += ", ";
    text += *spelling.text == '\0' ? "\"\" (empty)" : spelling.text;
  }
  return text;
}

template <class T, std::size_t N>
std::string defaultSpelling(const Spelling<T> (&spellings)[N], T value) {
  for (const Spelling<T>& spelling : spellings) {
    if (spelling.value == value) return spelling.text;
  }
  return "?";
}

bool parseString(const char* text, std::string* field, std::string*) {
  *field = text;
  return true;
}

bool parseIntField(const char* env, const char* text, int64_t min, int64_t max, int64_t* field,
                   std::string* error) {
  int64_t value = 0;
  if (!parseInt(text, &value)) {
    *error = quoted(env, text) + ": not an integer (k, m, g suffixes allowed); allowed: " + rangeText(min, max);
    return false;
  }
  if (value < min || value > max) {
    *error = quoted(env, text) + ": out of range; allowed: " + rangeText(min, max);
    return false;
  }
  *field = value;
  return true;
}

template <class T, std::size_t N>
bool parseEnumField(const char* env, const char* text, const Spelling<T> (&spellings)[N], T* field,
                    std::string* error) {
  for (const Spelling<T>& spelling : spellings) {
    if (std::strcmp(spelling.text, text) == 0) {
      *field = spelling.value;
      return true;
    }
  }
  *error = quoted(env, text) + ": not a known value; allowed: " + spellingsText(spellings);
  return false;
}

// An integer setting from NCCL's name: clamped into railnet's range, or left at its default when it does not parse.
void loadIntFallback(const char* env, const char* nccl, const char* text, int64_t min, int64_t max, int64_t* field,
                     LoadedSettings* result) {
  int64_t value = 0;
  if (!parseInt(text, &value)) {
    result->warnings.push_back(quoted(nccl, text) + ": not an integer; railnet keeps " + env + "'s default " +
                               std::to_string(*field));
    return;
  }
  const int64_t used = std::clamp(value, min, max);
  if (used != value) {
    result->warnings.push_back(quoted(nccl, text) + " is outside railnet's range for " + env + " (" +
                               rangeText(min, max) + "): railnet uses " + std::to_string(used));
  }
  *field = used;
  result->sources.push_back({env, nccl, std::to_string(used)});
}

// Each enum row's spellings, as kSpellings_<field>.
#define RAILNET_SETTING_SPELLINGS_String(field, allowed)
#define RAILNET_SETTING_SPELLINGS_Int(field, allowed)
#define RAILNET_SETTING_SPELLINGS_Enum(field, allowed) \
  constexpr Spelling<RAILNET_SETTING_FIRST allowed> kSpellings_##field[] = {RAILNET_SETTING_REST allowed};
#define RAILNET_SETTING_SPELLINGS(type, field, env, def, allowed, doc) \
  RAILNET_SETTING_SPELLINGS_##type(field, allowed)
RAILNET_SETTINGS(RAILNET_SETTING_SPELLINGS)
#undef RAILNET_SETTING_SPELLINGS

std::vector<SettingInfo> buildTable() {
  std::vector<SettingInfo> table;
  const Settings defaults;
#define RAILNET_SETTING_INFO_String(field, def, allowed) std::string(def), std::string("any string")
#define RAILNET_SETTING_INFO_Int(field, def, allowed) \
  std::to_string(defaults.field), rangeText(RAILNET_SETTING_FIRST allowed, RAILNET_SETTING_SECOND allowed)
#define RAILNET_SETTING_INFO_Enum(field, def, allowed) \
  defaultSpelling(kSpellings_##field, defaults.field), spellingsText(kSpellings_##field)
#define RAILNET_SETTING_INFO(type, field, env, def, allowed, doc) \
  table.push_back(SettingInfo{#type, env, RAILNET_SETTING_INFO_##type(field, def, allowed), doc});
  RAILNET_SETTINGS(RAILNET_SETTING_INFO)
#undef RAILNET_SETTING_INFO
  return table;
}

const char* processEnv(const char* name) { return getenv(name); }

const LoadedSettings& processSettings() {
  static const LoadedSettings instance = loadSettings(processEnv);
  return instance;
}

}  // namespace

bool parseSetting(const char* env, const char* text, Settings* out, std::string* error) {
#define RAILNET_SETTING_PARSE_String(field, env, allowed) parseString(text, &out->field, error)
#define RAILNET_SETTING_PARSE_Int(field, env, allowed) \
  parseIntField(env, text, RAILNET_SETTING_FIRST allowed, RAILNET_SETTING_SECOND allowed, &out->field, error)
#define RAILNET_SETTING_PARSE_Enum(field, env, allowed) \
  parseEnumField(env, text, kSpellings_##field, &out->field, error)
#define RAILNET_SETTING_PARSE(type, field, name, def, allowed, doc) \
  if (std::strcmp(env, name) == 0) return RAILNET_SETTING_PARSE_##type(field, name, allowed);
  RAILNET_SETTINGS(RAILNET_SETTING_PARSE)
#undef RAILNET_SETTING_PARSE
  *error = std::string(env) + " is not a railnet setting";
  return false;
}

const char* ncclFallbackFor(const char* railnetName) {
#define RAILNET_FALLBACK_FIND(railnet, nccl) \
  if (std::strcmp(railnetName, railnet) == 0) return nccl;
  RAILNET_NCCL_FALLBACKS(RAILNET_FALLBACK_FIND)
#undef RAILNET_FALLBACK_FIND
  return nullptr;
}

LoadedSettings loadSettings(const char* (*lookup)(const char* name)) {
  LoadedSettings result;
  // NCCL's name, when railnet's is unset: the same parser; what NCCL allows but railnet does not is clamped (ints)
  // or left at the default (anything else), with a warning instead of an error.
#define RAILNET_FALLBACK_String(field, env, nccl, text, allowed) \
  result.values.field = text;                                     \
  result.sources.push_back({env, nccl, text});
#define RAILNET_FALLBACK_Int(field, env, nccl, text, allowed) \
  loadIntFallback(env, nccl, text, RAILNET_SETTING_FIRST allowed, RAILNET_SETTING_SECOND allowed, &result.values.field, &result);
#define RAILNET_FALLBACK_Enum(field, env, nccl, text, allowed)                                       \
  {                                                                                                   \
    std::string error;                                                                                \
    if (parseEnumField(nccl, text, kSpellings_##field, &result.values.field, &error)) {             \
      result.sources.push_back({env, nccl, text});                                                   \
    } else {                                                                                          \
      result.warnings.push_back(error + "; railnet keeps " + std::string(env) + "'s default");      \
    }                                                                                                 \
  }
#define RAILNET_SETTING_LOAD(type, field, env, def, allowed, doc)                                      \
  if (const char* value = lookup(env)) {                                                              \
    std::string error;                                                                                \
    if (parseSetting(env, value, &result.values, &error)) {                                           \
      result.sources.push_back({env, env, value});                                                    \
    } else {                                                                                          \
      result.errors.push_back(std::move(error));                                                      \
    }                                                                                                 \
  } else if (const char* nccl = ncclFallbackFor(env); nccl != nullptr && lookup(nccl) != nullptr) {  \
    const char* text = lookup(nccl);                                                                  \
    RAILNET_FALLBACK_##type(field, env, nccl, text, allowed)                                          \
  }
  RAILNET_SETTINGS(RAILNET_SETTING_LOAD)
#undef RAILNET_SETTING_LOAD
#undef RAILNET_FALLBACK_String
#undef RAILNET_FALLBACK_Int
#undef RAILNET_FALLBACK_Enum
  return result;
}

const Settings& settings() { return processSettings().values; }

const std::vector<std::string>& settingsErrors() { return processSettings().errors; }

const std::vector<std::string>& settingsWarnings() { return processSettings().warnings; }

const std::vector<SettingSource>& settingsSources() { return processSettings().sources; }

std::span<const SettingInfo> settingsTable() {
  static const std::vector<SettingInfo> table = buildTable();
  return table;
}

}  // namespace railnet
