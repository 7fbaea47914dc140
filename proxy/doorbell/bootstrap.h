// The unique-id bootstrap of a doorbell context (issue 15, NVSHMEM's UID mode): rank 0 makes a unique id that
// names a listening socket of its own; the application hands the id to every rank by its own means (MPI_Bcast, a
// file, torch.distributed); every rank then connects there, and rank 0 returns everyone's blob to everyone (an
// all-gather of fixed-size blobs: here, each rank's one-sided listen handle). No NCCL involved.
//
// Wire: each rank sends a 24-byte hello {magic, rank, nranks, blob bytes, secret} and its blob; rank 0 checks the
// secret the id carries (a stray connection is closed and logged, as the transports do), waits for all, then sends
// the nranks blobs in rank order to each. Every step has a deadline: a rank that never comes fails init with the
// ranks still missing named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "proxy/protocol/socket.h"

namespace railnet::doorbell {

// What the application passes around: 128 bytes, opaque to it.
struct UniqueId {
  char bytes[128];
};

// Rank 0's listening socket and the id's secret, from makeUniqueId until rank 0's allGather has run.
class BootstrapRoot {
 public:
  BootstrapRoot(protocol::Fd listen, uint64_t secret) : listen_(std::move(listen)), secret_(secret) {}
  int fd() const { return listen_.get(); }
  uint64_t secret() const { return secret_; }

 private:
  protocol::Fd listen_;
  uint64_t secret_;
};

// Rank 0, before handing out the id: listens on `address` (port 0 picks one) and fills *id. The root must stay
// alive until rank 0's allGather has run.
std::unique_ptr<BootstrapRoot> makeUniqueId(const protocol::SocketAddress& address, UniqueId* id);

// Every rank, rank 0 included (rank 0 passes the root it made, the others nullptr): contributes `blob` (the same
// size on every rank) and returns every rank's, in rank order. Throws railnet::Error (naming the missing ranks, or
// the stray connection's address) when `timeoutMs` passes.
std::vector<std::vector<char>> allGather(const UniqueId& id, BootstrapRoot* root, int rank, int nranks,
                                         const std::vector<char>& blob, int timeoutMs);

}  // namespace railnet::doorbell
