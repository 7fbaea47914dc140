// The mlx5 direct path's pure parts: CQE parsing (proxy/doorbell/mlx5_cqe.h) against rdma-core's mlx5dv.h, and
// the producer protocol (railnet/doorbell_direct_producer.h with HostMemory) with CPU threads as producers and a
// fake NIC thread that reads the send queue the way a ConnectX does: only up to the doorbell record, WQE by WQE in
// slot order, each slot free again only once `completed` passes it. Not run on hardware.
#include <catch2/catch.hpp>

#include <endian.h>
#include <infiniband/mlx5dv.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "proxy/doorbell/mlx5_cqe.h"
#include "railnet/doorbell_direct_producer.h"

namespace {

namespace mlx5 = railnet::doorbell::mlx5;
namespace cqe = railnet::doorbell::mlx5::cqe;
using railnet::doorbell::DirectKey;
using railnet::doorbell::DirectQueue;
using railnet::doorbell::DirectView;
using railnet::doorbell::direct::DirectProducer;
using railnet::doorbell::direct::HostMemory;
using Producer = DirectProducer<HostMemory>;

// Sees every store to one queue's doorbell record and register, in the order they happen (each made under its
// lock): the record only moves forward, by at most the ring, and each register value names the WQE just before the
// record (the last of the batch whose record was just written), as when producers ring strictly in turn.
struct DoorbellWitness {
  std::mutex mutex;
  const void* record = nullptr;  // the queue's doorbellRecord + 1; nullptr: not watching
  uint32_t depth = 0;
  uint16_t last = 0;  // the record's value, host order
  uint64_t stores = 0;
  std::vector<std::string> problems;

  void watch(const DirectQueue& queue) {
    const std::lock_guard<std::mutex> lock(mutex);
    record = queue.doorbellRecord + 1;
    depth = queue.depth;
    last = static_cast<uint16_t>(be32toh(queue.doorbellRecord[1]));
    stores = 0;
    problems.clear();
  }
  void problem(const std::string& what) {
    if (problems.size() < 20) problems.push_back("doorbell store " + std::to_string(stores) + ": " + what);
  }
};

DoorbellWitness& witness() {
  static DoorbellWitness instance;
  return instance;
}

// HostMemory with a yield before every second access to shared words, so that producers and the NIC interleave
// between the protocol's steps even on a machine with fewer cores than threads, and with the witness above on the
// doorbell stores: an out-of-order step (a doorbell record written after the next producer's turn began, say) then
// shows in a run however the NIC happened to poll.
struct JitteryMemory : HostMemory {
  static void jitter() {
    thread_local uint32_t calls = 0;
    if (++calls % 2 == 0) std::this_thread::yield();
  }
  static uint64_t fetchAddDevice(uint64_t* word, uint64_t add) {
    jitter();
    return HostMemory::fetchAddDevice(word, add);
  }
  template <typename T>
  static T loadAcquireSystem(const T* word) {
    jitter();
    return HostMemory::loadAcquireSystem(word);
  }
  template <typename T>
  static void storeReleaseSystem(T* word, T value) {
    jitter();
    DoorbellWitness& seen = witness();
    if (static_cast<const void*>(word) != seen.record) return HostMemory::storeReleaseSystem(word, value);
    const std::lock_guard<std::mutex> lock(seen.mutex);
    const auto next = static_cast<uint16_t>(be32toh(static_cast<uint32_t>(value)));
    const uint32_t forward = static_cast<uint16_t>(next - seen.last);
    if (forward == 0 || forward > seen.depth) {
      seen.problem("record " + std::to_string(next) + " after " + std::to_string(seen.last));
    }
    seen.last = next;
    ++seen.stores;
    HostMemory::storeReleaseSystem(word, value);
  }
  static void storeMmio64(uint64_t* reg, uint64_t value) {
    jitter();
    DoorbellWitness& seen = witness();
    const std::lock_guard<std::mutex> lock(seen.mutex);
    const auto index = static_cast<uint16_t>(be32toh(static_cast<uint32_t>(value)) >> 8);
    if (seen.record != nullptr && static_cast<uint16_t>(index + 1) != seen.last) {
      seen.problem("register names WQE " + std::to_string(index) + ", record is " + std::to_string(seen.last));
    }
    HostMemory::storeMmio64(reg, value);
  }
};

// ---- CQEs -----------------------------------------------------------------------------------------------------

// rdma-core's ownership test (get_sw_cqe in providers/mlx5/cq.c), through mlx5dv.h's helpers.
bool rdmaCoreOwned(mlx5_cqe64* entry, uint32_t ci, uint32_t count) {
  return mlx5dv_get_cqe_opcode(entry) != MLX5_CQE_INVALID &&
         !((mlx5dv_get_cqe_owner(entry) & MLX5_CQE_OWNER_MASK) ^ !!(ci & count));
}

// ---- the fake NIC's world ---------------------------------------------------------------------------------------

constexpr uint32_t kDepth = 64;
constexpr uint32_t kQpn = 0xabcdef;
constexpr int kPeer = 1;  // queues[0] is this rank's own, unused entry
constexpr uint32_t kWindows = 2;
constexpr uint32_t kSignals = 8;
constexpr uint64_t kSecond = 1'000'000'000ull;
constexpr uint32_t kProducers = 4;  // the threaded test's producers and posts each
constexpr uint32_t kPosts = 2000;

// One rank's direct view over plain memory: a send queue to peer 1, keys for two windows on each side.
struct World {
  explicit World(uint64_t startIndex = 0, uint32_t depth = kDepth) : sq(depth) {
    std::memset(sq.data(), 0xa5, sq.size() * sizeof(sq[0]));
    DirectQueue& queue = queues[kPeer];
    queue.wqes = sq.data();
    queue.doorbellRecord = doorbellRecord;
    queue.doorbellRegister = &doorbellRegister;
    queue.depth = depth;
    queue.qpn = kQpn;
    queue.reserved = queue.rung = queue.completed = startIndex;  // as if startIndex WQEBBs had come before
    doorbellRecord[1] = mlx5::doorbellRecordValue(static_cast<uint16_t>(startIndex));
    // Windows 2^40 apart: a write's target address is window base + (producer << 32 | post), see judge().
    for (uint32_t w = 0; w < kWindows; ++w) {
      local[w] = {0x7f0000000000ull + (static_cast<uint64_t>(w) << 40), 0x1100u + w, 1};
      for (uint32_t r = 0; r < 2; ++r) {
        remote[r * kWindows + w] = {0x550000000000ull + (static_cast<uint64_t>(w) << 40), 0x2200u + r * 16 + w, 1};
      }
    }
    signals[kPeer] = {0x660000001000ull, 0x3300u, 1};
    view.queues = queues;
    view.localWindows = local;
    view.remoteWindows = remote;
    view.remoteSignals = signals;
    view.atomicSink = {0x7e0000000040ull, 0x4400u, 1};
    view.maxWindows = kWindows;
  }
  template <class Memory = HostMemory>
  DirectProducer<Memory> producer(uint64_t timeoutNs = 30 * kSecond) const {
    return DirectProducer<Memory>(view, 2, kSignals, &contextError, timeoutNs);
  }
  DirectQueue& queue() { return queues[kPeer]; }
  const unsigned char* slot(uint64_t index) const {
    return reinterpret_cast<const unsigned char*>(sq.data()) + (index & (sq.size() - 1)) * mlx5::kWqebbBytes;
  }
  uint64_t load(const uint64_t& word) const { return std::atomic_ref<uint64_t>(const_cast<uint64_t&>(word)).load(); }

