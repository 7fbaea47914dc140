#include "railnet/error.h"

#include <cstring>

namespace railnet {

void fail(ncclResult_t code, const char* fmt, ...) {
  char message[1024];
  va_list args;
  va_start(args, fmt);
  vsnprintf(message, sizeof(message), fmt, args);
  va_end(args);
  throw Error(code, message);
}

std::string errnoText(int err) {
  char buffer[256];
  // GNU strerror_r returns the message pointer, which may not be `buffer`.
  const char* text = strerror_r(err, buffer, sizeof(buffer));
  return text;
}

}  // namespace railnet
