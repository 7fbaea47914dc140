#include "plugin/tools/raw_tcp.h"

#include <algorithm>
#include <functional>
#include <memory>

namespace railnet::bench {

RawTcpPeer::RawTcpPeer(int streams, int window, BenchBuffers& buffers, StallGuard& guard)
    : buffers_(buffers), guard_(guard), window_(window) {
  guard.setPhase("raw TCP connect");
  pairs_ = connectLoopbackPairs(streams, "raw TCP");
  backPairs_ = connectLoopbackPairs(streams, "raw TCP");
}

int RawTcpPeer::streamsFor(size_t size) const noexcept {
  return static_cast<int>(std::min<size_t>(pairs_.size(), std::max<size_t>(size, 1)));
}

void RawTcpPeer::addStreamTasks(const std::vector<SocketPair>& pairs, const HostBuffer& source,
                                HostBuffer& destination, size_t size, uint64_t count,
                                std::vector<std::unique_ptr<MessageCredit>>* credits,
                                std::vector<std::function<void()>>* tasks) {
  const int used = streamsFor(size);
  for (int j = 0; j < used; ++j) {
    credits->push_back(std::make_unique<MessageCredit>());
    MessageCredit& credit = *credits->back();
    const auto [begin, length] = sliceOf(size, j, used);
    const int senderFd = pairs[static_cast<size_t>(j)].sender.fd();
    const int receiverFd = pairs[static_cast<size_t>(j)].receiver.fd();
    std::byte* from = source.data();
    std::byte* to = destination.data();

    tasks->emplace_back([=, this, &credit] {
      const std::string who = format("raw TCP sender %d", j);
      for (uint64_t i = 0; i < count; ++i) {
        credit.waitToStart(i, window_, guard_, who.c_str());
        sendAll(guard_, senderFd, from + buffers_.slotOffset(size, i) + begin, length, "raw TCP sender");
      }
    });
    tasks->emplace_back([=, this, &credit] {
      for (uint64_t i = 0; i < count; ++i) {
        recvAll(guard_, receiverFd, to + buffers_.slotOffset(size, i) + begin, length, "raw TCP receiver");
        credit.complete(i + 1);
      }
    });
  }
}

double RawTcpPeer::stream(size_t size, uint64_t count) {
  std::vector<std::unique_ptr<MessageCredit>> credits;
  std::vector<std::function<void()>> tasks;
  addStreamTasks(pairs_, buffers_.send.host(), buffers_.recv.host(), size, count, &credits, &tasks);
  return runTogether(guard_, tasks);
}

double RawTcpPeer::streamBothWays(size_t size, uint64_t count) {
  std::vector<std::unique_ptr<MessageCredit>> credits;
  std::vector<std::function<void()>> tasks;
  addStreamTasks(pairs_, buffers_.send.host(), buffers_.recv.host(), size, count, &credits, &tasks);
  addStreamTasks(backPairs_, buffers_.echoSend.host(), buffers_.echoRecv.host(), size, count, &credits, &tasks);
  return runTogether(guard_, tasks);
}

double RawTcpPeer::pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) {
  const int initiatorFd = pairs_.front().sender.fd();
  const int echoFd = pairs_.front().receiver.fd();
  halfRttUs->reserve(halfRttUs->size() + count);
  auto initiator = [&] {
    for (uint64_t i = 0; i < count; ++i) {
      double start = now();
      sendAll(guard_, initiatorFd, buffers_.send.host().data(), size, "raw TCP ping send");
      recvAll(guard_, initiatorFd, buffers_.echoRecv.host().data(), size, "raw TCP pong recv");
      halfRttUs->push_back((now() - start) * 1e6 / 2);
    }
  };
  auto echo = [&] {
    for (uint64_t i = 0; i < count; ++i) {
      recvAll(guard_, echoFd, buffers_.recv.host().data(), size, "raw TCP ping recv");
      sendAll(guard_, echoFd, buffers_.echoSend.host().data(), size, "raw TCP pong send");
    }
  };
  return runTogether(guard_, {initiator, echo});
}

}  // namespace railnet::bench
