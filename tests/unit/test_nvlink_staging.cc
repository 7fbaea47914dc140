// The GPU half of the verbs NVLink hop (proxy/staging/nvlink_staging.h) on a real GPU: staging on the rail's GPU,
// written by the comm's GPU's copy engine, exported as a DMA-BUF as the NIC registration would. Hidden ([.]): it
// needs a GPU, so CI on the CPU machine does not run it; the GPU machine runs it by its tag (docs/verbs.md).
#include <catch2/catch.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <vector>

#include "base/cuda_allocation.h"
#include "proxy/staging/nvlink_staging.h"
#include "proxy/verbs/gpu_direct.h"

namespace cuda = railnet::cuda;
using railnet::staging::NvlinkStaging;

TEST_CASE("NVLink hop staging: pieces copied into the rail GPU's slots arrive intact", "[.][nvlink-staging]") {
  std::string why;
  const cuda::DriverApi* api = cuda::initDriver(&why);
  INFO(why);
  REQUIRE(api != nullptr);
  int count = 0;
  REQUIRE(api->cuDeviceGetCount(&count) == cuda::CUDA_SUCCESS);
  REQUIRE(count >= 1);
  cuda::CUcontext primary = nullptr;
  REQUIRE(api->cuDevicePrimaryCtxRetain(&primary, 0) == cuda::CUDA_SUCCESS);
  REQUIRE(api->cuCtxSetCurrent(primary) == cuda::CUDA_SUCCESS);  // as NCCL's proxy thread has its GPU current

  // The rail GPU: GPU 1 when there is one that GPU 0 reaches by peer access, else GPU 0 itself.
  int rail = 0;
  int can = 0;
  if (count > 1 && api->cuDeviceCanAccessPeer(&can, 0, 1) == cuda::CUDA_SUCCESS && can != 0) rail = 1;
  char busId[32] = {};
  REQUIRE(api->cuDeviceGetPCIBusId(busId, sizeof(busId), rail) == cuda::CUDA_SUCCESS);
  WARN("GPU 0 -> GPU " << rail << " (" << busId << ")");
  CHECK(railnet::staging::peerCopyPossible(busId, &why));
  CHECK(!railnet::staging::peerCopyPossible("0000:ff:1f.7", &why));
  CHECK(why.find("not visible") != std::string::npos);
  CHECK(!railnet::staging::peerCopyPossible("", &why));

  const uint64_t piece = 1 << 20;
  const int slots = 4;
  const size_t messageBytes = 3 * piece + 4096 + 7;  // three full pieces and a short one: one slot is reused
  auto source = cuda::CuMemAllocation::create(*api, 0, messageBytes, &why);
  INFO(why);
  REQUIRE(source != nullptr);
  std::vector<unsigned char> pattern(messageBytes);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>((i * 131) ^ (i >> 12));
  REQUIRE(api->cuMemcpyHtoD(source->address(), pattern.data(), pattern.size()) == cuda::CUDA_SUCCESS);

  NvlinkStaging staging(*api, reinterpret_cast<void*>(source->address()), busId, slots, piece);
  CHECK(staging.sourceDevice() == 0);
  CHECK(staging.railDevice() == rail);
  CHECK(staging.fromSourceGpu(reinterpret_cast<void*>(source->address())));
  const uint64_t pieces = (messageBytes + piece - 1) / piece;
  uint64_t next = 0;
  std::vector<unsigned char> landed(messageBytes, 0);
  std::vector<uint64_t> done;
  while (next < pieces || staging.copies().inFlight() > 0) {
    // At most slots - 1 in flight, so the last piece must wait for a slot to be read back and reused.
    while (next < pieces && staging.copies().inFlight() < slots - 1) {
      const uint64_t offset = next * piece;
      const uint64_t bytes = std::min<uint64_t>(piece, messageBytes - offset);
      const int slot = static_cast<int>(next % static_cast<uint64_t>(slots - 1));
      REQUIRE(staging.copies().submitDeviceToDevice(staging.slot(slot), source->address() + offset, bytes, next, &why));
      ++next;
    }
    done.clear();
    REQUIRE(staging.copies().poll(&done, &why));
    for (uint64_t number : done) {
      const uint64_t offset = number * piece;
      const uint64_t bytes = std::min<uint64_t>(piece, messageBytes - offset);
      const int slot = static_cast<int>(number % static_cast<uint64_t>(slots - 1));
      REQUIRE(api->cuMemcpyDtoH(landed.data() + offset, staging.slot(slot), bytes) == cuda::CUDA_SUCCESS);
    }
  }
  CHECK(memcmp(landed.data(), pattern.data(), pattern.size()) == 0);

  // What the NIC registration does with the staging (VerbsDevice::registerMemory, DMA-BUF path).
  const railnet::verbs::CudaGdrFacts& facts = railnet::verbs::cudaGdrFacts();
  if (facts.memGetHandle && facts.gpuDmabuf) {
    const int fd = railnet::cuda::exportDmabuf(*api, reinterpret_cast<uintptr_t>(staging.base()), staging.bytes(),
                                               &why);
    INFO(why);
    CHECK(fd >= 0);
    if (fd >= 0) close(fd);
  } else {
    WARN("no DMA-BUF export on this GPU/driver: " << facts.why);
  }
  api->cuDevicePrimaryCtxRelease(0);
}

