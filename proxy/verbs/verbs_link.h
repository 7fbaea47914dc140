// What a verbs send comm and recv comm share: the TCP control socket (QP handshake, clear-to-sends, oversize
// notices, and the fastest sign that the peer process is gone) and the connection's QPs and CQ.
#pragma once

#include <memory>

#include "proxy/nic_counters.h"
#include "proxy/tcp/connection.h"
#include "proxy/verbs/queue_pairs.h"

namespace railnet::verbs {

class VerbsLink final : public QpEventSink {
 public:
  // Creates the QPs (INIT) and sends our QP record. Throws railnet::Error.
  VerbsLink(std::shared_ptr<VerbsDevice> device, tcp::Fd control, const tcp::SocketAddress& peer,
            const char* direction, const QpOptions& options);

  // Advances the QP handshake; true once the QPs are at RTS. Caller holds the comm's lock. A failure is
  // recorded on control() and reported by the caller.
  bool ready();

  tcp::Connection& control() { return control_; }
  QueuePairs& qps() { return qps_; }
  VerbsDevice& device() { return *device_; }
  // The port's traffic counters (proxy/nic_counters.h), shared by every link on the port.
  NicCounters& counters() { return *counters_; }
  std::shared_ptr<VerbsDevice> devicePtr() const { return device_; }

  // A QP of this link hit a fatal asynchronous error (async-event thread): fails the connection's requests.
  void onQpAsyncError(const std::string& what) noexcept override;

  // Names a failed work completion for the failure record: QP, opcode, status, vendor error.
  std::string describe(const ibv_wc& completion) const;

  // Takes every finished work request off the CQ: failures are recorded, successes go to onSuccess.
  template <class OnSuccess>
  void drainCompletions(OnSuccess&& onSuccess) {
    ibv_wc completions[32];
    for (;;) {
      int count = ibv_poll_cq(qps_.cq(), 32, completions);
      if (count < 0) {
        control_.recordFailure("ibv_poll_cq failed");
        return;
      }
      for (int i = 0; i < count; ++i) {
        if (completions[i].status == IBV_WC_SUCCESS) {
          onSuccess(completions[i]);
        } else {
          control_.recordFailure(describe(completions[i]));
        }
      }
      if (count < 32) return;
    }
  }

 private:
  std::shared_ptr<VerbsDevice> device_;
  tcp::Connection control_;
  QueuePairs qps_;
  bool ready_ = false;
  NicCounters* counters_;
};

}  // namespace railnet::verbs
