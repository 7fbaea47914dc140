// Random bytes from the kernel (getrandom(2): the pool behind /dev/urandom), for every secret a railnet listener
// hands out (the listen handle's, the doorbell unique id's) and for connection ids. docs/security.md says what
// the secrets defend. Header-only, so the doorbell bootstrap and the handshake share it without a new source.
#pragma once

#include <sys/random.h>
#include <sys/types.h>

#include <cerrno>
#include <cstddef>

#include "railnet/error.h"

namespace railnet::protocol {

// Fills `size` bytes at `out`. Throws railnet::Error (ncclSystemError) when the kernel cannot.
inline void randomBytes(void* out, size_t size) {
  auto* bytes = static_cast<char*>(out);
  while (size > 0) {
    const ssize_t got = getrandom(bytes, size, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      fail(ncclSystemError, "NET/railnet: getrandom failed: %s", errnoText(err).c_str());
    }
    bytes += got;
    size -= static_cast<size_t>(got);
  }
}

}  // namespace railnet::protocol
