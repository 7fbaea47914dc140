// Moving and verifying data the way NCCL's proxy progress threads do: a sender that keeps up to a window of
// isends in flight and retries NULL requests (progressing each tag independently, as NCCL does per peer),
// and a receiver that posts (grouped) irecvs in order and checks every byte, size and untouched byte. Each
// send and each receive buffer lives in host or GPU memory (memory.h), as the plan says.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <random>
#include <vector>

#include "comms.h"
#include "memory.h"

namespace conformance {

// What receive memory holds where nothing may be written (around and past each posted buffer).
inline constexpr uint8_t kCanary = 0xA5;

// Deterministic bytes for a message: byte j depends only on (seed, j), so a receiver can check any range.
void fillPattern(uint8_t* data, size_t size, uint64_t seed);
// Offset of the first byte that differs from the pattern, or SIZE_MAX.
size_t findMismatch(const uint8_t* data, size_t size, uint64_t seed);
// The same for a message at `offset` in memory of either kind (GPU memory is copied out piecewise).
void writePattern(Memory& memory, size_t offset, size_t size, uint64_t seed);
size_t findMismatch(const Memory& memory, size_t offset, size_t size, uint64_t seed);
// "" when the `size` bytes at `offset` hold the pattern, else what differs: the first wrong byte with the value
// expected and the one found, how many bytes differ and the last of them.
std::string describeMismatch(const Memory& memory, size_t offset, size_t size, uint64_t seed);
// Offset (from `offset`) of the first of `size` bytes that is not `value`, or SIZE_MAX.
size_t findOtherThan(const Memory& memory, size_t offset, size_t size, uint8_t value);

struct SendSpec {
  int tag;
  size_t size;
  MemKind memory = MemKind::Host;  // where the bytes are sent from
};

struct RecvSpec {
  int tag;
  size_t capacity;                 // the posted size; the matching send may be smaller
  MemKind memory = MemKind::Host;  // where the bytes land
};

using RecvGroup = std::vector<RecvSpec>;  // one irecv of n = size() buffers

struct Plan {
  // Posting preference order. Per tag, order decides matching (k-th send of tag t fills tag t's buffer of the
  // k-th receive listing t); across tags the sender falls back to another tag when one returns NULL.
  std::vector<SendSpec> sends;
  std::vector<RecvGroup> recvs;  // posted in this order
  int sendWindow = 1;            // isend requests in flight per tag (NCCL: per peer) on the send comm
  int recvWindow = 1;            // irecv requests in flight on the recv comm
  // Preset *request = NCCL_NET_OPTIONAL_RECV_COMPLETION on every other n==1 irecv, as NCCL does for LL/LL128.
  bool optionalCompletion = false;
  uint64_t seed = 1;
};

// A plan of `count` single-buffer messages of tag 0.
Plan simplePlan(const std::vector<size_t>& sizes, int window, uint64_t seed);
// `count` messages of random sizes up to `maxSize` (randomSize's mix of small and large), `window` in flight.
Plan randomPlan(size_t count, size_t maxSize, int window, uint64_t seed);
// Random sizes in [0, maxSize] skewed toward small values (and some exact zero) for mixed traffic.
size_t randomSize(std::mt19937_64& rng, size_t maxSize);
// Grouped receives listing `tagsOf(g, rng)`, each buffer `capacity(g, rng)` bytes, and one send per buffer no
// larger than it, in group-major order (every peer sends its k-th message for the k-th receive).
template <typename Tags, typename Capacity>
Plan groupedPlan(int groups, Tags tagsOf, Capacity capacity, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Plan plan;
  plan.seed = seed;
  for (int g = 0; g < groups; ++g) {
    const std::vector<int> tags = tagsOf(g, rng);
    RecvGroup group;
    for (size_t b = 0; b < tags.size(); ++b) {
      const size_t cap = capacity(g, rng);
      group.push_back({tags[b], cap});
      plan.sends.push_back({tags[b], randomSize(rng, cap)});
    }
    plan.recvs.push_back(group);
  }
  return plan;
}
// Reorders the sends while keeping each tag's own order (which decides matching): picks the next tag by
// `chooseTag(open tags)` among tags that still have sends.
void interleave(Plan& plan, const std::function<int(const std::vector<int>&)>& chooseTag);
void randomInterleave(Plan& plan, uint64_t seed);

// Every send from `send` memory, every receive buffer in `recv` memory.
Plan& placeMemory(Plan& plan, MemKind send, MemKind recv);

// The largest message this pass may use: --max-size, the device's maxP2pBytes, and 64 MiB unless the pass
// carries the largest sizes (env.heavy).
size_t messageLimit(const TestEnv& env);
// The sizes that are at most `limit`, in order.
std::vector<size_t> clampSizes(const std::vector<size_t>& sizes, size_t limit);

// Runs the plan over `conn` (sender and receiver on two threads), registering one send and one recv region of
// each memory kind the plan uses once each. Throws TestFailure on any error, mismatch, or timeout.
// `beforeClose` runs on failure before the comms are closed (to stop other users of the comms first).
void runTransfer(NetApi& net, Connection& conn, const Plan& plan, const std::function<void()>& beforeClose = {});


// isend / irecv retried while the plugin answers "not yet" (*request == NULL), as NCCL's proxy does; any
// non-success result fails the test. Returns the request.
void* postSend(NetApi& net, void* comm, void* data, size_t size, int tag, void* mhandle, const Deadline& deadline);
void* postRecv(NetApi& net, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
               const Deadline& deadline);
// The single-buffer form (tag 0).
void* postRecv(NetApi& net, void* comm, void* data, size_t size, void* mhandle, const Deadline& deadline);

// Drives one request to completion (done=1) within `deadline`; returns the test() result that ended it
// (a non-success result ends it too). sizes may be nullptr.
ncclResult_t waitRequest(NetApi& net, void* request, int* sizes, const Deadline& deadline);

}  // namespace conformance
