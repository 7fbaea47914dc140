// The helper pool's placement of data streams (proxy/progress/engine.h) and a stream giving queued chunks to an
// idle sibling (proxy/tcp/stream.h), on real sockets and the real helper threads.
#include <catch2/catch.hpp>

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <memory>
#include <vector>

#include "proxy/progress/engine.h"
#include "proxy/tcp/stream.h"

using railnet::progress::Engine;
using railnet::progress::EventSource;
using railnet::protocol::Fd;
using railnet::tcp::SendOp;
using railnet::tcp::Stream;
using railnet::tcp::StreamOwner;

namespace {

// An idle source: an fd with nothing to do, and the key it is told to carry.
class KeyedSource final : public EventSource {
 public:
  explicit KeyedSource(uint64_t key) : key_(key) {
    int fds[2];
    REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
    mine_ = Fd(fds[0]);
    other_ = Fd(fds[1]);
  }
  int fd() const noexcept override { return mine_.get(); }
  uint64_t progress() noexcept override { return 0; }
  void markReady(bool, bool) noexcept override {}
  void failWith(const char*, int) noexcept override {}
  uint64_t affinityKey() const noexcept override { return key_; }

 private:
  uint64_t key_;
  Fd mine_;
  Fd other_;
};

class NoOwner final : public StreamOwner {
 public:
  char* resolveChunk(const railnet::protocol::ChunkHeader&) noexcept override { return nullptr; }
  void chunkReceived(const railnet::protocol::ChunkHeader&) noexcept override {}
  void streamFailed(int, const char*, int, bool) noexcept override {}
};

}  // namespace

TEST_CASE("streams spread over the least-loaded helpers and both ends of a connection share one", "[engine]") {
  std::shared_ptr<Engine> engine = Engine::acquire();
  std::vector<std::unique_ptr<KeyedSource>> sources;
  for (uint64_t key = 1; key <= 4; ++key) sources.push_back(std::make_unique<KeyedSource>(key * 1000 + 1));
  for (auto& source : sources) engine->attach(source.get());
  // A second end of each connection lands where the first is, whatever the load. Attached in reverse order, so
  // spreading by load alone would put them elsewhere whenever there are two or more helpers.
  std::vector<std::unique_ptr<KeyedSource>> partners;
  for (uint64_t key = 4; key >= 1; --key) partners.push_back(std::make_unique<KeyedSource>(key * 1000 + 1));
  for (auto& partner : partners) engine->attach(partner.get());
  for (size_t i = 0; i < sources.size(); ++i) CHECK(partners[3 - i]->helper() == sources[i]->helper());
  // Unkeyed sources go to the helpers serving the fewest: two of them never share one while another is free.
  KeyedSource first(0);
  KeyedSource second(0);
  engine->attach(&first);
  engine->attach(&second);
  CHECK(first.helper() >= 0);
  if (sources[0]->helper() != sources[1]->helper()) CHECK(first.helper() != second.helper());
  for (auto* source : {&first, &second}) engine->detach(source);
  for (auto& source : sources) engine->detach(source.get());
  for (auto& partner : partners) engine->detach(partner.get());
}

TEST_CASE("a stream gives away its oldest queued chunk only while another stays queued", "[engine]") {
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds) == 0);
  int small = 4096;
  REQUIRE(setsockopt(fds[0], SOL_SOCKET, SO_SNDBUF, &small, sizeof(small)) == 0);
  Fd peer(fds[1]);  // never read: the stream's helper stays stuck in its first chunk
  NoOwner owner;
  Stream stream{Fd(fds[0]), &owner, 0};
  std::shared_ptr<Engine> engine = Engine::acquire();
  engine->attach(&stream);
  constexpr uint64_t kChunk = 1 << 20;
  std::vector<char> data(4 * kChunk, 'x');
  std::atomic<int> pending{4};
  for (int i = 0; i < 4; ++i) {
    SendOp op{};
    op.header.offset = i * kChunk;
    op.header.length = kChunk;
    op.data = data.data() + i * kChunk;
    op.pending = &pending;
    stream.enqueue(op);
  }
  // The helper takes the first chunk (a pass's budget) and blocks on the full socket; chunks 1-3 stay queued.
  // Bytes reaching the peer say it has taken it.
  pollfd readable{peer.get(), POLLIN, 0};
  REQUIRE(poll(&readable, 1, 10000) == 1);
  SendOp given{};
  REQUIRE(stream.giveQueuedChunk(&given));
  CHECK(given.header.offset == kChunk);
  REQUIRE(stream.giveQueuedChunk(&given));
  CHECK(given.header.offset == 2 * kChunk);
  CHECK_FALSE(stream.giveQueuedChunk(&given));  // the last one stays for its own helper
  CHECK(stream.queuedBytes() == 2 * kChunk);
  CHECK(pending.load() == 4);
  engine->detach(&stream);
}
