// Establishing railnet connections without blocking, for both transports: the listener (accept side) and the
// connect state machine whose progress NCCL drives by calling connect() again with the same handle. Every
// connection opens one control socket plus `streams` data sockets per local NIC (0 for the verbs transport,
// whose bytes go by RDMA); what travels after the hellos is the transport's (its comm factories receive the
// sockets and what the handshake learned of the peer).
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "proxy/protocol/session_service.h"
#include "proxy/protocol/socket.h"
#include "proxy/protocol/wire.h"
#include "proxy/transport.h"

namespace railnet::protocol {

// One local NIC of a device; a fused (virtual) device has several.
struct LocalNic {
  SocketAddress bind;  // source address for connections; length 0 lets the kernel choose
  int16_t railId = -1;
};

// What the handshake told about the other end, for comms that count traffic per NIC and cross-rail.
struct PeerInfo {
  SocketAddress peer;
  int16_t controlRail = -1;        // rail of the peer's NIC at the control socket
  std::vector<int16_t> dataRails;  // the same per data stream
  int nicCount = 1;                // the peer device's ConnectOptions::nicCount (at least 1)
  uint32_t features = 0;           // what the connecting peer asked (Hello::features, kFeature*)
  SessionKey session;              // the connection's id and its listen handle's secret (resumable channels)
  // Sending side of a fused connection that can fail over: bit n, local NIC n (or the peer's NIC n) could not be
  // connected; its sockets stand in over another pair of NICs (wire.h kFeatureStandIn).
  uint64_t nicsDownAtConnect = 0;
  std::string whyDown;  // the first of those connect errors
};
// What a transport builds once all sockets of a connection are there: the TCP transport moves its data over
// them; the verbs transport keeps only the control socket, for its QP records and oversize notices.
using SendCommFactory = std::function<std::unique_ptr<SendComm>(Fd control, std::vector<Fd> data, const PeerInfo& peer)>;
using RecvCommFactory = std::function<std::unique_ptr<RecvComm>(Fd control, std::vector<Fd> data, const PeerInfo& peer)>;

struct ConnectOptions {
  int streams = 8;  // data sockets besides the control socket per local NIC; 0 for control-only connections
  StreamOptions stream;
  int16_t railId = -1;  // the device's rail, sent in every hello (a fused device: each NIC's own)
  std::chrono::milliseconds strayTimeout{10000};
  SendCommFactory makeSendComm;
  RecvCommFactory makeRecvComm;
  // Fused devices: the local NICs. Empty means one NIC with railId above and no source binding. Data stream s
  // leaves from NIC s % nics and goes to the peer's listening address s % (its count); the control socket
  // uses NIC 0 and the peer's first address.
  std::vector<LocalNic> nics;
  // NICs behind the device that the handle and the hello announce to the peer (a fused verbs device's RDMA
  // ports, which share one control address); 0 means 1. The peer reads it as PeerInfo::nicCount.
  uint16_t nicCount = 0;
  // Sent in the control socket's hello: what this (connecting, sending) side asks of the receiver (kFeature*).
  uint32_t features = 0;
};

// Data streams a connection opens: `streams` per local NIC, at most kMaxStreams.
int dataStreamCount(const ConnectOptions& options);

class HandshakeListener final : public ListenComm {
 public:
  HandshakeListener(const SocketAddress& address, const ConnectOptions& options, Handle* handle);
  // A fused device: one listening socket per NIC (port 0 in each address picks one); data stream s of a
  // connection must arrive on listener s % addresses.size(), the control socket on the first.
  HandshakeListener(const std::vector<ListenAddress>& addresses, const ConnectOptions& options, Handle* handle);
  void accept(std::unique_ptr<RecvComm>* comm) override;

 private:
  struct Arrival {  // an accepted socket whose hello is not complete yet
    Fd fd;
    size_t listener = 0;
    SocketAddress peer;
    Hello hello{};
    size_t helloBytes = 0;
    std::chrono::steady_clock::time_point since;
  };
  struct Group {  // the sockets of one connection, gathered until all are there
    Fd control;
    std::vector<Fd> data;
    int present = 0;
    PeerInfo peer;
  };

  void acceptArrivals();
  void acceptArrivals(size_t listener);
  // True when the arrival is finished with (accepted into a group, or rejected).
  bool readHello(Arrival& arrival);
  void reject(Arrival& arrival, const char* why);
  void dropOldestArrival(const char* why);
  // Incomplete groups one of whose sockets was closed by the peer (its process died mid-connect) are dropped, so
  // they hold no descriptor until the listen comm closes.
  bool abandoned(const Group& group) const;
  void dropAbandonedGroups();

  // Connections accepted and waiting for their hello, at most; a new one beyond this drops the oldest. Each costs a
  // descriptor and one Arrival until RAILNET_STRAY_TIMEOUT_MS (docs/security.md).
  static constexpr size_t kMaxArrivals = 1024;
  static constexpr uint64_t kRejectionsWarned = 10;
  // Out of descriptors: this many waiting connections are dropped at once, room for a comm's sockets and threads.
  static constexpr size_t kDescriptorReserve = 32;

  std::vector<Fd> listeners_;  // [i] listens on the device's i-th NIC
  SocketAddress address_;       // the first listener's
  ConnectOptions options_;
  uint64_t secret_[2];
  std::vector<Arrival> arrivals_;  // oldest first
  uint64_t rejected_ = 0;
  std::map<uint64_t, Group> groups_;
};

// One step of connect(): starts a connection described by `handle` or advances the one in progress.
// Leaves *comm empty until every socket is connected and has sent its hello.
void connectStep(Handle* handle, const ConnectOptions& options, std::unique_ptr<SendComm>* comm);

}  // namespace railnet::protocol
