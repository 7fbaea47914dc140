// The one-sided layer's control records (GIN puts, signals, acks), read from a peer's receive.
#include <cstdint>
#include <cstring>

#include "fuzz_quiet.h"
#include "proxy/rma/control_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  railnet::rma::ControlRecord record{};
  std::memcpy(&record, data, size < sizeof(record) ? size : sizeof(record));
  (void)railnet::rma::malformedReason(record);
  return 0;
}
