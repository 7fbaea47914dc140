// Logging through the logger NCCL hands to init(). railnet never writes to stdout: with no logger installed
// (command-line tools, unit tests) warnings go to stderr and everything else is dropped.
#pragma once

#include "railnet/nccl/common.h"

namespace railnet::log {

void setLogger(ncclDebugLogger_t logger) noexcept;
ncclDebugLogger_t logger() noexcept;

// printf-style; `flags` is an ncclDebugLogSubSys mask.
void write(ncclDebugLogLevel level, unsigned long flags, const char* file, int line, const char* fmt, ...) noexcept
    __attribute__((format(printf, 5, 6)));

}  // namespace railnet::log

#define RN_WARN(...) ::railnet::log::write(NCCL_LOG_WARN, NCCL_ALL, __FILE__, __LINE__, __VA_ARGS__)
#define RN_INFO(flags, ...) ::railnet::log::write(NCCL_LOG_INFO, (flags), __FILE__, __LINE__, __VA_ARGS__)
#define RN_TRACE(flags, ...) ::railnet::log::write(NCCL_LOG_TRACE, (flags), __FILE__, __LINE__, __VA_ARGS__)