  struct alignas(64) Slot {
    mlx5::Ctrl ctrl;
    unsigned char rest[48];
  };
  std::vector<Slot> sq;
  DirectQueue queues[2]{};
  uint32_t doorbellRecord[2] = {0, 0};
  uint64_t doorbellRegister = 0;
  DirectKey local[kWindows]{};
  DirectKey remote[2 * kWindows]{};
  DirectKey signals[2]{};
  uint32_t contextError = 0;
  DirectView view{};
};

// A WQE as the NIC reads it (host order).
struct Parsed {
  uint8_t opcode = 0;
  uint16_t index = 0;
  uint32_t qpn = 0;
  uint32_t ds = 0;
  uint8_t flags = 0;
  uint64_t remoteAddress = 0;
  uint32_t rkey = 0;
  uint32_t length = 0;
  uint32_t lkey = 0;
  uint64_t localAddress = 0;
  uint64_t add = 0;
  uint64_t compare = 0;
  uint64_t registerValue = 0;  // doorbellRegisterValue of its ctrl
};

Parsed parse(const unsigned char* wqe) {
  Parsed p;
  mlx5_wqe_ctrl_seg ctrl;
  std::memcpy(&ctrl, wqe, sizeof(ctrl));
  const uint32_t opmod = be32toh(ctrl.opmod_idx_opcode);
  p.opcode = static_cast<uint8_t>(opmod & 0xff);
  p.index = static_cast<uint16_t>((opmod >> 8) & 0xffff);
  p.qpn = be32toh(ctrl.qpn_ds) >> 8;
  p.ds = be32toh(ctrl.qpn_ds) & 0x3f;
  p.flags = ctrl.fm_ce_se;
  std::memcpy(&p.registerValue, wqe, sizeof(p.registerValue));
  mlx5_wqe_raddr_seg raddr;
  std::memcpy(&raddr, wqe + 16, sizeof(raddr));
  p.remoteAddress = be64toh(raddr.raddr);
  p.rkey = be32toh(raddr.rkey);
  mlx5_wqe_data_seg data;
  if (p.opcode == MLX5_OPCODE_RDMA_WRITE || p.opcode == MLX5_OPCODE_RDMA_READ) {
    std::memcpy(&data, wqe + 32, sizeof(data));
  } else {
    mlx5_wqe_atomic_seg atomic;
    std::memcpy(&atomic, wqe + 32, sizeof(atomic));
    p.add = be64toh(atomic.swap_add);
    p.compare = be64toh(atomic.compare);
    std::memcpy(&data, wqe + 48, sizeof(data));
  }
  p.length = be32toh(data.byte_count);
  p.lkey = be32toh(data.lkey);
  p.localAddress = be64toh(data.addr);
  return p;
}

// What producer `producer` posts as its `k`th operation; every field derives from (producer, k).
enum class Kind { kWrite, kFetchAdd, kWriteFetchAdd };
Kind kindOf(uint32_t producer, uint32_t k) { return static_cast<Kind>((k + producer) % 3); }
uint64_t tagOf(uint32_t producer, uint32_t k) { return static_cast<uint64_t>(producer) << 32 | k; }
uint32_t targetWindowOf(uint32_t k) { return k % kWindows; }
uint32_t sourceWindowOf(uint32_t k) { return (k / 2) % kWindows; }
uint64_t sourceOffsetOf(uint32_t producer, uint32_t k) { return k * 64ull + producer; }
uint64_t bytesOf(uint32_t k) { return 1 + k * 3ull; }

template <class Memory>
int postOne(const DirectProducer<Memory>& producer, uint32_t p, uint32_t k) {
  const uint64_t tag = tagOf(p, k);
  switch (kindOf(p, k)) {
    case Kind::kWrite:
      return producer.postWrite(kPeer, targetWindowOf(k), tag, sourceWindowOf(k), sourceOffsetOf(p, k), bytesOf(k));
    case Kind::kFetchAdd:
      return producer.postFetchAdd(kPeer, p, tag);
    case Kind::kWriteFetchAdd:
      return producer.postWriteFetchAdd(kPeer, targetWindowOf(k), tag, sourceWindowOf(k), sourceOffsetOf(p, k),
                                        bytesOf(k), p, tag);
  }
  return -1;
}

// The fake NIC's judgement of one WQE: "" when it is what producer p's kth post put there, else why not.
std::string judge(const World& world, const Parsed& w, uint64_t position, uint32_t* producerOut, uint32_t* kOut) {
  if (w.index != static_cast<uint16_t>(position)) return "wqe index " + std::to_string(w.index) + " in slot of " +
                                                         std::to_string(position & 0xffff);
  if (w.qpn != kQpn) return "qpn";
  if (w.flags != MLX5_WQE_CTRL_CQ_UPDATE) return "not signalled";
  uint64_t tag = 0;
  if (w.opcode == MLX5_OPCODE_RDMA_WRITE) {
    if (w.ds != 3) return "write ds";
    tag = w.remoteAddress - world.remote[kPeer * kWindows].address;  // + (target window << 40)
  } else if (w.opcode == MLX5_OPCODE_ATOMIC_FA) {
    if (w.ds != 4) return "atomic ds";
    tag = w.add;
  } else {
    return "opcode " + std::to_string(w.opcode);
  }
  const uint32_t p = static_cast<uint32_t>(tag >> 32) & 0xff;
  const uint32_t k = static_cast<uint32_t>(tag);
  if (p >= kProducers || k >= kPosts) return "unknown tag " + std::to_string(tag);
  tag = tagOf(p, k);
  *producerOut = p;
  *kOut = k;
  if (w.opcode == MLX5_OPCODE_RDMA_WRITE) {
    if (kindOf(p, k) == Kind::kFetchAdd) return "a write for a fetch-add post";
    const DirectKey target = world.remote[kPeer * kWindows + targetWindowOf(k)];
    const DirectKey source = world.local[sourceWindowOf(k)];
    if (w.remoteAddress != target.address + tag || w.rkey != target.key) return "write target";
    if (w.localAddress != source.address + sourceOffsetOf(p, k) || w.lkey != source.key) return "write source";
    if (w.length != bytesOf(k)) return "write length";
  } else {
    if (kindOf(p, k) == Kind::kWrite) return "a fetch-add for a write post";
    const DirectKey signals = world.signals[kPeer];
    if (w.remoteAddress != signals.address + 8ull * p || w.rkey != signals.key) return "atomic target";
    if (w.localAddress != world.view.atomicSink.address || w.lkey != world.view.atomicSink.key || w.length != 8) {
      return "atomic sink";
    }
    if (w.compare != 0) return "atomic compare";
  }
  return "";
}

}  // namespace

