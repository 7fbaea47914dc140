// The gin group's refusals and failures (group "gin", with test_gin.cc): out-of-window puts, contexts, foreign
// requests, and a peer process killed with puts in flight or idle.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "gin_harness.h"

namespace conformance {

TEST_CASE("gin", "bounds", Scope::Once) {
  // Puts outside the windows are refused with ncclInvalidArgument and write nothing: past the end of the
  // target's window, past the end of the source window, an offset that wraps around, a signal word past the end
  // of the signal window; to the peer and to itself. Then a put that exactly fits (the last bytes of the window,
  // the last signal word) lands, on the same comm.
  const size_t windowSize = 64 * KiB;
  forEachTable(env, false, [&](GinApi& api) {
    runMesh(api, 2, 1, [&](GinRank& rank) {
      const bool initiator = rank.rank() == 0;
      HostWindow data(windowSize, kBackground);
      HostWindow signals(kSignalBytes, 0);
      Window dataWin = rank.registerWindow(data, 0);
      Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
      const uint64_t seed = seedOf(windowSize, 0, 4242);
      // The initiator's source: a pattern over its whole window (its own window is a target of its self-puts, so
      // what it must keep is that pattern).
      if (initiator) fillPattern(data.data(), windowSize, seed);
      rank.barrier("start");
      if (initiator) {
        const uint64_t W = windowSize;
        struct Refusal {
          const char* what;
          bool signal;
          uint64_t srcOff;
          size_t size;
          uint64_t dstOff;
          uint64_t signalOff;
        };
        const Refusal refusals[] = {
            {"iput whose dstOff + size passes the target window's end by 1", false, 0, 11, W - 10, 0},
            {"iput at dstOff == window size", false, 0, 1, W, 0},
            {"iput whose srcOff + size passes the local window's end", false, W - 3, 4, 0, 0},
            {"iput whose dstOff + size wraps around 2^64", false, 0, 16, std::numeric_limits<uint64_t>::max() - 7, 0},
            {"iput of the whole window at dstOff 1", false, 0, static_cast<size_t>(W), 1, 0},
            {"iputSignal whose signal word straddles the signal window's end", true, 0, 16, 64, kSignalBytes - 4},
            {"iputSignal whose signal word starts at the signal window's end", true, 0, 16, 128, kSignalBytes},
            {"signal-only iputSignal far past the signal window", true, 0, 0, 0, 4096},
            {"iputSignal whose data passes the target window's end", true, 0, 32, W - 16, 0},
        };
        for (int peer : {1, 0}) {
          for (const Refusal& r : refusals) {
            void* request = nullptr;
            ncclResult_t rc;
            const bool signalOnly = r.signal && r.size == 0;
            if (r.signal) {
              rc = api.iputSignal(rank.endpoint(), 0, r.srcOff, signalOnly ? nullptr : dataWin.handle, r.size, r.dstOff,
                                  signalOnly ? nullptr : dataWin.handle, static_cast<uint32_t>(peer), r.signalOff,
                                  sigWin.handle, 1, NCCL_NET_SIGNAL_OP_ADD, &request);
            } else {
              rc = api.iput(rank.endpoint(), 0, r.srcOff, dataWin.handle, r.size, r.dstOff, dataWin.handle,
                            static_cast<uint32_t>(peer), &request);
            }
            REQUIRE(
                rc == ncclInvalidArgument,
                rank.where() + strf(": %s (to rank %d; srcOff %llu size %zu dstOff %llu signalOff %llu) returned %s, "
                                    "expected ncclInvalidArgument",
                                    r.what, peer, static_cast<unsigned long long>(r.srcOff), r.size,
                                    static_cast<unsigned long long>(r.dstOff),
                                    static_cast<unsigned long long>(r.signalOff), ncclResultName(rc)));
            rank.progress();
          }
        }
      }
      // The caller's mistakes did not poison the comm: puts that exactly fit the windows' ends land, to the peer
      // and to itself, and they are ordered after the refused ones, so anything those wrote would be there now.
      const size_t tail = 10;
      const uint64_t tailOff = windowSize - tail;
      const size_t lastWord = kSignalWords - 1;
      if (initiator) {
        for (int peer : {1, 0}) {
          void* req = rank.putSignal(0, 0, &dataWin, tail, tailOff, &dataWin, peer, sigWin, lastWord, 0,
                                     NCCL_NET_SIGNAL_OP_INC);
          rank.complete(req, strf("the valid put to rank %d after the refused ones", peer));
        }
      }
      rank.awaitSignal(signals, lastWord, 0, 1, "the valid put after the refused ones");
      // What each window must hold: the target's, background except the tail; the initiator's, its pattern except
      // the tail (its own first 10 bytes).
      std::string damage;
      if (initiator) {
        std::vector<uint8_t> head(tail);
        fillPattern(head.data(), tail, seed);
        std::vector<uint8_t> all(windowSize);
        fillPattern(all.data(), windowSize, seed);
        std::memcpy(all.data() + tailOff, head.data(), tail);
        const auto diff = std::mismatch(all.begin(), all.end(), data.data());
        if (diff.first != all.end()) {
          const size_t at = static_cast<size_t>(diff.first - all.begin());
          damage =
              rank.where() + strf(
                                 ": own window byte %zu is 0x%02x, expected 0x%02x after the refused self-puts and "
                                 "the valid one",
                                 at, data.data()[at], all[at]);
        }
        if (damage.empty()) damage = data.guardDamage(rank.where() + ": own window");
      } else {
        // The tail holds the initiator's first `tail` pattern bytes of `seed`.
        std::vector<uint8_t> head(tail);
        fillPattern(head.data(), tail, seed);
        damage = std::memcmp(data.data() + tailOff, head.data(), tail) == 0
                     ? ""
                     : rank.where() + ": the valid put to the last 10 bytes of the window did not land intact";
        if (damage.empty()) {
          damage = untouchedOutside(data, {{static_cast<size_t>(tailOff), tail}}, kBackground,
                                    rank.where() + ": after the refused puts");
        }
      }
      REQUIRE(damage.empty(), damage);
      for (size_t w = 0; w < lastWord; ++w) {
        REQUIRE(signals.signal(w) == 0, rank.where() + strf(": signal word %zu is %llu after refused signals", w,
                                                            static_cast<unsigned long long>(signals.signal(w))));
      }
      const std::string sigDamage = signals.guardDamage(rank.where() + ": signal window");
      REQUIRE(sigDamage.empty(), sigDamage);
      rank.barrier("end");
    });
  });
}

TEST_CASE("gin", "contexts", Scope::Once) {
  // v13/v14 with nContexts = 2: each rank puts to the other on context 0 and on context 1 (a put, then a
  // signal-only iputSignal on the same context, which must follow it), and an iputSignal with data on context 1.
  const size_t size = 256 * KiB + 1;
  const size_t slot = size + 63;
  const size_t windowSize = 6 * slot;
  forEachTable(env, true, [&](GinApi& api) {
    runMesh(api, 2, 2, [&](GinRank& rank) {
      HostWindow data(windowSize, kBackground);
      HostWindow signals(kSignalBytes, 0);
      Window dataWin = rank.registerWindow(data, 0);
      Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
      const int me = rank.rank();
      const int peer = 1 - me;
      // Regions 0..2 receive; 3..5 are the sources. Region j travels on context j % 2 (region 2 on context 1).
      auto seedFor = [&](int src, int j) { return seedOf(size, static_cast<uint64_t>(j) * slot, 900 + src * 8 + j); };
      for (int j = 0; j < 3; ++j) fillPattern(data.data() + (3 + j) * slot, size, seedFor(me, j));
      rank.barrier("start");
      std::deque<void*> inflight;
      for (int context : {0, 1}) {
        inflight.push_back(rank.put(context, (3 + context) * slot, dataWin, size, context * slot, dataWin, peer));
        inflight.push_back(rank.putSignal(context, 0, nullptr, 0, 0, nullptr, peer, sigWin,
                                          static_cast<size_t>(context), 0, NCCL_NET_SIGNAL_OP_INC));
      }
      inflight.push_back(
          rank.putSignal(1, 5 * slot, &dataWin, size, 2 * slot, &dataWin, peer, sigWin, 2, 3, NCCL_NET_SIGNAL_OP_ADD));
      std::vector<Range> written{{3 * slot, 3 * slot}};
      for (int j = 0; j < 3; ++j) {
        const int context = j % 2;
        rank.awaitSignal(signals, static_cast<size_t>(j), 0, j == 2 ? 3 : 1,
                         strf("region %d on context %d from rank %d", j, context, peer));
        const std::string damage = patternDamage(data, j * slot, size, seedFor(peer, j),
                                                 rank.where() + strf(": region %d on context %d", j, context));
        REQUIRE(damage.empty(), damage);
        written.push_back({j * slot, size});
      }
      rank.drain(inflight, "the puts on both contexts");
      const std::string damage = untouchedOutside(data, written, kBackground, rank.where() + ": two contexts");
      REQUIRE(damage.empty(), damage);
      rank.barrier("end");
    });
  });
}

TEST_CASE("gin", "bad_request", Scope::Once) {
  // test() on pointers the plugin never returned (a local int, a heap block of garbage) returns an error and
  // does not crash; the comm then still moves a put.
  forEachTable(env, false, [&](GinApi& api) {
    runMesh(api, 2, 1, [&](GinRank& rank) {
      HostWindow data(4 * KiB, kBackground);
      HostWindow signals(kSignalBytes, 0);
      Window dataWin = rank.registerWindow(data, 0);
      Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
      int local = 0;
      std::vector<uint8_t> garbage(256, 0xAB);
      struct Foreign {
        const char* what;
        void* pointer;
      };
      for (const Foreign& f :
           {Foreign{"a pointer to a local int", &local}, Foreign{"a heap block of 0xAB", garbage.data()}}) {
        int done = 0;
        const ncclResult_t rc = api.test(rank.collComm(), f.pointer, &done);
        REQUIRE(rc != ncclSuccess, rank.where() + strf(": test(%s) returned ncclSuccess (done %d)", f.what, done));
        rank.progress();
      }
      REQUIRE(local == 0, rank.where() + ": test() wrote into the local int it was given");
      REQUIRE(std::all_of(garbage.begin(), garbage.end(), [](uint8_t b) { return b == 0xAB; }),
              rank.where() + ": test() wrote into the heap block it was given");
      const uint64_t seed = seedOf(100, 2048, 31 + static_cast<uint64_t>(rank.rank()));
      fillPattern(data.data(), 100, seed);
      rank.barrier("start");
      const int peer = 1 - rank.rank();
      void* req = rank.putSignal(0, 0, &dataWin, 100, 2048, &dataWin, peer, sigWin, 0, 0, NCCL_NET_SIGNAL_OP_INC);
      rank.complete(req, "a put after the foreign requests");
      rank.awaitSignal(signals, 0, 0, 1, "a put after the foreign requests");
      const uint64_t peerSeed = seedOf(100, 2048, 31 + static_cast<uint64_t>(peer));
      const std::string damage =
          patternDamage(data, 2048, 100, peerSeed, rank.where() + ": a put after the foreign requests");
      REQUIRE(damage.empty(), damage);
      rank.barrier("end");
    });
  });
}

}  // namespace conformance

