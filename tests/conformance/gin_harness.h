// The gin group's harness (test_gin.cc, test_gin_failure.cc): the plugin's GIN/RMA tables loaded once, each case
// run on every table, host windows with guard bytes, and a mesh of ranks as threads of this process, each calling
// the progress function while it waits (as NCCL's GIN progress thread does).
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "child.h"
#include "comms.h"
#include "gin_api.h"
#include "harness.h"
#include "log_capture.h"
#include "memory.h"
#include "transfer.h"


namespace conformance {

constexpr uint8_t kBackground = 0x5A;  // what target windows hold where nothing may be written
constexpr uint8_t kGuard = 0xC3;       // the bytes right after a registered window, in the same allocation
constexpr size_t kGuardBytes = 4096;
constexpr size_t kSignalWords = 8;  // each signal window: 8 64-bit words, registered with FORCE_SO
constexpr size_t kSignalBytes = kSignalWords * sizeof(uint64_t);

// The plugin, loaded once for the whole run like NCCL loads it, and never unloaded: a failed case may leave
// comms (and the plugin's threads) behind, which must not lose their code.
inline GinLibrary& ginLibrary(const std::string& path) {
  static GinLibrary* const library = new GinLibrary(path);  // never deleted: no dlclose, not even at exit
  return *library;
}

// Runs `fn` on each exported table (or only those with contexts), then fails naming every table that failed and
// every table that is not exported (so a case never passes without having driven all three).
inline void forEachTable(const TestEnv& env, bool contextsOnly, const std::function<void(GinApi&)>& fn) {
  GinLibrary& library = ginLibrary(*env.pluginPath);
  std::string failures;
  for (GinApi* api : library.tables()) {
    if (contextsOnly && !api->hasContexts()) continue;
    try {
      fn(*api);
    } catch (const TestFailure& e) {
      failures += std::string(failures.empty() ? "" : " | ") + api->symbol() + ": " + e.what();
    } catch (const std::exception& e) {
      failures += std::string(failures.empty() ? "" : " | ") + api->symbol() + ": unexpected exception: " + e.what();
    }
  }
  std::string missing;
  for (const std::string& symbol : library.missing()) {
    if (contextsOnly && symbol == "ncclGinPlugin_v11") continue;
    missing += " " + symbol;
  }
  if (!missing.empty()) {
    failures += std::string(failures.empty() ? "" : " | ") + "not exported by the plugin, so not tested:" + missing;
  }
  if (!failures.empty()) throw TestFailure(failures);
}

// A pattern seed for a put: the bytes depend on the put's size, destination offset and a salt.
inline uint64_t seedOf(uint64_t size, uint64_t dstOff, uint64_t salt) {
  return (size * 0x100000001B3ull) ^ (dstOff << 17) ^ (salt * 0x9E3779B97F4A7C15ull) ^ 0x6A09E667F3BCC909ull;
}

// Host memory of which the first `size` bytes are registered and the kGuardBytes after them are guard bytes.
class HostWindow {
 public:
  HostWindow(size_t size, uint8_t background)
      : size_(size), memory_(allocateMemory(MemKind::Host, size + kGuardBytes)) {
    std::memset(data(), background, size_);
    std::memset(data() + size_, kGuard, kGuardBytes);
  }
  uint8_t* data() const { return memory_->hostData(); }
  size_t size() const { return size_; }
  const Memory& memory() const { return *memory_; }
  void fill(uint8_t value) { std::memset(data(), value, size_); }
  uint64_t signal(size_t word) const {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(data() + word * sizeof(uint64_t)), __ATOMIC_ACQUIRE);
  }
  // "" when the guard bytes are intact, else what changed.
  std::string guardDamage(const std::string& what) const {
    const size_t bad = findOtherThan(*memory_, size_, kGuardBytes, kGuard);
    if (bad == SIZE_MAX) return "";
    return strf("%s: guard byte %zu past the end of the %zu-byte window is 0x%02x, not 0x%02x (written out of bounds)",
                what.c_str(), bad, size_, data()[size_ + bad], kGuard);
  }

 private:
  size_t size_;
  std::unique_ptr<Memory> memory_;
};

struct Range {
  size_t offset;
  size_t size;
};

