// The verbs (InfiniBand / RoCE) transport: one railnet device per active RDMA port.
#pragma once

#include <memory>
#include <string>

#include "proxy/transport.h"

namespace railnet::verbs {

// nullptr, with *why set, when libibverbs cannot be loaded or no RDMA port is usable.
std::unique_ptr<Transport> createVerbsTransport(std::string* why);

}  // namespace railnet::verbs
