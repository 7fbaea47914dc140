// Re-making broken control sockets (docs/failover.md, "The session layer"): one process-wide thread, running while
// a resumable connection exists. For receiving comms it listens on the local address of their control sockets and
// hands each re-made socket (a kResume hello naming the connection and its secret) to its session; NCCL closes a
// listen comm once its connection is accepted, so the session listener is railnet's own. For sending comms it
// watches the control socket for the peer's close (NCCL may not call an idle comm for a long time) and re-makes it:
// connect, hello, the peer's kResume answer, then the socket is the channel's. Calls into a session come from this
// thread and never while it holds its lock, so a session may call the service from anywhere.
#pragma once

#include <chrono>
#include <condition_variable>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "proxy/protocol/socket.h"
#include "proxy/protocol/wire.h"

namespace railnet::protocol {

// Which connection a re-made socket belongs to: the hello's connection id and the listen handle's secret.
struct SessionKey {
  uint64_t connectionId = 0;
  uint64_t secret[2] = {0, 0};
};

// A resumable control channel as the service sees it (protocol/control_channel.h).
class ResumeEndpoint {
 public:
  // Sending side: stop taking frames from the broken socket; the count of the peer's frames processed, for the
  // resume hello (frames processed later would be sent again by the peer, and count twice).
  virtual uint32_t freezeInput() noexcept = 0;
  // The re-made socket. The peer processed `peerProcessed` of this side's frames (sending side: the peer's kResume
  // answer said so; receiving side: the hello did). The channel sends again what the peer lacks.
  virtual void resumed(Fd socket, uint32_t peerProcessed) noexcept = 0;
  // Sending side: the socket could not be re-made (why); the connection fails.
  virtual void resumeFailed(const std::string& why) noexcept = 0;
  // Sending side: the peer closed the current control socket (or it failed).
  virtual void peerClosed() noexcept = 0;
  // Failback: data stream `stream` made again (sending side: connected and its hello written; receiving side: its
  // hello arrived), or (sending side) not made (why).
  virtual void rejoinedStream(int stream, Fd socket, uint32_t failure) noexcept = 0;
  virtual void rejoinFailed(int stream, uint32_t failure, const std::string& why) noexcept = 0;

 protected:
  ~ResumeEndpoint() = default;
};

struct ReconnectPlan {
  SessionKey key;
  std::vector<SocketAddress> targets;  // the peer's session listeners, one per NIC, NIC 0 first (its kSession frame)
  std::vector<SocketAddress> locals;   // source addresses, one per local NIC, NIC 0 first; empty: the kernel chooses
  uint64_t avoid = 0;                  // bit n: NIC n failed here; its source and the peer's NIC n are tried last
  StreamOptions stream;
  std::chrono::steady_clock::time_point deadline;  // give up then
};

// The (source, target) pairs a re-made control socket tries, in order: each NIC to the peer's NIC of the same
// index (a rail to itself) first, NICs to avoid last, then every cross pair. Indices into plan.locals/targets; a
// source of -1 lets the kernel choose.
std::vector<std::pair<int, int>> reconnectOrder(const ReconnectPlan& plan);

class SessionService {
 public:
  // The shared service, started on first use and stopped when its last user releases it.
  static std::shared_ptr<SessionService> acquire();
  SessionService();
  ~SessionService();
  SessionService(const SessionService&) = delete;
  SessionService& operator=(const SessionService&) = delete;

  // Receiving side: where a re-made control socket for a session whose control socket's local address is `local`
  // must go (a listener on that IP, made on first use).
  SocketAddress listenerFor(const SocketAddress& local);
  void addAcceptor(ResumeEndpoint* endpoint, const SessionKey& key);
  // Sending side: `socket` is a duplicate of the current control socket; peerClosed() when it hangs up.
  void watch(ResumeEndpoint* endpoint, Fd socket);
  // Sending side: re-make the control socket as planned (replaces an attempt in progress).
  void reconnect(ResumeEndpoint* endpoint, const ReconnectPlan& plan);
  // Sending side, failback: make data stream `stream` (of `streams`) again from plan.locals[0] to plan.targets[0],
  // one try of at most the try limit; rejoinedStream or rejoinFailed follows.
  // `failure`: which failure of the stream's NIC this recovers from (wire.h kNicFailed).
  void rejoin(ResumeEndpoint* endpoint, const ReconnectPlan& plan, int stream, int streams, uint32_t failure);
  // Synchronous: once it returns, the service never calls `endpoint` again.
  void remove(ResumeEndpoint* endpoint);

 private:
  struct Listener {
    SocketAddress address;  // as bound (the port chosen)
    Fd fd;
  };
  struct Arrival {  // an accepted socket whose resume hello is not complete yet
    Fd fd;
    SocketAddress peer;
    Hello hello{};
    size_t got = 0;
    std::chrono::steady_clock::time_point since;
  };
  struct Attempt {
    enum class Phase { kWaiting, kConnecting, kHello, kAnswer };
    ResumeEndpoint* endpoint;
    ReconnectPlan plan;
    uint64_t id;
    Phase phase = Phase::kWaiting;
    Fd fd;
    bool frozen = false;
    Hello hello{};
    size_t sent = 0;
    FrameHeader answer{};
    size_t got = 0;
    std::chrono::steady_clock::time_point nextTry{};
    std::chrono::steady_clock::time_point tryDeadline{};  // this try's connect, hello and answer
    std::vector<std::pair<int, int>> order;               // reconnectOrder(plan)
    int rejoinStream = -1;                                 // >= 0: failback of that data stream, one try
    SocketAddress target;                                 // this try's
    size_t next = 0;                                      // the pair this try uses
    std::string lastError = "no attempt finished yet";
    int tries = 0;
    // The try failed (why): the next pair of NICs at once; after a round of them all, a pause.
    void tryNextPair(std::string why, std::chrono::steady_clock::time_point now);
  };
  struct Acceptor {
    ResumeEndpoint* endpoint;
    SessionKey key;
  };

  void run();
  void wake();
  // Runs `call` on `endpoint` with the lock released (remove() waits for it); lock is mutex_'s, held.
  template <class Call>
  void callEndpoint(std::unique_lock<std::mutex>& lock, ResumeEndpoint* endpoint, Call&& call);
  void acceptArrivals(std::unique_lock<std::mutex>& lock);
  // True when the arrival is finished with (handed over or closed).
  bool serveArrival(std::unique_lock<std::mutex>& lock, Arrival& arrival);
  void stepAttempts(std::unique_lock<std::mutex>& lock);
  void checkWatched(std::unique_lock<std::mutex>& lock);
  std::chrono::milliseconds nextTimeout() const;  // holds mutex_

  static constexpr size_t kMaxArrivals = 256;

  std::mutex mutex_;
  std::condition_variable idle_;
  bool stop_ = false;                                // guarded by mutex_
  Fd wakeFd_;                                        // eventfd
  std::vector<Listener> listeners_;                  // guarded
  std::list<Arrival> arrivals_;                      // guarded
  std::list<Attempt> attempts_;                      // guarded
  std::map<uint64_t, Acceptor> acceptors_;           // guarded; by connection id
  std::map<ResumeEndpoint*, Fd> watched_;            // guarded
  ResumeEndpoint* busy_ = nullptr;                   // guarded: the endpoint being called
  uint64_t nextAttemptId_ = 0;                       // guarded
  uint64_t rejected_ = 0;                            // guarded
  std::thread thread_;
};

}  // namespace railnet::protocol
