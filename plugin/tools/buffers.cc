#include "plugin/tools/buffers.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "plugin/tools/gpu_buffers.h"
#include "plugin/tools/harness.h"
#include "railnet/nccl/common.h"

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

BenchBuffer::BenchBuffer(size_t bytes, const GpuDevice* gpu)
    : host_(bytes), device_(gpu ? std::make_unique<DeviceMemory>(*gpu, bytes) : nullptr) {}

BenchBuffer::~BenchBuffer() = default;

std::byte* BenchBuffer::transportData() const noexcept {
  // A device address is only ever handed on (to regMr/isend/irecv), never dereferenced here.
  return device_ ? reinterpret_cast<std::byte*>(static_cast<uintptr_t>(device_->address())) : host_.data();
}

int BenchBuffer::pointerType() const noexcept { return device_ ? NCCL_PTR_CUDA : NCCL_PTR_HOST; }

cuda::CUdeviceptr BenchBuffer::deviceAddress() const noexcept { return device_ ? device_->address() : 0; }

void BenchBuffer::fill(uint64_t seed) {
  fillPattern(host_.data(), host_.size(), seed);
  if (device_) device_->upload(host_.data(), host_.size());
}

void BenchBuffer::clear(size_t bytes) {
  if (device_) device_->clear(bytes);
  else memset(host_.data(), 0, bytes);
}

void BenchBuffer::collect(size_t bytes) {
  if (device_) device_->download(host_.data(), bytes);
}

BenchBuffers::BenchBuffers(size_t maxMessage, int window, size_t arenaCap, const GpuDevice* gpu)
    : send(std::max(maxMessage, std::min(maxMessage * static_cast<size_t>(window), arenaCap)), gpu),
      recv(send.size(), gpu),
      echoSend(send.size(), gpu),
      echoRecv(send.size(), gpu),
      window_(window),
      gpu_(gpu) {
  send.fill(0x7261696c6e6574ULL);
  echoSend.fill(0x6563686fULL);
}

void BenchBuffers::prepareThread() const {
  if (gpu_) gpu_->makeCurrent();
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
