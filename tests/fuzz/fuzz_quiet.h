// Every fuzz target includes this: railnet's WARNs about bad input are the expected outcome here, and printing
// millions of them would slow the search to a crawl, so a logger that drops them is installed before the first
// input (railnet writes WARNs to stderr when no logger is set).
#pragma once

#include <cstddef>
#include <cstdint>

#include "railnet/log.h"

namespace fuzz {
inline void dropLog(ncclDebugLogLevel, unsigned long, const char*, int, const char*, ...) {}
}  // namespace fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  railnet::log::setLogger(fuzz::dropLog);
  return 0;
}
