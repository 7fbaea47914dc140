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

class Connection {
 public:
  Connection(Fd control, std::vector<Fd> data, const SocketAddress& peer, const char* direction);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

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
  // False once the control socket failed (the failure is recorded).
  bool flushControl();

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
  bool started_ = false;

  std::vector<char> controlOut_;
  size_t controlOutSent_ = 0;

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
