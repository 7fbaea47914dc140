// railnet-conformance: drives libnccl-net-railnet.so through every exported NCCL net ABI version the way
// NCCL's core and proxy threads do. See README.md in this directory.
#include <cstdlib>

#include "child.h"
#include "harness.h"

int main(int argc, char** argv) {
  // The conformance environment: loopback only. A setting already in the environment wins. Children inherit it.
  // Every other setting keeps its production default; the tests of stray connections shorten the stray timeout
  // in loads of their own (harness.h, kShortStrayTimeoutMs).
  setenv("RAILNET_IFNAME", "lo", 0);
  if (conformance::isChildInvocation(argc, argv)) return conformance::childMain(argc, argv);
  return conformance::runHarness(argc, argv);
}
