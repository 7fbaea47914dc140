// Link state from the OS (rail failover, docs/failover.md "Detection"): one process-wide thread, running while a comm
// that can fail over exists, reads the kernel's link notifications (a NETLINK_ROUTE socket, RTMGRP_LINK) and tells its
// subscribers when an interface stops or starts carrying traffic. A NIC whose carrier drops is then taken out at once
// instead of after RAILNET_FAILOVER_SILENCE_MS, and one whose carrier returns is probed at once. Cheap: the kernel
// sends a message only when a link changes. Subscribers are called from the thread, never under its lock, and
// unsubscribe() returns only once no call is running.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace railnet::progress {

// One link's state in a notification: its interface and whether it can carry traffic (up and running: the
// administrative flag and the carrier).
struct LinkEvent {
  int index = 0;
  std::string name;
  bool up = false;
};

// The link messages (RTM_NEWLINK, RTM_DELLINK) of one netlink datagram; anything else, or a message cut short, is
// skipped. Pure, for the unit tests.
std::vector<LinkEvent> parseLinkMessages(const void* data, size_t size);

class LinkWatch {
 public:
  using Handler = std::function<void(const std::string& interface, bool up)>;
  // The shared watch, started on first use and stopped when its last user releases it; nullptr when the kernel
  // refuses a netlink socket (then silence alone detects a dead link).
  static std::shared_ptr<LinkWatch> acquire();
  LinkWatch(int netlinkFd, int wakeFd);
  ~LinkWatch();
  LinkWatch(const LinkWatch&) = delete;
  LinkWatch& operator=(const LinkWatch&) = delete;

  // Calls `handler` on every change of a link's state from now on; returns the subscription.
  uint64_t subscribe(Handler handler);
  // Synchronous: once it returns, the handler is never called again.
  void unsubscribe(uint64_t subscription);
  // The last notification said `interface` cannot carry traffic (false when none came since the watch started).
  bool down(const std::string& interface);

 private:
  void run();
  int netlinkFd_;
  int wakeFd_;
  std::mutex mutex_;
  std::map<uint64_t, std::shared_ptr<Handler>> handlers_;  // guarded by mutex_
  uint64_t nextSubscription_ = 0;                           // guarded by mutex_
  std::mutex callMutex_;                                    // held while handlers run
  std::map<int, bool> lastUp_;                              // the thread's: per interface index
  std::set<std::string> down_;                              // guarded by mutex_
  bool stop_ = false;                                       // guarded by mutex_
  std::thread thread_;
};

// RAII: a subscription to the shared watch (none when it could not start).
class LinkSubscription {
 public:
  LinkSubscription() = default;
  ~LinkSubscription() { reset(); }
  LinkSubscription(const LinkSubscription&) = delete;
  LinkSubscription& operator=(const LinkSubscription&) = delete;
  void start(LinkWatch::Handler handler);
  void reset();
  // LinkWatch::down, false without a watch.
  bool down(const std::string& interface) { return watch_ && watch_->down(interface); }

 private:
  std::shared_ptr<LinkWatch> watch_;
  uint64_t id_ = 0;
};

// The interface a NIC's name names: "eth0" for "eth0", "lo" for "lo@127.0.1.1" (RAILNET_TCP_ADDRESSES devices).
std::string interfaceOfNic(const std::string& nicName);

}  // namespace railnet::progress
