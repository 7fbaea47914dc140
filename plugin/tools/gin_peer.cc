#include "plugin/tools/gin_peer.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <sched.h>

namespace railnet::bench {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The GIN ranks' commId: any value both ranks share (NCCL passes the communicator's).
constexpr uint64_t kCommId = 0x67696e6265ULL;

}  // namespace

template <class Fn>
void GinPeer::collective(Fn&& fn) {
  std::exception_ptr failure;
  std::thread other([&] {
    try {
      buffers_.prepareThread();
      fn(1);
    } catch (...) {
      failure = std::current_exception();
      guard_.abort();
    }
  });
  try {
    fn(0);
  } catch (...) {
    guard_.abort();
    other.join();
    guard_.clearAbort();
    throw;
  }
  other.join();
  if (failure) {
    guard_.clearAbort();
    std::rethrow_exception(failure);
  }
}

GinPeer::GinPeer(const NetPlugin& net, int dev, int window, BenchBuffers& buffers, StallGuard& guard,
                 const GpuDevice* gpu)
    : net_(net), gpu_(gpu), gin_(net.gin()), window_(window), buffers_(buffers), guard_(guard) {
  guard_.setPhase("GIN: connecting two ranks");
  char handles[kRanks][NCCL_NET_HANDLE_MAXSIZE] = {};
  for (int r = 0; r < kRanks; ++r) {
    NetPlugin::check(net_.ginInit(&ranks_[r].ctx, kCommId), "GIN init");
    NetPlugin::check(gin_.listen(ranks_[r].ctx, dev, handles[r], &ranks_[r].listen), "GIN listen");
  }
  void* handlePointers[kRanks] = {handles[0], handles[1]};
  collective([&](int r) {
    NetPlugin::check(gin_.connect(ranks_[r].ctx, handlePointers, kRanks, r, ranks_[r].listen, &ranks_[r].comm),
                     "GIN connect");
  });
  for (Rank& rank : ranks_) {
    NetPlugin::check(gin_.closeListen(rank.listen), "GIN closeListen");
    rank.listen = nullptr;
  }
  guard_.setPhase("GIN: registering windows");
  BenchBuffer* windows[kWindows] = {&buffers_.send, &buffers_.recv, &buffers_.echoSend, &buffers_.echoRecv};
  collective([&](int r) {
    Rank& rank = ranks_[r];
    void* ginHandle = nullptr;
    for (int w = 0; w < kWindows; ++w) {
      NetPlugin::check(gin_.regMrSym(rank.comm, windows[w]->transportData(), windows[w]->size(),
                                     windows[w]->pointerType(), 0, &rank.windows[w], &ginHandle),
                       "GIN regMrSym");
    }
    constexpr size_t kSignalBytes = 4096;
    void* words = nullptr;
    if (gpu_ != nullptr) {
      rank.deviceSignals = std::make_unique<DeviceMemory>(*gpu_, kSignalBytes);  // zeroed
      words = reinterpret_cast<void*>(rank.deviceSignals->address());
    } else {
      rank.signals = std::make_unique<HostBuffer>(kSignalBytes);
      std::memset(rank.signals->data(), 0, kSignalBytes);
      words = rank.signals->data();
    }
    NetPlugin::check(gin_.regMrSym(rank.comm, words, kSignalBytes, gpu_ != nullptr ? NCCL_PTR_CUDA : NCCL_PTR_HOST,
                                   NCCL_NET_MR_FLAG_FORCE_SO, &rank.signalWindow, &ginHandle),
                     "GIN regMrSym (signals)");
  });
  // Each rank's NCCL GIN progress thread: ginProgress in a loop, yielding between rounds as NCCL does.
  for (Rank& rank : ranks_) {
    rank.progress = std::thread([this, &rank] {
      buffers_.prepareThread();
      while (!stop_.load(std::memory_order_relaxed)) {
        if (gin_.ginProgress(rank.comm) != ncclSuccess) return;  // puts report it (as NCCL sees it)
        sched_yield();
      }
    });
  }
}

GinPeer::~GinPeer() {
  stop_.store(true);
  for (Rank& rank : ranks_) {
    if (rank.progress.joinable()) rank.progress.join();
  }
  auto report = [](ncclResult_t result, const char* call) {
    if (result != ncclSuccess) fprintf(stderr, "railnet-bench: GIN %s returned %d\n", call, static_cast<int>(result));
  };
  for (Rank& rank : ranks_) {
    if (rank.comm != nullptr) {
      for (void* handle : rank.windows) {
        if (handle != nullptr) report(gin_.deregMrSym(rank.comm, handle), "deregMrSym");
      }
      if (rank.signalWindow != nullptr) report(gin_.deregMrSym(rank.comm, rank.signalWindow), "deregMrSym");
      report(gin_.closeColl(rank.comm), "closeColl");
    }
    if (rank.listen != nullptr) report(gin_.closeListen(rank.listen), "closeListen");
    if (rank.ctx != nullptr) report(gin_.finalize(rank.ctx), "finalize");
  }
}

