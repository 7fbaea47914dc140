// Two host helpers the GPU test programs share: a monotonic wall clock in seconds and printf into a std::string.
#pragma once

#include <stdarg.h>
#include <stdio.h>
#include <time.h>

#include <string>

inline double wallS() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

inline std::string fmt(const char* f, ...) __attribute__((format(printf, 1, 2)));
inline std::string fmt(const char* f, ...) {
  char b[1024];
  va_list ap;
  va_start(ap, f);
  vsnprintf(b, sizeof b, f, ap);
  va_end(ap);
  return b;
}
