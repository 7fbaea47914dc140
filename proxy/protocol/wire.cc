#include "proxy/protocol/wire.h"

#include <netinet/in.h>

#include <cstring>

#include "railnet/error.h"

namespace railnet::protocol {

const char* validateHello(const Hello& hello, const uint64_t secret[2]) {
  if (hello.magic != kHelloMagic) return "not a railnet hello (bad magic)";
  if (hello.version != kWireVersion) return "railnet wire version mismatch";
  if (hello.secret[0] != secret[0] || hello.secret[1] != secret[1]) return "wrong secret for this listener";
  if (hello.role != static_cast<uint16_t>(StreamRole::kControl) && hello.role != static_cast<uint16_t>(StreamRole::kData)) {
    return hello.role == static_cast<uint16_t>(StreamRole::kResume)
               ? "a re-made control socket sent to a listen comm (it belongs to the session listener)"
               : "unknown stream role";
  }
  if (hello.streamCount > kMaxStreams) return "stream count out of range";
  if ((hello.features & ~kKnownFeatures) != 0 || hello.resumeProcessed != 0) return "unknown features asked";
  if (hello.role == static_cast<uint16_t>(StreamRole::kData) && hello.streamIndex >= hello.streamCount) {
    return "stream index out of range";
  }
  return nullptr;
}

uint64_t frameLength(const FrameHeader& header) {
  switch (static_cast<FrameType>(header.type)) {
    case FrameType::kClearToSend:
      return sizeof(FrameHeader) + uint64_t{header.slot} * sizeof(ClearToSendEntry) +
             uint64_t{header.slot} * header.extraKeys * sizeof(uint32_t);
    case FrameType::kInline:
    case FrameType::kSession:
    case FrameType::kPathDown:
    case FrameType::kPathQuery:
    case FrameType::kPathAnswer:
    case FrameType::kPathRenew:
    case FrameType::kPathReady:
      return sizeof(FrameHeader) + header.size;
    case FrameType::kOversize:
    case FrameType::kDone:
    case FrameType::kAck:
    case FrameType::kResume:
    case FrameType::kNicFailed:
      return sizeof(FrameHeader);
  }
  return 0;
}

uint64_t chunkSizeFor(uint64_t size, int streams, uint64_t minChunk) {
  constexpr uint64_t kPage = 4096;
  uint64_t perStream = (size + static_cast<uint64_t>(streams) - 1) / static_cast<uint64_t>(streams);
  uint64_t chunk = perStream > minChunk ? perStream : minChunk;
  chunk = (chunk + kPage - 1) / kPage * kPage;
  return chunk;
}

}  // namespace railnet::protocol

namespace railnet::protocol {

void writeHandleAddresses(Handle* handle, const std::vector<ListenAddress>& addresses) {
  if (addresses.empty()) fail(ncclInternalError, "NET/railnet: a listening device without an address");
  const sa_family_t family = addresses[0].address.storage.ss_family;
  const int most = family == AF_INET6 ? kMaxHandleAddresses6 : kMaxHandleAddresses4;
  if (static_cast<int>(addresses.size()) > most) {
    fail(ncclInvalidUsage,
         "NET/railnet: a fused TCP device of %zu %s NICs does not fit NCCL's 128-byte handle (at most %d)",
         addresses.size(), family == AF_INET6 ? "IPv6" : "IPv4", most);
  }
  memcpy(handle->address, &addresses[0].address.storage, addresses[0].address.length);
  handle->railId = addresses[0].railId;
  handle->addressCount = static_cast<uint16_t>(addresses.size());
  for (size_t i = 1; i < addresses.size(); ++i) {
    const SocketAddress& next = addresses[i].address;
    if (next.storage.ss_family != family) {
      fail(ncclInvalidUsage, "NET/railnet: a fused TCP device mixes IPv4 and IPv6 addresses (%s, %s)",
           addresses[0].address.toString().c_str(), next.toString().c_str());
    }
    if (family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&next.storage);
      HandleAddress6 entry{};
      memcpy(entry.address, &in6->sin6_addr, sizeof(entry.address));
      entry.port = in6->sin6_port;
      entry.railId = addresses[i].railId;
      memcpy(handle->moreAddresses + (i - 1) * sizeof(entry), &entry, sizeof(entry));
    } else {
      const auto* in4 = reinterpret_cast<const sockaddr_in*>(&next.storage);
      HandleAddress4 entry{};
      memcpy(entry.address, &in4->sin_addr, sizeof(entry.address));
      entry.port = in4->sin_port;
      entry.railId = addresses[i].railId;
      memcpy(handle->moreAddresses + (i - 1) * sizeof(entry), &entry, sizeof(entry));
    }
  }
}

std::vector<ListenAddress> handleAddresses(const Handle& handle) {
  if (handle.magic != kHandleMagic) {
    fail(ncclInvalidUsage, "NET/railnet: connect handle is not a railnet TCP handle (magic 0x%08x)", handle.magic);
  }
  if (handle.version != kWireVersion) {
    fail(ncclInvalidUsage, "NET/railnet: connect handle has wire version %u, this railnet speaks %u", handle.version,
         kWireVersion);
  }
  ListenAddress first;
  sa_family_t family;
  memcpy(&family, handle.address, sizeof(family));
  if (family == AF_INET) {
    first.address.length = sizeof(sockaddr_in);
  } else if (family == AF_INET6) {
    first.address.length = sizeof(sockaddr_in6);
  } else {
    fail(ncclInvalidUsage, "NET/railnet: connect handle has address family %u", family);
  }
  memcpy(&first.address.storage, handle.address, first.address.length);
  first.railId = handle.railId;
  const int count = handle.addressCount == 0 ? 1 : handle.addressCount;
  const int most = family == AF_INET6 ? kMaxHandleAddresses6 : kMaxHandleAddresses4;
  if (count > most) fail(ncclInvalidUsage, "NET/railnet: connect handle names %d addresses (at most %d)", count, most);
  std::vector<ListenAddress> addresses{first};
  for (int i = 1; i < count; ++i) {
    ListenAddress next = first;  // family, scope and flow info of the first address
    const size_t at = static_cast<size_t>(i - 1);
    if (family == AF_INET6) {
      HandleAddress6 entry;
      memcpy(&entry, handle.moreAddresses + at * sizeof(entry), sizeof(entry));
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&next.address.storage);
      memcpy(&in6->sin6_addr, entry.address, sizeof(entry.address));
      in6->sin6_port = entry.port;
      next.railId = entry.railId;
    } else {
      HandleAddress4 entry;
      memcpy(&entry, handle.moreAddresses + at * sizeof(entry), sizeof(entry));
      auto* in4 = reinterpret_cast<sockaddr_in*>(&next.address.storage);
      memcpy(&in4->sin_addr, entry.address, sizeof(entry.address));
      in4->sin_port = entry.port;
      next.railId = entry.railId;
    }
    addresses.push_back(next);
  }
  return addresses;
}

}  // namespace railnet::protocol
