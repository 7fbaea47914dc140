// What lands in the receiver's pre-posted notice buffers: a chunk header, and for small messages the payload
// itself (one SEND instead of a WRITE followed by a SEND: one work request less per message).
#pragma once

#include "proxy/protocol/wire.h"

namespace railnet::verbs {

constexpr uint32_t kEagerBytes = 224;  // notice buffers are 256 bytes
constexpr uint8_t kPayloadFollows = 1;  // in ChunkHeader::flags
// In ChunkHeader::flags of every header of a group notice: multireceive aggregation's one SEND after a grouped
// receive's RDMA WRITEs, carrying 1..8 headers (no payload), one per member (docs/design.md "Multireceive").
constexpr uint8_t kGroupMember = 4;
// Members up to this size are held for their group (larger ones are striped over the QPs as usual).
constexpr uint64_t kGroupMemberBytes = 64 * 1024;

struct Notice {
  protocol::ChunkHeader header;
  char payload[kEagerBytes];
};
static_assert(sizeof(Notice) == 256);

inline bool carriesPayload(const protocol::ChunkHeader& header) { return (header.flags & kPayloadFollows) != 0; }
inline bool isGroupMember(const protocol::ChunkHeader& header) { return (header.flags & kGroupMember) != 0; }
static_assert(protocol::kMaxRecvs * sizeof(protocol::ChunkHeader) <= sizeof(Notice), "a group notice fits a notice");

}  // namespace railnet::verbs
