// The 48 bytes that open every socket a listener accepts, from anyone who can reach it.
#include <cstdint>
#include <cstring>

#include "fuzz_quiet.h"
#include "proxy/protocol/wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railnet::protocol::Hello hello{};
  std::memcpy(&hello, data, size < sizeof(hello) ? size : sizeof(hello));
  const uint64_t secret[2] = {0x0123456789abcdefULL, 0xfedcba9876543210ULL};
  if (railnet::protocol::validateHello(hello, secret) == nullptr) {
    // Accepted: the fields the listener then indexes with must be in range.
    if (hello.streamCount > railnet::protocol::kMaxStreams) __builtin_trap();
    if (hello.role == 1 && hello.streamIndex >= hello.streamCount) __builtin_trap();
  }
  return 0;
}
