// A connection's control channel: the one TCP socket every railnet connection has, whichever transport moves
// its data. It carries the handshake's follow-up (verbs QP records), clear-to-sends and inline messages (TCP),
// oversize notices (both), and its end-of-stream is the quickest sign that the peer process is gone. It also
// holds the connection's first failure, which every later call reports.
// A resumable channel (TCP with RAILNET_FAILOVER, verbs with path failover: wire.h kFeatureResume) outlives its
// socket: frames are numbered and kept in a replay log until the peer acknowledges them; when the socket breaks, the
// sending side re-makes it through the SessionService, each side sends again what the other has not processed, and
// the connection fails only when no socket is re-made within RAILNET_FAILOVER_RESUME_MS (docs/failover.md, "The
// session layer").
#pragma once

#include <sys/uio.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "proxy/nic_counters.h"
#include "proxy/protocol/replay_log.h"
#include "proxy/protocol/session_service.h"
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

// How a resumable channel re-makes its socket.
struct ResumeOptions {
  bool acceptor = false;  // the receiving side, which accepted the connection (else the sending side re-makes it)
  SessionKey key;
  // Sending side: the local NICs' addresses a re-made socket may leave from, NIC 0 first (empty: the kernel
  // chooses). Receiving side: the local addresses of the connection's sockets, one per NIC, NIC 0 first: a session
  // listener on each, named to the sender in the kSession frame (empty: the control socket's).
  std::vector<SocketAddress> locals;
  // How many of `locals` are the connection's own NICs; the rest are other NICs of this host that a single-NIC
  // connection may move to (sending side: nearest first; receiving side: listed after the connection's in kSession).
  // 0: all of them.
  size_t connectionNics = 0;
  StreamOptions stream;
  std::chrono::milliseconds limit{2000};  // a broken socket not re-made within this fails the connection
  uint32_t cutEvery = 0;  // test feature (RAILNET_FAULT_CONTROL_CUT): cut the socket in every this-many-th frame
};

class ControlChannel final : private ResumeEndpoint {
 public:
  ControlChannel(Fd fd, const SocketAddress& peer, const char* direction);
  ~ControlChannel();
  ControlChannel(const ControlChannel&) = delete;
  ControlChannel& operator=(const ControlChannel&) = delete;

  // The socket input comes from (replaced when a resumable channel is re-made; read it under the owner's lock).
  int fd() const { return readFd_.load(std::memory_order_acquire); }
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

  // ---- resumable channels ----
  // Numbers frames from here on; the receiving side sends its kSession frame. Call once, before any frame.
  void enableResume(const ResumeOptions& options);
  bool resumable() const { return resumable_; }
  // The reader holds this while it reads and processes frames, so a re-made socket replaces the old one between
  // frames, never inside one.
  std::unique_lock<std::mutex> lockInput() { return std::unique_lock<std::mutex>(inputMutex_); }
  // Changes when the socket was replaced: the reader drops the state of a frame it had begun (it comes again).
  // Under lockInput().
  uint64_t inputGeneration() const { return inputGeneration_; }
  // The reader processed `count` numbered frames (under lockInput()); acknowledges them now and then.
  void framesProcessed(uint32_t count);
  // Sending side, waiting for the peer's frames: a kAck repeating what this side processed, at most one per
  // `interval`, so a path that went silent while only the peer had something to say still leaves one of this side's
  // frames unacknowledged, which the silence check sees (docs/failover.md "Detection"). Takes lockInput().
  void keepAlive(std::chrono::steady_clock::time_point now, std::chrono::milliseconds interval);
  // The peer's kAck: it processed our frames before `processed`. False on a count out of range (failure recorded).
  bool acknowledged(uint32_t processed);
  // Readers that parse frames themselves (verbs): a resumable channel's kAck at the head of the input is consumed
  // and applied; true when `frame` (that head) was one.
  bool takeAck(const FrameHeader& frame);
  // The sending side's kSession frame: the receiver's session listeners, `size` bytes of kSessionEntryBytes each, the
  // first `connectionNics` of them (0: all) on the connection's own NICs.
  bool sessionListeners(const char* entries, size_t size, size_t connectionNics);
  // A path between the hosts: indices into the local NICs (ResumeOptions::locals; -1: the kernel chooses) and the
  // receiver's session listeners. The original path of NIC n is {n, n}.
  struct Route {
    int local = 0;
    int target = 0;
    bool operator==(const Route&) const = default;
  };
  // Sending side: the path the control socket now uses (matched by its addresses when it is re-made).
  Route route() const;
  // Sending side: the control socket leaves from local NIC `nic` (true when this side binds no addresses).
  bool leavesFrom(int nic);
  // "<local address> to <peer listener>" for WARNs.
  std::string describeRoute(const Route& route);
  // Sending side: the session listeners the receiver named beyond its connection's NICs (0 until kSession arrived).
  bool knowsListeners();
  // Sending side: NIC n failed here; a re-made socket tries its address and the peer's NIC n last.
  void avoidNic(int nic);
  // Shut the socket down both ways (NIC 0 taken out of the connection, or RAILNET_FAULT_NIC_CUT of NIC 0): it is
  // re-made, through another NIC when the plan has one. `why`, when given, is the loss the re-made socket's WARN
  // names (else the reader's view of the cut: "the peer closed").
  void cut(const std::string& why = {});
  // Failback (the comm's, set before enableResume): where made-again data streams go (any thread: the session
  // service's), and, on the sending side, the ones that could not be made.
  using RejoinedHandler = std::function<void(int stream, Fd socket, uint32_t failure)>;
  using RejoinFailedHandler = std::function<void(int stream, uint32_t failure, const std::string& why)>;
  void setRejoinHandlers(RejoinedHandler rejoined, RejoinFailedHandler failed);
  // Sending side: make data stream `stream` (of `streams`) again from local NIC `nic` to the peer's listener of the
  // same index (modulo its count). False when the receiver named no listener or this side binds no NIC address.
  bool rejoin(int stream, int streams, int nic, uint32_t failure);
  // The same over a given path (a single-NIC connection moving to another NIC, or back).
  bool rejoinVia(int stream, int streams, const Route& route, uint32_t failure);
  // NIC n answers again: a re-made control socket no longer tries it last.
  void stopAvoiding(int nic);
  // Before the owner tears down what the rejoin handlers touch: no service call reaches this channel afterwards.
  void detachFromService();
  // The socket failed under the reader (under lockInput()) or a writer. Resumable: the channel waits for a re-made
  // socket (the sending side asks for one) and true is returned; else the failure is recorded, false returned.
  bool lost(const std::string& why, FailureKind kind = FailureKind::kRemote);
  // A resumable channel whose socket is broken and not yet re-made.
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  uint64_t resumes() const { return resumes_.load(std::memory_order_relaxed); }

