#include "plugin/tools/railnet_peer.h"

#include <sched.h>

#include <algorithm>
#include <cstdio>

namespace railnet::bench {
namespace {

// NCCL passes the sender's rank as the tag and lists the same tag in the matching irecv.
constexpr int kTag = 0;
// Any value: railnet must not depend on it, but NCCL passes a hash of the communicator.
constexpr uint64_t kCommId = 0x7261696c6e657442ULL;  // "railnetB"

}  // namespace

// One railnet connection with both ends in this process and one registered buffer on each end, as NCCL
// registers each protocol buffer once and then sends from / receives into sub-ranges of it.
class RailnetPeer::Link {
 public:
  // The sender connects from `fromDev` to the receiver listening on `toDev` (the same device but for --to).
  Link(const NetPlugin& net, void* ctx, int fromDev, int toDev, const BenchBuffer& source,
       const BenchBuffer& destination, StallGuard& guard, const char* label)
      : net_(net), label_(label) {
    guard.setPhase(format("railnet %s link: listen/connect/accept", label));
    try {
      connect(ctx, fromDev, toDev, guard);
      guard.setPhase(format("railnet %s link: regMr", label));
      NetPlugin::check(net.regMr(sendComm, source.transportData(), source.size(), source.pointerType(), &sendMr),
                       "regMr(sendComm)");
      NetPlugin::check(net.regMr(recvComm, destination.transportData(), destination.size(), destination.pointerType(),
                                 &recvMr), "regMr(recvComm)");
    } catch (...) {
      release();
      throw;
    }
  }

  ~Link() {
    std::string failure = release();
    if (!failure.empty()) fprintf(stderr, "railnet-bench: closing the %s link: %s\n", label_, failure.c_str());
  }

  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;

  // Deregisters and closes, reporting the first failure.
  void close() {
    std::string failure = release();
    if (!failure.empty()) fail("closing the railnet %s link: %s", label_, failure.c_str());
  }

  void* sendComm = nullptr;
  void* recvComm = nullptr;
  void* sendMr = nullptr;
  void* recvMr = nullptr;

 private:
  // listen, then connect and accept from the same thread: both must be non-blocking, so each is simply called
  // again (connect with the same handle buffer) until it hands out its comm.
  void connect(void* ctx, int fromDev, int toDev, StallGuard& guard) {
    alignas(8) char handle[NCCL_NET_HANDLE_MAXSIZE] = {};
    void* listenComm = nullptr;
    NetPlugin::check(net_.listen(ctx, toDev, handle, &listenComm), "listen");
    if (listenComm == nullptr) fail("plugin listen returned ncclSuccess but a NULL listenComm");
    try {
      while (sendComm == nullptr || recvComm == nullptr) {
        bool moved = false;
        if (sendComm == nullptr) {
          NetPlugin::check(net_.connect(ctx, fromDev, handle, &sendComm), "connect");
          moved |= sendComm != nullptr;
        }
        if (recvComm == nullptr) {
          NetPlugin::check(net_.accept(listenComm, &recvComm), "accept");
          moved |= recvComm != nullptr;
        }
        if (moved) {
          guard.progressed();
        } else {
          guard.check([&] {
            return format("connect %s, accept %s", sendComm ? "done" : "keeps returning a NULL sendComm",
                          recvComm ? "done" : "keeps returning a NULL recvComm");
          });
          sched_yield();
        }
      }
    } catch (...) {
      net_.closeListen(listenComm);
      throw;
    }
    // NCCL closes the listening comm right after accept succeeds.
    NetPlugin::check(net_.closeListen(listenComm), "closeListen");
  }

