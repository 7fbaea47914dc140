// Memory registrations shared and reference-counted per protection domain. NCCL registers each buffer once
// per comm, and several comms (channels, peers) register the same buffers; registering pinned pages again
// costs a syscall and NIC translation entries, so a range already covered by a registration reuses it.
// Ranges are widened to whole pages, as the NIC registers pages. Thread-safe: NCCL registers from its proxy
// service thread while other threads use the same device.
//
// A registration also has a kind (the NCCL_PTR_* type it was made for): host memory, CUDA memory registered
// through a DMA-BUF or peermem, and NCCL's own DMA-BUF fds are registered by different verbs, so a range is
// only shared between acquires of the same kind.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

#include "railnet/nccl/common.h"

namespace railnet::verbs {

template <class Registration>
class RegistrationCache {
 public:
  using Register = std::function<Registration(void* start, size_t length)>;  // throws on failure
  using Deregister = std::function<void(Registration)>;

  RegistrationCache(Register doRegister, Deregister doDeregister, size_t pageSize)
      : register_(std::move(doRegister)), deregister_(std::move(doDeregister)), pageSize_(pageSize) {}
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;
  ~RegistrationCache() { clear(); }

  // Deregisters everything still registered (the owner is going away).
  void clear() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& entry : entries_) deregister_(entry.registration);
    entries_.clear();
  }

  // The whole pages [begin, end) that cover [data, data + size); zero bytes still cover one page (a valid key).
  struct PageSpan {
    uintptr_t begin;
    uintptr_t end;
  };
  static PageSpan pagesOf(const void* data, size_t size, size_t pageSize) {
    uintptr_t begin = reinterpret_cast<uintptr_t>(data) / pageSize * pageSize;
    uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size + pageSize - 1) / pageSize * pageSize;
    if (end == begin) end = begin + pageSize;
    return {begin, end};
  }

  // A registration of `kind` covering [data, data + size), shared if one exists; pair each with release().
  // `doRegister`, when given, registers a new range instead of the cache's own function (e.g. with the
  // DMA-BUF fd of this call); it receives the page-aligned range.
  Registration acquire(void* data, size_t size, int kind = NCCL_PTR_HOST, const Register& doRegister = {}) {
    PageSpan span = pagesOf(data, size, pageSize_);
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& entry : entries_) {
      if (entry.kind == kind && entry.begin <= span.begin && span.end <= entry.end) {
        ++entry.references;
        return entry.registration;
      }
    }
    const Register& make = doRegister ? doRegister : register_;
    Registration registration = make(reinterpret_cast<void*>(span.begin), span.end - span.begin);
    entries_.push_back({span.begin, span.end, kind, registration, 1});
    return registration;
  }

  void release(Registration registration) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < entries_.size(); ++i) {
      if (entries_[i].registration != registration) continue;
      if (--entries_[i].references == 0) {
        deregister_(registration);
        entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(i));
      }
      return;
    }
  }

  size_t size() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return entries_.size();
  }

 private:
  struct Entry {
    uintptr_t begin;
    uintptr_t end;
    int kind;
    Registration registration;
    int references;
  };
  Register register_;
  Deregister deregister_;
  size_t pageSize_;
  mutable std::mutex mutex_;
  std::vector<Entry> entries_;  // guarded by mutex_; few entries (NCCL's buffers), so a scan is enough
};

}  // namespace railnet::verbs
