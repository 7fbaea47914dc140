// The host side of the doorbells' mlx5 direct path that runs without an mlx5 NIC: why a device declines it, the
// offers ranks all-gather to agree on it, and the window keys the one-sided comm carries for it (over TCP on
// loopback, two ranks as threads). The queue setup itself needs an mlx5 NIC: not run (proxy/doorbell/direct.h).
#include <catch2/catch.hpp>

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "proxy/doorbell/direct.h"
#include "proxy/rma/rma_comm.h"
#include "proxy/tcp/tcp_transport.h"
#include "proxy/verbs/queue_pairs.h"
#include "railnet/nccl/common.h"

using railnet::DeviceInfo;
using railnet::doorbell::DirectPath;

TEST_CASE("direct path: who declines it and why", "[doorbell][direct]") {
  DeviceInfo mlx5;
  mlx5.name = "mlx5_0";
  DeviceInfo port2 = mlx5;
  port2.name = "mlx5_3:2";
  DeviceInfo rxe;
  rxe.name = "rxe0:1";
  DeviceInfo fused = mlx5;
  fused.name = "mlx5_0+mlx5_1";
  fused.children = {0, 1};
  CHECK(DirectPath::unavailable("verbs", mlx5, false) == "RAILNET_DOORBELL_DIRECT=0");
  CHECK(DirectPath::unavailable("TCP", mlx5, true) == "the transport is TCP, not verbs");
  CHECK(DirectPath::unavailable("verbs", rxe, true) == "rxe0 is not an mlx5 device");
  CHECK(DirectPath::unavailable("verbs", fused, true) ==
        "device mlx5_0+mlx5_1 is fused (one queue pair per peer needs one port)");
  CHECK(DirectPath::unavailable("verbs", mlx5, true).empty());
  CHECK(DirectPath::unavailable("verbs", port2, true).empty());
}

TEST_CASE("direct path: the context's own transport declines it with its reason", "[doorbell][direct]") {
  std::unique_ptr<railnet::Transport> transport = railnet::tcp::createTcpTransport();
  std::string why;
  CHECK(DirectPath::open(*transport, 0, 0, 0, 2, &why) == nullptr);
  CHECK(!why.empty());  // RAILNET_DOORBELL_DIRECT=0 by default; "the transport is TCP" when it is 1
}

TEST_CASE("direct path: the offers every rank all-gathers", "[doorbell][direct]") {
  // A header and one queue-pair record per rank, the same size on every rank (the bootstrap gathers equal blobs).
  CHECK(DirectPath::offerBytes(1) == 8 + sizeof(railnet::verbs::QpInfo));
  CHECK(DirectPath::offerBytes(4) == 8 + 4 * sizeof(railnet::verbs::QpInfo));
  const std::vector<char> none = DirectPath::notOffered(3);
  REQUIRE(none.size() == DirectPath::offerBytes(3));
  std::string why;
  CHECK_FALSE(DirectPath::allOffered({none, none, none}, &why));
  CHECK(why == "rank 0 has no direct path");
  // A rank that offers it (the header's second word 1) beside one that does not: the one that does not is named.
  std::vector<char> offered = none;
  const uint32_t yes = 1;
  std::memcpy(offered.data() + 4, &yes, sizeof(yes));
  CHECK_FALSE(DirectPath::allOffered({offered, offered, none}, &why));
  CHECK(why == "rank 2 has no direct path");
  CHECK(DirectPath::allOffered({offered, offered, offered}, &why));
  // A blob of another size (another rank count) is refused, not read past its end.
  CHECK_FALSE(DirectPath::allOffered({offered, std::vector<char>(offered.begin(), offered.end() - 1), offered}, &why));
  CHECK(why == "rank 1's offer is " + std::to_string(offered.size() - 1) + " bytes");
  // Garbage in the magic: not an offer.
  std::vector<char> garbage = offered;
  garbage[0] = 'x';
  CHECK_FALSE(DirectPath::allOffered({offered, garbage, offered}, &why));
  CHECK(why == "rank 1 has no direct path");
}

TEST_CASE("one-sided comm: keys announced with a window reach every peer", "[doorbell][direct][rma]") {
  std::unique_ptr<railnet::Transport> transport = railnet::tcp::createTcpTransport();
  std::vector<std::vector<char>> handles(2, std::vector<char>(NCCL_NET_HANDLE_MAXSIZE));
  std::unique_ptr<railnet::rma::RmaListen> listens[2];
  for (int r = 0; r < 2; ++r) {
    listens[r] = std::make_unique<railnet::rma::RmaListen>(*transport, 0, handles[static_cast<size_t>(r)].data());
  }
  void* handlePointers[2] = {handles[0].data(), handles[1].data()};
  std::unique_ptr<railnet::rma::RmaComm> comms[2];
  std::vector<char> memory[2] = {std::vector<char>(4096), std::vector<char>(4096)};
  void* keyed[2] = {};
  void* plain[2] = {};
  auto rank = [&](int r) {
    comms[r] = std::make_unique<railnet::rma::RmaComm>(*listens[r], handlePointers, 2, r);
    const railnet::rma::WindowKey key{0x1000u + static_cast<uint64_t>(r), 0xabcd0000ull + static_cast<uint64_t>(r)};
    keyed[r] = comms[r]->registerWindow(memory[r].data(), 2048, NCCL_PTR_HOST, false, 0, -1, &key);
    plain[r] = comms[r]->registerWindow(memory[r].data() + 2048, 2048, NCCL_PTR_HOST, false, 0, -1);
  };
  std::thread other(rank, 1);
  rank(0);
  other.join();
  for (int r = 0; r < 2; ++r) {
    const int peer = 1 - r;
    railnet::rma::WindowKey key;
    REQUIRE(comms[r]->peerKey(peer, keyed[r], &key));
    CHECK(key.address == 0x1000u + static_cast<uint64_t>(peer));
    CHECK(key.key == 0xabcd0000ull + static_cast<uint64_t>(peer));
    CHECK_FALSE(comms[r]->peerKey(peer, plain[r], &key));  // announced nothing
    CHECK_FALSE(comms[r]->peerKey(peer, &key, &key));      // not a window of this comm
    CHECK_FALSE(comms[r]->peerKey(5, keyed[r], &key));     // not a rank of this comm
  }
  comms[0].reset();
  comms[1].reset();
}
