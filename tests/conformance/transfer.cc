#include "transfer.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <optional>

namespace conformance {
namespace {

constexpr uint8_t kCanary = 0xA5;
constexpr size_t kGap = 61;                           // odd: sub-ranges start unaligned; gap bytes are guards
constexpr size_t kDistinctLimit = size_t{256} << 20;  // up to this, every message gets its own region
constexpr size_t kCanaryLimit = size_t{64} << 20;     // recv memory pre-filled with canaries up to this
constexpr int kMaxGroup = 8;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t patternWord(uint64_t seed, size_t index) { return mix(seed * 0x9E3779B97F4A7C15ull + index); }

uint64_t messageSeed(const Plan& plan, size_t sendIndex) { return plan.seed * 1000003u + sendIndex + 1; }

// Where every message lives. Distinct mode gives each send / each receive buffer its own region; slot mode
// (for huge messages) reuses `window` slots, and a slot is posted again only once its previous use completed.
struct Layout {
  size_t sendSlots = 0;
  std::vector<size_t> sendSlotOffset;
  size_t sendBytes = 0;
  size_t recvSlots = 0;
  std::vector<std::vector<size_t>> recvSlotOffset;  // [slot][buffer]
  size_t recvBytes = 0;
  bool recvDistinct = false;
  std::vector<std::vector<size_t>> expected;  // [group][buffer] -> send index

  size_t sendSlot(size_t i) const { return i % sendSlots; }
  size_t recvSlot(size_t g) const { return g % recvSlots; }
};

Layout makeLayout(const Plan& plan) {
  Layout layout;
  const size_t nSends = plan.sends.size();
  const size_t nGroups = plan.recvs.size();

  // Oracle: the k-th send of tag t fills tag t's buffer in the k-th group listing t.
  std::map<int, std::vector<size_t>> sendsByTag;
  for (size_t i = 0; i < nSends; ++i) sendsByTag[plan.sends[i].tag].push_back(i);
  std::map<int, size_t> used;
  layout.expected.resize(nGroups);
  for (size_t g = 0; g < nGroups; ++g) {
    REQUIRE(!plan.recvs[g].empty() && plan.recvs[g].size() <= kMaxGroup, "plan: bad group size");
    for (const RecvSpec& buf : plan.recvs[g]) {
      size_t& k = used[buf.tag];
      const auto& list = sendsByTag[buf.tag];
      REQUIRE(k < list.size(), strf("plan: receive %zu lists tag %d more often than it is sent", g, buf.tag));
      REQUIRE(plan.sends[list[k]].size <= buf.capacity, "plan: a send exceeds its buffer");
      layout.expected[g].push_back(list[k++]);
    }
  }
  for (const auto& [tag, list] : sendsByTag) {
    REQUIRE(used[tag] == list.size(), strf("plan: tag %d has sends that no receive lists", tag));
  }

  size_t sendTotal = 0, maxSend = 0;
  for (const SendSpec& s : plan.sends) {
    sendTotal += s.size + kGap;
    maxSend = std::max(maxSend, s.size);
  }
  if (sendTotal <= kDistinctLimit) {
    layout.sendSlots = std::max<size_t>(nSends, 1);
    size_t offset = kGap;
    for (const SendSpec& s : plan.sends) {
      layout.sendSlotOffset.push_back(offset);
      offset += s.size + kGap;
    }
    layout.sendBytes = offset;
  } else {
    layout.sendSlots = static_cast<size_t>(plan.sendWindow) * sendsByTag.size();
    for (size_t slot = 0; slot < layout.sendSlots; ++slot) layout.sendSlotOffset.push_back(slot * (maxSend + kGap));
    layout.sendBytes = layout.sendSlots * (maxSend + kGap);
  }
  if (layout.sendSlotOffset.empty()) layout.sendSlotOffset.push_back(0);

  size_t recvTotal = 0, maxCapacity = 0, maxGroup = 1;
  for (const RecvGroup& group : plan.recvs) {
    maxGroup = std::max(maxGroup, group.size());
    for (const RecvSpec& buf : group) {
      recvTotal += buf.capacity + kGap;
      maxCapacity = std::max(maxCapacity, buf.capacity);
    }
  }
  layout.recvDistinct = recvTotal <= kDistinctLimit;
  if (layout.recvDistinct) {
    layout.recvSlots = std::max<size_t>(nGroups, 1);
    size_t offset = kGap;
    for (const RecvGroup& group : plan.recvs) {
      std::vector<size_t> offsets;
      for (const RecvSpec& buf : group) {
        offsets.push_back(offset);
        offset += buf.capacity + kGap;
      }
      layout.recvSlotOffset.push_back(offsets);
    }
    layout.recvBytes = offset;
  } else {
    layout.recvSlots = static_cast<size_t>(plan.recvWindow);
    size_t offset = 0;
    for (size_t slot = 0; slot < layout.recvSlots; ++slot) {
      std::vector<size_t> offsets;
      for (size_t b = 0; b < maxGroup; ++b) {
        offsets.push_back(offset);
        offset += maxCapacity + kGap;
      }
      layout.recvSlotOffset.push_back(offsets);
    }
    layout.recvBytes = offset;
  }
  if (layout.recvSlotOffset.empty()) layout.recvSlotOffset.push_back({0});
  return layout;
}

// Which send's bytes a buffer holds, for a readable report when data landed in the wrong place.
std::string identify(const Plan& plan, const uint8_t* data, size_t size) {
  if (size == 0 || size > (size_t{1} << 20) || plan.sends.size() > 4096) return "";
  for (size_t i = 0; i < plan.sends.size(); ++i) {
    if (plan.sends[i].size >= size && findMismatch(data, size, messageSeed(plan, i)) == SIZE_MAX) {
      return strf(" (it holds the bytes of send #%zu, tag %d)", i, plan.sends[i].tag);
    }
  }
  return "";
}

class Sender {
 public:
  Sender(NetApi& net, void* comm, void* mhandle, uint8_t* base, const Plan& plan, const Layout& layout)
      : net_(net),
        comm_(comm),
        mhandle_(mhandle),
        base_(base),
        plan_(plan),
        layout_(layout),
        slotBusy_(layout.sendSlots, false),
        filled_(plan.sends.size(), false) {
    for (size_t i = 0; i < plan.sends.size(); ++i) queues_[plan.sends[i].tag].push_back(i);
  }

