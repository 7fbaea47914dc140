// base/cuda_driver: libcuda resolved at run time, absent as a normal state, constants matching cuda.h.
#include <catch2/catch.hpp>

#include <dlfcn.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "base/cuda_driver.h"

using namespace railnet::cuda;

namespace {

// The value of `NAME = value` in an enum of cuda.h, or -1 when the header or the name is not there.
long long headerValue(const std::string& header, const std::string& name) {
  // Enumerators ("NAME = value") and macros ("#define NAME value").
  std::regex pattern("(?:\\b" + name + "\\s*=\\s*|#define\\s+" + name + "\\s+)(0x[0-9a-fA-F]+|[0-9]+)");
  std::smatch match;
  if (!std::regex_search(header, match, pattern)) return -1;
  return std::stoll(match[1].str(), nullptr, 0);
}

std::string readCudaHeader() {
  for (const char* path : {"/usr/local/cuda/include/cuda.h", "/usr/include/cuda.h"}) {
    std::ifstream in(path);
    if (!in) continue;
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  return {};
}

}  // namespace

TEST_CASE("cuda_driver: declared constants match cuda.h when the header is installed", "[cuda]") {
  const std::string header = readCudaHeader();
  if (header.empty()) {
    WARN("no cuda.h on this machine: constants not cross-checked");
    return;
  }
  CHECK(headerValue(header, "CUDA_SUCCESS") == CUDA_SUCCESS);
  CHECK(headerValue(header, "CUDA_ERROR_INVALID_VALUE") == CUDA_ERROR_INVALID_VALUE);
  CHECK(headerValue(header, "CUDA_ERROR_NOT_INITIALIZED") == CUDA_ERROR_NOT_INITIALIZED);
  CHECK(headerValue(header, "CUDA_ERROR_DEINITIALIZED") == CUDA_ERROR_DEINITIALIZED);
  CHECK(headerValue(header, "CUDA_ERROR_NO_DEVICE") == CUDA_ERROR_NO_DEVICE);
  CHECK(headerValue(header, "CUDA_ERROR_INVALID_CONTEXT") == CUDA_ERROR_INVALID_CONTEXT);
  CHECK(headerValue(header, "CUDA_ERROR_NOT_SUPPORTED") == CUDA_ERROR_NOT_SUPPORTED);
  CHECK(headerValue(header, "CUDA_ERROR_NOT_READY") == CUDA_ERROR_NOT_READY);
  CHECK(headerValue(header, "CU_STREAM_NON_BLOCKING") == static_cast<long long>(CU_STREAM_NON_BLOCKING));
  CHECK(headerValue(header, "CU_EVENT_DISABLE_TIMING") == static_cast<long long>(CU_EVENT_DISABLE_TIMING));
  CHECK(headerValue(header, "CU_MEMHOSTREGISTER_PORTABLE") == static_cast<long long>(CU_MEMHOSTREGISTER_PORTABLE));
  CHECK(headerValue(header, "CU_MEMHOSTALLOC_PORTABLE") == static_cast<long long>(CU_MEMHOSTALLOC_PORTABLE));
  CHECK(headerValue(header, "CU_DEVICE_ATTRIBUTE_PCI_BUS_ID") == CU_DEVICE_ATTRIBUTE_PCI_BUS_ID);
  CHECK(headerValue(header, "CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID") == CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID);
  CHECK(headerValue(header, "CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID") == CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID);
  CHECK(headerValue(header, "CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED") ==
        CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
  CHECK(headerValue(header, "CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED") == CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
  CHECK(headerValue(header, "CU_POINTER_ATTRIBUTE_CONTEXT") == CU_POINTER_ATTRIBUTE_CONTEXT);
  CHECK(headerValue(header, "CU_POINTER_ATTRIBUTE_MEMORY_TYPE") == CU_POINTER_ATTRIBUTE_MEMORY_TYPE);
  CHECK(headerValue(header, "CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL") == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL);
  CHECK(headerValue(header, "CU_MEMORYTYPE_HOST") == static_cast<long long>(CU_MEMORYTYPE_HOST));
  CHECK(headerValue(header, "CU_MEMORYTYPE_DEVICE") == static_cast<long long>(CU_MEMORYTYPE_DEVICE));
  CHECK(headerValue(header, "CU_MEMORYTYPE_ARRAY") == static_cast<long long>(CU_MEMORYTYPE_ARRAY));
  CHECK(headerValue(header, "CU_MEMORYTYPE_UNIFIED") == static_cast<long long>(CU_MEMORYTYPE_UNIFIED));
  CHECK(headerValue(header, "CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD") == CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD);
  CHECK(headerValue(header, "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR") == CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  CHECK(headerValue(header, "CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE") ==
        static_cast<long long>(CU_MEM_RANGE_FLAG_DMA_BUF_MAPPING_TYPE_PCIE));
  CHECK(headerValue(header, "CU_GET_PROC_ADDRESS_SUCCESS") == CU_GET_PROC_ADDRESS_SUCCESS);
  CHECK(headerValue(header, "CU_GET_PROC_ADDRESS_DEFAULT") == static_cast<long long>(CU_GET_PROC_ADDRESS_DEFAULT));
  // The pointer type must be 64 bits wide like CUdeviceptr_v2 on x86-64/aarch64.
  STATIC_REQUIRE(sizeof(CUdeviceptr) == 8);
}

TEST_CASE("cuda_driver: a missing library is a reason, not an error", "[cuda]") {
  DriverApi api;
  std::string why;
  REQUIRE_FALSE(loadDriverFrom("libcuda-railnet-does-not-exist.so.1", &api, &why));
  CHECK(why.find("libcuda-railnet-does-not-exist.so.1 not found") != std::string::npos);
  CHECK(api.cuInit == nullptr);
}

TEST_CASE("cuda_driver: a library without the driver symbols is refused and named", "[cuda]") {
  DriverApi api;
  std::string why;
  REQUIRE_FALSE(loadDriverFrom("libc.so.6", &api, &why));
  CHECK(why.find("symbol cuInit missing") != std::string::npos);
  CHECK(why.find("dlsym") != std::string::npos);  // libc has no cuGetProcAddress either
  CHECK(api.cuInit == nullptr);
  CHECK(api.cuDeviceGet == nullptr);
}

TEST_CASE("cuda_driver: the process-wide load answers the same every time", "[cuda]") {
  std::string first;
  std::string second;
  const DriverApi* a = loadDriver(&first);
  const DriverApi* b = loadDriver(&second);
  CHECK(a == b);
  CHECK(first == second);
  CHECK(loadDriver(nullptr) == a);
  // Whether this machine has a driver is decided by dlopen itself, independently of our code.
  void* probe = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
  if (probe == nullptr) probe = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (probe == nullptr) {
    REQUIRE(a == nullptr);
    CHECK(first.find("libcuda.so.1 not found") != std::string::npos);
    std::string initWhy;
    CHECK(initDriver(&initWhy) == nullptr);
    CHECK(initWhy == first);
  } else {
    dlclose(probe);
    REQUIRE(a != nullptr);
    CHECK(a->cuMemGetHandleForAddressRange != nullptr);  // any driver from the last years has it
    CHECK(a->driverVersion >= 11000);
    CHECK(a->errorText(CUDA_ERROR_NO_DEVICE).find("100") != std::string::npos);
  }
}
