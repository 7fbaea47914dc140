// GPU-initiated networking (group "gin"): the plugin's ncclGinPlugin_v11, ncclGinPlugin_v13 and ncclRmaPlugin_v14
// tables driven as NCCL's GIN proxy drives them (../shared/reference/gin-and-doorbells.md §1, §2, §5). Every
// rank of a simulated communicator is a thread of this process: init twice (NCCL's plugin init and its GIN
// connect: listen gets the second context, connect the first), listen, an in-memory all-gather of the handles,
// the collective connect, closeListen, createContext (v13/v14), collective regMrSym of host windows, then puts.
// Every rank's thread keeps calling the progress function while it waits for anything, as NCCL's GIN progress
// thread does, and a target observes its signal words only by polling them with acquire loads.
// Each case runs on each exported table in turn; a failure names the table and the rank.
#include <algorithm>
#include <cstring>
#include <deque>
#include <string>
#include <vector>

#include "gin_harness.h"

namespace conformance {

TEST_CASE("gin", "exports", Scope::Once) {
  GinLibrary& library = ginLibrary(*env.pluginPath);
  std::string problems;
  auto note = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
  for (const std::string& symbol : library.missing()) note(symbol + " is not exported");
  for (GinApi* api : library.tables()) {
    const std::string table = api->symbol();
    if (api->name() == nullptr) note(table + ".name is NULL");
    std::string missing;
    for (const std::string& fn : api->missingFunctions()) missing += " " + fn;
    if (!missing.empty()) {
      note(table + " has NULL entries NCCL calls:" + missing);
      continue;
    }
    void* ctx = nullptr;
    ncclResult_t rc = api->init(&ctx, nextCommId());
    if (rc != ncclSuccess) {
      note(table + ".init returned " + ncclResultName(rc));
      continue;
    }
    int ndev = -1;
    rc = api->devices(&ndev);
    if (rc != ncclSuccess || ndev <= 0)
      note(table + strf(".devices returned %s, %d devices", ncclResultName(rc), ndev));
    for (int dev = 0; dev < ndev; ++dev) {
      GinProps p;
      rc = api->getProperties(dev, &p);
      const std::string at = table + strf(".getProperties(%d)", dev);
      if (rc != ncclSuccess) {
        note(at + " returned " + ncclResultName(rc));
        continue;
      }
      if (p.netDeviceType != NCCL_NET_DEVICE_GIN_PROXY)
        note(at + strf(": netDeviceType %d, expected NCCL_NET_DEVICE_GIN_PROXY (2)", p.netDeviceType));
      if (p.maxRecvs < 1) note(at + strf(": maxRecvs %d (NCCL's proxy queue is 32 x maxRecvs)", p.maxRecvs));
      if (p.name == nullptr) note(at + ": name is NULL");
      if ((p.ptrSupport & NCCL_PTR_DMABUF) && !api->hasDmaBufRegistration())
        note(at + ": ptrSupport has NCCL_PTR_DMABUF but regMrSymDmaBuf is NULL (NCCL calls it)");
    }
    rc = api->finalize(ctx);
    if (rc != ncclSuccess) note(table + ".finalize returned " + ncclResultName(rc));
  }
  // The net tables keep reporting HOST: a GIN type there makes NCCL refuse the net plugin.
  const PluginLibrary& lib = library.library();
  for (int v : {11, 12}) {
    std::unique_ptr<NetApi> net = openApi(lib, v);
    if (!net) {
      note(symbolName(v) + " is not exported");
      continue;
    }
    void* ctx = nullptr;
    ncclResult_t rc = net->init(&ctx, nextCommId(), NCCL_NET_TRAFFIC_CLASS_UNDEF);
    if (rc != ncclSuccess) {
      note(symbolName(v) + ".init returned " + ncclResultName(rc));
      continue;
    }
    int ndev = -1;
    rc = net->devices(&ndev);
    if (rc != ncclSuccess || ndev <= 0)
      note(symbolName(v) + strf(".devices returned %s, %d devices", ncclResultName(rc), ndev));
    for (int dev = 0; dev < ndev; ++dev) {
      DeviceProps p;
      rc = net->getProperties(dev, &p);
      if (rc != ncclSuccess)
        note(symbolName(v) + strf(".getProperties(%d) returned %s", dev, ncclResultName(rc)));
      else if (p.netDeviceType != NCCL_NET_DEVICE_HOST)
        note(symbolName(v) +
             strf(".getProperties(%d): netDeviceType %d, expected NCCL_NET_DEVICE_HOST (0)", dev, p.netDeviceType));
    }
    rc = net->finalize(ctx);
    if (rc != ncclSuccess) note(symbolName(v) + ".finalize returned " + ncclResultName(rc));
  }
  REQUIRE(problems.empty(), problems);
}

TEST_CASE("gin", "connect_mesh", Scope::Once) {
  // Meshes of 2 and 3 ranks, one after the other, each: set up, every rank reaches every rank (itself included)
  // with a signal, torn down. First with NCCL's two contexts per rank (listen on the second init's, connect on
  // the first's; both finalized), then with one context for both.
  forEachTable(env, false, [&](GinApi& api) {
    for (bool split : {true, false}) {
      for (int nranks : {2, 3}) {
        const std::string variant = strf("%d ranks, %s", nranks, split ? "two inits per rank" : "one init per rank");
        try {
          runMesh(
              api, nranks, 1,
              [&](GinRank& rank) {
                HostWindow signals(kSignalBytes, 0);
                Window sig = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
                rank.barrier("after registration");
                std::deque<void*> inflight;
                for (int peer = 0; peer < rank.nranks(); ++peer) {
                  inflight.push_back(rank.putSignal(0, 0, nullptr, 0, 0, nullptr, peer, sig,
                                                    static_cast<size_t>(rank.rank()), 0, NCCL_NET_SIGNAL_OP_INC));
                }
                for (int src = 0; src < rank.nranks(); ++src) {
                  rank.awaitSignal(signals, static_cast<size_t>(src), 0, 1, strf("a signal from rank %d", src));
                }
                rank.drain(inflight, "the signals");
                for (size_t w = static_cast<size_t>(rank.nranks()); w < kSignalWords; ++w) {
                  REQUIRE(signals.signal(w) == 0, rank.where() + strf(": signal word %zu changed", w));
                }
              },
              split);
        } catch (const TestFailure& e) {
          throw TestFailure(variant + ": " + e.what());
        }
      }
    }
  });
}

TEST_CASE("gin", "put_signal", Scope::Once) {
  // Rank 0 puts to rank 1 with a signal: sizes 0 (signal only), 1, 7, 4 KiB, 1 MiB + 3 and 16 MiB, each with INC
  // and then ADD 0x100000001. Rank 1 waits for the exact signal value, then checks every byte and that nothing
  // else in its window (nor past it) changed. Rank 0 overwrites its source as soon as test() says done.
  // The largest: 16 MiB, or 4 MiB under --max-size 64M (sanitizer and soft-RoCE runs, where bytes are slow).
  const std::vector<size_t> sizes = capped({0, 1, 7, 4 * KiB, MiB + 3, std::min(16 * MiB, options().maxSize / 16)});
  const size_t largest = *std::max_element(sizes.begin(), sizes.end());
  const size_t kMargin = 64 * KiB;
  const size_t windowSize = largest + 2 * kMargin;
  forEachTable(env, false, [&](GinApi& api) {
    runMesh(api, 2, 1, [&](GinRank& rank) {
      const bool target = rank.rank() == 1;
      HostWindow data(windowSize, target ? kBackground : 0);
      HostWindow signals(kSignalBytes, 0);
      Window dataWin = rank.registerWindow(data, 0);
      Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
      uint64_t expected = 0;
      int step = 0;
      for (size_t size : sizes) {
        for (uint32_t op : {NCCL_NET_SIGNAL_OP_INC, NCCL_NET_SIGNAL_OP_ADD}) {
          ++step;
          const uint64_t value = op == NCCL_NET_SIGNAL_OP_INC ? 0 : 0x100000001ull;
          const uint64_t add = op == NCCL_NET_SIGNAL_OP_INC ? 1 : value;
          // Unaligned offsets that move from step to step.
          const uint64_t srcOff = size ? 3 + static_cast<uint64_t>(step) * 13 : 0;
          const uint64_t dstOff = size ? kMargin - 7 + static_cast<uint64_t>(step) * 5 : 0;
          const uint64_t seed = seedOf(size, dstOff, static_cast<uint64_t>(step));
          const size_t word = 3;
          const std::string what =
              strf("put %d: %zu bytes srcOff %llu dstOff %llu with %s", step, size,
                   static_cast<unsigned long long>(srcOff), static_cast<unsigned long long>(dstOff), signalOpName(op));
          if (target) data.fill(kBackground);
          rank.barrier(what + " (start)");
          if (!target) {
            fillPattern(data.data() + srcOff, size, seed);
            void* req = size ? rank.putSignal(0, srcOff, &dataWin, size, dstOff, &dataWin, 1, sigWin, word, value, op)
                             : rank.putSignal(0, 0, nullptr, 0, 0, nullptr, 1, sigWin, word, value, op);
            rank.complete(req, what);
            // Local completion: the source is the caller's again.
            std::memset(data.data() + srcOff, 0xEE, size);
          } else {
            expected = rank.awaitSignal(signals, word, expected, expected + add, what);
            std::string damage = patternDamage(data, dstOff, size, seed, rank.where() + ": " + what);
            if (damage.empty())
              damage = untouchedOutside(data, {{dstOff, size}}, kBackground, rank.where() + ": " + what);
            REQUIRE(damage.empty(), damage);
            for (size_t w = 0; w < kSignalWords; ++w) {
              if (w == word) continue;
              REQUIRE(signals.signal(w) == 0,
                      rank.where() + strf(": signal word %zu changed after %s", w, what.c_str()));
            }
            REQUIRE(signals.guardDamage("signal window").empty(),
                    rank.where() + ": " + signals.guardDamage("signal window"));
          }
          rank.barrier(what + " (end)");
          if (target) {
            REQUIRE(signals.signal(word) == expected,
                    rank.where() + strf(": signal word %zu changed again to %llu after %s", word,
                                        static_cast<unsigned long long>(signals.signal(word)), what.c_str()));
          }
        }
      }
      rank.deregister(sigWin);
      rank.deregister(dataWin);
    });
  });
}

namespace {

// The ordering cases' regions: alternately `big` and 8 bytes, at distinct offsets with gaps between them.
struct Layout {
  std::vector<Range> regions;
  size_t windowSize = 0;
};

Layout orderingLayout(int count, size_t big) {
  Layout layout;
  size_t at = 64;
  for (int i = 0; i < count; ++i) {
    const size_t size = i % 2 == 0 ? big : 8;
    layout.regions.push_back({at + static_cast<size_t>(i % 7), size});
    at += size + 64;
  }
  layout.windowSize = at + 64;
  return layout;
}

uint64_t regionSeed(const Range& r, int index) { return seedOf(r.size, r.offset, 1000 + static_cast<uint64_t>(index)); }

}  // namespace

TEST_CASE("gin", "ordering", Scope::Once) {
  // Rank 0 issues 200 puts (alternately 2 MiB and 8 B) to rank 1 without waiting for any (up to NCCL's 32 x
  // maxRecvs in flight), then a signal-only iputSignal: when rank 1 sees the signal, all 200 regions are there.
  // Then every put carries ADD 1: whenever rank 1 reads k, the first k regions are complete.
  constexpr int kPuts = 200;
  // 512 KiB under --max-size 64M (the sanitizer and soft-RoCE runs): the order is as much at stake, at a quarter of
  // the bytes.
  const size_t big = std::min(2 * MiB, options().maxSize / 128);
  const Layout layout = orderingLayout(kPuts, big);
  forEachTable(env, false, [&](GinApi& api) {
    for (bool signalEach : {false, true}) {
      const std::string variant = signalEach ? "every put with ADD 1" : "200 puts, then a signal";
      try {
        runMesh(api, 2, 1, [&](GinRank& rank) {
          const bool target = rank.rank() == 1;
          HostWindow data(layout.windowSize, target ? kBackground : 0);
          HostWindow signals(kSignalBytes, 0);
          Window dataWin = rank.registerWindow(data, 0);
          Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
          const size_t word = 5;
          if (!target) {
            for (int i = 0; i < kPuts; ++i) {
              const Range& r = layout.regions[static_cast<size_t>(i)];
              fillPattern(data.data() + r.offset, r.size, regionSeed(r, i));
            }
          }
          rank.barrier("start");
          if (!target) {
            std::deque<void*> inflight;
            for (int i = 0; i < kPuts; ++i) {
              const Range& r = layout.regions[static_cast<size_t>(i)];
              rank.makeRoom(inflight, strf("put %d", i));
              inflight.push_back(signalEach ? rank.putSignal(0, r.offset, &dataWin, r.size, r.offset, &dataWin, 1,
                                                             sigWin, word, 1, NCCL_NET_SIGNAL_OP_ADD)
                                            : rank.put(0, r.offset, dataWin, r.size, r.offset, dataWin, 1));
            }
            if (!signalEach) {
              rank.makeRoom(inflight, "the signal");
              inflight.push_back(
                  rank.putSignal(0, 0, nullptr, 0, 0, nullptr, 1, sigWin, word, 0, NCCL_NET_SIGNAL_OP_INC));
            }
            rank.drain(inflight, "the puts");
          } else {
            auto regionDamage = [&](int i) {
              const Range& r = layout.regions[static_cast<size_t>(i)];
              return patternDamage(data, r.offset, r.size, regionSeed(r, i),
                                   rank.where() + strf(": region %d (%zu bytes at %zu)", i, r.size, r.offset));
            };
            if (!signalEach) {
              rank.awaitSignal(signals, word, 0, 1, "200 puts and a signal");
              for (int i = 0; i < kPuts; ++i) {
                const std::string damage = regionDamage(i);
                REQUIRE(damage.empty(), damage + " when the signal that follows all 200 puts was visible");
              }
            } else {
              int verified = 0;  // regions [0, verified) were checked complete
              uint64_t seen = 0;
              while (verified < kPuts) {
                uint64_t k = 0;
                rank.waitFor([&] { return (k = signals.signal(word)) != seen; },
                             strf("the signal to pass %llu (of %d)", static_cast<unsigned long long>(seen), kPuts));
                REQUIRE(k > seen && k <= static_cast<uint64_t>(kPuts),
                        rank.where() + strf(": signal went from %llu to %llu (200 puts each ADD 1)",
                                            static_cast<unsigned long long>(seen), static_cast<unsigned long long>(k)));
                // The newest region first: it is the one a signal that overtook its data would leave incomplete.
                for (int i = static_cast<int>(k) - 1; i >= verified; --i) {
                  const std::string damage = regionDamage(i);
                  REQUIRE(damage.empty(),
                          damage + strf(" when the signal read %llu", static_cast<unsigned long long>(k)));
                }
                verified = static_cast<int>(k);
                seen = k;
              }
            }
            std::vector<Range> written(layout.regions.begin(), layout.regions.end());
            const std::string damage = untouchedOutside(data, written, kBackground, rank.where() + ": " + variant);
            REQUIRE(damage.empty(), damage);
          }
          rank.barrier("end");
          if (target) {
            const uint64_t last = signals.signal(word);
            const uint64_t want = signalEach ? kPuts : 1;
            REQUIRE(last == want,
                    rank.where() + strf(": the signal ended at %llu, expected %llu",
                                        static_cast<unsigned long long>(last), static_cast<unsigned long long>(want)));
          }
          rank.deregister(sigWin);
          rank.deregister(dataWin);
        });
      } catch (const TestFailure& e) {
        throw TestFailure(variant + ": " + e.what());
      }
    }
  });
}

TEST_CASE("gin", "loopback", Scope::Once) {
  // Each of 2 ranks puts 1 MiB + 5 from one part of its own window to another with an INC on its own signal word,
  // waits for the signal (progressing) before it tests the request, checks the bytes; then a signal-only ADD to
  // itself.
  const size_t size = std::min(MiB + 5, options().maxSize);
  const size_t dstBase = size + 4 * KiB;
  const size_t windowSize = 2 * dstBase;
  forEachTable(env, false, [&](GinApi& api) {
    runMesh(api, 2, 1, [&](GinRank& rank) {
      HostWindow data(windowSize, kBackground);
      HostWindow signals(kSignalBytes, 0);
      Window dataWin = rank.registerWindow(data, 0);
      Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
      const uint64_t srcOff = 11;
      const uint64_t dstOff = dstBase + 3 + static_cast<uint64_t>(rank.rank());
      const uint64_t seed = seedOf(size, dstOff, 77 + static_cast<uint64_t>(rank.rank()));
      fillPattern(data.data() + srcOff, size, seed);
      rank.barrier("start");
      const int self = rank.rank();
      void* req =
          rank.putSignal(0, srcOff, &dataWin, size, dstOff, &dataWin, self, sigWin, 1, 0, NCCL_NET_SIGNAL_OP_INC);
      rank.awaitSignal(signals, 1, 0, 1, "a put to itself");
      std::string damage =
          patternDamage(data, dstOff, size, seed, rank.where() + ": a put to itself, when its signal was seen");
      if (damage.empty()) {
        damage =
            untouchedOutside(data, {{srcOff, size}, {dstOff, size}}, kBackground, rank.where() + ": a put to itself");
      }
      REQUIRE(damage.empty(), damage);
      rank.complete(req, "a put to itself");
      req = rank.putSignal(0, 0, nullptr, 0, 0, nullptr, self, sigWin, 2, 0x10, NCCL_NET_SIGNAL_OP_ADD);
      rank.awaitSignal(signals, 2, 0, 0x10, "a signal-only ADD 0x10 to itself");
      rank.complete(req, "a signal to itself");
      rank.barrier("end");
    });
  });
}

TEST_CASE("gin", "all_pairs", Scope::Once) {
  // 3 ranks; every rank puts 64 KiB to every rank, itself included, each with an INC on the signal word of its
  // source rank; every rank waits for its 3 signals and checks the 3 regions.
  constexpr int kRanks = 3;
  const size_t size = 64 * KiB;
  const size_t slot = size + 64;
  const size_t sendBase = kRanks * slot;
  const size_t windowSize = 2 * kRanks * slot;
  forEachTable(env, false, [&](GinApi& api) {
    runMesh(api, kRanks, 1, [&](GinRank& rank) {
      HostWindow data(windowSize, kBackground);
      HostWindow signals(kSignalBytes, 0);
      Window dataWin = rank.registerWindow(data, 0);
      Window sigWin = rank.registerWindow(signals, NCCL_NET_MR_FLAG_FORCE_SO);
      const int me = rank.rank();
      auto seedFor = [&](int src, int dst) {
        return seedOf(size, static_cast<uint64_t>(src) * slot, 500 + static_cast<uint64_t>(src * kRanks + dst));
      };
      for (int dst = 0; dst < kRanks; ++dst) fillPattern(data.data() + sendBase + dst * slot, size, seedFor(me, dst));
      rank.barrier("start");
      std::deque<void*> inflight;
      for (int i = 0; i < kRanks; ++i) {
        const int dst = (me + i) % kRanks;
        inflight.push_back(rank.putSignal(0, sendBase + dst * slot, &dataWin, size, me * slot, &dataWin, dst, sigWin,
                                          static_cast<size_t>(me), 0, NCCL_NET_SIGNAL_OP_INC));
      }
      std::vector<Range> written;
      for (int src = 0; src < kRanks; ++src) {
        rank.awaitSignal(signals, static_cast<size_t>(src), 0, 1, strf("64 KiB from rank %d", src));
        const std::string damage =
            patternDamage(data, src * slot, size, seedFor(src, me), rank.where() + strf(": 64 KiB from rank %d", src));
        REQUIRE(damage.empty(), damage);
        written.push_back({src * slot, size});
      }
      rank.drain(inflight, "the puts");
      written.push_back({sendBase, kRanks * slot});
      const std::string damage = untouchedOutside(data, written, kBackground, rank.where() + ": all pairs");
      REQUIRE(damage.empty(), damage);
      rank.barrier("end");
    });
  });
}

}  // namespace conformance