TEST_CASE("mlx5 CQE offsets and constants equal rdma-core's", "[doorbell][direct]") {
  CHECK(cqe::kBytes == sizeof(mlx5_cqe64));
  CHECK(cqe::kBytes == sizeof(mlx5_err_cqe));
  CHECK(cqe::kWqeCounterOffset == offsetof(mlx5_cqe64, wqe_counter));
  CHECK(cqe::kWqeCounterOffset == offsetof(mlx5_err_cqe, wqe_counter));
  CHECK(cqe::kOpOwnOffset == offsetof(mlx5_cqe64, op_own));
  CHECK(cqe::kOpOwnOffset == offsetof(mlx5_err_cqe, op_own));
  CHECK(cqe::kQpnOffset == offsetof(mlx5_cqe64, sop_drop_qpn));
  CHECK(cqe::kQpnOffset == offsetof(mlx5_err_cqe, s_wqe_opcode_qpn));
  CHECK(cqe::kSyndromeOffset == offsetof(mlx5_err_cqe, syndrome));
  CHECK(cqe::kVendorSyndromeOffset == offsetof(mlx5_err_cqe, vendor_err_synd));
  CHECK(cqe::kOpcodeReq == MLX5_CQE_REQ);
  CHECK(cqe::kOpcodeReqErr == MLX5_CQE_REQ_ERR);
  CHECK(cqe::kOpcodeRespErr == MLX5_CQE_RESP_ERR);
  CHECK(cqe::kOpcodeInvalid == MLX5_CQE_INVALID);
  CHECK(mlx5::wqebbsForDs(4) == 1);
}