// "" when every byte of the window outside `written` (sorted, disjoint) holds `background` and the guard is intact.
inline std::string untouchedOutside(const HostWindow& window, std::vector<Range> written, uint8_t background,
                             const std::string& what) {
  std::sort(written.begin(), written.end(), [](const Range& a, const Range& b) { return a.offset < b.offset; });
  size_t at = 0;
  auto check = [&](size_t from, size_t to) -> std::string {
    if (to <= from) return "";
    const size_t bad = findOtherThan(window.memory(), from, to - from, background);
    if (bad == SIZE_MAX) return "";
    return strf("%s: byte at window offset %zu is 0x%02x, not 0x%02x (nothing was to be written there)", what.c_str(),
                from + bad, window.data()[from + bad], background);
  };
  for (const Range& r : written) {
    std::string damage = check(at, r.offset);
    if (!damage.empty()) return damage;
    at = std::max(at, r.offset + r.size);
  }
  std::string damage = check(at, window.size());
  if (!damage.empty()) return damage;
  return window.guardDamage(what);
}

// "" when the `size` bytes at `offset` hold the pattern of `seed`.
inline std::string patternDamage(const HostWindow& window, size_t offset, size_t size, uint64_t seed,
                          const std::string& what) {
  const std::string d = describeMismatch(window.memory(), offset, size, seed);
  return d.empty() ? "" : what + ": " + d;
}

// What the rank threads of one simulated communicator share: the all-gathered listen handles and a barrier.
class Mesh {
 public:
  Mesh(GinApi& api, int nranks, int nContexts, bool splitContexts, const std::atomic<bool>* abort)
      : api_(api),
        nranks_(nranks),
        nContexts_(nContexts),
        splitContexts_(splitContexts),
        commId_(nextCommId()),
        abort_(abort),
        handles_(static_cast<size_t>(nranks)) {}

  GinApi& api() const { return api_; }
  int nranks() const { return nranks_; }
  int nContexts() const { return nContexts_; }
  bool splitContexts() const { return splitContexts_; }
  uint64_t commId() const { return commId_; }
  const std::atomic<bool>* abort() const { return abort_; }
  ConnHandle& handle(int rank) { return handles_[static_cast<size_t>(rank)]; }

  // Returns once every rank arrived; calls `idle` while waiting (the progress function once a rank has a comm).
  void arrive(const std::function<void()>& idle, const std::string& what) {
    const uint64_t generation = generation_.load();
    if (arrived_.fetch_add(1) + 1 == nranks_) {
      arrived_.store(0);
      generation_.fetch_add(1);
      return;
    }
    Deadline deadline(abort_);
    Backoff backoff;
    while (generation_.load() == generation) {
      if (idle) idle();
      deadline.check(what.c_str());
      backoff.idle();
    }
  }

 private:
  GinApi& api_;
  const int nranks_;
  const int nContexts_;
  const bool splitContexts_;
  const uint64_t commId_;
  const std::atomic<bool>* abort_;
  std::vector<ConnHandle> handles_;
  std::atomic<int> arrived_{0};
  std::atomic<uint64_t> generation_{0};
};

// A window registered with regMrSym: `handle` is what puts name (ginHandle for v11/v13, the mhandle for v14).
struct Window {
  HostWindow* memory = nullptr;
  void* mhandle = nullptr;
  void* handle = nullptr;
};

