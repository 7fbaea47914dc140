// railnet-bench's command line and the sweep of message sizes it defines.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace railnet::bench {

constexpr size_t KiB = size_t{1} << 10;
constexpr size_t MiB = size_t{1} << 20;
constexpr size_t GiB = size_t{1} << 30;

struct Options {
  std::string plugin;  // empty: NetPlugin::defaultCandidates()
  size_t minSize = 8;
  size_t maxSize = 256 * MiB;
  size_t step = 4;
  double seconds = 0.5;  // timed part of each measurement
  double timeout = 30;   // stall limit
  int window = 8;
  std::string csv;
  std::string json;  // --json FILE: the rows as JSON Lines
  bool verbose = false;
  std::string device;           // --device: empty = the default loopback device ("lo", else device 0)
  std::string against = "raw";  // --against: "raw" (raw TCP) or a railnet device name (a+b fuses)
  bool oneWay = true;           // the one-way table (off with --bidir)
  bool bothWays = true;         // the both-directions table (off with --one-way)
  bool gpu = false;             // --gpu: the buffers are GPU memory (device 0), the raw baseline is CE+TCP
  int group = 1;                // --group N: grouped receives of N buffers against N single receives
  std::string to;               // --to DEVICE: railnet connects from --device to DEVICE's listener
  bool gin = false;             // --gin: railnet's GIN puts (iput/iputSignal) against its isend/irecv
  double timeline = 0;          // --timeline S: one way, --max-size messages, bandwidth per 100 ms for S seconds
  bool againstRaw() const { return against == "raw"; }
};

// Exits with status 2 and the usage text on a bad command line, 0 after --help.
Options parseOptions(int argc, char** argv);

// Powers of two from minSize to maxSize, `step` apart, anchored at maxSize so the round sizes (4 MiB, 16 MiB, ...)
// appear; minSize is always included.
std::vector<size_t> sweepSizes(const Options& options);

// The sizes of the both-ways table: the sweep's from 64 KiB up, plus the goal's 512 KiB and 4 MiB when they fit.
std::vector<size_t> bothWaysSizes(const Options& options);

// "8 B", "16 KiB", "4 MiB".
std::string sizeText(size_t size);

}  // namespace railnet::bench
