// Clear-to-send frames as the sender reads them off the control socket (TCP) or a SEND (verbs), in arbitrary
// pieces, then claimed by sends with the tags the rest of the input names. An odd first byte reads them as a verbs
// sender with path failover does, dropping repeated receives (clear_to_send.h).
#include <cstdint>
#include <string>

#include "fuzz_quiet.h"
#include "proxy/protocol/clear_to_send.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railnet::protocol::ClearToSendQueue queue;
  if (size > 0 && (data[0] & 1) != 0) queue.dropRepeatedReceives();
  const char* bytes = reinterpret_cast<const char*>(data);
  size_t offset = 0;
  std::string buffered;
  while (offset < size) {
    // The first byte of each round says how many bytes arrive now, as a socket may split anything.
    const size_t piece = 1 + static_cast<uint8_t>(bytes[offset++]);
    const size_t take = piece < size - offset ? piece : size - offset;
    buffered.append(bytes + offset, take);
    offset += take;
    std::string why;
    const long used = queue.parse(buffered.data(), buffered.size(), &why);
    if (used < 0) {
      if (why.empty()) __builtin_trap();  // an error must say why
      return 0;
    }
    if (static_cast<size_t>(used) > buffered.size()) __builtin_trap();
    buffered.erase(0, static_cast<size_t>(used));
    for (int tag = -1; tag < 4; ++tag) {
      if (auto claimed = queue.claim(tag)) {
        if (claimed->groupSize < 1 || claimed->groupSize > railnet::protocol::kMaxRecvs) __builtin_trap();
      }
    }
  }
  return 0;
}
