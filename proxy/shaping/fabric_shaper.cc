#include "proxy/shaping/fabric_shaper.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>

#include "base/clock.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::shaping {
namespace {

constexpr uint64_t kMagic = 0x4e4c5246534e5231ull;  // layout version of Shared
// Smallest write a shaped stream waits for: fewer, larger writes than trickling a few bytes per wake-up.
constexpr uint64_t kMinimumGrant = 16 * 1024;

uint64_t burstFor(double bytesPerSecond) {
  // One millisecond at the rate (helpers sleep in whole milliseconds), and never under 256 KiB.
  return std::max<uint64_t>(256 * 1024, static_cast<uint64_t>(bytesPerSecond / 1000));
}

std::string hostKey() {
  if (const char* id = std::getenv("NCCL_HOSTID"); id != nullptr && *id != '\0') return id;
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}

}  // namespace

// In shared memory, zero-filled when created: a zero arrival time is long past, so every bucket starts full.
struct FabricShaper::Shared {
  uint64_t magic;
  std::atomic<int64_t> nic[kMaxRails + 1];  // by local rail; [kMaxRails]: NICs without a rail
  std::atomic<int64_t> spine;
};
static_assert(std::atomic<int64_t>::is_always_lock_free, "buckets are shared between processes");

std::shared_ptr<FabricShaper> FabricShaper::get() {
  static std::mutex mutex;
  static std::shared_ptr<FabricShaper> shaper;  // guarded by mutex; lives for the process
  static bool made = false;
  std::lock_guard<std::mutex> lock(mutex);
  if (made) return shaper;
  const Settings& config = settings();
  const double nic = static_cast<double>(config.shapeNicMbps) * 1e6 / 8;
  const double spine = static_cast<double>(config.shapeSpineMbps) * 1e6 / 8;
  if (nic > 0 || spine > 0) {
    shaper.reset(new FabricShaper(nic, spine, hostKey(), false));
    shaper->self_ = shaper;
  }
  made = true;
  return shaper;
}

std::shared_ptr<FabricShaper> FabricShaper::createForTest(double nicBytesPerSecond, double spineBytesPerSecond,
                                                          const std::string& host) {
  std::shared_ptr<FabricShaper> shaper(new FabricShaper(nicBytesPerSecond, spineBytesPerSecond, host, true));
  shaper->self_ = shaper;
  return shaper;
}

FabricShaper::FabricShaper(double nicBytesPerSecond, double spineBytesPerSecond, const std::string& host,
                           bool removeSegment)
    : removeSegment_(removeSegment) {
  if (nicBytesPerSecond > 0) nic_ = std::make_unique<TokenBucket>(nicBytesPerSecond, burstFor(nicBytesPerSecond));
  if (spineBytesPerSecond > 0) {
    spine_ = std::make_unique<TokenBucket>(spineBytesPerSecond, burstFor(spineBytesPerSecond));
  }
  name_ = "/railnet-fabric-" + std::to_string(getuid()) + "-" + std::to_string(std::hash<std::string>{}(host));
  const int fd = shm_open(name_.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0) fail(ncclSystemError, "NET/railnet: fabric shaping: shm_open(%s): %s", name_.c_str(), strerror(errno));
  // Every process sizes it alike; a second ftruncate to the same size changes nothing.
  if (ftruncate(fd, sizeof(Shared)) != 0) {
    const int err = errno;
    close(fd);
    fail(ncclSystemError, "NET/railnet: fabric shaping: ftruncate(%s): %s", name_.c_str(), strerror(err));
  }
  void* mapped = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int err = errno;
  close(fd);
  if (mapped == MAP_FAILED) fail(ncclSystemError, "NET/railnet: fabric shaping: mmap(%s): %s", name_.c_str(), strerror(err));
  shared_ = static_cast<Shared*>(mapped);
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: fabric shaping for host '%s' (%s): NICs %s Mb/s, spine %s Mb/s",
          host.c_str(), name_.c_str(), nic_ ? std::to_string(nicBytesPerSecond * 8 / 1e6).c_str() : "unlimited",
          spine_ ? std::to_string(spineBytesPerSecond * 8 / 1e6).c_str() : "unlimited");
}

FabricShaper::~FabricShaper() {
  // The segment stays for the host's other processes (and the next run: its buckets, in the past, read as full).
  if (shared_ != nullptr) munmap(shared_, sizeof(Shared));
  if (removeSegment_) shm_unlink(name_.c_str());
}

EgressShaping FabricShaper::forStream(int localRail, int remoteRail) {
  std::shared_ptr<FabricShaper> shaper = get();
  return shaper == nullptr ? EgressShaping{} : shaper->streamShaping(localRail, remoteRail);
}

EgressShaping FabricShaper::streamShaping(int localRail, int remoteRail) {
  EgressShaping shaping;
  const int slot = localRail >= 0 ? localRail % kMaxRails : kMaxRails;
  shaping.nic_ = nic_ ? &shared_->nic[slot] : nullptr;
  const bool crossRail = localRail >= 0 && remoteRail >= 0 && localRail != remoteRail;
  shaping.spine_ = crossRail && spine_ ? &shared_->spine : nullptr;
  if (shaping.nic_ != nullptr || shaping.spine_ != nullptr) shaping.shaper_ = self_.lock();
  return shaping;
}

uint64_t EgressShaping::take(uint64_t wanted, int64_t nowNs, int64_t* waitNs) const {
  uint64_t granted = wanted;
  if (nic_ != nullptr) {
    granted = shaper_->nic_->take(*nic_, wanted, kMinimumGrant, nowNs, waitNs);
    if (granted == 0) return 0;
  }
  if (spine_ != nullptr) {
    const uint64_t spine = shaper_->spine_->take(*spine_, granted, kMinimumGrant, nowNs, waitNs);
    if (nic_ != nullptr) shaper_->nic_->refund(*nic_, granted - spine);
    granted = spine;
  }
  return granted;
}

bool EgressShaping::takeWhole(uint64_t bytes) const {
  if (shaper_ == nullptr || bytes == 0) return true;
  const int64_t now = monotonicNs();
  int64_t wait = 0;
  uint64_t granted = bytes;
  // A message larger than a burst could never find room for all of it: it goes once a burst's worth is there.
  uint64_t nicGranted = 0;
  if (nic_ != nullptr) {
    nicGranted = shaper_->nic_->take(*nic_, bytes, std::min(bytes, shaper_->nic_->burstBytes()), now, &wait);
    if (nicGranted == 0) return false;
  }
  if (spine_ != nullptr) {
    granted = shaper_->spine_->take(*spine_, bytes, std::min(bytes, shaper_->spine_->burstBytes()), now, &wait);
    if (granted == 0 && nic_ != nullptr) shaper_->nic_->refund(*nic_, nicGranted);
  }
  return granted != 0;
}

void EgressShaping::refund(uint64_t bytes) const {
  if (nic_ != nullptr) shaper_->nic_->refund(*nic_, bytes);
  if (spine_ != nullptr) shaper_->spine_->refund(*spine_, bytes);
}

}  // namespace railnet::shaping
