// Network interfaces railnet may use for TCP: discovery and NCCL_SOCKET_IFNAME-style selection.
#pragma once

#include <sys/socket.h>

#include <string>
#include <string_view>
#include <vector>

#include "railnet/settings.h"

namespace railnet::topo {

struct NetInterface {
  std::string name;
  sockaddr_storage address{};  // port 0
  socklen_t addressLength = 0;
  int family = 0;
  std::string pciPath;  // realpath of /sys/class/net/<name>/device, empty for virtual interfaces
  int speedMbps = 0;    // from sysfs; 0 when unknown
  bool loopback = false;
};

// Up interfaces with an address of the wanted family (kAny: IPv4 preferred), one entry per interface, in the
// kernel's order. `spec` is in the NCCL_SOCKET_IFNAME grammar (topo/name_filter.h, Syntax::kNames: "eth,ib"
// prefixes, "^docker,lo" excludes, "=eth0" exact). An empty spec picks as NCCL's socket code does: the first of
// kAutomaticInterfaces that matches any interface (IPoIB first; then anything but docker, loopback and virtual
// bridges; then docker, lo, virbr). NCCL's NCCL_COMM_ID subnet hint is not used.
inline constexpr const char* kAutomaticInterfaces[] = {"ib", "^docker,lo,virbr", "docker", "lo", "virbr"};
std::vector<NetInterface> discoverInterfaces(std::string_view spec, AddressFamily family);
// The same with the family spelled as RAILNET_SOCKET_FAMILY allows ("", "AF_INET", "AF_INET6", ...); an unknown
// spelling is logged and means any family.
std::vector<NetInterface> discoverInterfaces(std::string_view spec, std::string_view family);

// "1.2.3.4:5678" / "[::1]:5678".
std::string formatAddress(const sockaddr* address);

}  // namespace railnet::topo
