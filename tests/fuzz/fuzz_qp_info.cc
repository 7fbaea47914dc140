// The verbs QP record each end sends first on the control socket.
#include <cstdint>
#include <cstring>

#include "fuzz_quiet.h"
#include "proxy/verbs/queue_pairs.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railnet::verbs::QpInfo info{};
  std::memcpy(&info, data, size < sizeof(info) ? size : sizeof(info));
  for (int linkLayer : {IBV_LINK_LAYER_INFINIBAND, IBV_LINK_LAYER_ETHERNET}) {
    if (railnet::verbs::qpInfoProblem(info, linkLayer).empty()) {
      if (info.qpCount < 1 || info.qpCount > railnet::verbs::kMaxQps) __builtin_trap();
    }
  }
  return 0;
}