TEST_CASE("NVLink hop staging: rate through the slots next to one plain copy", "[.][nvlink-staging-rate]") {
  // Not a speed goal: the figures for docs/performance.md, printed. 256 MiB from GPU 0 through 8 slots of 1 MiB
  // on the rail GPU (the hop's defaults), against one cuMemcpyDtoDAsync of the same bytes into the rail GPU
  // (the copy engines' ceiling for this pair), in the same run.
  std::string why;
  const cuda::DriverApi* api = cuda::initDriver(&why);
  REQUIRE(api != nullptr);
  int count = 0, can = 0, rail = 0;
  REQUIRE(api->cuDeviceGetCount(&count) == cuda::CUDA_SUCCESS);
  if (count > 1 && api->cuDeviceCanAccessPeer(&can, 0, 1) == cuda::CUDA_SUCCESS && can != 0) rail = 1;
  cuda::CUcontext primary = nullptr;
  REQUIRE(api->cuDevicePrimaryCtxRetain(&primary, 0) == cuda::CUDA_SUCCESS);
  REQUIRE(api->cuCtxSetCurrent(primary) == cuda::CUDA_SUCCESS);
  char busId[32] = {};
  REQUIRE(api->cuDeviceGetPCIBusId(busId, sizeof(busId), rail) == cuda::CUDA_SUCCESS);
  const uint64_t piece = 1 << 20;
  const int slots = 8;
  const size_t total = size_t{256} << 20;
  auto source = cuda::CuMemAllocation::create(*api, 0, total, &why);
  auto target = cuda::CuMemAllocation::create(*api, rail, total, {{0}, false, false}, &why);
  REQUIRE((source != nullptr && target != nullptr));
  NvlinkStaging staging(*api, reinterpret_cast<void*>(source->address()), busId, slots, piece);
  using Clock = std::chrono::steady_clock;
  auto seconds = [](Clock::time_point since) { return std::chrono::duration<double>(Clock::now() - since).count(); };
  std::vector<uint64_t> done;
  for (int round = 0; round < 3; ++round) {
    // Through the slots, as the send comm does: a slot is refilled as soon as its copy is done (no NIC here).
    Clock::time_point start = Clock::now();
    uint64_t next = 0, finished = 0;
    const uint64_t pieces = total / piece;
    while (finished < pieces) {
      while (next < pieces && !staging.copies().full()) {
        REQUIRE(staging.copies().submitDeviceToDevice(staging.slot(static_cast<int>(next % slots)),
                                                      source->address() + next * piece, piece, next, &why));
        ++next;
      }
      done.clear();
      REQUIRE(staging.copies().poll(&done, &why));
      finished += done.size();
    }
    const double slotted = static_cast<double>(total) / seconds(start) / 1e9;
    // One plain copy of the same bytes between the same GPUs, on the same copy queue.
    start = Clock::now();
    REQUIRE(staging.copies().submitDeviceToDevice(target->address(), source->address(), total, 0, &why));
    for (done.clear(); done.empty();) REQUIRE(staging.copies().poll(&done, &why));
    const double plain = static_cast<double>(total) / seconds(start) / 1e9;
    WARN("round " << round << ": GPU 0 -> GPU " << rail << " through " << slots << " x 1 MiB slots " << slotted
                  << " GB/s, one plain copy " << plain << " GB/s, ratio " << slotted / plain);
  }
  api->cuDevicePrimaryCtxRelease(0);
}

