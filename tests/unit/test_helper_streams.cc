// The helper pool's placement of data streams (proxy/progress/engine.h) and a stream giving queued chunks to an
// idle sibling (proxy/tcp/stream.h), on real sockets and the real helper threads.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
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
  void markReady(bool, bool, bool) noexcept override {}
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

// Receives chunks into one buffer at their offsets and records the order they completed in.
class BufferOwner final : public StreamOwner {
 public:
  explicit BufferOwner(size_t bytes) : buffer(bytes, 0) {}
  char* resolveChunk(const railnet::protocol::ChunkHeader& header) noexcept override {
    return header.offset + header.length <= buffer.size() ? buffer.data() + header.offset : nullptr;
  }
  void chunkReceived(const railnet::protocol::ChunkHeader& header) noexcept override {
    std::lock_guard<std::mutex> lock(mutex);
    completed.push_back(header.offset);
  }
  void streamFailed(int, const char* why, int, bool endOfStream) noexcept override {
    std::lock_guard<std::mutex> lock(mutex);
    failure = endOfStream ? "end of stream" : why;
  }
  size_t completedCount() {
    std::lock_guard<std::mutex> lock(mutex);
    return completed.size();
  }

  std::vector<char> buffer;
  std::mutex mutex;
  std::vector<uint64_t> completed;  // guarded by mutex
  std::string failure;              // guarded by mutex
};

}  // namespace

TEST_CASE("a receiving stream reassembles chunks however the bytes are split, headers read with payloads",
          "[engine]") {
  // Chunks of 0, 1, 31, 32, 33 and 100000 bytes back to back: the header of each next chunk arrives in the same
  // reads as the payload before it, split at every awkward point by writes of prime lengths.
  const std::vector<uint64_t> lengths{100000, 0, 1, 31, 32, 33, 4096, 0, 65536};
  const uint64_t total = std::accumulate(lengths.begin(), lengths.end(), uint64_t{0});
  std::vector<char> expected(total);
  for (uint64_t i = 0; i < total; ++i) expected[i] = static_cast<char>((i * 131 + 7) % 251);
  std::vector<char> wire;
  uint64_t offset = 0;
  for (uint64_t length : lengths) {
    railnet::protocol::ChunkHeader header{};
    header.messageSize = total;
    header.offset = offset;
    header.length = length;
    const char* raw = reinterpret_cast<const char*>(&header);
    wire.insert(wire.end(), raw, raw + sizeof(header));
    wire.insert(wire.end(), expected.begin() + static_cast<long>(offset),
                expected.begin() + static_cast<long>(offset + length));
    offset += length;
  }
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  Fd writer(fds[1]);
  REQUIRE(fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0);
  BufferOwner owner(total);
  Stream stream{Fd(fds[0]), &owner, 0};
  std::shared_ptr<Engine> engine = Engine::acquire();
  engine->attach(&stream);
  const size_t pieces[] = {1, 7, 29, 31, 33, 4099, 65537};
  size_t written = 0;
  for (size_t k = 0; written < wire.size(); ++k) {
    const size_t piece = std::min(pieces[k % std::size(pieces)], wire.size() - written);
    REQUIRE(write(writer.get(), wire.data() + written, piece) == static_cast<ssize_t>(piece));
    written += piece;
    if (k % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));  // let the helper read a piece
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (owner.completedCount() < lengths.size() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  engine->detach(&stream);
  std::lock_guard<std::mutex> lock(owner.mutex);
  CHECK(owner.failure.empty());
  REQUIRE(owner.completed.size() == lengths.size());
  offset = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    CHECK(owner.completed[i] == offset);
    offset += lengths[i];
  }
  CHECK(owner.buffer == expected);
}