  void run(const Deadline& deadline) {
    Backoff backoff;
    while (completed_ < plan_.sends.size()) {
      deadline.check("isend requests to complete");
      const bool posted = post();
      const bool tested = testAll();
      (posted || tested) ? backoff.progressed() : backoff.idle();
    }
  }

 private:
  struct InFlight {
    void* request;
    size_t index;
  };

  // Tries the head of each tag's queue, earliest in the plan first; a NULL request moves on to the next tag
  // (NCCL's proxy progresses each peer independently, each with its own window of steps). Restarts after each
  // success to honour the plan's order.
  bool post() {
    bool any = false;
    for (bool again = true; again;) {
      again = false;
      std::vector<size_t> heads;
      for (const auto& [tag, queue] : queues_) {
        if (!queue.empty()) heads.push_back(queue.front());
      }
      std::sort(heads.begin(), heads.end());
      for (size_t i : heads) {
        if (inflightPerTag_[plan_.sends[i].tag] >= plan_.sendWindow) continue;
        if (slotBusy_[layout_.sendSlot(i)]) continue;
        if (tryPost(i)) {
          any = again = true;
          break;
        }
      }
    }
    return any;
  }

  bool tryPost(size_t i) {
    const SendSpec& spec = plan_.sends[i];
    uint8_t* data = base_ + layout_.sendSlotOffset[layout_.sendSlot(i)];
    if (!filled_[i]) {
      fillPattern(data, spec.size, messageSeed(plan_, i));
      filled_[i] = true;
    }
    void* request = nullptr;
    const ncclResult_t rc = net_.isend(comm_, data, spec.size, spec.tag, mhandle_, &request);
    REQUIRE(rc == ncclSuccess,
            strf("isend #%zu (tag %d, %zu bytes) returned %s", i, spec.tag, spec.size, ncclResultName(rc)));
    if (!request) return false;
    inflight_.push_back({request, i});
    ++inflightPerTag_[spec.tag];
    slotBusy_[layout_.sendSlot(i)] = true;
    queues_[spec.tag].pop_front();
    return true;
  }

