// railnet's own fabric emulation, a test feature (docs/fabric-shaping.md): every NIC of a host sends at most
// RAILNET_SHAPE_NIC_MBPS, and traffic between NICs of different rails also shares one budget per host,
// RAILNET_SHAPE_SPINE_MBPS, as a rail-optimized fabric's spine would. Made for machines where `tc` is not available
// (the GPU machines), so that forwarding to the same-rail NIC can show what it saves. The buckets live in
// shared memory named by the host (NCCL_HOSTID if set, else the hostname), so every railnet process of one real
// or fake host draws from the same ones. TCP data streams only; off (no shared memory, no cost) by default.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "proxy/shaping/token_bucket.h"

namespace railnet::shaping {

class FabricShaper;

// What one data stream draws from: its NIC's bucket, and the spine's when it crosses rails. Empty: unshaped.
class EgressShaping {
 public:
  EgressShaping() = default;
  bool active() const { return shaper_ != nullptr; }
  // Bytes the stream may write now (at most `wanted`; 0 with *waitNs when it must wait). Takes from the NIC and,
  // across rails, the spine; what one grants and the other refuses is given back.
  uint64_t take(uint64_t wanted, int64_t nowNs, int64_t* waitNs) const;
  // Granted bytes the socket did not take.
  void refund(uint64_t bytes) const;
  // All of `bytes` at once or nothing (a message sent inline on the control socket, by NCCL's thread, which
  // cannot wait: isend then returns a NULL request and NCCL retries).
  bool takeWhole(uint64_t bytes) const;

 private:
  friend class FabricShaper;
  std::shared_ptr<FabricShaper> shaper_;
  std::atomic<int64_t>* nic_ = nullptr;
  std::atomic<int64_t>* spine_ = nullptr;  // null: same rail
};

class FabricShaper {
 public:
  // The process's shaper when RAILNET_SHAPE_NIC_MBPS or RAILNET_SHAPE_SPINE_MBPS is set, else nullptr. Throws
  // railnet::Error (ncclSystemError) when the shared memory cannot be made.
  static std::shared_ptr<FabricShaper> get();
  // A stream leaving from a NIC of `localRail` towards `remoteRail` (either -1: unknown, no spine), under the
  // process's shaper (get()); inactive when there is none.
  static EgressShaping forStream(int localRail, int remoteRail);
  // The same under this shaper.
  EgressShaping streamShaping(int localRail, int remoteRail);
  // A shaper of its own (rates in bytes per second, 0: unlimited) on a segment named by `host`, removed when the
  // shaper goes: for tests.
  static std::shared_ptr<FabricShaper> createForTest(double nicBytesPerSecond, double spineBytesPerSecond,
                                                     const std::string& host);

  ~FabricShaper();
  FabricShaper(const FabricShaper&) = delete;
  FabricShaper& operator=(const FabricShaper&) = delete;

  static constexpr int kMaxRails = 64;

 private:
  friend class EgressShaping;
  FabricShaper(double nicBytesPerSecond, double spineBytesPerSecond, const std::string& host, bool removeSegment);
  struct Shared;
  Shared* shared_ = nullptr;
  std::unique_ptr<TokenBucket> nic_;    // null: NICs unlimited
  std::unique_ptr<TokenBucket> spine_;  // null: spine unlimited
  std::string name_;
  bool removeSegment_ = false;
  std::weak_ptr<FabricShaper> self_;
};

}  // namespace railnet::shaping
