// The doorbell engine (proxy/doorbell/engine.h) over a real one-sided comm: two ranks in this process, each an
// rma::RmaComm over the TCP transport on loopback, rank 1 a passive target driven by its own thread. A host
// producer stands in for the GPU threads that post into the ring.
#include <catch2/catch.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "base/clock.h"
#include "proxy/doorbell/engine.h"
#include "proxy/doorbell/ring.h"
#include "tests/unit/doorbell_test_ring.h"
#include "proxy/rma/mesh.h"
#include "proxy/rma/rma_comm.h"
#include "proxy/tcp/tcp_transport.h"
#include "railnet/nccl/common.h"

namespace {

using railnet::doorbell::Descriptor;
using railnet::doorbell::Engine;
using railnet::doorbell::Op;
using railnet::doorbell::RingError;
using railnet::doorbell::SignalOp;

constexpr size_t kWindowBytes = 1 << 20;
constexpr size_t kSignalWords = 16;

// Two ranks of one-sided comms on loopback, each with a data window and a signal window (host memory).
class TwoRanks {
 public:
  TwoRanks() : transport_(railnet::tcp::createTcpTransport()) {
    std::vector<std::vector<char>> handles(2, std::vector<char>(NCCL_NET_HANDLE_MAXSIZE));
    for (int r = 0; r < 2; ++r) {
      listens_[r] = std::make_unique<railnet::rma::RmaListen>(*transport_, 0, handles[static_cast<size_t>(r)].data());
      data_[r].assign(kWindowBytes, 0);
      signals_[r].assign(kSignalWords, 0);
    }
    void* handlePointers[2] = {handles[0].data(), handles[1].data()};
    // Collective: the mesh and each window registration need both ranks at once.
    auto rank = [&](int r) {
      comms_[r] = std::make_unique<railnet::rma::RmaComm>(*listens_[r], handlePointers, 2, r);
      dataWindow_[r] = comms_[r]->registerWindow(data_[r].data(), kWindowBytes, NCCL_PTR_HOST, false, 0, -1);
      signalWindow_[r] = comms_[r]->registerWindow(signals_[r].data(), kSignalWords * sizeof(uint64_t),
                                                   NCCL_PTR_HOST, false, 0, -1);
    };
    std::thread other(rank, 1);
    rank(0);
    other.join();
    target_ = std::thread([this] {
      while (!stop_.load()) {
        comms_[1]->progress();
        std::this_thread::yield();
      }
    });
  }
  ~TwoRanks() {
    stop_.store(true);
    target_.join();
    comms_[0].reset();  // before the windows' memory goes
    comms_[1].reset();
  }

  railnet::rma::RmaComm& origin() { return *comms_[0]; }
  void* dataWindow() const { return dataWindow_[0]; }
  void* signalWindow() const { return signalWindow_[0]; }
  std::vector<char>& sourceBytes() { return data_[0]; }
  const std::vector<char>& targetBytes() const { return data_[1]; }
  uint64_t targetSignal(size_t index) const {
    return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(signals_[1][index])).load(std::memory_order_acquire);
  }

 private:
  std::unique_ptr<railnet::Transport> transport_;
  std::unique_ptr<railnet::rma::RmaListen> listens_[2];
  std::unique_ptr<railnet::rma::RmaComm> comms_[2];
  std::vector<char> data_[2];
  std::vector<uint64_t> signals_[2];
  void* dataWindow_[2] = {};
  void* signalWindow_[2] = {};
  std::atomic<bool> stop_{false};
  std::thread target_;
};

using Ring = TestRing;

Descriptor put(uint64_t sourceOffset, uint64_t targetOffset, uint64_t bytes) {
  Descriptor d{};
  d.op = static_cast<uint32_t>(Op::kPut);
  d.peer = 1;
  d.sourceOffset = sourceOffset;
  d.targetOffset = targetOffset;
  d.bytes = bytes;
  return d;
}

Descriptor withSignal(Descriptor d, uint32_t signal, uint64_t value) {
  d.op = static_cast<uint32_t>(d.op == static_cast<uint32_t>(Op::kPut) ? Op::kPutSignal : Op::kSignal);
  d.signal = signal;
  d.signalOp = static_cast<uint32_t>(SignalOp::kAdd);
  d.signalValue = value;
  return d;
}

Descriptor signalOnly(uint32_t signal, uint64_t value) {
  Descriptor d{};
  d.op = static_cast<uint32_t>(Op::kSignal);
  d.peer = 1;
  return withSignal(d, signal, value);
}