TEST_CASE("mlx5 CQEs read as rdma-core reads them", "[doorbell][direct]") {
  constexpr uint32_t kCount = 8;
  alignas(64) mlx5_cqe64 cq[kCount];
  std::memset(cq, 0, sizeof(cq));
  REQUIRE(cqe::at(cq, kCount, 0) == &cq[0]);
  REQUIRE(cqe::at(cq, kCount, 13) == &cq[5]);
  REQUIRE(cqe::at(cq, kCount, 0xffffffffu) == &cq[7]);
  const uint8_t opcodes[] = {MLX5_CQE_REQ, MLX5_CQE_RESP_SEND, MLX5_CQE_REQ_ERR, MLX5_CQE_RESP_ERR, MLX5_CQE_INVALID};
  const uint32_t consumerIndices[] = {0, 3, 7, 8, 9, 15, 16, 0xfffff8, 0xffffff, 0x1000000, 0xfffffff9};
  for (const uint8_t op : opcodes) {
    for (const uint32_t ci : consumerIndices) {
      for (uint8_t ownerBit = 0; ownerBit < 2; ++ownerBit) {
        for (uint8_t low = 0; low < 8; low += 2) {  // the solicited and other low bits do not matter
          mlx5_cqe64& entry = cq[ci & (kCount - 1)];
          entry.op_own = static_cast<uint8_t>(op << 4 | low | ownerBit);
          const void* read = cqe::at(cq, kCount, ci);
          CAPTURE(op, ci, ownerBit, low);
          CHECK(cqe::opcode(read) == mlx5dv_get_cqe_opcode(&entry));
          CHECK(cqe::owner(read) == mlx5dv_get_cqe_owner(&entry));
          CHECK(cqe::ready(read, ci, kCount) == rdmaCoreOwned(&entry, ci, kCount));
          CHECK(cqe::isError(read) == (op == MLX5_CQE_REQ_ERR || op == MLX5_CQE_RESP_ERR));
        }
      }
    }
  }
  // A fresh CQ (every entry INVALID with owner 1, as the provider initialises it) is owned by no one on pass 0.
  for (auto& entry : cq) entry.op_own = MLX5_CQE_INVALID << 4 | 1;
  for (uint32_t ci = 0; ci < 2 * kCount; ++ci) CHECK_FALSE(cqe::ready(cqe::at(cq, kCount, ci), ci, kCount));

  for (const uint32_t counter : {0x0000u, 0x0001u, 0x00ffu, 0x1234u, 0xff00u, 0xffffu}) {
    mlx5_cqe64 entry;
    std::memset(&entry, 0x5a, sizeof(entry));
    entry.wqe_counter = htobe16(static_cast<uint16_t>(counter));
    entry.sop_drop_qpn = htobe32(0xab000000u | 0x123456u);
    CHECK(cqe::wqeCounter(&entry) == be16toh(entry.wqe_counter));
    CHECK(cqe::qpn(&entry) == (be32toh(entry.sop_drop_qpn) & 0xffffff));
  }
  mlx5_err_cqe error;
  std::memset(&error, 0, sizeof(error));
  error.syndrome = MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR;
  error.vendor_err_synd = 0x88;
  error.wqe_counter = htobe16(0xbeef);
  error.op_own = MLX5_CQE_REQ_ERR << 4 | 1;
  CHECK(cqe::syndrome(&error) == MLX5_CQE_SYNDROME_REMOTE_ACCESS_ERR);
  CHECK(cqe::vendorSyndrome(&error) == 0x88);
  CHECK(cqe::wqeCounter(&error) == 0xbeef);
  CHECK(cqe::opcode(&error) == MLX5_CQE_REQ_ERR);
  CHECK(cqe::isError(&error));

  // The CQ doorbell record, as update_cons_index in providers/mlx5/cq.c writes it.
  for (const uint32_t ci : {0u, 1u, 0x123456u, 0xffffffu, 0x1000000u, 0xfedcba98u}) {
    CHECK(cqe::doorbellRecordValue(ci) == htobe32(ci & 0xffffff));
  }
}

TEST_CASE("a CQE's 16-bit counter extends to the 64-bit completed count", "[doorbell][direct]") {
  CHECK(cqe::completedAfter(0, 0, 1) == 1);
  CHECK(cqe::completedAfter(0, 5, 1) == 6);     // CQEs for WQEs 0..4 coalesced into this one's
  CHECK(cqe::completedAfter(10, 10, 2) == 12);  // the first WQE not yet complete
  CHECK(cqe::completedAfter(0xfffe, 0xffff, 1) == 0x10000);
  CHECK(cqe::completedAfter(0xfffe, 0x0001, 1) == 0x10002);  // the counter wrapped
  CHECK(cqe::completedAfter(0x3fffffff0ull, 0xfff8, 1) == 0x3fffffff9ull);
  CHECK(cqe::completedAfter(0x3fffffffeull, 0x0003, 2) == 0x400000005ull);
  CHECK(cqe::completedAfter(0x12345ffffull, 0x7fff, 1) == 0x123467fffull + 1);
  // ds from the WQE's ctrl segment: a write and an atomic take one WQEBB, a 100-byte inline write three.
  alignas(64) unsigned char sq[4 * 64];
  const mlx5::Post post{7, kQpn, mlx5::kCtrlCqUpdate};
  mlx5::buildWrite(sq, post, {0x1000, 1}, {0x2000, 2}, 64);
  CHECK(cqe::wqebbsOfWqe(sq) == 1);
  mlx5::buildFetchAdd(sq, post, {0x1000, 1}, {0x2000, 2}, 1);
  CHECK(cqe::wqebbsOfWqe(sq) == 1);
  unsigned char data[100] = {};
  void* const bbs[] = {sq, sq + 64, sq + 128};
  REQUIRE(mlx5::buildWriteInline(bbs, post, {0x2000, 2}, data, sizeof(data)) == 3);
  CHECK(cqe::wqebbsOfWqe(sq) == 3);
}

