#include "proxy/progress/link_watch.h"

#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "railnet/log.h"

namespace railnet::progress {
namespace {

std::mutex gWatchMutex;
std::weak_ptr<LinkWatch> gWatch;  // guarded by gWatchMutex

}  // namespace

std::vector<LinkEvent> parseLinkMessages(const void* data, size_t size) {
  std::vector<LinkEvent> events;
  const auto* bytes = static_cast<const char*>(data);
  size_t at = 0;
  while (size - at >= sizeof(nlmsghdr)) {
    nlmsghdr header;
    memcpy(&header, bytes + at, sizeof(header));
    if (header.nlmsg_len < sizeof(nlmsghdr) || header.nlmsg_len > size - at) break;  // cut short: stop
    const size_t end = at + header.nlmsg_len;
    if ((header.nlmsg_type == RTM_NEWLINK || header.nlmsg_type == RTM_DELLINK) &&
        header.nlmsg_len >= NLMSG_LENGTH(sizeof(ifinfomsg))) {
      ifinfomsg info;
      memcpy(&info, bytes + at + NLMSG_HDRLEN, sizeof(info));
      LinkEvent event;
      event.index = info.ifi_index;
      event.up = header.nlmsg_type == RTM_NEWLINK && (info.ifi_flags & IFF_UP) != 0 && (info.ifi_flags & IFF_RUNNING) != 0;
      // Attributes follow the ifinfomsg, each aligned to 4 bytes: the interface's name is IFLA_IFNAME.
      size_t attr = at + NLMSG_HDRLEN + NLMSG_ALIGN(sizeof(ifinfomsg));
      while (end - attr >= sizeof(rtattr) && attr < end) {
        rtattr attribute;
        memcpy(&attribute, bytes + attr, sizeof(attribute));
        if (attribute.rta_len < sizeof(rtattr) || attribute.rta_len > end - attr) break;
        if (attribute.rta_type == IFLA_IFNAME) {
          const char* name = bytes + attr + RTA_LENGTH(0);
          const size_t most = attribute.rta_len - RTA_LENGTH(0);
          event.name.assign(name, strnlen(name, most));
        }
        attr += RTA_ALIGN(attribute.rta_len);
      }
      events.push_back(std::move(event));
    }
    at += NLMSG_ALIGN(header.nlmsg_len);
    if (at > size) break;
  }
  return events;
}

std::string interfaceOfNic(const std::string& nicName) { return nicName.substr(0, nicName.find('@')); }

std::shared_ptr<LinkWatch> LinkWatch::acquire() {
  std::lock_guard<std::mutex> lock(gWatchMutex);
  std::shared_ptr<LinkWatch> watch = gWatch.lock();
  if (watch) return watch;
  const int netlink = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
  if (netlink < 0) {
    const int err = errno;
    RN_INFO(NCCL_NET, "NET/railnet: no link-state notifications (netlink socket: %s); silence alone detects a dead link",
            strerror(err));
    return nullptr;
  }
  sockaddr_nl address{};
  address.nl_family = AF_NETLINK;
  address.nl_groups = RTMGRP_LINK;
  const int wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (bind(netlink, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 || wake < 0) {
    const int err = errno;
    RN_INFO(NCCL_NET, "NET/railnet: no link-state notifications (%s); silence alone detects a dead link", strerror(err));
    close(netlink);
    if (wake >= 0) close(wake);
    return nullptr;
  }
  watch = std::make_shared<LinkWatch>(netlink, wake);
  gWatch = watch;
  return watch;
}

LinkWatch::LinkWatch(int netlinkFd, int wakeFd) : netlinkFd_(netlinkFd), wakeFd_(wakeFd) {
  thread_ = std::thread([this] { run(); });
  pthread_setname_np(thread_.native_handle(), "railnet-link");
}

LinkWatch::~LinkWatch() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wakeFd_, &one, sizeof(one));
  thread_.join();
  close(netlinkFd_);
  close(wakeFd_);
}

uint64_t LinkWatch::subscribe(Handler handler) {
  std::lock_guard<std::mutex> lock(mutex_);
  handlers_[++nextSubscription_] = std::make_shared<Handler>(std::move(handler));
  return nextSubscription_;
}

void LinkWatch::unsubscribe(uint64_t subscription) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    handlers_.erase(subscription);
  }
  // A call that began before the erase ends before this returns.
  std::lock_guard<std::mutex> calls(callMutex_);
}

bool LinkWatch::down(const std::string& interface) {
  std::lock_guard<std::mutex> lock(mutex_);
  return down_.count(interface) != 0;
}

void LinkWatch::run() {
  alignas(nlmsghdr) char buffer[16384];
  for (;;) {
    pollfd fds[2] = {{netlinkFd_, POLLIN, 0}, {wakeFd_, POLLIN, 0}};
    (void)poll(fds, 2, -1);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stop_) return;
    }
    for (;;) {
      const ssize_t got = recv(netlinkFd_, buffer, sizeof(buffer), 0);
      if (got <= 0) break;  // drained (EAGAIN), or ENOBUFS after an overflow: the next change is seen anyway
      for (const LinkEvent& event : parseLinkMessages(buffer, static_cast<size_t>(got))) {
        // Only changes: the kernel repeats RTM_NEWLINK for other reasons (statistics, addresses, MTU).
        auto known = lastUp_.find(event.index);
        const bool changed = known == lastUp_.end() ? !event.up : known->second != event.up;
        lastUp_[event.index] = event.up;
        if (!changed || event.name.empty()) continue;
        RN_INFO(NCCL_NET, "NET/railnet: link %s is %s", event.name.c_str(), event.up ? "up" : "down");
        std::lock_guard<std::mutex> calls(callMutex_);
        std::vector<std::shared_ptr<Handler>> handlers;
        {
          std::lock_guard<std::mutex> lock(mutex_);
          if (event.up) {
            down_.erase(event.name);
          } else {
            down_.insert(event.name);
          }
          for (const auto& entry : handlers_) handlers.push_back(entry.second);
        }
        for (const auto& handler : handlers) (*handler)(event.name, event.up);
      }
    }
  }
}

void LinkSubscription::start(LinkWatch::Handler handler) {
  watch_ = LinkWatch::acquire();
  if (watch_) id_ = watch_->subscribe(std::move(handler));
}

void LinkSubscription::reset() {
  if (watch_) watch_->unsubscribe(id_);
  watch_.reset();
}

}  // namespace railnet::progress