  bool testAll() {
    bool any = false;
    for (size_t k = 0; k < inflight_.size();) {
      const InFlight f = inflight_[k];
      const SendSpec& spec = plan_.sends[f.index];
      int done = 0;
      int size = -1;
      const bool withSize = f.index % 5 != 4;  // sizes may be NULL
      const ncclResult_t rc = net_.test(f.request, &done, withSize ? &size : nullptr);
      REQUIRE(rc == ncclSuccess,
              strf("test of isend #%zu (tag %d, %zu bytes) returned %s", f.index, spec.tag, spec.size, ncclResultName(rc)));
      if (!done) {
        ++k;
        continue;
      }
      if (withSize) {
        REQUIRE(size == static_cast<int>(spec.size),
                strf("isend #%zu completed reporting %d bytes, sent %zu", f.index, size, spec.size));
      }
      slotBusy_[layout_.sendSlot(f.index)] = false;
      --inflightPerTag_[spec.tag];
      inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(k));
      ++completed_;
      any = true;
    }
    return any;
  }

  NetApi& net_;
  void* comm_;
  void* mhandle_;
  uint8_t* base_;
  const Plan& plan_;
  const Layout& layout_;
  std::map<int, std::deque<size_t>> queues_;
  std::vector<bool> slotBusy_;
  std::vector<bool> filled_;
  std::vector<InFlight> inflight_;
  std::map<int, int> inflightPerTag_;
  size_t completed_ = 0;
};

class Receiver {
 public:
  Receiver(NetApi& net, void* comm, void* mhandle, uint8_t* base, const Plan& plan, const Layout& layout)
      : net_(net),
        comm_(comm),
        mhandle_(mhandle),
        base_(base),
        plan_(plan),
        layout_(layout),
        slotBusy_(layout.recvSlots, false) {}

  void run(const Deadline& deadline) {
    Backoff backoff;
    while (completed_ < plan_.recvs.size()) {
      deadline.check("irecv requests to complete");
      const bool posted = post();
      const bool tested = testAll();
      (posted || tested) ? backoff.progressed() : backoff.idle();
    }
    if (layout_.recvDistinct && layout_.recvBytes <= kCanaryLimit) checkGaps();
  }

 private:
  struct InFlight {
    void* request;
    size_t group;
  };

  uint8_t* bufferAt(size_t g, size_t b) const { return base_ + layout_.recvSlotOffset[layout_.recvSlot(g)][b]; }

  bool post() {
    bool any = false;
    while (next_ < plan_.recvs.size() && inflight_.size() < static_cast<size_t>(plan_.recvWindow) &&
           !slotBusy_[layout_.recvSlot(next_)]) {
      const size_t g = next_;
      const RecvGroup& group = plan_.recvs[g];
      const int n = static_cast<int>(group.size());
      void* data[kMaxGroup];
      size_t sizes[kMaxGroup];
      int tags[kMaxGroup];
      void* mhandles[kMaxGroup];
      for (int b = 0; b < n; ++b) {
        data[b] = bufferAt(g, b);
        sizes[b] = group[b].capacity;
        tags[b] = group[b].tag;
        mhandles[b] = mhandle_;
        // Slot reuse: restore canaries so writes past the received size are caught.
        if (!layout_.recvDistinct && group[b].capacity <= kCanaryLimit) {
          std::memset(data[b], kCanary, group[b].capacity);
        }
      }
      const bool optional = plan_.optionalCompletion && n == 1 && g % 2 == 0;
      void* request = optional ? reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION) : nullptr;
      const ncclResult_t rc = net_.irecv(comm_, n, data, sizes, tags, mhandles, &request);
      REQUIRE(rc == ncclSuccess, strf("irecv #%zu (n=%d) returned %s", g, n, ncclResultName(rc)));
      REQUIRE(request != reinterpret_cast<void*>(NCCL_NET_OPTIONAL_RECV_COMPLETION),
              strf("irecv #%zu left the optional-completion marker in *request instead of a real request", g));
      if (!request) break;  // not now; NCCL retries later
      inflight_.push_back({request, g});
      slotBusy_[layout_.recvSlot(g)] = true;
      ++next_;
      any = true;
    }
    return any;
  }

