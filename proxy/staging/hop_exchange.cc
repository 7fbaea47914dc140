#include "proxy/staging/hop_exchange.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstddef>
#include <cstring>
#include <fstream>
#include <map>
#include <vector>

#include "base/cuda_allocation.h"
#include "proxy/staging/copy_queue.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/text.h"

namespace railnet::staging {
namespace {

constexpr uint32_t kMagic = 0x524e4850;  // "RNHP"
constexpr uint32_t kVersion = 1;
constexpr int kReplyTimeoutMs = 10000;   // a local process making one allocation

struct Request {
  uint32_t magic = kMagic;
  uint32_t version = kVersion;
  uint64_t bytes = 0;
};

struct Reply {
  uint32_t magic = kMagic;
  int32_t status = 0;    // 0: the staging's fd rides along (SCM_RIGHTS), then its DMA-BUF when hasDmabuf
  uint64_t bytes = 0;    // the allocation's size (rounded up to its granularity)
  uint32_t hasDmabuf = 0;
  char why[200] = {};
};

// FNV-1a: a short, stable name for the host key.
uint64_t fnv1a(const std::string& text) {
  uint64_t hash = 1469598103934665603ull;
  for (unsigned char c : text) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

std::string hostKey() {
  if (const char* id = getenv("NCCL_HOSTID"); id != nullptr && id[0] != '\0') return id;
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  return std::string(name) + "/" + boot;
}

socklen_t abstractAddress(const std::string& name, sockaddr_un* address) {
  *address = {};
  address->sun_family = AF_UNIX;
  const size_t length = std::min(name.size(), sizeof(address->sun_path) - 1);
  memcpy(address->sun_path + 1, name.data(), length);  // sun_path[0] == 0: the abstract namespace
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + length);
}

protocol::Fd connectTo(const std::string& busId, std::string* why) {
  protocol::Fd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd.valid()) {
    *why = "socket(AF_UNIX): " + errnoText(errno);
    return fd;
  }
  sockaddr_un address;
  const socklen_t length = abstractAddress(hopExchangeName(busId), &address);
  if (connect(fd.get(), reinterpret_cast<sockaddr*>(&address), length) != 0) {
    *why = "no process on this host serves GPU " + busId + " (" + hopExchangeName(busId) + ": " + errnoText(errno) + ")";
    fd.reset();
  }
  return fd;
}

bool sameUser(int fd) {
  ucred peer{};
  socklen_t length = sizeof(peer);
  return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &peer, &length) == 0 && peer.uid == geteuid();
}

// The reply, with `fds` (up to two: the staging, then its DMA-BUF) as SCM_RIGHTS.
void sendReply(int fd, const Reply& reply, const std::vector<int>& fds) {
  iovec part{const_cast<Reply*>(&reply), sizeof(reply)};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  if (!fds.empty()) {
    message.msg_control = control;
    message.msg_controllen = CMSG_SPACE(fds.size() * sizeof(int));
    cmsghdr* header = CMSG_FIRSTHDR(&message);
    header->cmsg_level = SOL_SOCKET;
    header->cmsg_type = SCM_RIGHTS;
    header->cmsg_len = CMSG_LEN(fds.size() * sizeof(int));
    memcpy(CMSG_DATA(header), fds.data(), fds.size() * sizeof(int));
  }
  // A client that left already just misses its reply; its hang-up is seen next.
  (void)sendmsg(fd, &message, MSG_NOSIGNAL);
}

}  // namespace

std::string hopExchangeName(const std::string& busId) {
  std::string lower = busId;  // CUDA spells bus ids in capitals, sysfs and hwloc in lower case
  for (char& c : lower) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return textf("railnet-hop/%016llx/%s", static_cast<unsigned long long>(fnv1a(hostKey())), lower.c_str());
}

bool hopExchangeServed(const std::string& busId) {
  std::string why;
  return connectTo(busId, &why).valid();
}

// ---- the server ---------------------------------------------------------------------------------------------

