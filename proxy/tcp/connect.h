// Establishing railnet TCP connections without blocking: the listener (accept side) and the connect state
// machine whose progress NCCL drives by calling connect() again with the same handle.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "proxy/tcp/socket.h"
#include "proxy/tcp/wire.h"
#include "proxy/transport.h"

namespace railnet::tcp {

// What a transport builds once all sockets of a connection are there: the TCP transport moves its data over
// them; the verbs transport keeps only the control socket, to exchange QP details and clear-to-sends.
using SendCommFactory = std::function<std::unique_ptr<SendComm>(Fd control, std::vector<Fd> data, const SocketAddress& peer)>;
using RecvCommFactory = std::function<std::unique_ptr<RecvComm>(Fd control, std::vector<Fd> data, const SocketAddress& peer)>;

// One local NIC of a device; a fused (virtual) device has several, its "lanes".
struct LocalLane {
  SocketAddress bind;  // source address for connections; length 0 lets the kernel choose
  int16_t railId = -1;
};

// What the handshake told about the other end, for comms that count traffic per NIC and cross-rail.
struct PeerInfo {
  SocketAddress peer;
  int16_t controlRail = -1;        // rail of the peer's NIC at the control socket
  std::vector<int16_t> dataRails;  // the same per data stream
  int nicCount = 1;                // the peer device's ConnectOptions::nicCount (at least 1)
};
using SendCommFactoryWithPeer =
    std::function<std::unique_ptr<SendComm>(Fd control, std::vector<Fd> data, const PeerInfo& peer)>;
using RecvCommFactoryWithPeer =
    std::function<std::unique_ptr<RecvComm>(Fd control, std::vector<Fd> data, const PeerInfo& peer)>;

struct ConnectOptions {
  int streams = 8;  // data sockets besides the control socket per local lane; 0 for control-only connections
  StreamOptions stream;
  int16_t railId = -1;  // the device's rail, sent in every hello (a fused device: each lane's own)
  std::chrono::milliseconds strayTimeout{10000};
  SendCommFactory makeSendComm;
  RecvCommFactory makeRecvComm;
  // Fused devices: the local NICs. Empty means one lane with railId above and no source binding. Data stream s
  // leaves from lane s % lanes and goes to the peer's listening address s % (its count); the control socket
  // uses lane 0 and the peer's first address.
  std::vector<LocalLane> lanes;
  // NICs behind the device that the handle and the hello announce to the peer (a fused verbs device's RDMA
  // ports, which share one control address); 0 means 1. The peer reads it as PeerInfo::nicCount.
  uint16_t nicCount = 0;
  // When set, preferred over makeSendComm / makeRecvComm: the same with the peer's rails.
  SendCommFactoryWithPeer makeSendCommWithPeer;
  RecvCommFactoryWithPeer makeRecvCommWithPeer;
};

// Data streams a connection opens: `streams` per local lane, at most kMaxStreams.
int dataStreamCount(const ConnectOptions& options);

class TcpListenComm final : public ListenComm {
 public:
  TcpListenComm(const SocketAddress& address, const ConnectOptions& options, Handle* handle);
  // A fused device: one listening socket per NIC (port 0 in each address picks one); data stream s of a
  // connection must arrive on listener s % addresses.size(), the control socket on the first.
  TcpListenComm(const std::vector<LaneAddress>& addresses, const ConnectOptions& options, Handle* handle);
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

  std::vector<Fd> listeners_;  // [i] listens on the device's i-th NIC
  SocketAddress address_;       // the first listener's
  ConnectOptions options_;
  uint64_t secret_[2];
  std::vector<Arrival> arrivals_;
  std::map<uint64_t, Group> groups_;
};

// One step of connect(): starts a connection described by `handle` or advances the one in progress.
// Leaves *comm empty until every socket is connected and has sent its hello.
void connectStep(Handle* handle, const ConnectOptions& options, std::unique_ptr<SendComm>* comm);

// Decodes the (first) listen address from a handle; throws ncclInvalidUsage on a malformed handle.
SocketAddress handleAddress(const Handle& handle);

}  // namespace railnet::tcp
