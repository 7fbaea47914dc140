// railnet-conformance: drives libnccl-net-railnet.so through every exported NCCL net ABI version the way
// NCCL's core and proxy threads do. See README.md in this directory.
#include <cstdlib>

#include "child.h"
#include "harness.h"

int main(int argc, char** argv) {
  // The conformance environment: loopback only, and strays time out fast enough to test. Settings already
  // in the environment win. Children inherit these.
  setenv("RAILNET_IFNAME", "lo", 0);
  setenv("RAILNET_STRAY_TIMEOUT_MS", "500", 0);
  if (conformance::isChildInvocation(argc, argv)) return conformance::childMain(argc, argv);
  return conformance::runHarness(argc, argv);
}
