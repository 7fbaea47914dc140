// RAILNET_TCP_ADDRESSES: one TCP device per listed local address instead of one per interface. Each device
// listens on and connects from its own address, which is how rails are emulated on one host: every address
// of 127.0.0.0/8 reaches lo, so "127.0.1.1,127.0.2.1" gives two devices ("lo@127.0.1.1", "lo@127.0.2.1")
// whose connections and counters stay apart.
#pragma once

#include <string_view>
#include <vector>

#include "topo/netif.h"

namespace railnet::tcp {

// The devices the list names, in its order: name "<interface>@<address>", the address (port 0), and the
// owning interface's PCI path, speed and loopback flag. Throws ncclInvalidUsage on an address that does not
// parse, is listed twice, or lies on no local interface that is up.
std::vector<topo::NetInterface> interfacesForAddresses(std::string_view list);

}  // namespace railnet::tcp
