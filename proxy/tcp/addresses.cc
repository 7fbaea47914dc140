#include "proxy/tcp/addresses.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <cstring>
#include <memory>
#include <string>

#include "railnet/error.h"

namespace railnet::tcp {
namespace {

std::string trimmed(std::string_view text) {
  const size_t begin = text.find_first_not_of(" \t");
  if (begin == std::string_view::npos) return {};
  const size_t end = text.find_last_not_of(" \t");
  return std::string(text.substr(begin, end - begin + 1));
}

bool sameNetwork(const void* a, const void* b, const void* mask, size_t bytes) {
  const auto* x = static_cast<const unsigned char*>(a);
  const auto* y = static_cast<const unsigned char*>(b);
  const auto* m = static_cast<const unsigned char*>(mask);
  for (size_t i = 0; i < bytes; ++i) {
    if ((x[i] & m[i]) != (y[i] & m[i])) return false;
  }
  return true;
}

// The up interface whose address equals `address`, else the loopback interface whose subnet holds it; empty
// when none.
std::string owningInterface(const sockaddr_storage& address) {
  ifaddrs* raw = nullptr;
  if (getifaddrs(&raw) != 0) return {};
  std::unique_ptr<ifaddrs, decltype(&freeifaddrs)> list(raw, freeifaddrs);
  std::string bySubnet;
  for (const ifaddrs* entry = list.get(); entry != nullptr; entry = entry->ifa_next) {
    if (entry->ifa_addr == nullptr || entry->ifa_netmask == nullptr || (entry->ifa_flags & IFF_UP) == 0) continue;
    if (entry->ifa_addr->sa_family != address.ss_family) continue;
    const void* mine;
    const void* theirs;
    const void* mask;
    size_t bytes;
    if (address.ss_family == AF_INET) {
      mine = &reinterpret_cast<const sockaddr_in*>(&address)->sin_addr;
      theirs = &reinterpret_cast<const sockaddr_in*>(entry->ifa_addr)->sin_addr;
      mask = &reinterpret_cast<const sockaddr_in*>(entry->ifa_netmask)->sin_addr;
      bytes = 4;
    } else {
      mine = &reinterpret_cast<const sockaddr_in6*>(&address)->sin6_addr;
      theirs = &reinterpret_cast<const sockaddr_in6*>(entry->ifa_addr)->sin6_addr;
      mask = &reinterpret_cast<const sockaddr_in6*>(entry->ifa_netmask)->sin6_addr;
      bytes = 16;
    }
    if (memcmp(mine, theirs, bytes) == 0) return entry->ifa_name;
    // Only a loopback interface owns its whole subnet (127.0.0.0/8 is all local); elsewhere a neighbour's
    // address in the same subnet is not ours to bind.
    if (bySubnet.empty() && (entry->ifa_flags & IFF_LOOPBACK) != 0 && sameNetwork(mine, theirs, mask, bytes)) {
      bySubnet = entry->ifa_name;
    }
  }
  return bySubnet;
}

}  // namespace

std::vector<topo::NetInterface> interfacesForAddresses(std::string_view list) {
  std::vector<topo::NetInterface> result;
  size_t start = 0;
  while (start <= list.size()) {
    const size_t comma = std::min(list.find(',', start), list.size());
    std::string text = trimmed(list.substr(start, comma - start));
    start = comma + 1;
    if (text.empty()) continue;
    if (text.size() > 2 && text.front() == '[' && text.back() == ']') text = text.substr(1, text.size() - 2);
    topo::NetInterface item;
    auto* in4 = reinterpret_cast<sockaddr_in*>(&item.address);
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&item.address);
    if (inet_pton(AF_INET, text.c_str(), &in4->sin_addr) == 1) {
      in4->sin_family = AF_INET;
      item.family = AF_INET;
      item.addressLength = sizeof(sockaddr_in);
    } else if (inet_pton(AF_INET6, text.c_str(), &in6->sin6_addr) == 1) {
      in6->sin6_family = AF_INET6;
      item.family = AF_INET6;
      item.addressLength = sizeof(sockaddr_in6);
    } else {
      fail(ncclInvalidUsage, "NET/railnet: RAILNET_TCP_ADDRESSES: \"%s\" is not an IPv4 or IPv6 address", text.c_str());
    }
    const std::string ifname = owningInterface(item.address);
    if (ifname.empty()) {
      fail(ncclInvalidUsage, "NET/railnet: RAILNET_TCP_ADDRESSES: %s is on no local interface that is up",
           text.c_str());
    }
    if (item.family == AF_INET6) in6->sin6_scope_id = if_nametoindex(ifname.c_str());
    item.name = ifname + "@" + text;
    for (const topo::NetInterface& earlier : result) {
      if (earlier.name == item.name) {
        fail(ncclInvalidUsage, "NET/railnet: RAILNET_TCP_ADDRESSES lists %s twice", text.c_str());
      }
    }
    // The owning interface's properties (PCI path, speed, loopback flag).
    for (const topo::NetInterface& owner : topo::discoverInterfaces("=" + ifname, "")) {
      item.pciPath = owner.pciPath;
      item.speedMbps = owner.speedMbps;
      item.loopback = owner.loopback;
    }
    result.push_back(std::move(item));
  }
  if (result.empty()) fail(ncclInvalidUsage, "NET/railnet: RAILNET_TCP_ADDRESSES names no address");
  return result;
}

}  // namespace railnet::tcp