namespace conformance {
namespace {

using Clock = std::chrono::steady_clock;
// How soon after a peer's SIGKILL its pending puts must be done and the comm must refuse puts: the limit of the net
// tests' killed-peer cases (test_peer_death.cc).
constexpr double kDeathLimitMs = 2000;
// Tearing down a comm whose peer died must not hang; NCCL's abort path does exactly that.
constexpr double kTeardownLimitMs = 5000;

double msBetween(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::milli>(to - from).count();
}

// Rank 0 of a 2-rank GIN communicator whose rank 1 is a child process (child.h, childGinRankArgs), set up as
// GinRank does: init twice, devices, listen on the second init's context; then, once the child printed its handle,
// the collective connect (the child calls it at the same time), closeListen, createContext (1 context), and the
// collective regMrSym of the windows in the child's order. The destructor tears down without checking (after a
// failure); closeChecked() requires every call to succeed.
class RankWithChildPeer {
 public:
  explicit RankWithChildPeer(GinApi& api) : api_(api), commId_(nextCommId()) {
    REQUIRE_OK(api_.init(&ctxA_, commId_));
    liveA_ = true;
    REQUIRE_OK(api_.init(&ctxB_, commId_));
    liveB_ = true;
    int ndev = 0;
    REQUIRE_OK(api_.devices(&ndev));
    REQUIRE(ndev > 0, strf("rank 0: devices() reports %d devices", ndev));
    REQUIRE_OK(api_.listen(ctxB_, 0, handles_[0].bytes, &listenComm_));
    REQUIRE(listenComm_ != nullptr, "rank 0: listen returned no listenComm");
  }

