// The soak (issue 11, group "soak"): randomized traffic for RAILNET_SOAK_S seconds (20 by default), in cycles that
// each dlopen the plugin through a random ABI version, connect 1-6 comm pairs over one or two contexts per side,
// run a random plan on each pair at once (single and grouped receives of 0 B up to 64 MiB or --max-size, random
// windows, tag orders and optional completions, every byte checked), race regMr/deregMr against the traffic on the
// same comms from another thread (NCCL registers from its main thread while the proxy thread moves data), close
// everything and dlclose. After every cycle this process must hold the descriptors and threads it held before the
// first; at the end its RSS must be back near what it was after the first cycle (normal builds; sanitizers keep
// freed memory in quarantine). CI runs a minute under ASan+UBSan and a minute under TSan; docs/reliability.md
// ("Soak") has the hour-long runs. RAILNET_SOAK_SEED repeats a run.
#include <malloc.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "comms.h"
#include "harness.h"
#include "memory.h"
#include "transfer.h"

namespace conformance {
namespace {

using Clock = std::chrono::steady_clock;

double soakSeconds() {
  const char* set = std::getenv("RAILNET_SOAK_S");
  return set != nullptr ? std::atof(set) : 20.0;
}

uint64_t soakSeed() {
  const char* set = std::getenv("RAILNET_SOAK_SEED");
  if (set != nullptr) return std::strtoull(set, nullptr, 0);
  return (static_cast<uint64_t>(std::random_device{}()) << 32) ^ std::random_device{}();
}

// Resident memory once the allocator has given back what it can (free memory it keeps is not a leak).
size_t residentBytes() {
  malloc_trim(0);
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0;
  size_t resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

uint64_t planBytes(const Plan& plan) {
  uint64_t bytes = 0;
  for (const SendSpec& send : plan.sends) bytes += send.size;
  return bytes;
}

// One pair's traffic for a cycle: single-buffer messages of any size, or grouped receives over random tag subsets.
Plan soakPlan(std::mt19937_64& rng, size_t maxSize) {
  Plan plan;
  if (rng() % 3 == 0) {
    plan = randomPlan(4 + rng() % 24, maxSize, 1 + static_cast<int>(rng() % 8), rng());
  } else {
    auto subset = [](int, std::mt19937_64& r) {
      std::vector<int> peers(16);
      for (int i = 0; i < 16; ++i) peers[static_cast<size_t>(i)] = i * 5 + 2;
      std::shuffle(peers.begin(), peers.end(), r);
      peers.resize(1 + r() % 8);
      return peers;
    };
    // Group members are small or mid-sized as in NCCL's PXN and alltoall, now and then one large.
    auto capacity = [maxSize](int, std::mt19937_64& r) { return randomSize(r, r() % 8 == 0 ? maxSize : 1 * MiB); };
    plan = groupedPlan(4 + static_cast<int>(rng() % 24), subset, capacity, rng());
    randomInterleave(plan, rng());
    plan.sendWindow = 1 + static_cast<int>(rng() % 8);
    plan.recvWindow = 1 + static_cast<int>(rng() % 8);
  }
  plan.optionalCompletion = rng() % 2 == 0;
  return plan;
}

// Registers and deregisters buffers of random sizes on random comms of the cycle until `done`, some of them twice
// over (NCCL registers overlapping ranges). Returns how many registrations it made.
uint64_t raceRegistrations(NetApi& net, const std::vector<void*>& comms, const std::atomic<bool>& done, uint64_t seed,
                           const std::atomic<bool>* abort) {
  std::mt19937_64 rng(seed);
  HostBuffer pool(8 * MiB);
  uint64_t made = 0;
  while (!done.load() && !abort->load()) {
    void* comm = comms[rng() % comms.size()];
    const size_t offset = rng() % (4 * MiB);
    const size_t size = 1 + rng() % (4 * MiB);
    void* first = nullptr;
    REQUIRE_OK(net.regMr(comm, pool.data() + offset, size, NCCL_PTR_HOST, &first));
    void* second = nullptr;
    const bool twice = rng() % 4 == 0;
    if (twice) REQUIRE_OK(net.regMr(comm, pool.data() + offset / 2, size, NCCL_PTR_HOST, &second));
    if (rng() % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(rng() % 500));
    REQUIRE_OK(net.deregMr(comm, first));
    if (twice) REQUIRE_OK(net.deregMr(comm, second));
    made += twice ? 2 : 1;
  }
  return made;
}

// What a cycle leaves behind in this process: descriptors and threads (the plugin's helpers, engine and watchdog
// must be gone after dlclose). Waits up to 2 s for threads that are still exiting.
void requireNothingLeft(size_t filesBefore, int threadsBefore, int cycle) {
  const auto end = Clock::now() + std::chrono::seconds(2);
  while ((threadCount() > threadsBefore || openFileCount() > filesBefore) && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::string names;
  for (const std::string& name : threadNames()) names += " " + name;
  REQUIRE(threadCount() <= threadsBefore,
          strf("after cycle %d: %d threads (%s ), %d before the first", cycle, threadCount(), names.c_str(),
               threadsBefore));
  REQUIRE(openFileCount() <= filesBefore,
          strf("after cycle %d: %zu open descriptors, %zu before the first", cycle, openFileCount(), filesBefore));
}

}  // namespace

TEST_CASE("soak", "randomized", Scope::PerVersionOwnLoad) {
  skipUnlessHeavy(env);
  const uint64_t seed = soakSeed();
  note(strf("seed %llu (RAILNET_SOAK_SEED repeats the run), %.0f s", static_cast<unsigned long long>(seed),
            soakSeconds()));
  std::mt19937_64 rng(seed);
  const size_t maxSize = std::min(size_t{64} << 20, options().maxSize);
  std::vector<int> versions;
  {
    PluginLibrary library(options().plugin);
    for (int version : kSupportedVersions) {
      if (openApi(library, version) != nullptr) versions.push_back(version);
    }
  }
  REQUIRE(!versions.empty(), "the plugin exports no net ABI version");
  const size_t filesBefore = openFileCount();
  const int threadsBefore = startupThreadCount();
  const auto end = Clock::now() + std::chrono::milliseconds(static_cast<long>(soakSeconds() * 1000));

  int cycles = 0;
  uint64_t bytes = 0;
  uint64_t messages = 0;
  uint64_t registrations = 0;
  int comms = 0;
  size_t rssAfterFirst = 0;
  // A long run says how it goes every few minutes: the counts, and whether resident memory keeps growing.
  const auto started = Clock::now();
  auto nextProgress = started + std::chrono::minutes(5);
  do {
    ++cycles;
    {
      PluginLibrary library(options().plugin);
      const int version = versions[rng() % versions.size()];
      std::unique_ptr<NetApi> net = openApi(library, version);
      REQUIRE(net != nullptr, strf("version %d vanished on reload", version));
      // One or two contexts per side, as one or two NCCL communicators in the process.
      std::vector<std::unique_ptr<NetContext>> sendCtx;
      std::vector<std::unique_ptr<NetContext>> recvCtx;
      const int contexts = 1 + static_cast<int>(rng() % 2);
      for (int c = 0; c < contexts; ++c) {
        sendCtx.push_back(std::make_unique<NetContext>(*net, nextCommId()));
        recvCtx.push_back(std::make_unique<NetContext>(*net, nextCommId()));
      }
      const int pairs = 1 + static_cast<int>(rng() % 6);
      std::vector<std::unique_ptr<Connection>> connections;
      std::vector<Plan> plans;
      std::vector<void*> registrable;
      for (int p = 0; p < pairs; ++p) {
        const size_t c = rng() % sendCtx.size();
        connections.push_back(
            std::make_unique<Connection>(connectPair(*net, sendCtx[c]->get(), recvCtx[c]->get(), env.dev)));
        registrable.push_back(connections.back()->send.get());
        registrable.push_back(connections.back()->recv.get());
        plans.push_back(soakPlan(rng, maxSize));
        bytes += planBytes(plans.back());
        messages += plans.back().sends.size();
      }
      comms += 2 * pairs;
      {
        ThreadGroup traffic;
        std::atomic<int> running{pairs};
        std::atomic<bool> trafficDone{false};
        for (int p = 0; p < pairs; ++p) {
          traffic.spawn([&, p] {
            runTransfer(*net, *connections[static_cast<size_t>(p)], plans[static_cast<size_t>(p)]);
            if (--running == 0) trafficDone = true;
          });
        }
        const uint64_t raceSeed = rng();
        std::atomic<uint64_t> made{0};
        traffic.spawn([&] { made = raceRegistrations(*net, registrable, trafficDone, raceSeed, traffic.abortFlag()); });
        traffic.join();
        registrations += made.load();
      }
      for (auto& connection : connections) {
        REQUIRE_OK(connection->send.close());
        REQUIRE_OK(connection->recv.close());
      }
      connections.clear();
      for (auto& ctx : sendCtx) ctx->finalize();
      for (auto& ctx : recvCtx) ctx->finalize();
    }
    requireNothingLeft(filesBefore, threadsBefore, cycles);
    if (cycles == 1) rssAfterFirst = residentBytes();
    if (Clock::now() >= nextProgress) {
      nextProgress += std::chrono::minutes(5);
      note(strf("after %.0f s: %d cycles, %.2f GiB checked, RSS %.1f MiB",
                std::chrono::duration<double>(Clock::now() - started).count(), cycles,
                static_cast<double>(bytes) / (1 << 30), static_cast<double>(residentBytes()) / MiB));
    }
  } while (Clock::now() < end);

  const size_t rssAtEnd = residentBytes();
  note(strf("%d cycles, %d comms, %llu messages, %.2f GiB checked, %llu registrations raced; RSS %.1f MiB after the "
            "first cycle, %.1f MiB at the end; descriptors and threads back to %zu and %d after every cycle",
            cycles, comms, static_cast<unsigned long long>(messages), static_cast<double>(bytes) / (1 << 30),
            static_cast<unsigned long long>(registrations), static_cast<double>(rssAfterFirst) / MiB,
            static_cast<double>(rssAtEnd) / MiB, filesBefore, threadsBefore));
  if (!sanitizedBuild()) {
    // The allocator may keep some freed memory; a leak of a connection's buffers per cycle would pass this fast.
    REQUIRE(rssAtEnd <= rssAfterFirst + 64 * MiB,
            strf("RSS grew from %.1f MiB after the first cycle to %.1f MiB after %d", static_cast<double>(rssAfterFirst) / MiB,
                 static_cast<double>(rssAtEnd) / MiB, cycles));
  }
}

}  // namespace conformance
