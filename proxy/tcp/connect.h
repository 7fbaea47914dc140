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

struct ConnectOptions {
  int streams = 8;  // data sockets besides the control socket; 0 for control-only connections
  StreamOptions stream;
  int16_t railId = -1;
  std::chrono::milliseconds strayTimeout{10000};
  SendCommFactory makeSendComm;
  RecvCommFactory makeRecvComm;
};

class TcpListenComm final : public ListenComm {
 public:
  TcpListenComm(const SocketAddress& address, const ConnectOptions& options, Handle* handle);
  void accept(std::unique_ptr<RecvComm>* comm) override;

 private:
  struct Arrival {  // an accepted socket whose hello is not complete yet
    Fd fd;
    SocketAddress peer;
    Hello hello{};
    size_t helloBytes = 0;
    std::chrono::steady_clock::time_point since;
  };
  struct Group {  // the sockets of one connection, gathered until all are there
    Fd control;
    std::vector<Fd> data;
    int present = 0;
    SocketAddress peer;
  };

  void acceptArrivals();
  // True when the arrival is finished with (accepted into a group, or rejected).
  bool readHello(Arrival& arrival);
  void reject(Arrival& arrival, const char* why);

  Fd listener_;
  SocketAddress address_;
  ConnectOptions options_;
  uint64_t secret_[2];
  std::vector<Arrival> arrivals_;
  std::map<uint64_t, Group> groups_;
};

// One step of connect(): starts a connection described by `handle` or advances the one in progress.
// Leaves *comm empty until every socket is connected and has sent its hello.
void connectStep(Handle* handle, const ConnectOptions& options, std::unique_ptr<SendComm>* comm);

// Decodes the listen address from a handle; throws ncclInvalidUsage on a malformed handle.
SocketAddress handleAddress(const Handle& handle);

}  // namespace railnet::tcp