namespace {

// kProducers threads post kPosts each (writes, fetch-adds and write+fetch-adds) through a 64-WQEBB queue; a fake
// NIC thread follows the doorbell record and completes what it read, holding completions back until the ring is
// full (or the record stops moving), so producers always run into WQEs not yet completed.
template <class Memory>
void runProducersAgainstFakeNic() {
  // 16-bit WQE indices and the doorbell record wrap a few thousand WQEBBs into the run.
  constexpr uint64_t kStart = 0x3fffff000ull - 3000;
  World world(kStart);
  witness().watch(world.queue());
  std::atomic<uint32_t> producersDone{0};
  std::vector<std::vector<int>> results(kProducers, std::vector<int>(kPosts, -1));

  // The NIC's findings, read after it has stopped.
  std::vector<std::string> problems;
  std::vector<std::vector<uint8_t>> writesSeen(kProducers, std::vector<uint8_t>(kPosts, 0));
  std::vector<std::vector<uint8_t>> atomicsSeen(kProducers, std::vector<uint8_t>(kPosts, 0));
  std::map<uint16_t, std::pair<uint64_t, bool>> registerValueAt;  // index -> (register value, last WQE of a post)
  std::vector<uint64_t> registerValuesSeen;
  uint64_t position = kStart;
  uint64_t doorbells = 0;

  // A broken protocol stalls: no WQEBB consumed for 30 s. Counted from the last progress, not from the start: a
  // passing run takes well under a second alone, but on two cores shared with a parallel build each hand-off between
  // the producers (they publish in order) can cost a scheduler slice, and a run took over 30 s.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::thread nic([&] {
    DirectQueue& queue = world.queue();
    std::vector<uint32_t> lastK(kProducers, UINT32_MAX);
    std::map<uint64_t, std::vector<unsigned char>> inFlight;  // consumed, not yet completed: the bytes read
    uint64_t pairTag = UINT64_MAX;                             // a write+fetch-add's write seen, its atomic next
    uint64_t completed = kStart;
    // When the NIC last saw a new WQE: it completes what it consumed after 100 us without new work, by the clock,
    // not by a count of idle polls (what 64 polls with a yield between them last depends on who else runs).
    auto lastWork = std::chrono::steady_clock::now();
    bool wasDone = false;  // every producer had returned before this poll of the record
    auto problem = [&](const std::string& what) {
      if (problems.size() < 20) problems.push_back("at WQEBB " + std::to_string(position - kStart) + ": " + what);
    };
    while (problems.empty()) {
      const uint32_t record = be32toh(std::atomic_ref<uint32_t>(world.doorbellRecord[1]).load(std::memory_order_acquire));
      const uint64_t ahead = (record - static_cast<uint16_t>(position)) & 0xffff;
      if (ahead > kDepth) {  // a record behind the NIC's position reads as almost 2^16 ahead
        problem("doorbell record " + std::to_string(record) + " moved back or past the ring");
        break;
      }
      const uint64_t target = position + ahead;
      if (ahead != 0) ++doorbells;
      const auto now = std::chrono::steady_clock::now();
      if (ahead != 0) {
        lastWork = now;
        deadline = now + std::chrono::seconds(30);
      }
      const bool idle = now - lastWork >= std::chrono::microseconds(100);
      while (position < target) {
        const unsigned char* slot = world.slot(position);
        const Parsed w = parse(slot);
        uint32_t p = 0, k = 0;
        if (const std::string bad = judge(world, w, position, &p, &k); !bad.empty()) {
          problem(bad);
          break;
        }
        if (w.opcode == MLX5_OPCODE_RDMA_WRITE) {
          if (pairTag != UINT64_MAX) problem("a write+fetch-add's atomic did not follow its write");
          if (lastK[p] != UINT32_MAX && k <= lastK[p]) problem("producer " + std::to_string(p) + " out of order");
          ++writesSeen[p][k];
          if (kindOf(p, k) == Kind::kWriteFetchAdd) pairTag = tagOf(p, k);
        } else {
          if (kindOf(p, k) == Kind::kWriteFetchAdd) {
            if (pairTag != tagOf(p, k)) problem("a write+fetch-add's atomic without its write just before");
          } else if (lastK[p] != UINT32_MAX && k <= lastK[p]) {
            problem("producer " + std::to_string(p) + " out of order");
          }
          pairTag = UINT64_MAX;
          ++atomicsSeen[p][k];
        }
        lastK[p] = k;
        registerValueAt[w.index] = {w.registerValue, pairTag == UINT64_MAX};
        inFlight.emplace(position, std::vector<unsigned char>(slot, slot + 64));
        ++position;
      }
      if (wasDone && position != world.load(queue.reserved)) {
        problem("every post returned, the record stops at " + std::to_string(record));
      }
      if (const uint64_t value = std::atomic_ref<uint64_t>(world.doorbellRegister).load(std::memory_order_relaxed);
          value != 0 && (registerValuesSeen.empty() || registerValuesSeen.back() != value)) {
        registerValuesSeen.push_back(value);
      }
      // Every consumed WQE must still be as read until it completes (no producer wrote over a slot not yet free).
      for (const auto& [index, bytes] : inFlight) {
        if (std::memcmp(world.slot(index), bytes.data(), bytes.size()) != 0) {
          problem("slot of WQEBB " + std::to_string(index - kStart) + " overwritten before its completion");
        }
      }
      const bool done = producersDone.load() == kProducers;
      if (position != completed && (position - completed == kDepth || idle || done)) {
        inFlight.clear();
        completed = position;
        std::atomic_ref<uint64_t>(queue.completed).store(position, std::memory_order_release);
      }
      if (done && position == world.load(queue.reserved)) break;
      wasDone = done;
      if (std::chrono::steady_clock::now() > deadline) {
        problem("deadline: producers stuck");
        break;
      }
      std::this_thread::yield();
    }
    // Let producers that are still waiting see the failure and stop (their posts then fail: checked below).
    if (!problems.empty()) std::atomic_ref<uint32_t>(queue.error).store(RAILNET_DOORBELL_PEER_FAILED);
  });
  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      const DirectProducer<Memory> producer = world.template producer<Memory>(20 * kSecond);
      for (uint32_t k = 0; k < kPosts; ++k) results[p][k] = postOne(producer, p, k);
      producersDone.fetch_add(1);
    });
  }
  for (auto& thread : producers) thread.join();
  nic.join();

  for (const auto& problem : problems) FAIL_CHECK(problem);
  REQUIRE(problems.empty());
  {
    DoorbellWitness& seen = witness();
    const std::lock_guard<std::mutex> lock(seen.mutex);
    for (const auto& problem : seen.problems) FAIL_CHECK(problem);
    CHECK(seen.problems.empty());
    // JitteryMemory saw every record store (one per post: each has WQEs); HostMemory none.
    CHECK(seen.stores == (std::is_same_v<Memory, JitteryMemory> ? kProducers * kPosts : 0));
    seen.record = nullptr;
  }
  uint64_t wqebbs = 0;
  for (uint32_t p = 0; p < kProducers; ++p) {
    for (uint32_t k = 0; k < kPosts; ++k) {
      CAPTURE(p, k);
      REQUIRE(results[p][k] == RAILNET_DOORBELL_OK);
      const Kind kind = kindOf(p, k);
      REQUIRE(writesSeen[p][k] == (kind == Kind::kFetchAdd ? 0 : 1));
      REQUIRE(atomicsSeen[p][k] == (kind == Kind::kWrite ? 0 : 1));
      wqebbs += kind == Kind::kWriteFetchAdd ? 2 : 1;
    }
  }
  const DirectQueue& queue = world.queue();
  CHECK(position == kStart + wqebbs);
  CHECK(queue.reserved == kStart + wqebbs);
  CHECK(queue.rung == queue.reserved);
  CHECK(queue.completed == queue.reserved);
  CHECK(world.doorbellRecord[1] == htobe32(static_cast<uint16_t>(kStart + wqebbs)));
  CHECK(doorbells > 100);  // the NIC followed the record as it moved, not only at the end
  // Every value rung into the register is the ctrl of a posted WQE, the last of its post; the final one is the
  // last WQE's.
  REQUIRE_FALSE(registerValuesSeen.empty());
  for (const uint64_t value : registerValuesSeen) {
    const auto index = static_cast<uint16_t>(be32toh(static_cast<uint32_t>(value)) >> 8);
    const auto found = registerValueAt.find(index);
    CAPTURE(index);
    REQUIRE(found != registerValueAt.end());
    CHECK(found->second.first == value);
    CHECK(found->second.second);
  }
  CHECK(world.doorbellRegister == registerValueAt.at(static_cast<uint16_t>(kStart + wqebbs - 1)).first);
  CHECK(world.producer().quietQueues() == RAILNET_DOORBELL_OK);
  CHECK(world.producer().error() == RAILNET_DOORBELL_OK);
}

}  // namespace

