// GPUDirect decisions of the verbs transport (proxy/verbs/gpu_direct.h) and the registration cache's kinds.
// The GPU paths themselves cannot run here; what decides them can.
#include <catch2/catch.hpp>

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "proxy/verbs/gpu_direct.h"
#include "proxy/verbs/registration_cache.h"

using namespace railnet::verbs;

namespace {

GdrInputs everything() {
  GdrInputs in;
  in.cudaUsable = true;
  in.peermem = true;
  in.cuMemGetHandle = true;
  in.gpuDmabuf = true;
  in.ibvDmabuf = true;
  in.kernelDmabuf = true;
  return in;
}

// A temporary directory tree, removed at the end.
struct TempTree {
  std::string root;
  TempTree() {
    char pattern[] = "/tmp/railnet-gdr-XXXXXX";
    root = mkdtemp(pattern);
  }
  ~TempTree() { (void)!system(("rm -rf " + root).c_str()); }
  void touch(const std::string& path) {
    (void)!system(("mkdir -p " + root + path.substr(0, path.rfind('/'))).c_str());
    std::ofstream(root + path) << "1.1\n";
  }
};

}  // namespace

TEST_CASE("gpu_direct: no CUDA driver means host memory only, with the reason", "[verbs][gdr]") {
  GdrInputs in = everything();
  in.cudaUsable = false;
  in.cudaWhy = "libcuda.so.1 not found: no such file";
  GdrDecision decision = decideGdr(in);
  CHECK(decision.ptrSupport == NCCL_PTR_HOST);
  CHECK_FALSE(decision.dmabuf);
  CHECK_FALSE(decision.peermem);
  CHECK(decision.summary == "host memory only (CUDA driver: libcuda.so.1 not found: no such file)");
}

TEST_CASE("gpu_direct: peermem gives CUDA, the DMA-BUF chain gives DMABUF, independently", "[verbs][gdr]") {
  GdrDecision all = decideGdr(everything());
  CHECK(all.ptrSupport == (NCCL_PTR_HOST | NCCL_PTR_CUDA | NCCL_PTR_DMABUF));
  CHECK(all.summary == "CUDA memory via peermem; DMA-BUF yes");

  GdrInputs noPeermem = everything();
  noPeermem.peermem = false;
  GdrDecision d = decideGdr(noPeermem);
  CHECK(d.ptrSupport == (NCCL_PTR_HOST | NCCL_PTR_DMABUF));
  CHECK(d.dmabuf);
  CHECK_FALSE(d.peermem);

  // Each missing link of the DMA-BUF chain removes DMABUF, and is named.
  struct Case {
    bool GdrInputs::*field;
    const char* named;
  } cases[] = {{&GdrInputs::cuMemGetHandle, "libcuda lacks cuMemGetHandleForAddressRange"},
               {&GdrInputs::gpuDmabuf, "the GPU does not report DMA_BUF_SUPPORTED"},
               {&GdrInputs::ibvDmabuf, "libibverbs lacks ibv_reg_dmabuf_mr"},
               {&GdrInputs::kernelDmabuf, "the kernel refuses ibv_reg_dmabuf_mr"}};
  for (const Case& c : cases) {
    GdrInputs in = everything();
    in.*(c.field) = false;
    GdrDecision decision = decideGdr(in);
    CHECK(decision.ptrSupport == (NCCL_PTR_HOST | NCCL_PTR_CUDA));
    CHECK_FALSE(decision.dmabuf);
    CHECK(decision.summary.find(c.named) != std::string::npos);
  }

  GdrInputs none = everything();
  none.peermem = false;
  none.kernelDmabuf = false;
  CHECK(decideGdr(none).ptrSupport == NCCL_PTR_HOST);
}

TEST_CASE("gpu_direct: peermem is found by NCCL's module files", "[verbs][gdr]") {
  {
    TempTree tree;
    CHECK_FALSE(peermemLoaded(tree.root));
    tree.touch("/sys/kernel/mm/memory_peers/nv_mem/version");
    CHECK(peermemLoaded(tree.root));
  }
  {
    TempTree tree;
    tree.touch("/sys/module/nvidia_peermem/version");
    CHECK(peermemLoaded(tree.root));
  }
  {
    TempTree tree;
    tree.touch("/sys/kernel/mm/memory_peers/nv_mem_nc/version");
    CHECK(peermemLoaded(tree.root));
  }
  {
    TempTree tree;
    tree.touch("/sys/module/nvidia/version");  // the GPU driver alone is not peermem
    CHECK_FALSE(peermemLoaded(tree.root));
  }
}

