#include "proxy/verbs/gpu_direct.h"

#include <unistd.h>

#include <cerrno>
#include <vector>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::verbs {

GdrDecision decideGdr(const GdrInputs& in) {
  GdrDecision decision;
  if (!in.cudaUsable) {
    decision.summary = "host memory only (CUDA driver: " + (in.cudaWhy.empty() ? std::string("unusable") : in.cudaWhy) +
                       ")";
    return decision;
  }
  decision.peermem = in.peermem;
  decision.dmabuf = in.cuMemGetHandle && in.gpuDmabuf && in.ibvDmabuf && in.kernelDmabuf;
  if (decision.peermem) decision.ptrSupport |= NCCL_PTR_CUDA;
  if (decision.dmabuf) decision.ptrSupport |= NCCL_PTR_DMABUF;
  std::vector<std::string> missing;
  if (!in.cuMemGetHandle) missing.push_back("libcuda lacks cuMemGetHandleForAddressRange");
  if (!in.gpuDmabuf) missing.push_back("the GPU does not report DMA_BUF_SUPPORTED");
  if (!in.ibvDmabuf) missing.push_back("libibverbs lacks ibv_reg_dmabuf_mr");
  if (in.ibvDmabuf && !in.kernelDmabuf) missing.push_back("the kernel refuses ibv_reg_dmabuf_mr");
  std::string text = std::string("CUDA memory ") + (decision.peermem ? "via peermem" : "not via peermem (no module)");
  text += decision.dmabuf ? "; DMA-BUF yes" : "; DMA-BUF no (";
  if (!decision.dmabuf) {
    for (size_t i = 0; i < missing.size(); ++i) text += (i ? ", " : "") + missing[i];
    text += ")";
  }
  decision.summary = text;
  return decision;
}

bool peermemLoaded(const std::string& root) {
  for (const char* path : {"/sys/kernel/mm/memory_peers/nv_mem/version", "/sys/kernel/mm/memory_peers/nv_mem_nc/version",
                           "/sys/module/nvidia_peermem/version"}) {
    if (access((root + path).c_str(), F_OK) == 0) return true;
  }
  return false;
}

namespace {

CudaGdrFacts probeCuda() {
  CudaGdrFacts facts;
  const cuda::DriverApi* driver = cuda::initDriver(&facts.why);
  if (driver == nullptr) return facts;
  facts.usable = true;
  facts.memGetHandle = driver->cuMemGetHandleForAddressRange != nullptr;
  auto supports = [driver](cuda::CUdevice device) {
    int value = 0;
    return driver->cuDeviceGetAttribute(&value, cuda::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, device) ==
               cuda::CUDA_SUCCESS &&
           value != 0;
  };
  cuda::CUdevice current = -1;
  if (driver->cuCtxGetDevice(&current) == cuda::CUDA_SUCCESS && current >= 0) {
    facts.gpuDmabuf = supports(current);
    return facts;
  }
  // No current context (e.g. a tool): every GPU must support it.
  int count = 0;
  if (driver->cuDeviceGetCount(&count) != cuda::CUDA_SUCCESS || count <= 0) return facts;
  facts.gpuDmabuf = true;
  for (int ordinal = 0; ordinal < count; ++ordinal) {
    cuda::CUdevice device = 0;
    if (driver->cuDeviceGet(&device, ordinal) != cuda::CUDA_SUCCESS || !supports(device)) facts.gpuDmabuf = false;
  }
  return facts;
}

}  // namespace

const CudaGdrFacts& cudaGdrFacts() {
  static const CudaGdrFacts facts = probeCuda();  // once per process, thread-safe
  return facts;
}

bool kernelAcceptsDmabuf(const IbvApi& api, ibv_context* context, std::string* why) {
  if (api.regDmabufMr == nullptr) {
    if (why) *why = "libibverbs lacks ibv_reg_dmabuf_mr";
    return false;
  }
  ibv_pd* pd = api.allocPd(context);
  if (pd == nullptr) {
    if (why) *why = "ibv_alloc_pd failed: " + errnoText(errno);
    return false;
  }
  errno = 0;
  ibv_mr* mr = api.regDmabufMr(pd, 0, 0, 0, -1, 0);
  int err = errno;
  if (mr != nullptr) api.deregMr(mr);  // cannot happen with fd -1; be tidy if a provider says yes anyway
  api.deallocPd(pd);
  bool accepted = err != EOPNOTSUPP && err != EPROTONOSUPPORT;
  if (!accepted && why) *why = "ibv_reg_dmabuf_mr probe: " + errnoText(err);
  return accepted;
}

GdrInputs gatherGdrInputs(const IbvApi& api, ibv_context* context) {
  GdrInputs in;
  const CudaGdrFacts& facts = cudaGdrFacts();
  in.cudaUsable = facts.usable;
  in.cudaWhy = facts.why;
  if (!in.cudaUsable) return in;  // no probe of the device: nothing could use it
  in.peermem = peermemLoaded();
  in.cuMemGetHandle = facts.memGetHandle;
  in.gpuDmabuf = facts.gpuDmabuf;
  in.ibvDmabuf = api.dmabufSupported();
  in.kernelDmabuf = in.ibvDmabuf && kernelAcceptsDmabuf(api, context, nullptr);
  return in;
}

bool dmabufOffsetOfPage(uintptr_t data, uint64_t offset, uintptr_t pageBegin, uint64_t* pageOffset) {
  if (pageBegin > data) return false;
  uint64_t back = data - pageBegin;
  if (offset < back) return false;
  *pageOffset = offset - back;
  return true;
}

}  // namespace railnet::verbs
