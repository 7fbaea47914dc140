// The doorbell context (proxy/doorbell/context.h) and its unique-id bootstrap (bootstrap.h): ranks are threads of
// this process on loopback TCP, without a GPU (ring and signal words in host memory); a host producer posts into
// rank 0's ring as kernels would.
#include <catch2/catch.hpp>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proxy/doorbell/bootstrap.h"
#include "proxy/doorbell/context.h"
#include "proxy/tcp/tcp_transport.h"
#include "railnet/error.h"

namespace {

using railnet::doorbell::allGather;
using railnet::doorbell::BootstrapRoot;
using railnet::doorbell::Context;
using railnet::doorbell::ContextOptions;
using railnet::doorbell::Descriptor;
using railnet::doorbell::DeviceView;
using railnet::doorbell::makeUniqueId;
using railnet::doorbell::Op;
using railnet::doorbell::postFromHost;
using railnet::doorbell::SignalOp;
using railnet::doorbell::UniqueId;

railnet::protocol::SocketAddress loopback() {
  railnet::protocol::SocketAddress address;
  auto* in = reinterpret_cast<sockaddr_in*>(&address.storage);
  in->sin_family = AF_INET;
  in->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.length = sizeof(sockaddr_in);
  return address;
}

std::vector<char> blobOf(int rank) { return std::vector<char>(40, static_cast<char>('a' + rank)); }

}  // namespace

TEST_CASE("the unique-id bootstrap gathers every rank's blob in rank order", "[doorbell][bootstrap]") {
  constexpr int kRanks = 4;
  UniqueId id{};
  std::unique_ptr<BootstrapRoot> root = makeUniqueId(loopback(), &id);
  std::vector<std::vector<std::vector<char>>> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 1; r < kRanks; ++r) {
    threads.emplace_back([&, r] { results[static_cast<size_t>(r)] = allGather(id, nullptr, r, kRanks, blobOf(r), 10000); });
  }
  results[0] = allGather(id, root.get(), 0, kRanks, blobOf(0), 10000);
  for (std::thread& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    REQUIRE(results[static_cast<size_t>(r)].size() == kRanks);
    for (int from = 0; from < kRanks; ++from) CHECK(results[static_cast<size_t>(r)][static_cast<size_t>(from)] == blobOf(from));
  }
}

TEST_CASE("the bootstrap names the ranks that never came, and drops a stray connection", "[doorbell][bootstrap]") {
  UniqueId id{};
  std::unique_ptr<BootstrapRoot> root = makeUniqueId(loopback(), &id);
  // A stray connection that sends garbage: rejected (a WARN), and rank 0 goes on waiting for its real ranks.
  std::thread stray([&id] {
    railnet::protocol::SocketAddress target;
    std::memcpy(&target.storage, id.bytes + 16, sizeof(sockaddr_in));  // the id's address (bootstrap.cc IdLayout)
    target.length = sizeof(sockaddr_in);
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    if (::connect(fd, target.get(), target.length) == 0) {
      const char junk[24] = "not a doorbell hello...";
      (void)::send(fd, junk, sizeof(junk), MSG_NOSIGNAL);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    ::close(fd);
  });
  std::thread rank1([&id] {
    try {
      (void)allGather(id, nullptr, 1, 3, blobOf(1), 10000);
    } catch (const railnet::Error&) {
      // expected: rank 0 gives up and closes
    }
  });
  std::string message;
  try {
    (void)allGather(id, root.get(), 0, 3, blobOf(0), 1500);  // rank 2 never comes
  } catch (const railnet::Error& error) {
    message = error.what();
  }
  stray.join();
  CHECK(message.find("ranks 2 never arrived") != std::string::npos);
  // Rank 1 fails on its own, since rank 0 gave up and closed.
  rank1.join();
}

TEST_CASE("a doorbell context: windows registered collectively, a ring's puts and signals land at the peer",
          "[doorbell][context]") {
  std::unique_ptr<railnet::Transport> transport = railnet::tcp::createTcpTransport();
  UniqueId id{};
  std::unique_ptr<BootstrapRoot> root = makeUniqueId(loopback(), &id);
  ContextOptions options;
  options.ringSlots = 16;
  options.signalCount = 8;
  constexpr size_t kBytes = 256 << 10;
  std::vector<char> buffers[2] = {std::vector<char>(kBytes), std::vector<char>(kBytes, 0)};
  for (size_t i = 0; i < kBytes; ++i) buffers[0][i] = static_cast<char>(i * 7 + 1);
  std::unique_ptr<Context> contexts[2];
  uint32_t windows[2] = {99, 99};
  std::thread rank1([&] {  // collective: both ranks construct and register at once
    contexts[1] = std::make_unique<Context>(*transport, 0, id, nullptr, 1, 2, -1, options);
    windows[1] = contexts[1]->registerWindow(buffers[1].data(), kBytes);
  });
  contexts[0] = std::make_unique<Context>(*transport, 0, id, root.get(), 0, 2, -1, options);
  windows[0] = contexts[0]->registerWindow(buffers[0].data(), kBytes);
  rank1.join();  // rank 1's engine thread keeps serving it
  CHECK(windows[0] == 0);
  CHECK(windows[1] == 0);

  const DeviceView view = contexts[0]->deviceView();
  CHECK(view.rank == 0);
  CHECK(view.nranks == 2);
  // 20 puts of 8 KiB through a 16-slot ring, then a signal: the engine thread carries them.
  for (uint64_t i = 0; i < 20; ++i) {
    Descriptor d{};
    d.op = static_cast<uint32_t>(i == 19 ? Op::kPutSignal : Op::kPut);
    d.peer = 1;
    d.sourceOffset = i * 8192;
    d.targetOffset = kBytes - (i + 1) * 8192;
    d.bytes = 8192;
    d.signal = 3;
    d.signalOp = static_cast<uint32_t>(i == 19 ? SignalOp::kAdd : SignalOp::kNone);
    d.signalValue = 41;
    REQUIRE(postFromHost(view.slots, view.control, view.capacity, d, 1u << 22));
  }
  uint64_t* signal = &contexts[1]->deviceView().signals[3];
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::atomic_ref<uint64_t>(*signal).load(std::memory_order_acquire) != 41 &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::yield();
  }
  REQUIRE(std::atomic_ref<uint64_t>(*signal).load(std::memory_order_acquire) == 41);
  size_t wrong = 0;
  for (uint64_t i = 0; i < 20; ++i) {
    wrong += std::memcmp(&buffers[1][kBytes - (i + 1) * 8192], &buffers[0][i * 8192], 8192) == 0 ? 0 : 1;
  }
  CHECK(wrong == 0);
  CHECK(contexts[0]->error() == 0);
  contexts[0].reset();
  contexts[1].reset();
}