TEST_CASE("direct producers: 4 threads x 2000 posts through a 64-WQEBB queue, read by a fake NIC",
          "[doorbell][direct]") {
  runProducersAgainstFakeNic<HostMemory>();
}

TEST_CASE("direct producers and a fake NIC, with a yield between the protocol's steps", "[doorbell][direct]") {
  runProducersAgainstFakeNic<JitteryMemory>();
}

TEST_CASE("direct producer: WQE bytes of each post, long writes split, zero-byte writes post nothing",
          "[doorbell][direct]") {
  World world(0xfffe);  // the 16-bit index wraps inside the posts below
  const Producer producer = world.producer();
  DirectQueue& queue = world.queue();
  // A write: one WQEBB, byte for byte what buildWrite makes; the register gets its ctrl.
  REQUIRE(producer.postWrite(kPeer, 1, 0x40, 0, 0x80, 4096) == RAILNET_DOORBELL_OK);
  alignas(64) unsigned char expected[64] = {};
  mlx5::buildWrite(expected, {0xfffe, kQpn, mlx5::kCtrlCqUpdate}, {world.local[0].address + 0x80, world.local[0].key},
                   {world.remote[kPeer * kWindows + 1].address + 0x40, world.remote[kPeer * kWindows + 1].key}, 4096);
  CHECK(std::memcmp(world.slot(0xfffe), expected, 48) == 0);
  CHECK(world.doorbellRecord[1] == htobe32(0xffff));
  CHECK(world.doorbellRegister == mlx5::doorbellRegisterValue(reinterpret_cast<const mlx5::Ctrl*>(expected)));
  CHECK(queue.reserved == 0xffff);
  CHECK(queue.rung == 0xffff);

  // Zero bytes: nothing posted; with a signal, only the fetch-and-add.
  REQUIRE(producer.postWrite(kPeer, 1, 0, 0, 0, 0) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 0xffff);
  REQUIRE(producer.postWriteFetchAdd(kPeer, 1, 0, 0, 0, 0, 3, 9) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 0x10000);
  Parsed w = parse(world.slot(0xffff));
  CHECK(w.opcode == MLX5_OPCODE_ATOMIC_FA);
  CHECK(w.index == 0xffff);
  CHECK(w.remoteAddress == world.signals[kPeer].address + 3 * 8);
  CHECK(w.add == 9);
  CHECK(world.doorbellRecord[1] == htobe32(0));

  // 2 GiB + 5 bytes and a signal: three writes of 1 GiB, 1 GiB and 5 bytes at advancing addresses, then the atomic;
  // one doorbell for the four, naming the atomic.
  const uint64_t big = 2 * railnet::doorbell::direct::kMaxWriteBytes + 5;
  REQUIRE(producer.postWriteFetchAdd(kPeer, 0, 0x1000, 1, 0x2000, big, 2, 1) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 0x10004);
  for (uint32_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    w = parse(world.slot(0x10000 + i));
    CHECK(w.opcode == MLX5_OPCODE_RDMA_WRITE);
    CHECK(w.index == i);
    CHECK(w.length == (i < 2 ? railnet::doorbell::direct::kMaxWriteBytes : 5));
    CHECK(w.remoteAddress == world.remote[kPeer * kWindows].address + 0x1000 + i * (1ull << 30));
    CHECK(w.localAddress == world.local[1].address + 0x2000 + i * (1ull << 30));
  }
  w = parse(world.slot(0x10003));
  CHECK(w.opcode == MLX5_OPCODE_ATOMIC_FA);
  CHECK(w.index == 3);
  CHECK(world.doorbellRecord[1] == htobe32(4));
  CHECK(world.doorbellRegister == w.registerValue);
  CHECK(queue.rung == 0x10004);
}