  std::string release() noexcept {
    std::string failure;
    auto note = [&](ncclResult_t result, const char* call) {
      if (result != ncclSuccess && failure.empty()) failure = format("%s returned %d", call, static_cast<int>(result));
    };
    if (recvMr) note(net_.deregMr(recvComm, recvMr), "deregMr(recvComm)");
    if (sendMr) note(net_.deregMr(sendComm, sendMr), "deregMr(sendComm)");
    if (sendComm) note(net_.closeSend(sendComm), "closeSend");
    if (recvComm) note(net_.closeRecv(recvComm), "closeRecv");
    recvMr = sendMr = sendComm = recvComm = nullptr;
    return failure;
  }

  const NetPlugin& net_;
  const char* label_;
};

namespace {

// The index of the device named `name`, or -1.
int findDevice(const NetPlugin& net, int count, const std::string& name) {
  DeviceProps props;
  for (int dev = 0; dev < count; ++dev) {
    NetPlugin::check(net.properties(dev, &props), "getProperties");
    if (props.name == name) return dev;
  }
  return -1;
}

std::string deviceList(const NetPlugin& net, int count) {
  std::string names;
  DeviceProps props;
  for (int dev = 0; dev < count; ++dev) {
    NetPlugin::check(net.properties(dev, &props), "getProperties");
    names += (names.empty() ? "" : ", ") + props.name;
  }
  return names;
}

}  // namespace

RailnetPeer::RailnetPeer(const NetPlugin& net, const std::string& deviceName, int window, BenchBuffers& buffers,
                         StallGuard& guard, const Options& options)
    : net_(net), buffers_(buffers), guard_(guard), window_(window), group_(options.group),
      groupedReceives_(options.groupedReceives), label_(options.label) {
  const bool exact = options.exact;
  guard.setPhase(label_ + " init/devices");
  NetPlugin::check(net.init(&ctx_, kCommId), "init");
  try {
    int count = 0;
    NetPlugin::check(net.devices(&count), "devices");
    if (count <= 0) fail("plugin devices() reports %d devices (is RAILNET_IFNAME right?)", count);
    if (deviceName.find('+') != std::string::npos) {
      // "a+b": fuse the named devices, as NCCL does with NCCL_NET_MERGE_LEVEL / NCCL_NET_FORCE_MERGE.
      std::vector<int> children;
      size_t start = 0;
      while (start <= deviceName.size()) {
        const size_t plus = std::min(deviceName.find('+', start), deviceName.size());
        const std::string child = deviceName.substr(start, plus - start);
        const int dev = findDevice(net, count, child);
        if (dev < 0) fail("no device named \"%s\" to fuse (devices: %s)", child.c_str(), deviceList(net, count).c_str());
        children.push_back(dev);
        start = plus + 1;
      }
      const ncclResult_t fused = net.makeVDevice(&dev_, children);
      if (fused != ncclSuccess) {
        fail("plugin makeVDevice(%s) returned %s (%d); the plugin's WARN above says why", deviceName.c_str(),
             ncclResultName(fused), static_cast<int>(fused));
      }
    } else {
      // The default loopback run prefers the device named like the interface, else device 0 as NCCL would.
      dev_ = findDevice(net, count, deviceName);
      if (dev_ < 0 && exact) {
        fail("no device named \"%s\" (devices: %s)", deviceName.c_str(), deviceList(net, count).c_str());
      }
      if (dev_ < 0) dev_ = 0;
    }
    NetPlugin::check(net.properties(dev_, &props_), "getProperties");
    if (buffers.onGpu() && !(props_.ptrSupport & NCCL_PTR_CUDA)) {
      throw Unsupported(format(
          "device %d \"%s\" does not take GPU memory (ptrSupport %d, no NCCL_PTR_CUDA): the TCP transport offers it "
          "only when libcuda is usable and RAILNET_TCP_GPU is not 0 (-v shows the plugin's reason)",
          dev_, props_.name.c_str(), props_.ptrSupport));
    }
    if (!buffers.onGpu() && !(props_.ptrSupport & NCCL_PTR_HOST)) {
      fail("device %d does not support host memory (ptrSupport %d)", dev_, props_.ptrSupport);
    }
    toDev_ = dev_;
    if (!options.toDevice.empty()) {
      toDev_ = findDevice(net, count, options.toDevice);
      if (toDev_ < 0) fail("no device named \"%s\" (devices: %s)", options.toDevice.c_str(), deviceList(net, count).c_str());
    }
    forward_ = std::make_unique<Link>(net, ctx_, dev_, toDev_, buffers.send, buffers.recv, guard, "forward");
    back_ = std::make_unique<Link>(net, ctx_, toDev_, dev_, buffers.echoSend, buffers.echoRecv, guard, "back");
    open_ = true;
  } catch (...) {
    back_.reset();
    forward_.reset();
    net.finalize(ctx_);
    throw;
  }
}

RailnetPeer::~RailnetPeer() {
  if (!open_) return;  // shutdown() already ran
  back_.reset();
  forward_.reset();
  if (net_.finalize(ctx_) != ncclSuccess) fprintf(stderr, "railnet-bench: plugin finalize failed\n");
}

void RailnetPeer::shutdown() {
  guard_.setPhase("railnet close/finalize");
  back_->close();
  forward_->close();
  back_.reset();
  forward_.reset();
  open_ = false;
  NetPlugin::check(net_.finalize(ctx_), "finalize");
}

// Posts `count` requests with at most `window` in flight and tests them oldest first. `post(i, &request)` posts
// message i; a NULL request means "retry later".
class RailnetPeer::Pipeline {
 public:
  using Post = std::function<ncclResult_t(uint64_t, void**)>;
  // `members`: buffers per request (a grouped irecv's n), each checked for `size` bytes when exactSize.
  Pipeline(const NetPlugin& net, std::string side, size_t size, uint64_t count, bool exactSize, int window, Post post,
           int members = 1)
      : net_(net), side_(std::move(side)), size_(size), count_(count), exactSize_(exactSize), members_(members),
        inFlight_(static_cast<size_t>(window)), post_(std::move(post)) {}

