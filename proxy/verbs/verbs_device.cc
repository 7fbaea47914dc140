#include "proxy/verbs/verbs_device.h"

#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>

#include "base/cuda_allocation.h"
#include "base/cuda_driver.h"
#include "proxy/nic_counters.h"
#include "proxy/verbs/gpu_direct.h"
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
  // Non-blocking, so the thread never sleeps inside ibv_get_async_event where it could not be stopped.
  int flags = fcntl(context_->async_fd, F_GETFL);
  wakeFd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (flags < 0 || fcntl(context_->async_fd, F_SETFL, flags | O_NONBLOCK) < 0 || wakeFd_ < 0) {
    int err = errno;
    if (wakeFd_ >= 0) close(wakeFd_);
    api_.deallocPd(pd_);
    api_.closeDevice(context_);
    fail(ncclSystemError, "NET/railnet: cannot set up the async-event thread of %s: %s", port_.device.c_str(),
         errnoText(err).c_str());
  }
  asyncThread_ = std::thread([this] { asyncLoop(); });
  // Named here, not by the thread itself: whoever looks right after the device opens (railnet-info, the
  // conformance count of "rn-verbs-async" threads) must find the name even before the thread first runs.
  pthread_setname_np(asyncThread_.native_handle(), "rn-verbs-async");
}

void VerbsDevice::asyncLoop() {
  pollfd fds[2] = {{context_->async_fd, POLLIN, 0}, {wakeFd_, POLLIN, 0}};
  while (!stopping_.load(std::memory_order_acquire)) {
    // The timeout is only a safety net: the destructor wakes the poll through the eventfd.
    int ready = poll(fds, 2, 1000);
    if (ready <= 0 || stopping_.load(std::memory_order_acquire)) continue;
    if ((fds[0].revents & POLLIN) == 0) continue;
    for (;;) {
      ibv_async_event event{};
      if (api_.getAsyncEvent(context_, &event) != 0) break;  // EAGAIN: all taken
      handleAsyncEvent(event);
      api_.ackAsyncEvent(&event);
    }
  }
}

void VerbsDevice::handleAsyncEvent(const ibv_async_event& event) {
  const char* name = api_.eventTypeStr(event.event_type);
  const char* device = port_.device.c_str();
  switch (event.event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
      ibv_qp* qp = event.element.qp;
      std::string what = std::string("async event ") + name + " on QP " + std::to_string(qp->qp_num) + " of " + device;
      RN_WARN("NET/railnet: %s", what.c_str());
      if (qp->qp_context != nullptr) static_cast<QpEventSink*>(qp->qp_context)->onQpAsyncError(what);
      break;
    }
    case IBV_EVENT_CQ_ERR:
      RN_WARN("NET/railnet: async event %s on a CQ of %s", name, device);
      break;
    case IBV_EVENT_DEVICE_FATAL:
      RN_WARN("NET/railnet: async event %s on %s: the device is unusable until it is reset", name, device);
      break;
    case IBV_EVENT_PORT_ERR:
      RN_WARN("NET/railnet: async event %s on %s port %d", name, device, event.element.port_num);
      if (event.element.port_num == port_.port) {
        portActive_.store(false, std::memory_order_release);
        portDowns_.fetch_add(1, std::memory_order_acq_rel);
      }
      break;
    case IBV_EVENT_PORT_ACTIVE:
      RN_INFO(NCCL_NET, "NET/railnet: async event %s on %s port %d", name, device, event.element.port_num);
      if (event.element.port_num == port_.port) {
        portActive_.store(true, std::memory_order_release);
        portUps_.fetch_add(1, std::memory_order_acq_rel);
      }
      break;
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_GID_CHANGE:
      RN_INFO(NCCL_NET, "NET/railnet: async event %s on %s port %d", name, device, event.element.port_num);
      break;
    default:
      RN_INFO(NCCL_NET, "NET/railnet: async event %s on %s", name, device);
      break;
  }
}

void VerbsDevice::stopEvents() {
  stopping_.store(true, std::memory_order_release);
  uint64_t one = 1;
  if (write(wakeFd_, &one, sizeof(one)) < 0) {
    // Cannot happen for an eventfd below its maximum; the poll timeout still ends the thread within a second.
  }
  if (asyncThread_.joinable()) asyncThread_.join();
}

VerbsDevice::~VerbsDevice() {
  stopEvents();
  close(wakeFd_);
  registrations_.clear();
  api_.deallocPd(pd_);
  api_.closeDevice(context_);
}