TEST_CASE("direct producer: a put_signal into GPU memory reads its data back before a fenced atomic",
          "[doorbell][direct]") {
  World world;
  world.remote[kPeer * kWindows + 1].valid = railnet::doorbell::kKeyGpuMemory;
  const Producer producer = world.producer();
  DirectQueue& queue = world.queue();
  // Into the GPU window: WRITE, READ of its last 8 bytes into the sink's second word, then the fenced atomic.
  REQUIRE(producer.postWriteFetchAdd(kPeer, 1, 0x40, 0, 0x80, 4096, 5, 7) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 3);
  const DirectKey target = world.remote[kPeer * kWindows + 1];
  Parsed w = parse(world.slot(0));
  CHECK(w.opcode == MLX5_OPCODE_RDMA_WRITE);
  CHECK((w.flags & MLX5_WQE_CTRL_FENCE) == 0);
  Parsed r = parse(world.slot(1));
  CHECK(r.opcode == MLX5_OPCODE_RDMA_READ);
  CHECK(r.index == 1);
  CHECK(r.remoteAddress == target.address + 0x40 + 4096 - 8);
  CHECK(r.rkey == target.key);
  CHECK(r.length == 8);
  CHECK(r.localAddress == world.view.atomicSink.address + 8);
  CHECK(r.lkey == world.view.atomicSink.key);
  Parsed a = parse(world.slot(2));
  CHECK(a.opcode == MLX5_OPCODE_ATOMIC_FA);
  CHECK((a.flags & MLX5_WQE_CTRL_FENCE) != 0);  // waits for the READ's response
  CHECK((a.flags & MLX5_WQE_CTRL_CQ_UPDATE) != 0);
  CHECK(a.add == 7);
  CHECK(world.doorbellRegister == a.registerValue);
  // A write shorter than 8 bytes reads back what it wrote; a write alone and a signal alone read nothing back.
  REQUIRE(producer.postWriteFetchAdd(kPeer, 1, 0x40, 0, 0x80, 3, 5, 1) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 6);
  r = parse(world.slot(4));
  CHECK(r.opcode == MLX5_OPCODE_RDMA_READ);
  CHECK(r.length == 3);
  CHECK(r.remoteAddress == target.address + 0x40);
  REQUIRE(producer.postWrite(kPeer, 1, 0, 0, 0, 64) == RAILNET_DOORBELL_OK);
  REQUIRE(producer.postFetchAdd(kPeer, 5, 1) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 8);
  CHECK((parse(world.slot(7)).flags & MLX5_WQE_CTRL_FENCE) == 0);
  // Into host memory (the other window): no READ, no fence.
  REQUIRE(producer.postWriteFetchAdd(kPeer, 0, 0, 0, 0, 64, 5, 1) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 10);
  CHECK(parse(world.slot(9)).opcode == MLX5_OPCODE_ATOMIC_FA);
  CHECK((parse(world.slot(9)).flags & MLX5_WQE_CTRL_FENCE) == 0);
}

TEST_CASE("direct producer: a peer, window or signal it cannot name posts nothing", "[doorbell][direct]") {
  World world(100, 4);
  const Producer producer = world.producer();
  const std::vector<World::Slot> before = world.sq;
  const uint32_t record = world.doorbellRecord[1];
  auto nothingPosted = [&] {
    return world.queue().reserved == 100 && world.doorbellRecord[1] == record && world.doorbellRegister == 0 &&
           std::memcmp(before.data(), world.sq.data(), before.size() * sizeof(before[0])) == 0;
  };
  constexpr int kBad = RAILNET_DOORBELL_BAD_DESCRIPTOR;
  CHECK(producer.postWrite(2, 0, 0, 0, 0, 8) == kBad);   // no such rank
  CHECK(producer.postWrite(-1, 0, 0, 0, 0, 8) == kBad);
  CHECK(producer.postWrite(0, 0, 0, 0, 0, 8) == kBad);   // this rank: no queue
  CHECK(producer.postFetchAdd(0, 0, 1) == kBad);
  CHECK(producer.postWrite(kPeer, kWindows, 0, 0, 0, 8) == kBad);  // window index past maxWindows
  CHECK(producer.postWrite(kPeer, 0, 0, kWindows, 0, 8) == kBad);
  CHECK(producer.postFetchAdd(kPeer, kSignals, 1) == kBad);        // signal index past the count
  CHECK(producer.postWriteFetchAdd(kPeer, 0, 0, 0, 0, 8, kSignals, 1) == kBad);
  // 5 GiB needs five WQEs in one reservation: never fits a 4-WQEBB queue (4 GiB does).
  CHECK(producer.postWrite(kPeer, 0, 0, 0, 0, 5ull << 30) == kBad);
  CHECK(producer.postWriteFetchAdd(kPeer, 0, 0, 0, 0, 4ull << 30, 0, 1) == kBad);
  REQUIRE(nothingPosted());
  world.remote[kPeer * kWindows + 1].valid = 0;  // the peer has not registered window 1
  CHECK(producer.postWrite(kPeer, 1, 0, 0, 0, 8) == kBad);
  CHECK(producer.postWriteFetchAdd(kPeer, 1, 0, 0, 0, 8, 0, 1) == kBad);
  CHECK(producer.postWrite(kPeer, 1, 0, 0, 0, 0) == kBad);  // even for 0 bytes
  world.local[0].valid = 0;
  CHECK(producer.postWrite(kPeer, 0, 0, 0, 0, 8) == kBad);
  world.signals[kPeer].valid = 0;
  CHECK(producer.postFetchAdd(kPeer, 0, 1) == kBad);
  world.signals[kPeer].valid = 1;
  world.view.atomicSink.valid = 0;
  CHECK(producer.postFetchAdd(kPeer, 0, 1) == kBad);
  REQUIRE(nothingPosted());
  // The same view with everything valid posts (the checks above failed for their reason alone).
  world.view.atomicSink.valid = 1;
  world.local[0].valid = 1;
  world.remote[kPeer * kWindows + 1].valid = 1;
  CHECK(producer.postWriteFetchAdd(kPeer, 1, 0, 0, 0, 8, kSignals - 1, 1) == RAILNET_DOORBELL_OK);
  CHECK(producer.postWrite(kPeer, 0, 0, 0, 0, 2ull << 30) == RAILNET_DOORBELL_OK);
  CHECK(world.queue().reserved == 104);
}

