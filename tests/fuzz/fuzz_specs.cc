// The grammars users write: RAILNET_RAILS (name:rail,...), RAILNET_IB_HCA / NCCL_IB_HCA (^=name:port:rail:plane)
// and RAILNET_IFNAME / NCCL_SOCKET_IFNAME (prefixes, ^ excludes, = exact). Any text parses or is an Error.
#include <cstdint>
#include <string>
#include <string_view>

#include "fuzz_quiet.h"
#include "railnet/error.h"
#include "topo/name_filter.h"
#include "topo/rails.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto spec = railnet::topo::parseRailSpec(text);
    (void)railnet::topo::railFromSpec(spec, "mlx5_0");
  } catch (const railnet::Error&) {
  }
  for (auto syntax : {railnet::topo::NameFilter::Syntax::kPorts, railnet::topo::NameFilter::Syntax::kNames}) {
    try {
      railnet::topo::NameFilter filter(text, syntax);
      (void)filter.matches("mlx5_0", 1);
      (void)filter.matches("eth0");
      (void)filter.selectsDevice("mlx5_1");
      (void)filter.railId("mlx5_0", 1);
      (void)filter.planeId("mlx5_0", 1);
    } catch (const railnet::Error&) {
    }
  }
  return 0;
}