  // Input, caller holds the owner's lock (and lockInput() on a resumable channel). Bytes are read in large gulps into a staging buffer, so a frame and
  // its payload usually cost one recv(), and a short read tells that the socket is drained. read() returns bytes
  // added (>0), 0 when nothing was waiting, kEndOfStream, or -errno.
  ssize_t read();
  const char* data() const { return input_.data() + inputBegin_; }
  size_t size() const { return inputEnd_ - inputBegin_; }
  void consume(size_t bytes);
  // True when the last read() filled the buffer, so more may be waiting in the socket.
  bool mayHaveMore() const { return lastReadFilled_; }
  // A resumable channel's read() never returns kEndOfStream or an error: it reports the loss (lost()) and returns 0.

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
  // ResumeEndpoint, from the session service's thread.
  uint32_t freezeInput() noexcept override;
  void resumed(Fd socket, uint32_t peerProcessed) noexcept override;
  void resumeFailed(const std::string& why) noexcept override;
  void peerClosed() noexcept override;
  void rejoinedStream(int stream, Fd socket, uint32_t failure) noexcept override;
  void rejoinFailed(int stream, uint32_t failure, const std::string& why) noexcept override;
  RejoinedHandler onRejoined_;
  RejoinFailedHandler onRejoinFailed_;

  bool lostLocked(const std::string& why, FailureKind kind);  // holds outputMutex_
  // Re-making the control socket: every pair of NICs until `deadline`. Holds outputMutex_.
  ReconnectPlan reconnectPlan(std::chrono::steady_clock::time_point deadline) const;
  void writeLocked(const iovec* pieces, int count);           // holds outputMutex_; queues what the socket refuses
  bool flushLocked();                                          // holds outputMutex_
  void dropInput();                                            // holds inputMutex_
  void watchForClose();                                        // sending side: the service watches a duplicate

  Fd fd_;  // guarded by outputMutex_ (replaced under inputMutex_ too)
  std::atomic<int> readFd_;
  std::vector<Fd> retired_;  // replaced sockets, closed by the reader (guarded by both mutexes)
  std::string peerName_;
  const char* direction_;
  NicCounters* counters_ = nullptr;

  // Resumable channels (set once by enableResume).
  bool resumable_ = false;
  ResumeOptions resume_;
  std::shared_ptr<SessionService> service_;
  std::mutex inputMutex_;
  uint32_t processed_ = 0;        // guarded by inputMutex_: the peer's numbered frames processed
  uint32_t acknowledgedUpTo_ = 0;  // guarded by inputMutex_: the count last sent in a kAck
  bool frozen_ = false;           // guarded by inputMutex_: no input taken until the socket is replaced
  uint64_t inputGeneration_ = 0;  // guarded by inputMutex_
  ReplayLog log_;                 // guarded by outputMutex_
  uint32_t cutEvery_ = 0;         // guarded by outputMutex_: RAILNET_FAULT_CONTROL_CUT, once enableResume is done
  uint32_t framesSinceCut_ = 0;   // guarded by outputMutex_
  std::vector<SocketAddress> resumeTargets_;  // guarded by outputMutex_: the receiver's session listeners
  size_t connectionTargets_ = 0;             // guarded by outputMutex_: how many are on the connection's NICs
  std::atomic<uint32_t> route_{1u << 16};         // route(): local index + 1 in the high half, target in the low half
  Route routeOf(int fd) const;               // holds outputMutex_
  uint64_t avoidNics_ = 0;                   // guarded by outputMutex_: ReconnectPlan::avoid
  std::string lossWhy_;           // guarded by outputMutex_
  std::atomic<bool> broken_{false};
  std::chrono::steady_clock::time_point brokenSince_{};  // guarded by outputMutex_
  std::atomic<int64_t> deadlineNs_{0};  // the broken socket's deadline (steady clock ns); read lock-free by read()
  std::atomic<uint64_t> resumes_{0};
  std::chrono::steady_clock::time_point lastKeepAlive_{};  // guarded by inputMutex_

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
