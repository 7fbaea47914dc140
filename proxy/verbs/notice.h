// What lands in the receiver's pre-posted notice buffers: a chunk header, and for small messages the payload
// itself (one SEND instead of a WRITE followed by a SEND: one work request less per message).
#pragma once

#include "proxy/protocol/wire.h"

namespace railnet::verbs {

constexpr uint32_t kEagerBytes = 224;  // notice buffers are 256 bytes
constexpr uint8_t kPayloadFollows = 1;  // in ChunkHeader::flags

struct Notice {
  protocol::ChunkHeader header;
  char payload[kEagerBytes];
};
static_assert(sizeof(Notice) == 256);

inline bool carriesPayload(const protocol::ChunkHeader& header) { return (header.flags & kPayloadFollows) != 0; }

}  // namespace railnet::verbs
