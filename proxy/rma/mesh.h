// The all-to-all connections of a GIN comm (NCCL's collective `connect`): to every rank, itself included, a
// control and a data connection of the transport, and every rank's two to us. The first message on each is a hello
// record (control_record.h) that tells the acceptor which rank and lane an accepted comm is.
#pragma once

#include <memory>
#include <vector>

#include "proxy/rma/control_record.h"
#include "proxy/transport.h"

namespace railnet::rma {

// Every message of the mesh, hellos included, carries this tag ("RM").
constexpr int kMeshTag = 0x524d;

// What NCCL's GIN listen returns: the transport's listen comm on one device.
class RmaListen {
 public:
  RmaListen(Transport& transport, int dev, void* handle);
  Transport& transport() const { return transport_; }
  int dev() const { return dev_; }
  ListenComm& listenComm() const { return *listen_; }

 private:
  Transport& transport_;
  int dev_;
  std::unique_ptr<ListenComm> listen_;
};

// One rank's four connections with this one.
struct PeerLinks {
  std::unique_ptr<SendComm> controlSend;
  std::unique_ptr<SendComm> dataSend;
  std::unique_ptr<RecvComm> controlRecv;
  std::unique_ptr<RecvComm> dataRecv;
};

// Collective: loops until every connection stands (says every 30 s which ranks it still waits for: a rank that has
// not reached connect yet), and returns them by rank. Throws railnet::Error naming the peer when one fails.
std::vector<PeerLinks> connectMesh(RmaListen& listen, void* const* handles, int nranks, int rank);

}  // namespace railnet::rma