  ~RankWithChildPeer() {
    if (listenComm_) (void)api_.closeListen(listenComm_);
    for (auto it = windows_.rbegin(); it != windows_.rend(); ++it) (void)api_.deregMrSym(ep_.collComm, *it);
    if (ep_.ginCtx) (void)api_.destroyContext(ep_.ginCtx);
    if (ep_.collComm) (void)api_.closeColl(ep_.collComm);
    if (liveB_) (void)api_.finalize(ctxB_);
    if (liveA_) (void)api_.finalize(ctxA_);
  }

  RankWithChildPeer(const RankWithChildPeer&) = delete;
  RankWithChildPeer& operator=(const RankWithChildPeer&) = delete;

  uint64_t commId() const { return commId_; }
  std::string handleHex() const { return toHex(handles_[0].bytes, sizeof(handles_[0].bytes)); }
  const GinEndpoint& endpoint() const { return ep_; }
  void* collComm() const { return ep_.collComm; }

  // The collective connect, with the handle the child printed.
  void connect(const ConnHandle& childHandle) {
    handles_[1] = childHandle;
    void* pointers[2] = {handles_[0].bytes, handles_[1].bytes};
    REQUIRE_OK(api_.connect(ctxA_, pointers, 2, 0, listenComm_, &ep_.collComm));
    REQUIRE(ep_.collComm != nullptr, "rank 0: connect returned no collComm");
    REQUIRE_OK(api_.closeListen(std::exchange(listenComm_, nullptr)));
    REQUIRE_OK(api_.createContext(ep_.collComm, 1, &ep_.ginCtx));
    REQUIRE(!api_.hasContexts() || ep_.ginCtx != nullptr, "rank 0: createContext returned no context");
  }

