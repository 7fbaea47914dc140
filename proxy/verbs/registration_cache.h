// Memory registrations shared and reference-counted per protection domain. NCCL registers each buffer once
// per comm, and several comms (channels, peers) register the same buffers; registering pinned pages again
// costs a syscall and NIC translation entries, so a range already covered by a registration reuses it.
// Ranges are widened to whole pages, as the NIC registers pages. Thread-safe: NCCL registers from its proxy
// service thread while other threads use the same device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <mutex>
#include <vector>

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

  // A registration covering [data, data + size), shared if one exists; pair each with release().
  Registration acquire(void* data, size_t size) {
    uintptr_t begin = reinterpret_cast<uintptr_t>(data) / pageSize_ * pageSize_;
    uintptr_t end = (reinterpret_cast<uintptr_t>(data) + size + pageSize_ - 1) / pageSize_ * pageSize_;
    if (end == begin) end = begin + pageSize_;  // zero bytes still need a valid key
    std::lock_guard<std::mutex> lock(mutex_);
    for (Entry& entry : entries_) {
      if (entry.begin <= begin && end <= entry.end) {
        ++entry.references;
        return entry.registration;
      }
    }
    Registration registration = register_(reinterpret_cast<void*>(begin), end - begin);
    entries_.push_back({begin, end, registration, 1});
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
