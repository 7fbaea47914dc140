#include "proxy/verbs/verbs_device.h"

#include <unistd.h>

#include <cerrno>

#include "railnet/error.h"
#include "railnet/log.h"

namespace railnet::verbs {

namespace {
constexpr int kAccess = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
}  // namespace

VerbsDevice::VerbsDevice(const IbvApi& api, const VerbsPort& port)
    : api_(api),
      port_(port),
      registrations_(
          [this](void* start, size_t length) {
            ibv_mr* mr = api_.regMr(pd_, start, length, kAccess);
            if (mr == nullptr) {
              int err = errno;
              fail(ncclSystemError, "NET/railnet: ibv_reg_mr of %zu bytes at %p on %s failed: %s", length, start,
                   port_.device.c_str(), errnoText(err).c_str());
            }
            return mr;
          },
          [this](ibv_mr* mr) {
            if (api_.deregMr(mr) != 0) RN_WARN("NET/railnet: ibv_dereg_mr on %s failed", port_.device.c_str());
          },
          static_cast<size_t>(sysconf(_SC_PAGESIZE))) {
  context_ = openDeviceByName(api_, port_.device);
  if (context_ == nullptr) fail(ncclSystemError, "NET/railnet: cannot open RDMA device %s", port_.device.c_str());
  pd_ = api_.allocPd(context_);
  if (pd_ == nullptr) {
    int err = errno;
    api_.closeDevice(context_);
    fail(ncclSystemError, "NET/railnet: ibv_alloc_pd on %s failed: %s", port_.device.c_str(), errnoText(err).c_str());
  }
}

VerbsDevice::~VerbsDevice() {
  registrations_.clear();
  api_.deallocPd(pd_);
  api_.closeDevice(context_);
}

std::unique_ptr<MemoryRegion> VerbsDevice::registerMemory(void* data, size_t size, int type) {
  if (type != NCCL_PTR_HOST) {
    fail(ncclInvalidArgument, "NET/railnet: verbs registration of memory type %d is not supported yet (host only)",
         type);
  }
  return std::make_unique<VerbsRegion>(shared_from_this(), registrations_.acquire(data, size));
}

}  // namespace railnet::verbs
