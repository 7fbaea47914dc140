// What railnet-bench measures, independent of the transport: railnet (through the plugin) and the raw TCP
// baseline both implement it, so the sweep measures them with the same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace railnet::bench {

class Peer {
 public:
  virtual ~Peer() = default;

  // Short label for tables and messages ("railnet", "raw TCP").
  virtual std::string name() const = 0;

  // Sends `count` messages of `size` bytes one way, from BenchBuffers::send slots into BenchBuffers::recv slots,
  // with the window of messages in flight the peer was built with. Returns the seconds from start until the
  // last message was received.
  virtual double stream(size_t size, uint64_t count) = 0;

  // Both directions at once, as all_reduce, all_gather, reduce_scatter and sendrecv load every rank's NIC:
  // `count` messages forward (send -> recv slots) and `count` back (echoSend -> echoRecv slots), each direction
  // with its own window. Returns the seconds until the last message of both directions was received.
  virtual double streamBothWays(size_t size, uint64_t count) = 0;

  // `count` round trips of `size` bytes (send -> recv, then echoSend -> echoRecv); appends each half round trip
  // in microseconds to `halfRttUs`. Returns the seconds the whole run took.
  virtual double pingPong(size_t size, uint64_t count, std::vector<double>* halfRttUs) = 0;
};

}  // namespace railnet::bench
