// The handles railnet has given a caller (NCCL's GIN/RMA side, or the doorbell API's application) and not yet taken
// back, by kind: a pointer a caller passes is used only once found here, so a freed or foreign one is refused
// untouched with ncclInvalidUsage, as the net side does (D60).
#pragma once

#include <memory>
#include <mutex>
#include <unordered_set>

#include "railnet/error.h"

namespace railnet {

template <class Object>
class LiveSet {
 public:
  explicit LiveSet(const char* api) : api_(api) {}
  Object* add(std::unique_ptr<Object> object) {
    std::lock_guard<std::mutex> lock(mutex_);
    live_.insert(object.get());
    return object.release();
  }
  Object* find(const char* entryPoint, const char* kind, void* handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle == nullptr || live_.count(handle) == 0) {
      fail(ncclInvalidUsage, "NET/railnet: %s %s: %p is not a live railnet %s", api_, entryPoint, handle, kind);
    }
    return static_cast<Object*>(handle);
  }
  std::unique_ptr<Object> take(const char* entryPoint, const char* kind, void* handle) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (handle == nullptr || live_.erase(handle) == 0) {
      fail(ncclInvalidUsage, "NET/railnet: %s %s: %p is not a live railnet %s", api_, entryPoint, handle, kind);
    }
    return std::unique_ptr<Object>(static_cast<Object*>(handle));
  }

 private:
  const char* api_;
  std::mutex mutex_;
  std::unordered_set<const void*> live_;
};

}  // namespace railnet
