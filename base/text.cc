#include "railnet/text.h"

#include <cstdarg>
#include <cstdio>

namespace railnet {

std::string textf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int length = vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string out;
  if (length > 0) {
    out.resize(static_cast<size_t>(length) + 1);
    vsnprintf(out.data(), out.size(), fmt, again);
    out.resize(static_cast<size_t>(length));
  }
  va_end(again);
  return out;
}

}  // namespace railnet