// One rank of a GIN communicator, set up as NCCL's ncclGinConnectOnce (and, for v13/v14, its proxy's
// createContext) does. close() tears down in NCCL's order; the destructor does so without checking after a failure.
class GinRank {
 public:
  GinRank(Mesh& mesh, int rank) : mesh_(mesh), api_(mesh.api()), rank_(rank) {
    REQUIRE_OK(api_.init(&ctxA_, mesh_.commId()));
    liveA_ = true;
    REQUIRE(ctxA_ != nullptr, where() + ": init returned no context");
    if (mesh_.splitContexts()) {
      REQUIRE_OK(api_.init(&ctxB_, mesh_.commId()));
      liveB_ = true;
      REQUIRE(ctxB_ != nullptr, where() + ": the second init returned no context");
      REQUIRE(ctxB_ != ctxA_, where() + ": two inits returned the same context");
    }
    int ndev = 0;
    REQUIRE_OK(api_.devices(&ndev));
    REQUIRE(ndev > 0, where() + strf(": devices() reports %d devices (NCCL disables GIN)", ndev));
    GinProps props;
    REQUIRE_OK(api_.getProperties(0, &props));
    REQUIRE(props.maxRecvs >= 1, where() + strf(": maxRecvs %d", props.maxRecvs));
    maxOutstanding_ = 32 * props.maxRecvs;  // NCCL's proxy queue: at most 32 x maxRecvs GFDs per (context, peer)

    // listen on the GIN instance (the second init), connect on the plugin-init context, as NCCL 2.28-2.30 do.
    void* listenCtx = mesh_.splitContexts() ? ctxB_ : ctxA_;
    REQUIRE_OK(api_.listen(listenCtx, 0, mesh_.handle(rank_).bytes, &listenComm_));
    REQUIRE(listenComm_ != nullptr, where() + ": listen returned no listenComm");
    mesh_.arrive(nullptr, where() + ": every rank's listen (the handle all-gather)");

    // NCCL's all-gather leaves each rank its own copy of every handle, freed right after connect.
    std::vector<ConnHandle> gathered(static_cast<size_t>(mesh_.nranks()));
    std::vector<void*> pointers(static_cast<size_t>(mesh_.nranks()));
    for (int r = 0; r < mesh_.nranks(); ++r) {
      gathered[static_cast<size_t>(r)] = mesh_.handle(r);
      pointers[static_cast<size_t>(r)] = gathered[static_cast<size_t>(r)].bytes;
    }
    const ncclResult_t rc = api_.connect(ctxA_, pointers.data(), mesh_.nranks(), rank_, listenComm_, &collComm_);
    for (ConnHandle& h : gathered) std::memset(h.bytes, 0xEE, sizeof(h.bytes));
    std::fill(pointers.begin(), pointers.end(), nullptr);
    REQUIRE(rc == ncclSuccess, where() + ": connect returned " + ncclResultName(rc));
    REQUIRE(collComm_ != nullptr, where() + ": connect returned no collComm");
    const ncclResult_t closed = api_.closeListen(std::exchange(listenComm_, nullptr));
    REQUIRE(closed == ncclSuccess, where() + ": closeListen after connect returned " + ncclResultName(closed));

    if (api_.hasContexts()) {
      REQUIRE_OK(api_.createContext(collComm_, mesh_.nContexts(), &ep_.ginCtx));
      REQUIRE(ep_.ginCtx != nullptr, where() + ": createContext returned no context");
    }
    ep_.collComm = collComm_;
  }

  ~GinRank() {
    if (listenComm_) (void)api_.closeListen(listenComm_);
    for (auto it = windows_.rbegin(); it != windows_.rend(); ++it) (void)api_.deregMrSym(collComm_, *it);
    if (ep_.ginCtx && api_.hasContexts()) (void)api_.destroyContext(ep_.ginCtx);
    if (collComm_) (void)api_.closeColl(collComm_);
    if (liveB_) (void)api_.finalize(ctxB_);
    if (liveA_) (void)api_.finalize(ctxA_);
  }

  GinRank(const GinRank&) = delete;
  GinRank& operator=(const GinRank&) = delete;

  GinApi& api() const { return api_; }
  int rank() const { return rank_; }
  int nranks() const { return mesh_.nranks(); }
  void* collComm() const { return collComm_; }
  const GinEndpoint& endpoint() const { return ep_; }
  int maxOutstanding() const { return maxOutstanding_; }
  const std::atomic<bool>* abort() const { return mesh_.abort(); }
  std::string where() const { return strf("rank %d of %d", rank_, mesh_.nranks()); }

  // One call of the progress function (what NCCL's GIN progress thread does after every poll step).
  void progress() {
    const ncclResult_t rc = api_.progress(ep_);
    REQUIRE(rc == ncclSuccess, where() + ": progress returned " + ncclResultName(rc));
  }

  // Polls `done` until it holds, progressing in between; fails naming `what` after --wait-timeout.
  template <typename Pred>
  void waitFor(Pred done, const std::string& what) {
    Deadline deadline(mesh_.abort());
    Backoff backoff;
    while (!done()) {
      progress();
      deadline.check((where() + ": " + what).c_str());
      backoff.idle();
    }
  }

  void barrier(const std::string& what) {
    mesh_.arrive([this] { progress(); }, where() + ": barrier " + what);
  }

