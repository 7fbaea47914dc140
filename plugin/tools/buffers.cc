#include "plugin/tools/buffers.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "plugin/tools/harness.h"

namespace railnet::bench {
namespace {

uint64_t splitmix64(uint64_t x) noexcept {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

}  // namespace

HostBuffer::HostBuffer(size_t bytes) : size_(bytes) {
  // mmap gives page alignment and returns the memory to the system on destruction, whatever its size.
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) fail("cannot allocate %zu bytes of host memory: %s", bytes, strerror(errno));
  data_ = static_cast<std::byte*>(memory);
  memset(data_, 0, size_);
}

HostBuffer::~HostBuffer() { munmap(data_, size_); }

BenchBuffers::BenchBuffers(size_t maxMessage, int window, size_t arenaCap)
    : send(std::max(maxMessage, std::min(maxMessage * static_cast<size_t>(window), arenaCap))),
      recv(send.size()),
      echoSend(send.size()),
      echoRecv(send.size()),
      window_(window) {
  fillPattern(send.data(), send.size(), 0x7261696c6e6574ULL);
  fillPattern(echoSend.data(), echoSend.size(), 0x6563686fULL);
}

void fillPattern(std::byte* data, size_t size, uint64_t seed) {
  size_t words = size / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) {
    uint64_t value = splitmix64(seed + i);
    memcpy(data + i * sizeof(uint64_t), &value, sizeof(value));
  }
  uint64_t tail = splitmix64(seed + words);
  memcpy(data + words * sizeof(uint64_t), &tail, size % sizeof(uint64_t));
}

uint64_t checksum(const std::byte* data, size_t size) {
  uint64_t hash = 0xcbf29ce484222325ULL ^ size;
  size_t words = size / sizeof(uint64_t);
  for (size_t i = 0; i < words; ++i) {
    uint64_t value;
    memcpy(&value, data + i * sizeof(uint64_t), sizeof(value));
    hash = (hash ^ value) * 0x100000001b3ULL;
    hash ^= hash >> 29;
  }
  for (size_t i = words * sizeof(uint64_t); i < size; ++i) {
    hash = (hash ^ static_cast<uint8_t>(data[i])) * 0x100000001b3ULL;
  }
  return hash;
}

}  // namespace railnet::bench
