// GPUDirect RDMA for the verbs transport: whether a device can take CUDA memory (ptrSupport), and how CUDA
// memory is registered. Mirrors NCCL's net_ib:
//  - NCCL_PTR_CUDA when a peer-memory module is loaded (nv_peer_mem / nvidia-peermem: ibv_reg_mr then pins
//    GPU pages itself), and libcuda is usable;
//  - NCCL_PTR_DMABUF when libcuda exports cuMemGetHandleForAddressRange, the GPU reports
//    CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED, libibverbs has ibv_reg_dmabuf_mr and the kernel accepts it (probed
//    with fd -1: EOPNOTSUPP / EPROTONOSUPPORT mean no, EBADF means yes, as ncclIbDmaBufSupport does).
// None of the GPU paths can run on the machines railnet is tested on (docs/verbs.md: "not run on hardware");
// the decisions are pure functions below, unit-tested.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/cuda_driver.h"
#include "proxy/verbs/ibverbs_api.h"
#include "railnet/nccl/common.h"

namespace railnet::verbs {

// Everything the ptrSupport decision of one RDMA device depends on.
struct GdrInputs {
  bool cudaUsable = false;  // libcuda loaded and cuInit succeeded
  std::string cudaWhy;      // why not, when !cudaUsable
  bool peermem = false;     // a peer-memory module is loaded
  bool cuMemGetHandle = false;  // cuMemGetHandleForAddressRange exported
  bool gpuDmabuf = false;       // the GPU(s) report CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
  bool ibvDmabuf = false;       // ibv_reg_dmabuf_mr exported
  bool kernelDmabuf = false;    // the kernel / device accepted the fd -1 probe
};

struct GdrDecision {
  int ptrSupport = NCCL_PTR_HOST;
  bool dmabuf = false;   // CUDA memory can be registered through a DMA-BUF
  bool peermem = false;  // CUDA memory can be registered with plain ibv_reg_mr
  std::string summary;   // for the INFO line: what is supported and, for what is not, why
};

GdrDecision decideGdr(const GdrInputs& inputs);

// Whether a peer-memory module is loaded: <root>/sys/kernel/mm/memory_peers/{nv_mem,nv_mem_nc}/version or
// <root>/sys/module/nvidia_peermem/version. `root` is "" on a real system; tests point it at a fake tree.
bool peermemLoaded(const std::string& root = "");

// The CUDA half of the inputs, probed once per process: driver, cuMemGetHandleForAddressRange, and
// DMA_BUF_SUPPORTED of the current context's GPU (of every GPU when no context is current).
struct CudaGdrFacts {
  bool usable = false;
  std::string why;
  bool memGetHandle = false;
  bool gpuDmabuf = false;
};
const CudaGdrFacts& cudaGdrFacts();

// ncclIbDmaBufSupport's probe on an open device: ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd -1) must fail with
// something other than EOPNOTSUPP / EPROTONOSUPPORT.
bool kernelAcceptsDmabuf(const IbvApi& api, ibv_context* context, std::string* why);

// The inputs for one open device (process-wide facts plus the device probe).
GdrInputs gatherGdrInputs(const IbvApi& api, ibv_context* context);

// DMA-BUF offset arithmetic. NCCL hands regMrDmaBuf(data, size, offset, fd) where byte `data` is at `offset`
// in the fd; the registration covers whole pages starting at `pageBegin` <= data. Returns the fd offset of
// pageBegin, or false when the fd does not reach back that far (offset < data - pageBegin).
bool dmabufOffsetOfPage(uintptr_t data, uint64_t offset, uintptr_t pageBegin, uint64_t* pageOffset);


}  // namespace railnet::verbs
