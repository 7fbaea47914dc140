// The TCP transport: one railnet device per usable network interface.
#pragma once

#include <memory>

#include "proxy/transport.h"

namespace railnet::tcp {

// Throws railnet::Error when no interface qualifies.
std::unique_ptr<Transport> createTcpTransport();

}  // namespace railnet::tcp
