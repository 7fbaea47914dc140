// A connection's control channel: the one TCP socket every railnet connection has, whichever transport moves
// its data. It carries the handshake's follow-up (verbs QP records), clear-to-sends and inline messages (TCP),
// oversize notices (both), and its end-of-stream is the quickest sign that the peer process is gone. It also
// holds the connection's first failure, which every later call reports.
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/protocol/socket.h"
#include "proxy/protocol/wire.h"
#include "railnet/nccl/common.h"

namespace railnet::protocol {

// Whose fault a failure is, which decides the code NCCL sees: kRemote (the peer closed, reset or stopped
// answering, sent bytes that break the protocol, or a work completion failed) becomes ncclRemoteError as in
// NCCL's own transports ("remote process exited or there was a network error"); kLocal (this host's OS or
// resources) stays ncclSystemError.
enum class FailureKind { kRemote, kLocal };

// errno values that mean the peer or the network, not this host.
bool isRemoteErrno(int err);

class ControlChannel {
 public:
  ControlChannel(Fd fd, const SocketAddress& peer, const char* direction);
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  int fd() const { return fd_.get(); }
  const std::string& peerName() const { return peerName_; }
  const char* direction() const { return direction_; }
  // The NIC whose traffic counters inline payload is added to (nullptr: not counted).
  void setCounters(NicCounters* counters) { counters_ = counters; }
  NicCounters* counters() const { return counters_; }

  // Output, from any thread (an internal lock orders the writers: a TCP receive comm's helper threads queue done
  // frames while its proxy thread writes clear-to-sends). Writes what the socket takes now, straight from the
  // caller's memory, and copies only the rest into the output queue (flushed by later calls).
  void send(const void* first, size_t firstSize, const void* second = nullptr, size_t secondSize = 0);
  // The same for `count` pieces (at most kMaxSendPieces), written by one syscall when the socket takes them.
  static constexpr int kMaxSendPieces = 2 * kMaxRecvs;
  void sendVector(const iovec* pieces, int count);
  // False once the socket failed (the failure is recorded). No syscall when nothing is queued.
  bool flush();
  // flush() until nothing is queued, waiting for the socket at most `limit` in all: a closing comm's last frames
  // (done frames the sender's last sends wait for). True when everything left.
  bool drain(std::chrono::milliseconds limit);

  // Input, caller holds the owner's lock. Bytes are read in large gulps into a staging buffer, so a frame and
  // its payload usually cost one recv(), and a short read tells that the socket is drained. read() returns bytes
  // added (>0), 0 when nothing was waiting, kEndOfStream, or -errno.
  ssize_t read();
  const char* data() const { return input_.data() + inputBegin_; }
  size_t size() const { return inputEnd_ - inputBegin_; }
  void consume(size_t bytes);
  // True when the last read() filled the buffer, so more may be waiting in the socket.
  bool mayHaveMore() const { return lastReadFilled_; }

  // The first failure wins. Recording is silent: a peer that closes after everything completed is no error.
  void recordFailure(const std::string& why, FailureKind kind = FailureKind::kRemote);
  // A socket call failed with -result (readSome/writeSome's negative return): remote or local by its errno.
  void recordSocketFailure(const char* what, ssize_t result);
  // A call or request fails because of the recorded failure: log it once, naming the peer; the code follows the
  // failure's kind.
  ncclResult_t reportFailure();
  bool failed() const { return failed_.load(std::memory_order_acquire); }
  std::string failure() const;

 private:
  Fd fd_;
  std::string peerName_;
  const char* direction_;
  NicCounters* counters_ = nullptr;

  std::mutex outputMutex_;
  std::vector<char> output_;  // guarded by outputMutex_
  size_t outputSent_ = 0;     // guarded by outputMutex_
  std::vector<char> input_;
  size_t inputBegin_ = 0;
  size_t inputEnd_ = 0;
  bool lastReadFilled_ = false;

  mutable std::mutex failureMutex_;
  std::string failure_;  // guarded by failureMutex_
  FailureKind failureKind_ = FailureKind::kRemote;  // guarded by failureMutex_
  std::atomic<bool> failed_{false};
  std::atomic<bool> reported_{false};
};

}  // namespace railnet::protocol
