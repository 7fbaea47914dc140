#include "proxy/staging/pinned_memory.h"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <fstream>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::staging {

namespace {
constexpr int kMpolPreferred = 1;  // <linux/mempolicy.h> MPOL_PREFERRED: the node if it has room, else any

void preferNode(void* data, size_t bytes, int node) {
  if (node < 0 || node >= 1024) return;
  unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {};
  mask[static_cast<size_t>(node) / (8 * sizeof(unsigned long))] |= 1UL << (static_cast<size_t>(node) % (8 * sizeof(unsigned long)));
  // Best effort: a kernel without NUMA support refuses, and the memory is then simply wherever it lands.
  if (syscall(SYS_mbind, data, bytes, kMpolPreferred, mask, 1024UL, 0U) != 0) {
    RN_INFO(NCCL_NET, "NET/railnet: staging memory not bound to NUMA node %d: %s", node, errnoText(errno).c_str());
  }
}
}  // namespace

PinnedMemory::PinnedMemory(const cuda::DriverApi& cuda, size_t bytes, int numaNode) : cuda_(cuda), size_(bytes) {
  void* mapped = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) {
    fail(ncclSystemError, "NET/railnet: cannot map %zu bytes of staging memory: %s", bytes, errnoText(errno).c_str());
  }
  preferNode(mapped, bytes, numaNode);
  memset(mapped, 0, bytes);  // place the pages now, under the policy
  const cuda::CUresult result = cuda_.cuMemHostRegister(mapped, bytes, cuda::CU_MEMHOSTREGISTER_PORTABLE);
  if (result != cuda::CUDA_SUCCESS) {
    munmap(mapped, bytes);
    fail(ncclSystemError, "NET/railnet: cannot pin %zu bytes of staging memory: cuMemHostRegister: %s", bytes,
         cuda_.errorText(result).c_str());
  }
  data_ = static_cast<char*>(mapped);
}

PinnedMemory::~PinnedMemory() {
  if (data_ == nullptr) return;
  cuda_.cuMemHostUnregister(data_);
  munmap(data_, size_);
}

int numaNodeOfPci(const std::string& busId) {
  std::string lower = busId;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  std::ifstream in("/sys/bus/pci/devices/" + lower + "/numa_node");
  int node = -1;
  if (!(in >> node)) return -1;
  return node;
}

}  // namespace railnet::staging