std::unique_ptr<MemoryRegion> VerbsDevice::registerMemory(void* data, size_t size, int type) {
  if (type == NCCL_PTR_HOST) {
    return std::make_unique<VerbsRegion>(shared_from_this(), registrations_.acquire(data, size, NCCL_PTR_HOST));
  }
  if (type != NCCL_PTR_CUDA) {
    fail(ncclInvalidArgument, "NET/railnet: verbs registration of memory type %d on %s: only NCCL_PTR_HOST (%d) and "
         "NCCL_PTR_CUDA (%d) exist", type, port_.device.c_str(), NCCL_PTR_HOST, NCCL_PTR_CUDA);
  }
  if (!port_.gdrDmabuf && !port_.gdrPeermem) {
    fail(ncclInvalidArgument, "NET/railnet: CUDA memory cannot be registered on %s: %s", port_.device.c_str(),
         port_.gdrSummary.c_str());
  }
  // Not run on hardware (docs/verbs.md): no machine here has a GPU and an RDMA device together.
  auto doRegister = [this](void* start, size_t length) -> ibv_mr* {
    std::string why;
    if (port_.gdrDmabuf) {
      const cuda::DriverApi* driver = cuda::loadDriver(&why);
      int fd = driver != nullptr ? cuda::exportDmabuf(*driver, reinterpret_cast<uintptr_t>(start), length, &why) : -1;
      if (fd >= 0) {
        ibv_mr* mr = api_.regDmabufMr(pd_, 0, length, reinterpret_cast<uint64_t>(start), fd, kAccess);
        int err = errno;
        close(fd);  // the registration holds its own reference to the DMA-BUF
        if (mr != nullptr) return mr;
        why = "ibv_reg_dmabuf_mr: " + errnoText(err);
      }
      if (!port_.gdrPeermem) {
        fail(ncclSystemError, "NET/railnet: DMA-BUF registration of %zu bytes of CUDA memory at %p on %s failed: %s",
             length, start, port_.device.c_str(), why.c_str());
      }
      RN_INFO(NCCL_NET, "NET/railnet: DMA-BUF registration of CUDA memory at %p on %s failed (%s); using peermem",
              start, port_.device.c_str(), why.c_str());
    }
    ibv_mr* mr = api_.regMr(pd_, start, length, kAccess);
    if (mr == nullptr) {
      int err = errno;
      fail(ncclSystemError, "NET/railnet: ibv_reg_mr (peermem) of %zu bytes of CUDA memory at %p on %s failed: %s",
           length, start, port_.device.c_str(), errnoText(err).c_str());
    }
    return mr;
  };
  return std::make_unique<VerbsRegion>(shared_from_this(),
                                       registrations_.acquire(data, size, NCCL_PTR_CUDA, doRegister), NCCL_PTR_CUDA);
}

std::unique_ptr<MemoryRegion> VerbsDevice::registerDmabuf(void* data, size_t size, int type, uint64_t offset, int fd) {
  if (fd < 0) return registerMemory(data, size, type);
  if (api_.regDmabufMr == nullptr) {
    fail(ncclInvalidArgument, "NET/railnet: DMA-BUF registration on %s: libibverbs lacks ibv_reg_dmabuf_mr",
         port_.device.c_str());
  }
  // Not run on hardware (docs/verbs.md).
  auto doRegister = [this, data, offset, fd](void* start, size_t length) -> ibv_mr* {
    uint64_t pageOffset = 0;
    if (!dmabufOffsetOfPage(reinterpret_cast<uintptr_t>(data), offset, reinterpret_cast<uintptr_t>(start),
                            &pageOffset)) {
      fail(ncclInvalidArgument,
           "NET/railnet: DMA-BUF registration of %p at fd offset %lu on %s: the page start %p lies before the fd",
           data, static_cast<unsigned long>(offset), port_.device.c_str(), start);
    }
    ibv_mr* mr = api_.regDmabufMr(pd_, pageOffset, length, reinterpret_cast<uint64_t>(start), fd, kAccess);
    if (mr == nullptr) {
      int err = errno;
      fail(ncclSystemError, "NET/railnet: ibv_reg_dmabuf_mr of %zu bytes (fd %d, offset %lu) on %s failed: %s", length,
           fd, static_cast<unsigned long>(pageOffset), port_.device.c_str(), errnoText(err).c_str());
    }
    return mr;
  };
  return std::make_unique<VerbsRegion>(shared_from_this(),
                                       registrations_.acquire(data, size, NCCL_PTR_DMABUF, doRegister),
                                       NCCL_PTR_DMABUF);
}

}  // namespace railnet::verbs