  Window registerWindow(HostWindow& memory, uint64_t mrFlags) {
    Window w;
    w.memory = &memory;
    REQUIRE_OK(
        api_.regMrSym(ep_.collComm, memory.data(), memory.size(), NCCL_PTR_HOST, mrFlags, &w.mhandle, &w.handle));
    REQUIRE(w.mhandle != nullptr && w.handle != nullptr, "rank 0: regMrSym returned no handle");
    windows_.push_back(w.mhandle);
    return w;
  }

  // test() until done, calling progress in between; the put must have succeeded.
  void complete(void* request, const std::string& what) {
    const Deadline deadline;
    for (Backoff backoff;; backoff.idle()) {
      int done = 0;
      const ncclResult_t rc = api_.test(ep_.collComm, request, &done);
      REQUIRE(rc == ncclSuccess,
              strf("rank 0: test of %s returned %s (done %d)", what.c_str(), ncclResultName(rc), done));
      if (done) return;
      const ncclResult_t progressed = api_.progress(ep_);
      REQUIRE(progressed == ncclSuccess, "rank 0: progress returned " + std::string(ncclResultName(progressed)) +
                                             " while " + what + " was in flight");
      deadline.check(("rank 0: local completion of " + what).c_str());
    }
  }

  // The teardown NCCL's abort does on a comm whose peer died: deregMrSym, destroyContext, closeColl, finalize of
  // both contexts, each required to succeed. Returns how long it took.
  double closeChecked() {
    const Clock::time_point start = Clock::now();
    while (!windows_.empty()) {
      void* mhandle = windows_.back();
      windows_.pop_back();
      const ncclResult_t rc = api_.deregMrSym(ep_.collComm, mhandle);
      REQUIRE(rc == ncclSuccess, std::string("rank 0: deregMrSym after the peer died returned ") + ncclResultName(rc));
    }
    if (ep_.ginCtx) {
      const ncclResult_t rc = api_.destroyContext(std::exchange(ep_.ginCtx, nullptr));
      REQUIRE(rc == ncclSuccess,
              std::string("rank 0: destroyContext after the peer died returned ") + ncclResultName(rc));
    }
    {
      const ncclResult_t rc = api_.closeColl(std::exchange(ep_.collComm, nullptr));
      REQUIRE(rc == ncclSuccess, std::string("rank 0: closeColl after the peer died returned ") + ncclResultName(rc));
    }
    liveB_ = false;
    ncclResult_t rc = api_.finalize(ctxB_);
    REQUIRE(rc == ncclSuccess, std::string("rank 0: finalize of the second context returned ") + ncclResultName(rc));
    liveA_ = false;
    rc = api_.finalize(ctxA_);
    REQUIRE(rc == ncclSuccess, std::string("rank 0: finalize returned ") + ncclResultName(rc));
    return msBetween(start, Clock::now());
  }

