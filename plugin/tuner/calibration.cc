#include "plugin/tuner/calibration.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "plugin/tuner/names.h"

namespace railnet::tuner {
namespace {

std::string trim(const std::string& text) {
  size_t begin = text.find_first_not_of(" \t\r");
  if (begin == std::string::npos) return "";
  size_t end = text.find_last_not_of(" \t\r");
  return text.substr(begin, end - begin + 1);
}

bool parseInteger(const std::string& text, long long lo, long long hi, long long* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || value < lo || value > hi) return false;
  *out = value;
  return true;
}

bool parseUnsigned(const std::string& text, uint64_t* out) {
  if (text.empty() || text[0] == '-') return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long value = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = value;
  return true;
}

bool parseDouble(const std::string& text, double* out) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(value)) return false;
  *out = value;
  return true;
}

// Parses one non-comment line; returns an empty string or why it is bad.
std::string parseLine(const std::string& line, CalRow* row) {
  std::vector<std::string> fields;
  std::stringstream stream(line);
  std::string field;
  while (std::getline(stream, field, ',')) fields.push_back(trim(field));
  if (!line.empty() && line.back() == ',') fields.emplace_back();
  if (fields.size() < 8 || fields.size() > 13) {
    return "expected 8 to 13 comma-separated fields, found " + std::to_string(fields.size());
  }
  row->coll = parseColl(fields[0]);
  if (row->coll < 0) return "unknown collective '" + fields[0] + "'";
  if (!parseUnsigned(fields[1], &row->minBytes)) return "bad min_bytes '" + fields[1] + "'";
  if (!parseUnsigned(fields[2], &row->maxBytes)) return "bad max_bytes '" + fields[2] + "'";
  if (row->maxBytes < row->minBytes) return "max_bytes is below min_bytes";
  row->algo = parseAlgo(fields[3]);
  if (row->algo < 0) return "unknown algorithm '" + fields[3] + "'";
  row->proto = parseProto(fields[4]);
  if (row->proto < 0) return "unknown protocol '" + fields[4] + "'";
  long long value = 0;
  struct IntField {
    size_t index;
    const char* name;
    long long lo, hi;
    int* out;
  };
  const IntField ints[] = {{5, "channels", -1, 64, &row->channels},      {6, "nNodes", -1, 1 << 20, &row->nNodes},
                           {7, "nRanks", -1, 1 << 24, &row->nRanks},      {8, "numPipeOps", -1, 1 << 20, &row->numPipeOps},
                           {9, "regBuff", -1, 1, &row->regBuff}};
  for (const IntField& spec : ints) {
    if (spec.index >= fields.size() || fields[spec.index].empty()) continue;
    if (!parseInteger(fields[spec.index], spec.lo, spec.hi, &value) || (value == 0 && spec.index <= 7)) {
      return std::string("bad ") + spec.name + " '" + fields[spec.index] + "'";
    }
    *spec.out = static_cast<int>(value);
  }
  if (fields.size() > 10 && !fields[10].empty() && !parseDouble(fields[10], &row->timeUs)) {
    return "bad time_us '" + fields[10] + "'";
  }
  if (fields.size() > 11 && !fields[11].empty() && !parseDouble(fields[11], &row->busbwGBs)) {
    return "bad busbw_gbs '" + fields[11] + "'";
  }
  if (fields.size() > 12 && !fields[12].empty() && !parseUnsigned(fields[12], &row->chunkBytes)) {
    return "bad chunk_bytes '" + fields[12] + "'";
  }
  if (row->isMeasurement() && row->minBytes != row->maxBytes) {
    return "a measurement (time_us > 0) needs min_bytes == max_bytes";
  }
  return "";
}

}  // namespace

bool parseCalibration(std::istream& in, Calibration* out, std::string* error) {
  Calibration parsed;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    std::string text = trim(line);
    if (text.empty() || text[0] == '#') continue;
    CalRow row;
    std::string why = parseLine(text, &row);
    if (!why.empty()) {
      *error = "line " + std::to_string(number) + ": " + why;
      return false;
    }
    parsed.rows.push_back(row);
  }
  *out = std::move(parsed);
  return true;
}

bool loadCalibration(const std::string& path, Calibration* out, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot open " + path;
    return false;
  }
  if (!parseCalibration(in, out, error)) {
    *error = path + ": " + *error;
    return false;
  }
  return true;
}

std::string formatRow(const CalRow& row) {
  char line[320];
  std::snprintf(line, sizeof(line), "%s,%llu,%llu,%s,%s,%d,%d,%d,%d,%d,%.3f,%.3f,%llu", collName(row.coll),
                static_cast<unsigned long long>(row.minBytes), static_cast<unsigned long long>(row.maxBytes),
                algoName(row.algo), protoName(row.proto), row.channels, row.nNodes, row.nRanks, row.numPipeOps,
                row.regBuff, row.timeUs, row.busbwGBs, static_cast<unsigned long long>(row.chunkBytes));
  return line;
}

const char* calibrationHeader() {
  return "# railnet tuner calibration: NCCL's example tuner CSV plus time_us, busbw_gbs, chunk_bytes\n"
         "# collective,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks,numPipeOps,regBuff,"
         "time_us,busbw_gbs,chunk_bytes\n";
}

}  // namespace railnet::tuner
