// railnet's exception for setup paths (listen/connect/accept/registration). Hot paths return ncclResult_t
// instead; every ABI entry point converts an Error into its code and logs its message.
#pragma once

#include <cstdarg>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "railnet/nccl/common.h"

namespace railnet {

class Error : public std::runtime_error {
 public:
  Error(ncclResult_t code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ncclResult_t code() const noexcept { return code_; }

 private:
  ncclResult_t code_;
};

// Throw an Error with a printf-formatted message.
[[noreturn]] void fail(ncclResult_t code, const char* fmt, ...) __attribute__((format(printf, 2, 3)));

// strerror(errno) as a std::string, thread-safe.
std::string errnoText(int err);

}  // namespace railnet
