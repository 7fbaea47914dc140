// NCCL's device-list grammar, parsed once: NCCL_SOCKET_IFNAME (RAILNET_IFNAME, topo/netif.h) and NCCL_IB_HCA
// (RAILNET_IB_HCA, proxy/verbs/devices.h).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace railnet::topo {

// Comma-separated entries; names are prefixes, or exact with a leading '='; a leading '^' (before any '=')
// excludes what the list names. An empty list selects everything.
//  - Syntax::kPorts (NCCL_IB_HCA): entries are `name[:port[:rail[:plane]]]`. An entry without a port (or with
//    an unparsable one, which is reported) covers every port. '^' or '=' later in the list is reported and
//    that entry ignored.
//  - Syntax::kNames (NCCL_SOCKET_IFNAME): an entry is a name only (':' is part of it, as in alias labels such
//    as "eth0:1"), and '^' or '=' after the start are plain characters of a name.
class NameFilter {
 public:
  enum class Syntax { kPorts, kNames };
  static constexpr int16_t kNoId = -1;  // NCCL_NET_ID_UNDEF

  // `setting` names the variable in warnings about malformed entries.
  explicit NameFilter(std::string_view spec, Syntax syntax = Syntax::kPorts,
                      std::string_view setting = "RAILNET_IB_HCA");

  // Whether (name, port) is selected; port -1: any port.
  bool matches(std::string_view name, int port = -1) const;
  // Whether any port of the device `name` can match (lets discovery skip opening devices the filter rules out).
  bool selectsDevice(std::string_view name) const;
  // Rail / plane ids of the first entry naming (name, port) in an including list ("mlx5_0:1:3:0"); kNoId when
  // not given.
  int16_t railId(std::string_view name, int port) const;
  int16_t planeId(std::string_view name, int port) const;
  bool empty() const { return entries_.empty(); }

 private:
  struct Entry {
    std::string name;
    int port = -1;  // -1: any port
    int16_t rail = kNoId;
    int16_t plane = kNoId;
  };
  bool names(const Entry& entry, std::string_view name) const;
  const Entry* find(std::string_view name, int port) const;

  std::vector<Entry> entries_;
  bool exclude_ = false;
  bool exact_ = false;
};

}  // namespace railnet::topo
