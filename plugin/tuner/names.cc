#include "plugin/tuner/names.h"

#include <array>
#include <cctype>
#include <string>

namespace railnet::tuner {
namespace {

constexpr std::array<const char*, 5> kColls = {"broadcast", "reduce", "allgather", "reducescatter", "allreduce"};
constexpr std::array<const char*, 7> kAlgos = {"tree", "ring", "collnet_direct", "collnet_chain",
                                               "nvls", "nvls_tree", "pat"};
constexpr std::array<const char*, 3> kProtos = {"ll", "ll128", "simple"};

std::string lower(std::string_view text, bool dropUnderscores) {
  std::string out;
  for (char c : text) {
    if (dropUnderscores && c == '_') continue;
    out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

template <size_t N>
int find(const std::array<const char*, N>& names, const std::string& wanted) {
  for (size_t i = 0; i < N; ++i) {
    if (wanted == names[i]) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace

const char* collName(int coll) noexcept { return coll >= 0 && coll < 5 ? kColls[coll] : nullptr; }
const char* algoName(int algo) noexcept { return algo >= 0 && algo < 7 ? kAlgos[algo] : nullptr; }
const char* protoName(int proto) noexcept { return proto >= 0 && proto < 3 ? kProtos[proto] : nullptr; }

int parseColl(std::string_view text) noexcept {
  try {
    std::string name = lower(text, /*dropUnderscores=*/true);
    if (name.ends_with("perf")) name.resize(name.size() - 4);
    return find(kColls, name);
  } catch (...) {
    return -1;
  }
}

int parseAlgo(std::string_view text) noexcept {
  try {
    return find(kAlgos, lower(text, false));
  } catch (...) {
    return -1;
  }
}

int parseProto(std::string_view text) noexcept {
  try {
    return find(kProtos, lower(text, false));
  } catch (...) {
    return -1;
  }
}

}  // namespace railnet::tuner
