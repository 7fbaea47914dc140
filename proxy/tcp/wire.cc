#include "proxy/tcp/wire.h"

namespace railnet::tcp {

const char* validateHello(const Hello& hello, const uint64_t secret[2]) {
  if (hello.magic != kHelloMagic) return "not a railnet hello (bad magic)";
  if (hello.version != kWireVersion) return "railnet wire version mismatch";
  if (hello.secret[0] != secret[0] || hello.secret[1] != secret[1]) return "wrong secret for this listener";
  if (hello.role != static_cast<uint16_t>(StreamRole::kControl) && hello.role != static_cast<uint16_t>(StreamRole::kData)) {
    return "unknown stream role";
  }
  if (hello.streamCount > kMaxStreams) return "stream count out of range";
  if (hello.role == static_cast<uint16_t>(StreamRole::kData) && hello.streamIndex >= hello.streamCount) {
    return "stream index out of range";
  }
  return nullptr;
}

uint64_t chunkSizeFor(uint64_t size, int streams, uint64_t minChunk) {
  constexpr uint64_t kPage = 4096;
  uint64_t perStream = (size + static_cast<uint64_t>(streams) - 1) / static_cast<uint64_t>(streams);
  uint64_t chunk = perStream > minChunk ? perStream : minChunk;
  chunk = (chunk + kPage - 1) / kPage * kPage;
  return chunk;
}

}  // namespace railnet::tcp