  bool testAll() {
    bool any = false;
    for (size_t k = 0; k < inflight_.size();) {
      const InFlight f = inflight_[k];
      int done = 0;
      int sizes[kMaxGroup];
      std::fill(std::begin(sizes), std::end(sizes), -1);
      const bool withSizes = f.group % 5 != 4;  // sizes may be NULL
      const ncclResult_t rc = net_.test(f.request, &done, withSizes ? sizes : nullptr);
      REQUIRE(rc == ncclSuccess, strf("test of irecv #%zu returned %s", f.group, ncclResultName(rc)));
      if (!done) {
        ++k;
        continue;
      }
      verify(f.group, withSizes ? sizes : nullptr);
      slotBusy_[layout_.recvSlot(f.group)] = false;
      inflight_.erase(inflight_.begin() + static_cast<std::ptrdiff_t>(k));
      ++completed_;
      any = true;
    }
    return any;
  }

  void verify(size_t g, const int* sizes) const {
    const RecvGroup& group = plan_.recvs[g];
    for (size_t b = 0; b < group.size(); ++b) {
      const size_t sendIndex = layout_.expected[g][b];
      const size_t expectedSize = plan_.sends[sendIndex].size;
      const uint8_t* data = bufferAt(g, b);
      const std::string where =
          strf("irecv #%zu buffer %zu (tag %d, posted %zu)", g, b, group[b].tag, group[b].capacity);
      if (sizes) {
        REQUIRE(sizes[b] == static_cast<int>(expectedSize),
                strf("%s: test reported %d bytes, the matching send #%zu had %zu", where.c_str(), sizes[b], sendIndex,
                     expectedSize));
      }
      const size_t bad = findMismatch(data, expectedSize, messageSeed(plan_, sendIndex));
      REQUIRE(bad == SIZE_MAX, strf("%s: byte %zu of %zu differs from send #%zu%s", where.c_str(), bad, expectedSize,
                                    sendIndex, identify(plan_, data, expectedSize).c_str()));
      const bool canaried =
          layout_.recvDistinct ? layout_.recvBytes <= kCanaryLimit : group[b].capacity <= kCanaryLimit;
      if (canaried) {
        for (size_t j = expectedSize; j < group[b].capacity; ++j) {
          REQUIRE(data[j] == kCanary,
                  strf("%s: byte %zu written past the %zu received bytes", where.c_str(), j, expectedSize));
        }
      }
    }
  }

  void checkGaps() const {
    for (size_t g = 0; g < plan_.recvs.size(); ++g) {
      for (size_t b = 0; b < plan_.recvs[g].size(); ++b) {
        const uint8_t* gap = bufferAt(g, b) - kGap;
        for (size_t j = 0; j < kGap; ++j) {
          REQUIRE(gap[j] == kCanary, strf("a byte before irecv #%zu buffer %zu was overwritten", g, b));
        }
      }
    }
  }

  NetApi& net_;
  void* comm_;
  void* mhandle_;
  uint8_t* base_;
  const Plan& plan_;
  const Layout& layout_;
  std::vector<bool> slotBusy_;
  std::deque<InFlight> inflight_;
  size_t next_ = 0;
  size_t completed_ = 0;
};

}  // namespace

void fillPattern(uint8_t* data, size_t size, uint64_t seed) {
  const size_t words = size / 8;
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = patternWord(seed, i);
    std::memcpy(data + 8 * i, &w, 8);
  }
  if (size % 8) {
    const uint64_t w = patternWord(seed, words);
    std::memcpy(data + 8 * words, &w, size % 8);
  }
}

size_t findMismatch(const uint8_t* data, size_t size, uint64_t seed) {
  const size_t words = size / 8;
  for (size_t i = 0; i < words; ++i) {
    uint64_t got;
    std::memcpy(&got, data + 8 * i, 8);
    const uint64_t want = patternWord(seed, i);
    if (got != want) {
      for (size_t j = 0; j < 8; ++j) {
        if (reinterpret_cast<const uint8_t*>(&got)[j] != reinterpret_cast<const uint8_t*>(&want)[j]) {
          return 8 * i + j;
        }
      }
    }
  }
  if (size % 8) {
    const uint64_t want = patternWord(seed, words);
    for (size_t j = 0; j < size % 8; ++j) {
      if (data[8 * words + j] != reinterpret_cast<const uint8_t*>(&want)[j]) return 8 * words + j;
    }
  }
  return SIZE_MAX;
}