TEST_CASE("NVLink hop staging from another process's GPU (each process sees one GPU)", "[.][nvlink-staging-ipc]") {
  // Run alone and first (nothing may have initialized CUDA in this process): a child that sees only GPU 1 serves
  // staging on it; this process, seeing only GPU 0, imports it, copies into it and reads it back. That is the
  // hop of a job whose ranks each see their own GPU (hop_exchange.h).
  char key[64];
  snprintf(key, sizeof(key), "nvlink-staging-test-%d", static_cast<int>(getpid()));
  setenv("NCCL_HOSTID", key, 1);  // a rendezvous of this test's own
  int ready[2], done[2];
  REQUIRE(pipe(ready) == 0);
  REQUIRE(pipe(done) == 0);
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    close(ready[0]);
    close(done[1]);  // or the read below never sees the parent's close
    setenv("CUDA_VISIBLE_DEVICES", "1", 1);
    std::string why;
    const cuda::DriverApi* api = cuda::initDriver(&why);
    char busId[32] = {};
    int ok = api != nullptr && api->cuDeviceGetPCIBusId(busId, sizeof(busId), 0) == cuda::CUDA_SUCCESS;
    std::unique_ptr<railnet::staging::HopExchangeServer> server;
    if (ok) server = std::make_unique<railnet::staging::HopExchangeServer>(*api, 0, busId);
    ok = ok && server->serving();
    if (write(ready[1], busId, sizeof(busId)) != static_cast<ssize_t>(sizeof(busId)) || !ok) _exit(1);
    char byte;
    (void)read(done[0], &byte, 1);  // until the parent is finished with the staging
    server.reset();
    _exit(0);
  }
  close(ready[1]);
  close(done[0]);
  char busId[32] = {};
  const bool childReady = read(ready[0], busId, sizeof(busId)) == static_cast<ssize_t>(sizeof(busId));
  setenv("CUDA_VISIBLE_DEVICES", "0", 1);
  std::string why;
  const cuda::DriverApi* api = cuda::initDriver(&why);
  REQUIRE(api != nullptr);
  REQUIRE(childReady);
  WARN("this process sees GPU 0 only; the child serves " << busId);
  cuda::CUcontext primary = nullptr;
  REQUIRE(api->cuDevicePrimaryCtxRetain(&primary, 0) == cuda::CUDA_SUCCESS);
  REQUIRE(api->cuCtxSetCurrent(primary) == cuda::CUDA_SUCCESS);
  CHECK(railnet::staging::peerCopyPossible(busId, &why));
  INFO(why);
  const uint64_t piece = 1 << 20;
  const size_t messageBytes = 2 * piece + 123;
  auto source = cuda::CuMemAllocation::create(*api, 0, messageBytes, &why);
  REQUIRE(source != nullptr);
  std::vector<unsigned char> pattern(messageBytes), landed(messageBytes, 0);
  for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = static_cast<unsigned char>(i * 7 + (i >> 16));
  REQUIRE(api->cuMemcpyHtoD(source->address(), pattern.data(), pattern.size()) == cuda::CUDA_SUCCESS);
  {
    NvlinkStaging staging(*api, reinterpret_cast<void*>(source->address()), busId, 4, piece);
    CHECK(staging.railDevice() == -1);  // another process's GPU
    for (uint64_t offset = 0, slot = 0; offset < messageBytes; offset += piece, ++slot) {
      const uint64_t bytes = std::min<uint64_t>(piece, messageBytes - offset);
      REQUIRE(staging.copies().submitDeviceToDevice(staging.slot(static_cast<int>(slot)), source->address() + offset,
                                                    bytes, slot, &why));
    }
    std::vector<uint64_t> finished;
    const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (finished.size() < 3 && std::chrono::steady_clock::now() < limit) {
      REQUIRE(staging.copies().poll(&finished, &why));
    }
    REQUIRE(finished.size() == 3);
    for (uint64_t offset = 0, slot = 0; offset < messageBytes; offset += piece, ++slot) {
      const uint64_t bytes = std::min<uint64_t>(piece, messageBytes - offset);
      REQUIRE(api->cuMemcpyDtoH(landed.data() + offset, staging.slot(static_cast<int>(slot)), bytes) == cuda::CUDA_SUCCESS);
    }
    CHECK(memcmp(landed.data(), pattern.data(), pattern.size()) == 0);
    // This process cannot export memory of a GPU it does not see (CUDA_ERROR_UNKNOWN on H200s); the serving
    // process exported it and handed the DMA-BUF over with the staging, for the NIC registration.
    std::string refused;
    const int own = railnet::cuda::exportDmabuf(*api, reinterpret_cast<uintptr_t>(staging.base()), staging.bytes(),
                                                &refused);
    WARN("this process's own DMA-BUF export of the imported staging: " << (own >= 0 ? "fd" : refused));
    if (own >= 0) close(own);
    INFO("the serving process: " << staging.importedDmabufWhy());
    REQUIRE(staging.dmabufFd() >= 0);
    char link[256] = {};
    const std::string path = "/proc/self/fd/" + std::to_string(staging.dmabufFd());
    REQUIRE(readlink(path.c_str(), link, sizeof(link) - 1) > 0);
    WARN("the serving process's DMA-BUF: " << link);
    CHECK(std::string(link).find("dmabuf") != std::string::npos);
  }
  close(done[1]);
  int status = -1;
  waitpid(child, &status, 0);
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) == 0));
  api->cuDevicePrimaryCtxRelease(0);
}
