#include "topo/netif.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>

#include "railnet/log.h"
#include "railnet/settings.h"
#include "topo/name_filter.h"

namespace railnet::topo {
namespace {

std::string sysfsPciPath(const std::string& ifname) {
  std::string link = "/sys/class/net/" + ifname + "/device";
  char resolved[PATH_MAX];
  if (realpath(link.c_str(), resolved) == nullptr) return {};
  // Only PCI functions count; virtual devices (e.g. virtio on some platforms) still resolve under /sys/devices.
  return strstr(resolved, "/pci") != nullptr ? std::string(resolved) : std::string();
}

int sysfsSpeed(const std::string& ifname) {
  std::ifstream in("/sys/class/net/" + ifname + "/speed");
  int speed = 0;
  if (!(in >> speed) || speed < 0) return 0;
  return speed;
}

bool usableAddress(const ifaddrs* entry) {
  if (entry->ifa_addr == nullptr || (entry->ifa_flags & IFF_UP) == 0) return false;
  int family = entry->ifa_addr->sa_family;
  if (family == AF_INET6) {
    // Link-local IPv6 needs a scope id on every peer; skip it as NCCL does.
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr);
    if (IN6_IS_ADDR_LINKLOCAL(&in6->sin6_addr)) return false;
  }
  return family == AF_INET || family == AF_INET6;
}

std::vector<NetInterface> collect(const ifaddrs* list, const NameFilter& filter, int family) {
  std::vector<NetInterface> result;
  for (const ifaddrs* entry = list; entry != nullptr; entry = entry->ifa_next) {
    if (!usableAddress(entry)) continue;
    int entryFamily = entry->ifa_addr->sa_family;
    if (family != AF_UNSPEC && entryFamily != family) continue;
    std::string name = entry->ifa_name;
    bool loopback = (entry->ifa_flags & IFF_LOOPBACK) != 0;
    if (!filter.matches(name)) continue;
    NetInterface* existing = nullptr;
    for (NetInterface& candidate : result) {
      if (candidate.name == name) existing = &candidate;
    }
    // One device per interface; IPv4 wins over IPv6 unless a family was forced.
    if (existing != nullptr && !(existing->family == AF_INET6 && entryFamily == AF_INET)) continue;
    NetInterface item;
    item.name = name;
    item.family = entryFamily;
    item.addressLength = entryFamily == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&item.address, entry->ifa_addr, item.addressLength);
    item.loopback = loopback;
    item.pciPath = sysfsPciPath(name);
    item.speedMbps = sysfsSpeed(name);
    if (existing != nullptr) {
      *existing = std::move(item);
    } else {
      result.push_back(std::move(item));
    }
  }
  return result;
}

}  // namespace

std::vector<NetInterface> discoverInterfaces(std::string_view spec, std::string_view family) {
  // The spellings of RAILNET_SOCKET_FAMILY, from the settings table.
  Settings parsed;
  std::string error;
  if (!parseSetting("RAILNET_SOCKET_FAMILY", std::string(family).c_str(), &parsed, &error)) {
    RN_WARN("NET/railnet: %s; using any family", error.c_str());
  }
  return discoverInterfaces(spec, parsed.socketFamily);
}

std::vector<NetInterface> discoverInterfaces(std::string_view spec, AddressFamily family) {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return {};
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> list(raw, freeifaddrs);
  NameFilter filter(spec, NameFilter::Syntax::kNames);
  const int wanted = static_cast<int>(family);
  if (!filter.empty()) return collect(list.get(), filter, wanted);
  // Nothing named: NCCL's own order (src/misc/socket.cc, ncclFindInterfaces), the first that finds any.
  for (const char* automatic : kAutomaticInterfaces) {
    std::vector<NetInterface> result = collect(list.get(), NameFilter(automatic, NameFilter::Syntax::kNames), wanted);
    if (!result.empty()) return result;
  }
  return {};
}

std::string formatAddress(const sockaddr* address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address->sa_family == AF_INET) {
    auto* in = reinterpret_cast<const sockaddr_in*>(address);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (address->sa_family == AF_INET6) {
    auto* in6 = reinterpret_cast<const sockaddr_in6*>(address);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    return "[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "<unknown address family " + std::to_string(address->sa_family) + ">";
}

}  // namespace railnet::topo