TEST_CASE("direct producer: a failed queue or context takes no post", "[doorbell][direct]") {
  World world;
  const Producer producer = world.producer();
  DirectQueue& queue = world.queue();
  REQUIRE(producer.postWrite(kPeer, 0, 0, 0, 0, 8) == RAILNET_DOORBELL_OK);
  REQUIRE(queue.reserved == 1);
  queue.error = RAILNET_DOORBELL_PEER_FAILED;
  CHECK(producer.postWrite(kPeer, 0, 0, 0, 0, 8) == RAILNET_DOORBELL_PEER_FAILED);
  CHECK(producer.postWrite(kPeer, 0, 0, 0, 0, 0) == RAILNET_DOORBELL_PEER_FAILED);
  CHECK(producer.postFetchAdd(kPeer, 0, 1) == RAILNET_DOORBELL_PEER_FAILED);
  CHECK(producer.postWriteFetchAdd(kPeer, 0, 0, 0, 0, 8, 0, 1) == RAILNET_DOORBELL_PEER_FAILED);
  CHECK(producer.quietQueues() == RAILNET_DOORBELL_PEER_FAILED);  // WQEBB 0 never completes now
  CHECK(producer.error() == RAILNET_DOORBELL_PEER_FAILED);
  CHECK(queue.reserved == 1);
  queue.error = 0;
  world.contextError = RAILNET_DOORBELL_STALLED;
  CHECK(producer.postFetchAdd(kPeer, 0, 1) == RAILNET_DOORBELL_STALLED);
  CHECK(producer.error() == RAILNET_DOORBELL_STALLED);
  CHECK(queue.reserved == 1);
  world.contextError = 0;
  CHECK(producer.postFetchAdd(kPeer, 0, 1) == RAILNET_DOORBELL_OK);
  CHECK(queue.reserved == 2);
  CHECK(producer.error() == RAILNET_DOORBELL_OK);
}

TEST_CASE("direct producer: a NIC that never completes fills the ring, then posts time out or see the error",
          "[doorbell][direct]") {
  World world;
  DirectQueue& queue = world.queue();
  constexpr uint64_t kShortNs = 2'000'000;
  const Producer quick = world.producer(kShortNs);
  for (uint32_t i = 0; i < kDepth; ++i) REQUIRE(quick.postWrite(kPeer, 0, i, 0, 0, 8) == RAILNET_DOORBELL_OK);
  CHECK(queue.rung == kDepth);
  CHECK(world.doorbellRecord[1] == htobe32(kDepth));
  const auto before = std::chrono::steady_clock::now();
  CHECK(quick.postFetchAdd(kPeer, 0, 1) == RAILNET_DOORBELL_TIMEOUT);
  CHECK(std::chrono::steady_clock::now() - before >= std::chrono::nanoseconds(kShortNs));
  CHECK(queue.reserved == kDepth + 1);  // reserved, never written: the slot of WQEBB 0 still holds WQE 0
  CHECK(parse(world.slot(kDepth)).index == 0);
  CHECK(world.doorbellRecord[1] == htobe32(kDepth));
  // WQEBB 64 will never ring, so the queue is marked STALLED: quiet and every later post say so at once, and
  // reserve nothing, even after the NIC completes and there would be room.
  CHECK(queue.error == RAILNET_DOORBELL_STALLED);
  CHECK(quick.quietQueues() == RAILNET_DOORBELL_STALLED);
  std::atomic_ref<uint64_t>(queue.completed).store(2, std::memory_order_release);
  CHECK(quick.postWrite(kPeer, 0, 0, 0, 0, 8) == RAILNET_DOORBELL_STALLED);
  CHECK(queue.reserved == kDepth + 1);
  CHECK(queue.rung == kDepth);

  // A post whose turn to ring never comes (an earlier post reserved and stopped) also gives up and marks it.
  World jammed;
  const Producer jammedProducer = jammed.producer(kShortNs);
  jammed.queue().reserved = 1;  // WQEBB 0 reserved by a post that never wrote or rang it
  CHECK(jammedProducer.postWrite(kPeer, 0, 0, 0, 0, 8) == RAILNET_DOORBELL_TIMEOUT);
  CHECK(jammed.queue().error == RAILNET_DOORBELL_STALLED);
  CHECK(jammed.queue().rung == 0);

  // A post waiting for room ends with the queue's error as soon as it is set, long before its own limit.
  World second;
  const Producer patient = second.producer(20 * kSecond);
  for (uint32_t i = 0; i < kDepth; ++i) REQUIRE(patient.postFetchAdd(kPeer, 0, i) == RAILNET_DOORBELL_OK);
  std::atomic<int> result{-1};
  std::thread waiter([&] { result = patient.postWrite(kPeer, 0, 0, 0, 0, 8); });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (second.load(second.queue().reserved) != kDepth + 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  CHECK(result.load() == -1);  // still waiting for room
  std::atomic_ref<uint32_t>(second.queue().error).store(RAILNET_DOORBELL_PEER_FAILED, std::memory_order_release);
  waiter.join();
  CHECK(result.load() == RAILNET_DOORBELL_PEER_FAILED);
}
