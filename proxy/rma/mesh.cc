#include "proxy/rma/mesh.h"

#include <chrono>
#include <string>
#include <thread>

#include "base/clock.h"
#include "railnet/log.h"

namespace railnet::rma {

RmaListen::RmaListen(Transport& transport, int dev, void* handle)
    : transport_(transport), dev_(dev), listen_(transport.listen(dev, handle)) {}

namespace {

// One connection of ours to a peer's listen, until its hello has gone.
struct OutgoingConnection {
  int rank = -1;
  Lane lane = Lane::kControl;
  std::vector<char> handle;  // our copy: NCCL's connect may keep state in the handle buffer
  std::unique_ptr<SendComm> comm;
  ControlRecord hello;
  std::unique_ptr<MemoryRegion> region;
  Request* request = nullptr;
  bool sent = false;
};

// One connection a peer made to our listen, until its hello says who and which lane.
struct IncomingConnection {
  std::unique_ptr<RecvComm> comm;
  ControlRecord hello;
  std::unique_ptr<MemoryRegion> region;
  Request* request = nullptr;
};

void check(ncclResult_t result, const char* what, int rank) {
  if (result != ncclSuccess) fail(result, "NET/railnet: one-sided: %s with rank %d failed", what, rank);
}

constexpr int64_t kWaitLogNs = 30'000'000'000LL;  // says what it waits for every 30 s

const char* laneName(Lane lane) { return lane == Lane::kControl ? "control" : "data"; }

}  // namespace

std::vector<PeerLinks> connectMesh(RmaListen& listen, void* const* handles, int nranks, int rank) {
  std::vector<PeerLinks> links(static_cast<size_t>(nranks));
  // Held by pointer: each posts a send or receive of its own hello record, which must not move.
  std::vector<std::unique_ptr<OutgoingConnection>> outgoing;
  for (int peer = 0; peer < nranks; ++peer) {
    for (Lane lane : {Lane::kControl, Lane::kData}) {
      auto connection = std::make_unique<OutgoingConnection>();
      connection->rank = peer;
      connection->lane = lane;
      const char* handle = static_cast<const char*>(handles[peer]);
      connection->handle.assign(handle, handle + NCCL_NET_HANDLE_MAXSIZE);
      connection->hello.kind = RecordKind::kHello;
      connection->hello.sequence = static_cast<uint32_t>(rank);
      connection->hello.window = static_cast<uint32_t>(lane);
      connection->hello.size = static_cast<uint64_t>(nranks);
      outgoing.push_back(std::move(connection));
    }
  }
  std::vector<std::unique_ptr<IncomingConnection>> incoming;
  int identified = 0;
  int64_t nextLog = monotonicNs() + kWaitLogNs;
  while (true) {
    bool progressed = false;
    size_t sent = 0;
    for (auto& pending : outgoing) {
      OutgoingConnection& connection = *pending;
      if (!connection.comm) {
        listen.transport().connect(listen.dev(), connection.handle.data(), &connection.comm);
        if (!connection.comm) continue;
        connection.region = connection.comm->regMr(&connection.hello, sizeof connection.hello, NCCL_PTR_HOST);
        progressed = true;
      }
      if (connection.request == nullptr) {
        check(connection.comm->isend(&connection.hello, sizeof connection.hello, kMeshTag, connection.region.get(),
                                     &connection.request),
              "sending the hello", connection.rank);
        if (connection.request == nullptr) continue;
      }
      if (!connection.sent) {
        int done = 0;
        check(connection.request->test(&done, nullptr), "sending the hello", connection.rank);
        connection.sent = done != 0;
        progressed = progressed || connection.sent;
      }
      sent += connection.sent ? 1 : 0;
    }
    std::unique_ptr<RecvComm> accepted;
    listen.listenComm().accept(&accepted);
    if (accepted) {
      auto connection = std::make_unique<IncomingConnection>();
      connection->comm = std::move(accepted);
      connection->region = connection->comm->regMr(&connection->hello, sizeof connection->hello, NCCL_PTR_HOST);
      incoming.push_back(std::move(connection));
      progressed = true;
    }
    for (auto& pending : incoming) {
      IncomingConnection& connection = *pending;
      if (!connection.comm) continue;  // identified and handed to its peer
      if (connection.request == nullptr) {
        void* data = &connection.hello;
        size_t size = sizeof connection.hello;
        int tag = kMeshTag;
        MemoryRegion* region = connection.region.get();
        check(connection.comm->irecv(1, &data, &size, &tag, &region, &connection.request), "receiving a hello", -1);
        if (connection.request == nullptr) continue;
      }
      int done = 0;
      check(connection.request->test(&done, nullptr), "receiving a hello", -1);
      if (!done) continue;
      const ControlRecord& hello = connection.hello;
      const uint32_t peerRank = hello.sequence;
      const auto lane = static_cast<Lane>(hello.window);
      if (!malformedReason(hello).empty() || hello.kind != RecordKind::kHello || peerRank >= links.size() ||
          hello.size != static_cast<uint64_t>(nranks) || (lane != Lane::kControl && lane != Lane::kData)) {
        fail(ncclRemoteError, "NET/railnet: one-sided connect: a connection to rank %d's listen sent a bad hello (rank %u, "
             "%llu ranks, lane %u; this mesh has %d ranks)", rank, peerRank,
             static_cast<unsigned long long>(hello.size), hello.window, nranks);
      }
      PeerLinks& peer = links[peerRank];
      std::unique_ptr<RecvComm>& slot = lane == Lane::kControl ? peer.controlRecv : peer.dataRecv;
      if (slot) fail(ncclRemoteError, "NET/railnet: one-sided connect: rank %u opened two %s connections", peerRank, laneName(lane));
      connection.region.reset();
      slot = std::move(connection.comm);
      ++identified;
      progressed = true;
    }
    if (sent == outgoing.size() && identified == 2 * nranks) break;
    if (!progressed) std::this_thread::sleep_for(std::chrono::microseconds(50));
    if (monotonicNs() > nextLog) {
      nextLog = monotonicNs() + kWaitLogNs;
      std::string waiting;
      for (const auto& connection : outgoing) {
        if (!connection->sent) waiting += " to " + std::to_string(connection->rank) + "/" + laneName(connection->lane);
      }
      for (size_t peer = 0; peer < links.size(); ++peer) {
        if (!links[peer].controlRecv) waiting += " from " + std::to_string(peer) + "/control";
        if (!links[peer].dataRecv) waiting += " from " + std::to_string(peer) + "/data";
      }
      RN_WARN("NET/railnet: one-sided connect of rank %d still waits for connections:%s", rank, waiting.c_str());
    }
  }
  for (auto& connection : outgoing) {
    connection->region.reset();
    PeerLinks& peer = links[static_cast<size_t>(connection->rank)];
    (connection->lane == Lane::kControl ? peer.controlSend : peer.dataSend) = std::move(connection->comm);
  }
  return links;
}

}  // namespace railnet::rma
