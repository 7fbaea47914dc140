// The connect handle NCCL carries from the listening peer (128 bytes): railnet reads its addresses before it
// connects. Any bytes must give addresses or a railnet::Error, nothing else.
#include <cstdint>
#include <cstring>

#include "fuzz_quiet.h"
#include "proxy/protocol/wire.h"
#include "railnet/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railnet::protocol::Handle handle{};
  std::memcpy(&handle, data, size < sizeof(handle) ? size : sizeof(handle));
  try {
    for (const auto& address : railnet::protocol::handleAddresses(handle)) {
      if (address.address.length > sizeof(address.address.storage)) __builtin_trap();
    }
  } catch (const railnet::Error&) {
  }
  return 0;
}
