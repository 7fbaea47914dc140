#include "plugin/tools/tests_log.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "plugin/tuner/names.h"

namespace railnet::tuner {
namespace {

// "key=value" out of a "# railnet-tune: ..." line.
std::string field(const std::string& line, const std::string& key) {
  size_t at = line.find(key + "=");
  if (at == std::string::npos) return "";
  size_t begin = at + key.size() + 1;
  size_t end = line.find_first_of(" \t", begin);
  return line.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
}

}  // namespace

// Reads one nccl-tests log. Rows: size count type redop root time algbw busbw #wrong (out-of-place), then the
// same three numbers and #wrong in place; the time is the mean of the two.
bool readTestsLog(const std::string& path, TestsLog* out, std::string* why) {
  std::ifstream in(path);
  if (!in) return *why = "cannot open", false;
  // File name COLL__ALGO_PROTO.log, as scripts/gpu/tuner-sweep.sh writes.
  std::string base = path.substr(path.find_last_of('/') + 1);
  if (size_t dot = base.rfind(".log"); dot != std::string::npos) base.resize(dot);
  if (size_t sep = base.find("__"); sep != std::string::npos) {
    out->coll = parseColl(base.substr(0, sep));
    std::string combo = base.substr(sep + 2);
    if (size_t under = combo.find('_'); under != std::string::npos) {
      out->algo = parseAlgo(combo.substr(0, under));
      out->proto = parseProto(combo.substr(under + 1));
    }
  }
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("# railnet-tune:", 0) == 0) {
      if (int c = parseColl(field(line, "coll")); c >= 0) out->coll = c;
      if (int a = parseAlgo(field(line, "algo")); a >= 0) out->algo = a;
      if (int p = parseProto(field(line, "proto")); p >= 0) out->proto = p;
      if (std::string c = field(line, "channels"); !c.empty()) {
        int channels = std::atoi(c.c_str());
        out->channels = channels >= 1 && channels <= 64 ? channels : -1;
      }
      continue;
    }
    if (size_t at = line.find("Collective test starting:"); at != std::string::npos) {
      std::string name = line.substr(at + 25);
      name.erase(0, name.find_first_not_of(' '));
      if (int c = parseColl(name.substr(0, name.find_first_of(" \t"))); c >= 0) out->coll = c;
      continue;
    }
    std::istringstream words(line);
    std::vector<std::string> tokens;
    for (std::string word; words >> word;) tokens.push_back(word);
    if (tokens.size() >= 3 && tokens[0] == "#" && tokens[1] == "Rank") ++out->ranks;
    if (tokens.size() < 9 || tokens[0].find_first_not_of("0123456789") != std::string::npos) continue;
    auto number = [](const std::string& text, double* value) {
      char* end = nullptr;
      *value = std::strtod(text.c_str(), &end);
      return end != text.c_str() && *end == '\0' && std::isfinite(*value);
    };
    double time = 0, busbw = 0, inTime = 0, inBusbw = 0;
    if (!number(tokens[5], &time) || !number(tokens[7], &busbw)) continue;
    int samples = 1;
    if (tokens.size() >= 13 && number(tokens[9], &inTime) && number(tokens[11], &inBusbw)) {
      time += inTime;
      busbw += inBusbw;
      samples = 2;
    }
    CalRow row;
    row.minBytes = row.maxBytes = std::strtoull(tokens[0].c_str(), nullptr, 10);
    row.timeUs = time / samples;
    row.busbwGBs = busbw / samples;
    if (row.minBytes == 0 || row.timeUs <= 0) continue;
    out->rows.push_back(row);
  }
  if (out->coll < 0) return *why = "collective unknown", false;
  if (out->algo < 0 || out->proto < 0) return *why = "no forced algorithm/protocol (name it COLL__ALGO_PROTO.log)", false;
  if (out->rows.empty()) return *why = "no result rows", false;
  return true;
}


}  // namespace railnet::tuner