  // regMrSym of the window's registered part; collective: every rank registers its windows in the same order.
  Window registerWindow(HostWindow& memory, uint64_t mrFlags) {
    Window w;
    w.memory = &memory;
    void* ginHandle = nullptr;
    const ncclResult_t rc =
        api_.regMrSym(collComm_, memory.data(), memory.size(), NCCL_PTR_HOST, mrFlags, &w.mhandle, &ginHandle);
    REQUIRE(rc == ncclSuccess,
            where() + strf(": regMrSym(%zu bytes of host memory, mrFlags %llu) returned %s", memory.size(),
                           static_cast<unsigned long long>(mrFlags), ncclResultName(rc)));
    REQUIRE(w.mhandle != nullptr, where() + ": regMrSym returned no mhandle");
    REQUIRE(ginHandle != nullptr, where() + ": regMrSym returned no ginHandle");
    REQUIRE(reinterpret_cast<uintptr_t>(ginHandle) < (uintptr_t{1} << 63),
            where() + strf(": ginHandle %p does not fit the 63 bits NCCL's descriptors carry", ginHandle));
    w.handle = ginHandle;
    windows_.push_back(w.mhandle);
    return w;
  }

  void deregister(Window& w) {
    auto it = std::find(windows_.begin(), windows_.end(), w.mhandle);
    REQUIRE(it != windows_.end(), "harness: deregister of a window not registered");
    windows_.erase(it);
    const ncclResult_t rc = api_.deregMrSym(collComm_, w.mhandle);
    REQUIRE(rc == ncclSuccess, where() + ": deregMrSym returned " + ncclResultName(rc));
    w.mhandle = nullptr;
    w.handle = nullptr;
  }

  // iput / iputSignal that must be accepted with a request.
  void* put(int context, uint64_t srcOff, const Window& src, size_t size, uint64_t dstOff, const Window& dst,
            int peer) {
    void* request = nullptr;
    const ncclResult_t rc =
        api_.iput(ep_, context, srcOff, src.handle, size, dstOff, dst.handle, static_cast<uint32_t>(peer), &request);
    REQUIRE(rc == ncclSuccess, where() + strf(": iput(context %d, srcOff %llu, size %zu, dstOff %llu, to rank %d) "
                                              "returned %s",
                                              context, static_cast<unsigned long long>(srcOff), size,
                                              static_cast<unsigned long long>(dstOff), peer, ncclResultName(rc)));
    REQUIRE(request != nullptr, where() + strf(": iput of %zu bytes to rank %d returned no request", size, peer));
    return request;
  }

  void* putSignal(int context, uint64_t srcOff, const Window* src, size_t size, uint64_t dstOff, const Window* dst,
                  int peer, const Window& signals, size_t signalWord, uint64_t value, uint32_t op) {
    void* request = nullptr;
    const ncclResult_t rc = api_.iputSignal(ep_, context, srcOff, src ? src->handle : nullptr, size, dstOff,
                                            dst ? dst->handle : nullptr, static_cast<uint32_t>(peer),
                                            signalWord * sizeof(uint64_t), signals.handle, value, op, &request);
    REQUIRE(
        rc == ncclSuccess,
        where() + strf(": iputSignal(context %d, srcOff %llu, size %zu, dstOff %llu, to rank %d, signal word %zu, "
                       "%s %llu) returned %s",
                       context, static_cast<unsigned long long>(srcOff), size, static_cast<unsigned long long>(dstOff),
                       peer, signalWord, signalOpName(op), static_cast<unsigned long long>(value), ncclResultName(rc)));
    REQUIRE(request != nullptr, where() + strf(": iputSignal of %zu bytes to rank %d returned no request", size, peer));
    return request;
  }

  // One test(); true when the request is done (and then forgotten).
  bool poll(void* request) {
    int done = 0;
    const ncclResult_t rc = api_.test(collComm_, request, &done);
    REQUIRE(rc == ncclSuccess, where() + strf(": test(%p) returned %s", request, ncclResultName(rc)));
    return done != 0;
  }

  // test() until done, progressing in between.
  void complete(void* request, const std::string& what) {
    waitFor([&] { return poll(request); }, "local completion of " + what);
  }

  // Before issuing another put: completes the oldest requests until fewer than maxOutstanding() are in flight
  // (NCCL never has more per context and peer).
  void makeRoom(std::deque<void*>& inflight, const std::string& what) {
    while (static_cast<int>(inflight.size()) >= maxOutstanding_) {
      complete(inflight.front(), what);
      inflight.pop_front();
    }
  }

  void drain(std::deque<void*>& inflight, const std::string& what) {
    while (!inflight.empty()) {
      complete(inflight.front(), what);
      inflight.pop_front();
    }
  }

