#include "railnet/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>

namespace railnet::log {
namespace {
std::atomic<ncclDebugLogger_t> gLogger{nullptr};
}

void setLogger(ncclDebugLogger_t logger) noexcept { gLogger.store(logger, std::memory_order_release); }

ncclDebugLogger_t logger() noexcept { return gLogger.load(std::memory_order_acquire); }

void write(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) noexcept {
  char message[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  if (ncclDebugLogger_t sink = logger()) {
    // NCCL formats with its own printf; pass the finished text as an argument so '%' in it is harmless.
    sink(level, flags, file, line, "%s", message);
  } else if (level == NCCL_LOG_WARN) {
    fprintf(stderr, "railnet WARN %s\n", message);
  }
}

}  // namespace railnet::log
