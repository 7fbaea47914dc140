// What a TCP send comm and a TCP recv comm share: the control socket and its output queue, the data streams
// and their engine, the peer's name, and the first failure seen (which every later call reports).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/tcp/engine.h"
#include "proxy/tcp/socket.h"
#include "proxy/transport.h"

namespace railnet::tcp {

// The local NICs ("lanes") of a comm's device and their counters. Data stream s uses lane s % lanes.size();
// the control socket uses lane 0. One lane for a physical device, one per child for a fused one.
struct LaneLayout {
  std::vector<NicCounters*> lanes;  // empty: one lane, nothing counted
  uint64_t minStripeBytes = 0;      // sender of a fused device: planStripes' threshold (proxy/stripe_plan.h)
};

class Connection {
 public:
  Connection(Fd control, std::vector<Fd> data, const SocketAddress& peer, const char* direction);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Per-NIC counters: `control` for the control socket (inline payload), perStream[i] for data stream i.
  // Optional; call before start().
  void setCounters(NicCounters* control, std::vector<NicCounters*> perStream);
  // The same from a layout: lane 0 for control, lane s % lanes for data stream s.
  void setCounters(const LaneLayout& layout);
  NicCounters* controlCounters() const { return controlCounters_; }
  // Hands the data streams to the engine; call once the owner is fully constructed.
  void start(StreamOwner* owner);
  // Takes the streams back from the engine; after it returns no worker calls the owner.
  void stop();

  int controlFd() const { return control_.get(); }
  const std::string& peerName() const { return peerName_; }
  const char* direction() const { return direction_; }
  int streamCount() const { return static_cast<int>(streams_.size()); }
  Stream& stream(int index) { return *streams_[static_cast<size_t>(index)]; }

  // Control output, caller holds the owner's lock. Writes what the socket takes now, straight from the
  // caller's memory, and copies only the rest into the output queue (flushed by later calls).
  void sendControl(const void* first, size_t firstSize, const void* second = nullptr, size_t secondSize = 0);
  // False once the control socket failed (the failure is recorded). No syscall when nothing is queued.
  bool flushControl();

  // Control input, caller holds the owner's lock. Bytes are read in large gulps into a staging buffer, so a
  // frame and its payload usually cost one recv(), and a short read tells that the socket is drained.
  // readControl returns bytes added (>0), 0 when nothing was waiting, kEndOfStream, or -errno.
  ssize_t readControl();
  const char* controlData() const { return input_.data() + inputBegin_; }
  size_t controlSize() const { return inputEnd_ - inputBegin_; }
  void consumeControl(size_t bytes);
  // True when the last readControl filled the buffer, so more may be waiting in the socket.
  bool controlMayHaveMore() const { return lastReadFilled_; }

  // The first failure wins. Recording is silent: a peer that closes after everything completed is no error.
  void recordFailure(const std::string& why);
  // A call or request fails because of the recorded failure: log it once, naming the peer.
  ncclResult_t reportFailure();
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const;

 private:
  Fd control_;
  std::string peerName_;
  const char* direction_;
  std::shared_ptr<Engine> engine_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::vector<Fd> pendingData_;  // data sockets until start()
  NicCounters* controlCounters_ = nullptr;
  std::vector<NicCounters*> streamCounters_;
  bool started_ = false;

  std::vector<char> controlOut_;
  size_t controlOutSent_ = 0;
  std::vector<char> input_;
  size_t inputBegin_ = 0;
  size_t inputEnd_ = 0;
  bool lastReadFilled_ = false;

  mutable std::mutex failureMutex_;
  std::string failure_;  // guarded by failureMutex_
  std::atomic<bool> failed_{false};
  std::atomic<bool> reported_{false};
};

// TCP transports carry host memory only; the region just remembers what was registered.
class HostRegion final : public MemoryRegion {
 public:
  HostRegion(void* data, size_t size) : data_(data), size_(size) {}
  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_;
  size_t size_;
};

std::unique_ptr<MemoryRegion> registerHostMemory(void* data, size_t size, int type);

}  // namespace railnet::tcp