Plan simplePlan(const std::vector<size_t>& sizes, int window, uint64_t seed) {
  Plan plan;
  for (size_t size : sizes) {
    plan.sends.push_back({0, size});
    plan.recvs.push_back({{0, size}});
  }
  plan.sendWindow = plan.recvWindow = window;
  plan.seed = seed;
  return plan;
}

void runTransfer(NetApi& net, Connection& conn, const Plan& plan, const std::function<void()>& beforeClose) {
  const Layout layout = makeLayout(plan);
  // Buffers outlive the comms on every path: on failure the comms are closed before the memory goes away.
  HostBuffer sendBuffer(layout.sendBytes);
  HostBuffer recvBuffer(layout.recvBytes);
  if (layout.recvDistinct && layout.recvBytes <= kCanaryLimit) {
    std::memset(recvBuffer.data(), kCanary, recvBuffer.size());
  }
  std::optional<Registration> sendReg, recvReg;
  try {
    // Registered once per buffer; isend/irecv address sub-ranges with the same mhandle (as NCCL does).
    sendReg.emplace(net, conn.send.get(), sendBuffer.data(), sendBuffer.size());
    recvReg.emplace(net, conn.recv.get(), recvBuffer.data(), recvBuffer.size());
    ThreadGroup threads;
    const Deadline deadline(threads.abortFlag());
    Sender sender(net, conn.send.get(), sendReg->handle(), sendBuffer.data(), plan, layout);
    Receiver receiver(net, conn.recv.get(), recvReg->handle(), recvBuffer.data(), plan, layout);
    threads.spawn([&] { receiver.run(deadline); });
    threads.spawn([&] { sender.run(deadline); });
    threads.join();
  } catch (...) {
    // Requests may still be in flight: close the comms (allowed with requests pending) so the plugin stops
    // touching the buffers; the registrations die with their comms.
    if (beforeClose) beforeClose();
    (void)conn.send.close();
    (void)conn.recv.close();
    if (sendReg) sendReg->abandon();
    if (recvReg) recvReg->abandon();
    throw;
  }
}

size_t randomSize(std::mt19937_64& rng, size_t maxSize) {
  const uint64_t bucket = rng() % 10;
  size_t limit = maxSize;
  if (bucket == 0) return 0;
  if (bucket <= 4)
    limit = std::min<size_t>(maxSize, 256);
  else if (bucket <= 7)
    limit = std::min<size_t>(maxSize, 64 << 10);
  return static_cast<size_t>(rng() % (limit + 1));
}

void* postSend(NetApi& net, void* comm, void* data, size_t size, int tag, void* mhandle, const Deadline& deadline) {
  void* request = nullptr;
  for (Backoff backoff; !request; backoff.idle()) {
    deadline.check("isend to accept the send");
    const ncclResult_t rc = net.isend(comm, data, size, tag, mhandle, &request);
    REQUIRE(rc == ncclSuccess, strf("isend (%zu bytes, tag %d) returned %s", size, tag, ncclResultName(rc)));
  }
  return request;
}

void* postRecv(NetApi& net, void* comm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
               const Deadline& deadline) {
  void* request = nullptr;
  for (Backoff backoff; !request; backoff.idle()) {
    deadline.check("irecv to accept the receive");
    const ncclResult_t rc = net.irecv(comm, n, data, sizes, tags, mhandles, &request);
    REQUIRE(rc == ncclSuccess, strf("irecv (n=%d) returned %s", n, ncclResultName(rc)));
  }
  return request;
}

void* postRecv(NetApi& net, void* comm, void* data, size_t size, void* mhandle, const Deadline& deadline) {
  int tag = 0;
  return postRecv(net, comm, 1, &data, &size, &tag, &mhandle, deadline);
}

ncclResult_t waitRequest(NetApi& net, void* request, int* sizes, const Deadline& deadline) {
  Backoff backoff;
  for (;;) {
    deadline.check("a request to complete");
    int done = 0;
    const ncclResult_t rc = net.test(request, &done, sizes);
    if (rc != ncclSuccess || done) return rc;
    backoff.idle();
  }
}

}  // namespace conformance