uint64_t GinPeer::signal(int rank, int word) const {
  const Rank& owner = ranks_[rank];
  if (owner.deviceSignals == nullptr) {
    return __atomic_load_n(reinterpret_cast<const uint64_t*>(owner.signals->data()) + word, __ATOMIC_ACQUIRE);
  }
  uint64_t value = 0;
  gpu_->check(gpu_->api().cuMemcpyDtoH(&value, owner.deviceSignals->address() + static_cast<size_t>(word) * 8,
                                       sizeof value),
              "cuMemcpyDtoH (a GIN signal word)");
  return value;
}

void GinPeer::waitSignal(int rank, int word, uint64_t atLeast, const char* what) {
  while (signal(rank, word) < atLeast) {
    sched_yield();  // a GPU polls its own word; here the poller shares the cores with the progress threads
    guard_.check([&] {
      return std::string("GIN: ") + what + ": rank " + std::to_string(rank) + "'s signal " + std::to_string(word) +
             " is " + std::to_string(signal(rank, word)) + ", waiting for " + std::to_string(atLeast);
    });
  }
  guard_.progressed();
}

void GinPeer::waitRequest(int rank, void* request, const char* what) {
  int done = 0;
  while (true) {
    NetPlugin::check(gin_.test(ranks_[rank].comm, request, &done), "GIN test");
    if (done) break;
    sched_yield();
    guard_.check([&] { return std::string("GIN: ") + what + ": a put of rank " + std::to_string(rank) + " pending"; });
  }
  guard_.progressed();
}

void GinPeer::putStream(int from, int srcWindow, int dstWindow, int word, size_t size, uint64_t count) {
  Rank& rank = ranks_[from];
  const uint32_t to = static_cast<uint32_t>(1 - from);
  std::vector<void*> inFlight;
  size_t oldest = 0;
  for (uint64_t i = 0; i < count; ++i) {
    if (inFlight.size() - oldest >= static_cast<size_t>(window_)) waitRequest(from, inFlight[oldest++], "streaming");
    const uint64_t offset = buffers_.slotOffset(size, i);
    void* request = nullptr;
    if (i + 1 < count) {
      NetPlugin::check(gin_.iput(rank.comm, offset, rank.windows[srcWindow], size, offset, rank.windows[dstWindow], to,
                                 &request),
                       "GIN iput");
    } else {
      NetPlugin::check(gin_.iputSignal(rank.comm, offset, rank.windows[srcWindow], size, offset,
                                       rank.windows[dstWindow], to, static_cast<uint64_t>(word) * 8, rank.signalWindow,
                                       0, NCCL_NET_SIGNAL_OP_INC, &request),
                       "GIN iputSignal");
    }
    inFlight.push_back(request);
  }
  while (oldest < inFlight.size()) waitRequest(from, inFlight[oldest++], "streaming");
}

double GinPeer::stream(size_t size, uint64_t count) {
  const uint64_t target = signal(1, 0) + 1;
  const Clock::time_point start = Clock::now();
  putStream(0, 0, 1, 0, size, count);
  waitSignal(1, 0, target, "streaming");
  return secondsSince(start);
}

double GinPeer::streamBothWays(size_t size, uint64_t count) {
  const uint64_t forward = signal(1, 0) + 1;
  const uint64_t back = signal(0, 1) + 1;
  const Clock::time_point start = Clock::now();
  collective([&](int r) {
    if (r == 0) {
      putStream(0, 0, 1, 0, size, count);
      waitSignal(1, 0, forward, "streaming both ways");
    } else {
      putStream(1, 2, 3, 1, size, count);
      waitSignal(0, 1, back, "streaming both ways");
    }
  });
  return secondsSince(start);
}

double GinPeer::pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) {
  const uint64_t pingBase = signal(1, 0);
  const uint64_t pongBase = signal(0, 1);
  const Clock::time_point start = Clock::now();
  collective([&](int r) {
    Rank& rank = ranks_[r];
    for (uint64_t k = 1; k <= count; ++k) {
      void* request = nullptr;
      if (r == 0) {
        const Clock::time_point sent = Clock::now();
        NetPlugin::check(gin_.iputSignal(rank.comm, 0, rank.windows[0], size, 0, rank.windows[1], 1, 0,
                                         rank.signalWindow, 0, NCCL_NET_SIGNAL_OP_INC, &request),
                         "GIN iputSignal");
        waitSignal(0, 1, pongBase + k, "ping-pong");
        halfRttUs->push_back(std::chrono::duration<double, std::micro>(Clock::now() - sent).count() / 2);
      } else {
        waitSignal(1, 0, pingBase + k, "ping-pong");
        NetPlugin::check(gin_.iputSignal(rank.comm, 0, rank.windows[2], size, 0, rank.windows[3], 0, 8,
                                         rank.signalWindow, 0, NCCL_NET_SIGNAL_OP_INC, &request),
                         "GIN iputSignal");
      }
      waitRequest(r, request, "ping-pong");
    }
  });
  return secondsSince(start);
}

}  // namespace railnet::bench