 private:
  GinApi& api_;
  const uint64_t commId_;
  void* ctxA_ = nullptr;  // connect's context (NCCL's plugin init)
  void* ctxB_ = nullptr;  // listen's context (NCCL's GIN connect init)
  bool liveA_ = false;
  bool liveB_ = false;
  void* listenComm_ = nullptr;
  ConnHandle handles_[2];  // rank 0's (ours), rank 1's (the child's)
  GinEndpoint ep_;
  std::vector<void*> windows_;  // mhandles, in registration order
};

// What the plugin did with the puts that were pending at the kill.
struct PendingOutcome {
  int failed = 0;     // done with ncclRemoteError
  int succeeded = 0;  // done with ncclSuccess: it completed locally before the death was noticed
  double firstMs = -1;
  double lastMs = -1;
};

// Polls test() on every request (calling progress in between, whose result NCCL ignores) until all are done; each
// must be done within kDeathLimitMs of the kill. A request is either done with ncclSuccess (it completed locally
// before the plugin noticed the death: its bytes had left) or with ncclRemoteError; test() may not report an error
// for a request it does not report done (NCCL would not know whether to test it again).
PendingOutcome awaitPending(GinApi& api, const RankWithChildPeer& rank, std::vector<void*> pending,
                            Clock::time_point killedAt) {
  PendingOutcome out;
  for (Backoff backoff; !pending.empty(); backoff.idle()) {
    for (auto it = pending.begin(); it != pending.end();) {
      int done = 0;
      const ncclResult_t rc = api.test(rank.collComm(), *it, &done);
      const double ms = msBetween(killedAt, Clock::now());
      if (!done) {
        REQUIRE(rc == ncclSuccess, strf("test of a put pending at the kill returned %s with done 0, %.1f ms after "
                                        "the kill",
                                        ncclResultName(rc), ms));
        ++it;
        continue;
      }
      REQUIRE(
          rc == ncclSuccess || rc == ncclRemoteError,
          strf("test of a put pending at the kill: done with %s, expected ncclRemoteError (or ncclSuccess for a put "
               "that completed before the death)",
               ncclResultName(rc)));
      (rc == ncclSuccess ? out.succeeded : out.failed) += 1;
      if (out.firstMs < 0) out.firstMs = ms;
      out.lastMs = ms;
      it = pending.erase(it);
    }
    if (pending.empty()) break;
    (void)api.progress(rank.endpoint());
    const double ms = msBetween(killedAt, Clock::now());
    REQUIRE(ms <= kDeathLimitMs,
            strf("%zu of the puts pending at the peer's SIGKILL are still not done %.0f ms after it (limit %.0f ms)",
                 pending.size(), ms, kDeathLimitMs));
  }
  return out;
}

// How the comm came to refuse puts to the dead peer.
struct Refusal {
  int accepted = 0;             // iputSignals accepted after the kill (the death not noticed yet)
  std::string acceptedResults;  // what each of them was done with, and when
  ncclResult_t code = ncclSuccess;
  double ms = 0;  // when the first refused one returned, after the kill
};

// From the kill on: an iputSignal of 4 KiB with an INC of signal word 2 to rank 1, again and again, calling progress
// in between (as NCCL's GIN thread keeps doing), until one is refused. One that is accepted (the plugin has not
// noticed the death yet) is tested until done before the next is issued. Within kDeathLimitMs of the kill an
// iputSignal must be refused, with ncclRemoteError, and every accepted one must be done (with ncclRemoteError, or
// with ncclSuccess when its bytes left before the death was noticed: local completion promises no delivery).
Refusal awaitRefusal(GinApi& api, const RankWithChildPeer& rank, const Window& data, const Window& signals,
                     Clock::time_point killedAt) {
  Refusal out;
  const double limitMs = kDeathLimitMs;
  void* outstanding = nullptr;
  for (Backoff backoff;; backoff.idle()) {
    if (outstanding) {
      int done = 0;
      const ncclResult_t rc = api.test(rank.collComm(), outstanding, &done);
      const double ms = msBetween(killedAt, Clock::now());
      if (!done) {
        REQUIRE(rc == ncclSuccess,
                strf("test of an iputSignal accepted after the kill returned %s with done 0", ncclResultName(rc)));
      } else {
        REQUIRE(rc == ncclSuccess || rc == ncclRemoteError,
                strf("an iputSignal accepted after the kill was done with %s, expected ncclRemoteError or ncclSuccess",
                     ncclResultName(rc)));
        out.acceptedResults += strf("%s%s at %.1f ms", out.acceptedResults.empty() ? "" : ", ", ncclResultName(rc), ms);
        outstanding = nullptr;
      }
    } else {
      void* request = nullptr;
      const ncclResult_t rc = api.iputSignal(rank.endpoint(), 0, 0, data.handle, 4 * KiB, 0, data.handle, 1,
                                             2 * sizeof(uint64_t), signals.handle, 0, NCCL_NET_SIGNAL_OP_INC, &request);
      const double ms = msBetween(killedAt, Clock::now());
      if (rc != ncclSuccess) {
        out.code = rc;
        out.ms = ms;
        break;
      }
      REQUIRE(request != nullptr, "an iputSignal accepted after the kill returned no request");
      ++out.accepted;
      outstanding = request;
    }
    (void)api.progress(rank.endpoint());
    const double ms = msBetween(killedAt, Clock::now());
    REQUIRE(
        ms <= limitMs,
        strf("%.0f ms after the peer's SIGKILL the comm still accepts puts to it (%d accepted: %s%s; limit %.0f ms)",
             ms, out.accepted, out.acceptedResults.c_str(), outstanding ? ", the last one not done" : "", limitMs));
  }
  REQUIRE(out.code == ncclRemoteError,
          strf("the iputSignal to the dead rank 1 was refused with %s, expected ncclRemoteError",
               ncclResultName(out.code)));
  REQUIRE(out.ms <= limitMs, strf("the first refused iputSignal returned %.0f ms after the kill", out.ms));
  return out;
}

// After the first refusal every put of the comm is refused, whatever its kind and target (itself included).
void requireEveryPutRefused(GinApi& api, const RankWithChildPeer& rank, const Window& data, const Window& signals) {
  struct Try {
    const char* what;
    uint32_t peer;
    bool signal;
    size_t size;
  };
  for (const Try& t :
       {Try{"iput of 1 MiB to rank 1", 1, false, MiB}, Try{"signal-only iputSignal to rank 1", 1, true, 0},
        Try{"iput of 4 KiB to itself (rank 0)", 0, false, 4 * KiB},
        Try{"iputSignal of 4 KiB to itself (rank 0)", 0, true, 4 * KiB}}) {
    void* request = nullptr;
    void* handle = t.size ? data.handle : nullptr;
    const ncclResult_t rc =
        t.signal ? api.iputSignal(rank.endpoint(), 0, 0, handle, t.size, 0, handle, t.peer, 3 * sizeof(uint64_t),
                                  signals.handle, 0, NCCL_NET_SIGNAL_OP_INC, &request)
                 : api.iput(rank.endpoint(), 0, 0, handle, t.size, 0, handle, t.peer, &request);
    REQUIRE(
        rc == ncclRemoteError,
        strf("after a put to the dead rank 1 was refused, %s returned %s, expected ncclRemoteError (every later put "
             "of the comm fails)",
             t.what, ncclResultName(rc)));
    (void)api.progress(rank.endpoint());
  }
}

// When gin.peer_death kills the child, and what rank 0 does first afterwards.
enum class DeathVariant {
  kInFlight,      // right after 8 puts of 1 MiB to it were issued; then test() them
  kIdle,          // with nothing in flight; then iputSignal to it at once
  kIdleProgress,  // with nothing in flight; then only the progress function until it reports the failure
};

const char* variantName(DeathVariant v) {
  switch (v) {
    case DeathVariant::kInFlight: return "killed with 8 puts in flight";
    case DeathVariant::kIdle: return "killed while idle, then put to";
    case DeathVariant::kIdleProgress: return "killed while idle, then only progressed";
  }
  return "?";
}

// rma_comm.h: progress returns the comm's failure. NCCL ignores it, but its GIN thread calls progress all the time,
// so this is how a death is noticed when nothing is sent to the dead peer: progress must return ncclRemoteError
// within kDeathLimitMs of the kill. Returns when it did (ms after the kill).
double awaitProgressFailure(GinApi& api, const RankWithChildPeer& rank, Clock::time_point killedAt) {
  for (Backoff backoff;; backoff.idle()) {
    const ncclResult_t rc = api.progress(rank.endpoint());
    const double ms = msBetween(killedAt, Clock::now());
    if (rc != ncclSuccess) {
      REQUIRE(rc == ncclRemoteError,
              strf("progress after the peer's SIGKILL returned %s, expected ncclRemoteError", ncclResultName(rc)));
      REQUIRE(ms <= kDeathLimitMs, strf("progress reported the dead peer only %.0f ms after the kill", ms));
      return ms;
    }
    REQUIRE(ms <= kDeathLimitMs,
            strf("progress, called alone in a loop, still returns ncclSuccess %.0f ms after the peer's SIGKILL (limit "
                 "%.0f ms): the closed connection is not noticed without a put",
                 ms, kDeathLimitMs));
  }
}

// One run of gin.peer_death on `api`: a 2-rank communicator with the child as rank 1, three puts that must land,
// then the kill. Returns what the plugin did, for --verbose.
std::string peerDeathRun(GinApi& api, DeathVariant variant) {
  const bool inFlight = variant == DeathVariant::kInFlight;
  const size_t big = std::min(MiB, options().maxSize);
  const size_t check = std::min(64 * KiB + 3, big);
  constexpr int kBigPuts = 8;
  RankWithChildPeer rank(api);
  ChildProcess child(childGinRankArgs(api.symbol(), rank.handleHex(), rank.commId(), big, check));
  {
    const std::string line = child.readLine(Deadline());
    ConnHandle handle;
    REQUIRE(line.rfind("HANDLE ", 0) == 0 && fromHex(line.substr(7), handle.bytes, sizeof(handle.bytes)),
            "the GIN child printed no handle: " + line);
    rank.connect(handle);
  }
  HostWindow data(big, 0);
  HostWindow signals(kSignalBytes, 0);
  const Window dataWin = rank.registerWindow(data, 0);
  const Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
  {
    const std::string line = child.readLine(Deadline());
    REQUIRE(line == "READY", "the GIN child printed '" + line + "', not READY");
  }

  // Three puts of 64 KiB + 3 with an INC of word 0: each locally complete with ncclSuccess, and the child sees the
  // signal reach it with the bytes in place. The next put waits for the child's line: the child reads the region
  // when the signal moves, so a put landing meanwhile would race with that read.
  fillPattern(data.data(), check, childPatternSeed());
  for (uint64_t i = 1; i <= 3; ++i) {
    void* request = nullptr;
    REQUIRE_OK(api.iputSignal(rank.endpoint(), 0, 0, dataWin.handle, check, 0, dataWin.handle, 1, 0, sigWin.handle, 0,
                              NCCL_NET_SIGNAL_OP_INC, &request));
    REQUIRE(request != nullptr, "iputSignal returned no request");
    rank.complete(request, strf("put %llu of the warm-up", static_cast<unsigned long long>(i)));
    const std::string line = child.readLine(Deadline());
    unsigned long long value = 0;
    char verdict[8] = {};
    REQUIRE(std::sscanf(line.c_str(), "SIGNAL %llu %7s", &value, verdict) == 2 && std::strcmp(verdict, "OK") == 0 &&
                value == i,
            "the GIN child (rank 1), after warm-up put " + std::to_string(i) + ": " + line);
  }

  const uint64_t mark = logMark();
  std::vector<void*> pending;
  if (inFlight) {
    fillPattern(data.data(), big, 99);
    for (int i = 0; i < kBigPuts; ++i) {
      void* request = nullptr;
      const ncclResult_t rc = api.iputSignal(rank.endpoint(), 0, 0, dataWin.handle, big, 0, dataWin.handle, 1,
                                             sizeof(uint64_t), sigWin.handle, 0, NCCL_NET_SIGNAL_OP_INC, &request);
      REQUIRE(rc == ncclSuccess && request != nullptr,
              strf("iputSignal %d of %zu bytes before the kill returned %s", i, big, ncclResultName(rc)));
      pending.push_back(request);
    }
  }
  // Right after issuing: no test() or progress() between the puts and the kill.
  const Clock::time_point killedAt = Clock::now();
  child.kill();  // SIGKILL, and reaped: when it returns the child's sockets are closed
  const double reapedMs = msBetween(killedAt, Clock::now());

  std::string report;
  if (inFlight) {
    // Each put pending at the kill ends done within 2 s: with ncclRemoteError, or with ncclSuccess if it had
    // completed locally (its payload had left; test() promises no more) before the plugin noticed the death. How
    // many had left before the SIGKILL landed is timing (on a loaded machine this thread may lose the CPU between
    // the puts and the kill), so "at least one of them failed" is not required. What the contract fixes for every
    // timing is awaitRefusal's: within 2 s of the kill a put to the dead peer is refused with ncclRemoteError. So
    // "at least one pending put failed, or the next put is refused" always holds, through that stricter check.
    const PendingOutcome outcome = awaitPending(api, rank, pending, killedAt);
    report += strf(
        "%d puts of %zu bytes in flight at the kill: %d done with ncclRemoteError, %d with ncclSuccess, "
        "the first at %.1f ms, the last at %.1f ms after the kill; ",
        kBigPuts, big, outcome.failed, outcome.succeeded, outcome.firstMs, outcome.lastMs);
  } else if (variant == DeathVariant::kIdle) {
    report += "idle at the kill; ";
  } else {
    // Nothing is sent to the dead peer: the progress function alone must notice, and from then on the comm knows,
    // so the first put after it must already be refused (awaitRefusal's first try; required below).
    report += strf("idle at the kill; progress returned ncclRemoteError at %.1f ms; ",
                   awaitProgressFailure(api, rank, killedAt));
  }
  const Refusal refusal = awaitRefusal(api, rank, dataWin, sigWin, killedAt);
  REQUIRE(variant != DeathVariant::kIdleProgress || refusal.accepted == 0,
          strf("progress had reported the dead peer, yet %d iputSignal(s) to it were accepted afterwards (done: %s)",
               refusal.accepted, refusal.acceptedResults.c_str()));
  report += refusal.accepted == 0
                ? strf("the first iputSignal after the kill was refused (%s) at %.1f ms", ncclResultName(refusal.code),
                       refusal.ms)
                : strf("%d iputSignal(s) after the kill accepted (done: %s), then one refused (%s) at %.1f ms",
                       refusal.accepted, refusal.acceptedResults.c_str(), ncclResultName(refusal.code), refusal.ms);
  requireEveryPutRefused(api, rank, dataWin, sigWin);
  REQUIRE(waitForWarning(mark, {"one-sided", "rank 1"}, std::chrono::milliseconds(500)),
          "no WARN names the dead peer \"rank 1\"; the WARNs since the kill:\n" + describeWarnings(mark));
  const double teardownMs = rank.closeChecked();
  REQUIRE(teardownMs <= kTeardownLimitMs, strf("tearing down the comm whose peer died took %.0f ms", teardownMs));
  report += strf(" (SIGKILL + reap %.1f ms; teardown %.1f ms)", reapedMs, teardownMs);
  return report;
}

}  // namespace

TEST_CASE("gin", "peer_death", Scope::Once) {
  // Rank 1 of a 2-rank mesh is a child process (child.h, --child-gin-rank) that progresses until it is SIGKILLed.
  // Rank 0 (this thread) first moves three puts with signals that must land, then the child is killed: (a) right
  // after 8 puts of 1 MiB to it were issued, (b) while idle, and rank 0 puts to it at once, (c) while idle, and
  // rank 0 only calls progress until that returns ncclRemoteError. Then, within 2 s of the kill: every pending put
  // is done (ncclRemoteError, or ncclSuccess if it had completed), an iputSignal to rank 1 is refused with
  // ncclRemoteError (in (a) and (b) one issued before the plugin noticed may be accepted, and must then be done; in
  // (c) the first is refused), after which every put of the comm is refused; a WARN names rank 1; deregMrSym,
  // destroyContext, closeColl and finalize all succeed.
  forEachTable(env, false, [&](GinApi& api) {
    for (DeathVariant v : {DeathVariant::kInFlight, DeathVariant::kIdle, DeathVariant::kIdleProgress}) {
      const char* variant = variantName(v);
      try {
        const std::string report = peerDeathRun(api, v);
        if (options().verbose)
          std::fprintf(stderr, "gin.peer_death %s, %s: %s\n", api.symbol(), variant, report.c_str());
      } catch (const TestFailure& e) {
        throw TestFailure(std::string(variant) + ": " + e.what());
      }
    }
  });
}

}  // namespace conformance