  // Waits until signal word `word` of `signals` leaves `previous`; it must then read exactly `expected` (an
  // atomic add shows no intermediate value). Returns the value.
  uint64_t awaitSignal(const HostWindow& signals, size_t word, uint64_t previous, uint64_t expected,
                       const std::string& what) {
    uint64_t seen = previous;
    waitFor([&] { return (seen = signals.signal(word)) != previous; },
            strf("signal word %zu to become %llu (it reads %llu) after %s", word,
                 static_cast<unsigned long long>(expected), static_cast<unsigned long long>(previous), what.c_str()));
    REQUIRE(seen == expected,
            where() + strf(": signal word %zu went from %llu to %llu, expected %llu, after %s", word,
                           static_cast<unsigned long long>(previous), static_cast<unsigned long long>(seen),
                           static_cast<unsigned long long>(expected), what.c_str()));
    return seen;
  }

  // Orderly teardown, collective: a barrier (no peer still expects anything), then deregMrSym of what is still
  // registered, destroyContext, closeColl and finalize of both contexts, each required to succeed.
  void close() {
    barrier("before teardown");
    while (!windows_.empty()) {
      void* mhandle = windows_.back();
      windows_.pop_back();
      const ncclResult_t rc = api_.deregMrSym(collComm_, mhandle);
      REQUIRE(rc == ncclSuccess, where() + ": deregMrSym returned " + ncclResultName(rc));
    }
    if (api_.hasContexts()) {
      const ncclResult_t rc = api_.destroyContext(std::exchange(ep_.ginCtx, nullptr));
      REQUIRE(rc == ncclSuccess, where() + ": destroyContext returned " + ncclResultName(rc));
    }
    {
      const ncclResult_t rc = api_.closeColl(std::exchange(collComm_, nullptr));
      ep_.collComm = nullptr;
      REQUIRE(rc == ncclSuccess, where() + ": closeColl returned " + ncclResultName(rc));
    }
    if (liveB_) {
      liveB_ = false;
      const ncclResult_t rc = api_.finalize(ctxB_);
      REQUIRE(rc == ncclSuccess, where() + ": finalize of the second init's context returned " + ncclResultName(rc));
    }
    liveA_ = false;
    const ncclResult_t rc = api_.finalize(ctxA_);
    REQUIRE(rc == ncclSuccess, where() + ": finalize returned " + ncclResultName(rc));
  }

 private:
  Mesh& mesh_;
  GinApi& api_;
  const int rank_;
  void* ctxA_ = nullptr;  // NCCL's plugin init (comm->ginContext): connect's context
  void* ctxB_ = nullptr;  // NCCL's GIN connect init (ginInstance): listen's context
  bool liveA_ = false;
  bool liveB_ = false;
  void* listenComm_ = nullptr;
  void* collComm_ = nullptr;
  GinEndpoint ep_;
  int maxOutstanding_ = 32;
  std::vector<void*> windows_;  // mhandles still registered, in registration order
};

// Runs `body` on `nranks` rank threads of one communicator (each: set up, body, orderly teardown). A failure
// reports every rank's failure in the order they happened: the first is the cause, the others often its echo
// (a peer that failed and tore down makes the plugin report a remote error on the others).
inline void runMesh(GinApi& api, int nranks, int nContexts, const std::function<void(GinRank&)>& body,
             bool splitContexts = true) {
  std::mutex mutex;
  std::vector<std::string> failures;
  {
    ThreadGroup threads;
    Mesh mesh(api, nranks, nContexts, splitContexts, threads.abortFlag());
    for (int r = 0; r < nranks; ++r) {
      threads.spawn([&mesh, &body, &mutex, &failures, r] {
        try {
          GinRank rank(mesh, r);
          body(rank);
          rank.close();
        } catch (const TestFailure& e) {
          if (std::strncmp(e.what(), "aborted:", 8) != 0) {
            std::lock_guard<std::mutex> lock(mutex);
            failures.push_back(e.what());
          }
          throw;
        }
      });
    }
    try {
      threads.join();
    } catch (const TestFailure&) {
      if (failures.empty()) throw;
    }
  }
  if (failures.empty()) return;
  std::string all = failures.front();
  for (size_t i = 1; i < failures.size(); ++i) all += " -- then: " + failures[i];
  throw TestFailure(all);
}

// The sizes a case moves, each no larger than --max-size (larger ones are replaced by it).
inline std::vector<size_t> capped(std::vector<size_t> sizes) {
  for (size_t& s : sizes) s = std::min(s, options().maxSize);
  sizes.erase(std::unique(sizes.begin(), sizes.end()), sizes.end());
  return sizes;
}


}  // namespace conformance