TEST_CASE("a receiving stream sees the end of stream that arrived together with its last bytes", "[engine]") {
  // A sender killed while its kernel still holds unsent bytes (its receiver was behind) has the FIN ride on the
  // last data segment. One edge reports both; recvmsg returns the bytes short and consumes the FIN, so the next
  // read returns 0 with no new edge. A stream that takes every short read as "drained" never learns the peer is
  // gone, and a receive waiting on it never fails (conformance failure.killed_sender).
  Fd listener(socket(AF_INET, SOCK_STREAM, 0));
  REQUIRE(listener.valid());
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  REQUIRE(bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  REQUIRE(listen(listener.get(), 1) == 0);
  REQUIRE(getsockname(listener.get(), reinterpret_cast<sockaddr*>(&address), &length) == 0);
  Fd writer(socket(AF_INET, SOCK_STREAM, 0));
  REQUIRE(connect(writer.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0);
  Fd reader(accept(listener.get(), nullptr, nullptr));
  REQUIRE(reader.valid());
  REQUIRE(fcntl(reader.get(), F_SETFL, O_NONBLOCK) == 0);
  constexpr uint64_t kChunk = 1000;
  auto chunkAt = [&](uint64_t offset) {
    railnet::protocol::ChunkHeader header{};
    header.messageSize = 2 * kChunk;
    header.offset = offset;
    header.length = kChunk;
    std::vector<char> wire(sizeof(header) + kChunk, 'x');
    memcpy(wire.data(), &header, sizeof(header));
    return wire;
  };
  BufferOwner owner(2 * kChunk);
  Stream stream{std::move(reader), &owner, 0};
  std::shared_ptr<Engine> engine = Engine::acquire();
  engine->attach(&stream);
  // The first chunk leaves the helper having read its payload short, as "drained".
  const std::vector<char> first = chunkAt(0);
  REQUIRE(write(writer.get(), first.data(), first.size()) == static_cast<ssize_t>(first.size()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (owner.completedCount() < 1 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(owner.completedCount() == 1);
  // The second chunk and the FIN in one segment: corked, then shut down (the FIN is set on the unsent tail).
  int on = 1;
  REQUIRE(setsockopt(writer.get(), IPPROTO_TCP, TCP_CORK, &on, sizeof(on)) == 0);
  const std::vector<char> second = chunkAt(kChunk);
  REQUIRE(write(writer.get(), second.data(), second.size()) == static_cast<ssize_t>(second.size()));
  REQUIRE(shutdown(writer.get(), SHUT_WR) == 0);
  auto failure = [&] {
    std::lock_guard<std::mutex> lock(owner.mutex);
    return owner.failure;
  };
  while (failure().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  engine->detach(&stream);
  CHECK(owner.completedCount() == 2);
  CHECK(failure() == "end of stream");
}

TEST_CASE("a chunk told to retry later stays unread, with everything behind it, until the stream is resumed",
          "[engine]") {
  // The receive side of GPU staging: a chunk whose staging slot is busy must not be read (its bytes would have
  // nowhere to go) and must not let later chunks overtake it; resumeReceive() lets the stream read on.
  class HoldingOwner final : public StreamOwner {
   public:
    explicit HoldingOwner(size_t bytes) : buffer(bytes, 0) {}
    char* resolveChunk(const railnet::protocol::ChunkHeader& header) noexcept override {
      if (header.offset == heldOffset && holding.load()) {
        asked.fetch_add(1);
        return retryLater();
      }
      return buffer.data() + header.offset;
    }
    void chunkReceived(const railnet::protocol::ChunkHeader& header) noexcept override {
      std::lock_guard<std::mutex> lock(mutex);
      completed.push_back(header.offset);
    }
    void streamFailed(int, const char* why, int, bool) noexcept override {
      std::lock_guard<std::mutex> lock(mutex);
      failure = why;
    }
    size_t completedCount() {
      std::lock_guard<std::mutex> lock(mutex);
      return completed.size();
    }
    std::vector<char> buffer;
    uint64_t heldOffset = 0;
    std::atomic<bool> holding{true};
    std::atomic<int> asked{0};
    std::mutex mutex;
    std::vector<uint64_t> completed;
    std::string failure;
  };
  constexpr uint64_t kChunk = 50000;
  constexpr int kChunks = 4;
  std::vector<char> expected(kChunk * kChunks);
  for (size_t i = 0; i < expected.size(); ++i) expected[i] = static_cast<char>(i * 7 + 3);
  std::vector<char> wire;
  for (uint64_t c = 0; c < kChunks; ++c) {
    railnet::protocol::ChunkHeader header{};
    header.messageSize = expected.size();
    header.offset = c * kChunk;
    header.length = kChunk;
    const char* raw = reinterpret_cast<const char*>(&header);
    wire.insert(wire.end(), raw, raw + sizeof(header));
    wire.insert(wire.end(), expected.begin() + static_cast<long>(c * kChunk),
                expected.begin() + static_cast<long>((c + 1) * kChunk));
  }
  int fds[2];
  REQUIRE(socketpair(AF_UNIX, SOCK_STREAM, 0, fds) == 0);
  Fd writer(fds[1]);
  REQUIRE(fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0);
  HoldingOwner owner(expected.size());
  owner.heldOffset = kChunk;  // the second chunk
  Stream stream{Fd(fds[0]), &owner, 0};
  std::shared_ptr<Engine> engine = Engine::acquire();
  engine->attach(&stream);
  // A writer thread: the socket buffer may hold less than the whole wire while the stream is held.
  std::thread writing([&] {
    size_t written = 0;
    while (written < wire.size()) {
      const ssize_t n = write(writer.get(), wire.data() + written, wire.size() - written);
      if (n <= 0) break;
      written += static_cast<size_t>(n);
    }
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (owner.asked.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  REQUIRE(owner.asked.load() > 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the helper would read on now if it could
  CHECK(owner.completedCount() == 1);  // only the first chunk; nothing overtook the held one
  owner.holding.store(false);
  stream.resumeReceive();
  while (owner.completedCount() < kChunks && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  writing.join();
  engine->detach(&stream);
  std::lock_guard<std::mutex> lock(owner.mutex);
  CHECK(owner.failure.empty());
  REQUIRE(owner.completed.size() == kChunks);
  for (uint64_t c = 0; c < kChunks; ++c) CHECK(owner.completed[c] == c * kChunk);
  CHECK(owner.buffer == expected);
}

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
  // Staged chunks (pieces landing in a GPU receiver's slots) keep their stream, however long the backlog.
  for (int i = 0; i < 2; ++i) {
    SendOp op{};
    op.header.flags = railnet::protocol::kChunkStaged;
    op.header.offset = 4 * kChunk;
    op.header.length = 1;
    op.data = data.data();
    op.pending = &pending;
    stream.enqueue(op);
  }
  REQUIRE(stream.giveQueuedChunk(&given));  // chunk 3 is not staged
  CHECK(given.header.offset == 3 * kChunk);
  CHECK_FALSE(stream.giveQueuedChunk(&given));
  engine->detach(&stream);
}
