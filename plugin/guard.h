// Every ABI entry point runs its body through guarded(): no exception crosses into NCCL, and each failure
// comes back as an ncclResult_t with its reason logged.
#pragma once

#include <exception>
#include <new>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet {

template <class Body>
ncclResult_t guarded(const char* entryPoint, Body&& body) noexcept {
  try {
    return body();
  } catch (const Error& error) {
    RN_WARN("%s", error.what());
    return error.code();
  } catch (const std::bad_alloc&) {
    RN_WARN("NET/railnet: %s: out of memory", entryPoint);
    return ncclSystemError;
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: %s: %s", entryPoint, error.what());
    return ncclInternalError;
  } catch (...) {
    RN_WARN("NET/railnet: %s: unknown exception", entryPoint);
    return ncclInternalError;
  }
}

}  // namespace railnet