  bool done() const { return completed_ == count_; }

  // Posts one message if the window allows and tests the oldest; true if either moved.
  bool step() {
    bool moved = false;
    if (canPost()) {
      void* request = nullptr;
      NetPlugin::check(post_(posted_, &request), side_.c_str());
      if (request != nullptr) {
        inFlight_[posted_ % inFlight_.size()] = request;
        ++posted_;
        moved = true;
      }
    }
    if (completed_ < posted_) {
      int finished = 0;
      int received[kMaxGroup] = {-1, -1, -1, -1, -1, -1, -1, -1};  // test() writes one size per buffer
      NetPlugin::check(net_.test(inFlight_[completed_ % inFlight_.size()], &finished, received), "test");
      if (finished) {
        for (int m = 0; exactSize_ && m < members_; ++m) {
          if (static_cast<size_t>(received[m]) != size_) {
            fail("%s: message %llu buffer %d completed with %d bytes, expected %zu", side_.c_str(),
                 static_cast<unsigned long long>(completed_), m, received[m], size_);
          }
        }
        ++completed_;
        moved = true;
      }
    }
    return moved;
  }

  std::string state() const {
    const char* reason = !canPost()               ? "test() never reports the oldest request done"
                         : completed_ < posted_ ? "posting returns a NULL request, test() not done"
                                                : "posting keeps returning a NULL request";
    return format("%s: %llu of %llu posted, %llu completed; %s", side_.c_str(),
                  static_cast<unsigned long long>(posted_), static_cast<unsigned long long>(count_),
                  static_cast<unsigned long long>(completed_), reason);
  }

 private:
  bool canPost() const { return posted_ < count_ && posted_ - completed_ < inFlight_.size(); }