// Drives the engine (and, while producing, the producer) until `done` holds; false after 20 s.
template <typename Done>
bool driveUntil(Engine& engine, Done done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    if (!engine.progress()) std::this_thread::yield();
  }
  return true;
}

// Waits up to 20 s for the target's signal word to read `value`.
bool waitForSignal(const TwoRanks& ranks, size_t index, uint64_t value) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (ranks.targetSignal(index) != value) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

void fillPattern(std::vector<char>& bytes, uint32_t seed) {
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>((i * 131 + seed) >> 3);
}

}  // namespace

TEST_CASE("the engine carries puts, put+signal, signal and quiet in ticket order", "[doorbell][engine]") {
  TwoRanks ranks;
  fillPattern(ranks.sourceBytes(), 7);
  Ring ring(8);
  Engine engine(ranks.origin(), ring.slots.get(), &ring.control, ring.capacity, {ranks.dataWindow()},
                ranks.signalWindow(), 10'000'000'000ull);
  // More descriptors than slots: the producer waits for the engine, which runs in between.
  std::thread producer([&ring] {
    for (uint64_t i = 0; i < 40; ++i) ring.post(put(i * 4096, i * 4096 + 3, 4096));  // 40 puts, offset by 3
    ring.post(withSignal(put(200000, 300000, 65536), 2, 5));                           // a put with its signal
    ring.post(signalOnly(2, 7));                                                        // a bare signal
    Descriptor quiet{};
    quiet.op = static_cast<uint32_t>(Op::kQuiet);
    ring.post(quiet);
  });
  const bool finished = driveUntil(engine, [&] { return engine.completed() == 43; });
  producer.join();
  REQUIRE(finished);
  CHECK(ring.control.completed == 43);
  CHECK(ring.control.error == 0);
  // Completion is local (the sources may be reused). At the target a signal is applied after its payload and
  // every earlier payload from this rank: once signal 2 reads 5 + 7, every byte is in place.
  REQUIRE(waitForSignal(ranks, 2, 12));
  CHECK(ranks.targetSignal(1) == 0);
  const std::vector<char>& source = ranks.sourceBytes();
  const std::vector<char>& target = ranks.targetBytes();
  size_t wrong = 0;
  for (uint64_t i = 0; i < 40; ++i) {
    wrong += std::memcmp(&target[i * 4096 + 3], &source[i * 4096], 4096) == 0 ? 0 : 1;
  }
  CHECK(wrong == 0);
  CHECK(std::memcmp(&target[300000], &source[200000], 65536) == 0);
}

TEST_CASE("a bad descriptor sets the ring's error word; later descriptors still go", "[doorbell][engine]") {
  TwoRanks ranks;
  fillPattern(ranks.sourceBytes(), 11);
  Ring ring(8);
  Engine engine(ranks.origin(), ring.slots.get(), &ring.control, ring.capacity, {ranks.dataWindow()},
                ranks.signalWindow(), 10'000'000'000ull);
  Descriptor badWindow = put(0, 0, 16);
  badWindow.targetWindow = 5;                      // no such window
  REQUIRE(ring.post(badWindow));
  REQUIRE(ring.post(put(0, kWindowBytes - 8, 16)));  // past the peer's window: RmaComm refuses it
  REQUIRE(ring.post(withSignal(put(64, 128, 256), 3, 1)));  // a good one after them
  REQUIRE(driveUntil(engine, [&] { return engine.completed() == 3; }));
  CHECK(ring.control.error == static_cast<uint32_t>(RingError::kBadDescriptor));
  REQUIRE(waitForSignal(ranks, 3, 1));
  CHECK(std::memcmp(&ranks.targetBytes()[128], &ranks.sourceBytes()[64], 256) == 0);
}

TEST_CASE("a ticket reserved and never published fails the ring as stalled, after the stall time", "[doorbell][engine]") {
  TwoRanks ranks;
  Ring ring(8);
  Engine engine(ranks.origin(), ring.slots.get(), &ring.control, ring.capacity, {ranks.dataWindow()},
                ranks.signalWindow(), 50'000'000ull);  // 50 ms
  std::atomic_ref<uint64_t>(ring.control.reserved).fetch_add(1);  // a producer that stopped after step 1
  const int64_t start = railnet::monotonicNs();
  REQUIRE(driveUntil(engine, [&] { return ring.control.error != 0; }));
  CHECK(railnet::monotonicNs() - start >= 50'000'000);
  CHECK(ring.control.error == static_cast<uint32_t>(RingError::kStalled));
  CHECK(engine.completed() == 0);
}