TEST_CASE("gpu_direct: this process's CUDA facts agree with dlopen", "[verbs][gdr]") {
  const CudaGdrFacts& facts = cudaGdrFacts();
  void* probe = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (probe == nullptr) {
    CHECK_FALSE(facts.usable);
    CHECK(facts.why.find("libcuda.so.1 not found") != std::string::npos);
    GdrInputs in;
    in.cudaUsable = facts.usable;
    in.cudaWhy = facts.why;
    GdrDecision decision = decideGdr(in);
    CHECK(decision.ptrSupport == NCCL_PTR_HOST);
    CHECK(decision.summary.find(facts.why) != std::string::npos);
  } else {
    dlclose(probe);
    CHECK((facts.usable || !facts.why.empty()));
  }
}

TEST_CASE("gpu_direct: DMA-BUF offsets follow the registration back to its first page", "[verbs][gdr]") {
  uint64_t offset = 0;
  // Page-aligned data: the fd offset is unchanged.
  REQUIRE(dmabufOffsetOfPage(0x200000, 4096, 0x200000, &offset));
  CHECK(offset == 4096);
  // Data 0x123 bytes into its page at fd offset 0x10123: the page starts at fd offset 0x10000.
  REQUIRE(dmabufOffsetOfPage(0x7f0000001123, 0x10123, 0x7f0000001000, &offset));
  CHECK(offset == 0x10000);
  // The fd starts after the page does: refused, not wrapped around.
  CHECK_FALSE(dmabufOffsetOfPage(0x7f0000001123, 0x100, 0x7f0000001000, &offset));
  // A page start after the data is a caller bug.
  CHECK_FALSE(dmabufOffsetOfPage(0x1000, 0, 0x2000, &offset));
}

TEST_CASE("gpu_direct: registrations of different kinds are never shared", "[verbs][gdr][mrcache]") {
  int registered = 0;
  int deregistered = 0;
  RegistrationCache<int> cache([&](void*, size_t) { return ++registered; }, [&](int) { ++deregistered; }, 4096);
  alignas(4096) static char buffer[4 * 4096];
  int host = cache.acquire(buffer, sizeof(buffer));
  int hostAgain = cache.acquire(buffer + 100, 100, NCCL_PTR_HOST);
  CHECK(host == hostAgain);
  size_t seenLength = 0;
  void* seenStart = nullptr;
  int cuda = cache.acquire(buffer + 100, 5000, NCCL_PTR_CUDA, [&](void* start, size_t length) {
    seenStart = start;
    seenLength = length;
    return 1000 + ++registered;
  });
  CHECK(cuda != host);
  CHECK(cuda > 1000);  // made by the per-call registrar
  CHECK(seenStart == buffer);
  CHECK(seenLength == 2 * 4096);  // the whole pages under [buffer + 100, buffer + 5100)
  CHECK(cache.acquire(buffer + 4096, 10, NCCL_PTR_CUDA) == cuda);  // same kind, covered: shared
  CHECK(cache.size() == 2);
  cache.release(cuda);
  cache.release(cuda);
  cache.release(host);
  cache.release(hostAgain);
  CHECK(cache.size() == 0);
  CHECK(deregistered == 2);
}

TEST_CASE("pagesOf: zero bytes cover one page; ranges round outwards", "[verbs][gdr][mrcache]") {
  using Cache = RegistrationCache<int>;
  auto span = Cache::pagesOf(reinterpret_cast<void*>(0x5000), 0, 4096);
  CHECK(span.begin == 0x5000);
  CHECK(span.end == 0x6000);
  span = Cache::pagesOf(reinterpret_cast<void*>(0x5fff), 2, 4096);
  CHECK(span.begin == 0x5000);
  CHECK(span.end == 0x7000);
  span = Cache::pagesOf(reinterpret_cast<void*>(0x10000), 0x10000, 0x10000);
  CHECK(span.begin == 0x10000);
  CHECK(span.end == 0x20000);
}