  const NetPlugin& net_;
  const std::string side_;
  const size_t size_;
  const uint64_t count_;
  const bool exactSize_;
  const int members_;
  std::vector<void*> inFlight_;
  Post post_;
  uint64_t posted_ = 0;
  uint64_t completed_ = 0;
};

void RailnetPeer::runRank(const std::vector<Pipeline*>& pipelines) {
  for (;;) {
    bool moved = false;
    bool allDone = true;
    for (Pipeline* pipeline : pipelines) {
      if (pipeline->done()) continue;
      allDone = false;
      moved = pipeline->step() || moved;
    }
    if (allDone) return;
    if (moved) {
      guard_.progressed();
      continue;
    }
    guard_.check([&] {
      std::string states;
      for (const Pipeline* pipeline : pipelines) {
        if (!pipeline->done()) states += (states.empty() ? "" : "; ") + pipeline->state();
      }
      return states;
    });
    sched_yield();  // leave the core to the plugin's threads, as NCCL's idle proxy does
  }
}

template <class Post>
void* RailnetPeer::postWithRetry(const char* what, Post&& post) {
  for (;;) {
    void* request = nullptr;
    NetPlugin::check(post(&request), what);
    if (request != nullptr) {
      guard_.progressed();
      return request;
    }
    guard_.check([&] { return format("%s keeps returning a NULL request", what); });
    sched_yield();
  }
}

void RailnetPeer::waitDone(void* request, const char* what, size_t size, bool exactSize) {
  for (;;) {
    int done = 0;
    int received = -1;
    NetPlugin::check(net_.test(request, &done, &received), what);
    if (done) {
      if (exactSize && static_cast<size_t>(received) != size) {
        fail("%s completed with %d bytes, expected %zu", what, received, size);
      }
      guard_.progressed();
      return;
    }
    guard_.check([&] { return format("test() never reports the %s done", what); });
    sched_yield();
  }
}

RailnetPeer::Direction RailnetPeer::streamPipelines(Link& link, const BenchBuffer& source,
                                                    const BenchBuffer& destination, size_t size, uint64_t count,
                                                    const char* direction) {
  Direction pipelines;
  if (group_ > 1) return groupPipelines(link, source, destination, size, count, direction);
  pipelines.sender = std::make_unique<Pipeline>(
      net_, std::string(direction) + " sender isend", size, count, false, window_,
      [&, size](uint64_t i, void** request) {
        return net_.isend(link.sendComm, source.transportData() + buffers_.slotOffset(size, i), size, kTag,
                          link.sendMr, request);
      });
  pipelines.receiver = std::make_unique<Pipeline>(
      net_, std::string(direction) + " receiver irecv", size, count, true, window_,
      [&, size](uint64_t i, void** request) {
        return net_.irecv(link.recvComm, destination.transportData() + buffers_.slotOffset(size, i), size, kTag,
                          link.recvMr, request);
      });
  return pipelines;
}

RailnetPeer::Direction RailnetPeer::groupPipelines(Link& link, const BenchBuffer& source, const BenchBuffer& destination,
                                                   size_t size, uint64_t count, const char* direction) {
  // Message i goes with tag i % group_ into slot i: the k-th send of each tag fills the k-th group.
  const uint64_t groups = (count + static_cast<uint64_t>(group_) - 1) / static_cast<uint64_t>(group_);
  const uint64_t messages = groups * static_cast<uint64_t>(group_);
  const int group = group_;
  Direction pipelines;
  pipelines.sender = std::make_unique<Pipeline>(
      net_, std::string(direction) + " sender isend", size, messages, false, window_ * group,
      [&, size, group](uint64_t i, void** request) {
        return net_.isend(link.sendComm, source.transportData() + buffers_.slotOffset(size, i), size,
                          static_cast<int>(i % static_cast<uint64_t>(group)), link.sendMr, request);
      });
  if (!groupedReceives_) {
    pipelines.receiver = std::make_unique<Pipeline>(
        net_, std::string(direction) + " receiver irecv", size, messages, true, window_ * group,
        [&, size, group](uint64_t i, void** request) {
          return net_.irecv(link.recvComm, destination.transportData() + buffers_.slotOffset(size, i), size,
                            static_cast<int>(i % static_cast<uint64_t>(group)), link.recvMr, request);
        });
    return pipelines;
  }
  pipelines.receiver = std::make_unique<Pipeline>(
      net_, std::string(direction) + " receiver grouped irecv", size, groups, true, window_,
      [&, size, group](uint64_t g, void** request) {
        void* data[kMaxGroup];
        size_t sizes[kMaxGroup];
        int tags[kMaxGroup];
        void* mhandles[kMaxGroup];
        for (int m = 0; m < group; ++m) {
          const uint64_t message = g * static_cast<uint64_t>(group) + static_cast<uint64_t>(m);
          data[m] = destination.transportData() + buffers_.slotOffset(size, message);
          sizes[m] = size;
          tags[m] = m;
          mhandles[m] = link.recvMr;
        }
        return net_.irecvGroup(link.recvComm, group, data, sizes, tags, mhandles, request);
      },
      group);
  return pipelines;
}

double RailnetPeer::runRanks(const std::vector<std::function<void()>>& ranks) {
  return runTogether(guard_, ranks, [this] { buffers_.prepareThread(); });
}

double RailnetPeer::stream(size_t size, uint64_t count) {
  Direction forward = streamPipelines(*forward_, buffers_.send, buffers_.recv, size, count, "forward");
  return runRanks({[&] { runRank({forward.sender.get()}); }, [&] { runRank({forward.receiver.get()}); }});
}

double RailnetPeer::streamBothWays(size_t size, uint64_t count) {
  // Rank A sends forward and receives back; rank B the reverse: one proxy thread each, as in NCCL.
  Direction forward = streamPipelines(*forward_, buffers_.send, buffers_.recv, size, count, "forward");
  Direction back = streamPipelines(*back_, buffers_.echoSend, buffers_.echoRecv, size, count, "back");
  return runRanks({[&] { runRank({forward.sender.get(), back.receiver.get()}); },
                   [&] { runRank({forward.receiver.get(), back.sender.get()}); }});
}

double RailnetPeer::pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) {
  Link& forward = *forward_;
  Link& back = *back_;
  auto postPingSend = [&](void** request) {
    return net_.isend(forward.sendComm, buffers_.send.transportData(), size, kTag, forward.sendMr, request);
  };
  auto postPingRecv = [&](void** request) {
    return net_.irecv(forward.recvComm, buffers_.recv.transportData(), size, kTag, forward.recvMr, request);
  };
  auto postPongSend = [&](void** request) {
    return net_.isend(back.sendComm, buffers_.echoSend.transportData(), size, kTag, back.sendMr, request);
  };
  auto postPongRecv = [&](void** request) {
    return net_.irecv(back.recvComm, buffers_.echoRecv.transportData(), size, kTag, back.recvMr, request);
  };
  halfRttUs->reserve(halfRttUs->size() + count);

  // Each side posts its next receive before it sends, so the receiver-driven handshake is off the timed path,
  // as it is in NCCL where receives are posted steps ahead.
  auto initiator = [&] {
    void* pongRecv = postWithRetry("pong irecv", postPongRecv);
    for (uint64_t i = 0; i < count; ++i) {
      double start = now();
      waitDone(postWithRetry("ping isend", postPingSend), "ping isend", size, false);
      waitDone(pongRecv, "pong irecv", size, true);
      halfRttUs->push_back((now() - start) * 1e6 / 2);
      if (i + 1 < count) pongRecv = postWithRetry("pong irecv", postPongRecv);
    }
  };
  auto echo = [&] {
    void* pingRecv = postWithRetry("ping irecv", postPingRecv);
    for (uint64_t i = 0; i < count; ++i) {
      waitDone(pingRecv, "ping irecv", size, true);
      if (i + 1 < count) pingRecv = postWithRetry("ping irecv", postPingRecv);
      waitDone(postWithRetry("pong isend", postPongSend), "pong isend", size, false);
    }
  };
  return runRanks({initiator, echo});
}

}  // namespace railnet::bench