HopExchangeServer::HopExchangeServer(const cuda::DriverApi& cuda, int device, std::string busId)
    : cuda_(cuda), device_(device), busId_(std::move(busId)) {
  protocol::Fd listener(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_un address;
  const socklen_t length = abstractAddress(hopExchangeName(busId_), &address);
  if (!listener.valid() || bind(listener.get(), reinterpret_cast<sockaddr*>(&address), length) != 0 ||
      listen(listener.get(), 64) != 0) {
    const int error = errno;
    if (error != EADDRINUSE) {
      RN_INFO(NCCL_NET, "NET/railnet: NVLink hop: cannot serve GPU %s to other processes: %s", busId_.c_str(),
              errnoText(error).c_str());
    }
    return;  // EADDRINUSE: another process on this host serves this GPU
  }
  protocol::Fd wake(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return;
  // Without it the staging is still served, but without a DMA-BUF: the asker's NIC registration then fails, named.
  if (cuda_.cuDevicePrimaryCtxRetain == nullptr || cuda_.cuDevicePrimaryCtxRetain(&primary_, device_) != cuda::CUDA_SUCCESS) {
    primary_ = nullptr;
  }
  listener_ = std::move(listener);
  wake_ = std::move(wake);
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "railnet-hop");
  RN_INFO(NCCL_NET, "NET/railnet: NVLink hop: serving staging on GPU %d (%s) to railnet in other processes of this "
          "host", device_, busId_.c_str());
}

HopExchangeServer::~HopExchangeServer() {
  if (!thread_.joinable()) return;
  stop_.store(true);
  uint64_t one = 1;
  (void)write(wake_.get(), &one, sizeof(one));
  thread_.join();
  if (primary_ != nullptr) cuda_.cuDevicePrimaryCtxRelease(device_);
}

void HopExchangeServer::run() {
  std::map<int, std::pair<protocol::Fd, std::unique_ptr<cuda::CuMemAllocation>>> clients;  // by fd
  std::vector<pollfd> fds;
  while (!stop_.load()) {
    fds.assign({{wake_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}});
    for (const auto& [fd, client] : clients) fds.push_back({fd, POLLIN, 0});
    if (poll(fds.data(), fds.size(), -1) < 0) {
      if (errno == EINTR) continue;
      RN_WARN("NET/railnet: NVLink hop server of GPU %s stops: poll: %s", busId_.c_str(), errnoText(errno).c_str());
      return;
    }
    if (fds[0].revents != 0) return;
    if (fds[1].revents & POLLIN) {
      protocol::Fd client(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (client.valid() && sameUser(client.get())) {
        const int fd = client.get();
        clients[fd] = {std::move(client), nullptr};
      }
    }
    for (size_t i = 2; i < fds.size(); ++i) {
      if (fds[i].revents == 0) continue;
      auto found = clients.find(fds[i].fd);
      Request request;
      const ssize_t got = recv(fds[i].fd, &request, sizeof(request), MSG_DONTWAIT);
      if (got == -1 && (errno == EAGAIN || errno == EINTR)) continue;
      // A hang-up, an error, a malformed request or a second one: the client goes, and its staging with it.
      if (got != static_cast<ssize_t>(sizeof(request)) || request.magic != kMagic || request.version != kVersion ||
          found->second.second != nullptr) {
        clients.erase(found);
        continue;
      }
      Reply reply;
      std::string why;
      std::unique_ptr<cuda::CuMemAllocation> staging;
      if (request.bytes == 0 || request.bytes > kMaxBytes) {
        why = "asked for " + std::to_string(request.bytes) + " bytes (1 to " + std::to_string(kMaxBytes) + ")";
      } else {
        staging = cuda::CuMemAllocation::create(cuda_, device_, request.bytes, {{}, true, true}, &why);
      }
      protocol::Fd exported(staging != nullptr ? staging->exportFd(&why) : -1);
      if (!exported.valid()) {
        reply.status = 1;
        snprintf(reply.why, sizeof(reply.why), "%s", why.c_str());
        sendReply(fds[i].fd, reply, {});
        clients.erase(found);
        continue;
      }
      // The NIC registration needs a DMA-BUF, which only this process (its GPU holds the memory) can export.
      // The export needs a current context of the GPU (this thread has none of its own).
      protocol::Fd dmabuf;
      if (primary_ == nullptr) {
        why = "no context of GPU " + busId_ + " in its process";
      } else if (ContextScope scope(cuda_, primary_); scope.ok()) {
        dmabuf.reset(cuda::exportDmabuf(cuda_, staging->address(), staging->mappedBytes(), &why));
      } else {
        why = "cannot enter GPU " + busId_ + "'s context";
      }
      reply.bytes = staging->mappedBytes();
      reply.hasDmabuf = dmabuf.valid() ? 1 : 0;
      if (!dmabuf.valid()) snprintf(reply.why, sizeof(reply.why), "no DMA-BUF: %s", why.c_str());
      std::vector<int> handed{exported.get()};
      if (dmabuf.valid()) handed.push_back(dmabuf.get());
      sendReply(fds[i].fd, reply, handed);  // our copies of the fds close here; the client holds its own
      found->second.second = std::move(staging);
    }
  }
}

// ---- the client ---------------------------------------------------------------------------------------------

std::unique_ptr<ImportedStaging> ImportedStaging::request(const cuda::DriverApi& cuda, const std::string& railGpuBusId,
                                                          int device, size_t bytes, std::string* why) {
  if (cuda.cuMemImportFromShareableHandle == nullptr || cuda.cuMemAddressReserve == nullptr || cuda.cuMemMap == nullptr ||
      cuda.cuMemSetAccess == nullptr) {
    *why = "the CUDA driver lacks the cuMem import API";
    return nullptr;
  }
  std::unique_ptr<ImportedStaging> staging(new ImportedStaging(cuda));
  staging->connection_ = connectTo(railGpuBusId, why);
  if (!staging->connection_.valid()) return nullptr;
  const int fd = staging->connection_.get();
  Request request;
  request.bytes = bytes;
  if (send(fd, &request, sizeof(request), MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof(request))) {
    *why = "sending the request to GPU " + railGpuBusId + "'s process: " + errnoText(errno);
    return nullptr;
  }
  pollfd wait{fd, POLLIN, 0};
  if (poll(&wait, 1, kReplyTimeoutMs) != 1) {
    *why = "GPU " + railGpuBusId + "'s process did not answer within " + std::to_string(kReplyTimeoutMs / 1000) + " s";
    return nullptr;
  }
  Reply reply;
  iovec part{&reply, sizeof(reply)};
  msghdr message{};
  message.msg_iov = &part;
  message.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  message.msg_control = control;
  message.msg_controllen = sizeof(control);
  const ssize_t got = recvmsg(fd, &message, MSG_CMSG_CLOEXEC);
  std::vector<protocol::Fd> received;  // owned at once, so none leaks whatever the reply says
  for (cmsghdr* header = CMSG_FIRSTHDR(&message); header != nullptr; header = CMSG_NXTHDR(&message, header)) {
    if (header->cmsg_level != SOL_SOCKET || header->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (header->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t k = 0; k < count; ++k) {
      int one = -1;
      memcpy(&one, CMSG_DATA(header) + k * sizeof(int), sizeof(int));
      received.emplace_back(one);
    }
  }
  protocol::Fd exported = received.empty() ? protocol::Fd() : std::move(received[0]);
  if (got != static_cast<ssize_t>(sizeof(reply)) || reply.magic != kMagic) {
    *why = "a malformed reply from GPU " + railGpuBusId + "'s process";
    return nullptr;
  }
  if (reply.status != 0 || !exported.valid() || reply.bytes < bytes) {
    reply.why[sizeof(reply.why) - 1] = '\0';
    *why = "GPU " + railGpuBusId + "'s process made no staging: " + (reply.status != 0 ? reply.why : "no memory handed over");
    return nullptr;
  }
  auto failed = [&](const char* call, cuda::CUresult result) {
    *why = std::string(call) + " of GPU " + railGpuBusId + "'s staging: " + cuda.errorText(result);
    return nullptr;
  };
  if (auto r = cuda.cuMemImportFromShareableHandle(&staging->handle_, reinterpret_cast<void*>(static_cast<intptr_t>(exported.get())),
                                                   cuda::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != cuda::CUDA_SUCCESS) {
    return failed("cuMemImportFromShareableHandle", r);
  }
  staging->imported_ = true;
  staging->bytes_ = reply.bytes;
  if (reply.hasDmabuf != 0 && received.size() == 2) {
    staging->dmabuf_ = std::move(received[1]);
  } else {
    reply.why[sizeof(reply.why) - 1] = '\0';
    staging->dmabufWhy_ = reply.why;
  }
  if (auto r = cuda.cuMemAddressReserve(&staging->address_, staging->bytes_, 0, 0, 0); r != cuda::CUDA_SUCCESS) {
    staging->address_ = 0;
    return failed("cuMemAddressReserve", r);
  }
  if (auto r = cuda.cuMemMap(staging->address_, staging->bytes_, 0, staging->handle_, 0); r != cuda::CUDA_SUCCESS) {
    return failed("cuMemMap", r);
  }
  staging->mapped_ = true;
  cuda::CUmemAccessDesc access{};
  access.location = {cuda::CU_MEM_LOCATION_TYPE_DEVICE, device};
  access.flags = cuda::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (auto r = cuda.cuMemSetAccess(staging->address_, staging->bytes_, &access, 1); r != cuda::CUDA_SUCCESS) {
    return failed("cuMemSetAccess (peer access from this process's GPU)", r);
  }
  return staging;
}

ImportedStaging::~ImportedStaging() {
  if (mapped_) cuda_.cuMemUnmap(address_, bytes_);
  if (address_ != 0) cuda_.cuMemAddressFree(address_, bytes_);
  if (imported_) cuda_.cuMemRelease(handle_);
}

}  // namespace railnet::staging
