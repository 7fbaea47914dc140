// The receiving end of a railnet TCP connection. irecv publishes each posted buffer to the sender in a
// clear-to-send frame; data then arrives inline on the control channel (read by the calling thread) or as
// self-describing chunks on the data streams (read by helper threads straight into the posted buffer). A buffer
// in GPU memory is announced as staged: its chunks land in the comm's pinned slots (landing ring), and this
// comm's driving thread copies each finished piece up with the copy engines; the receive completes when the
// last copy has.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "proxy/protocol/control_channel.h"
#include "proxy/protocol/receive_ring.h"
#include "proxy/protocol/request_pool.h"
#include "proxy/progress/watchdog.h"
#include "proxy/staging/landing_ring.h"
#include "proxy/staging/telemetry.h"
#include "proxy/tcp/data_streams.h"
#include "proxy/tcp/gpu_staging.h"
#include "proxy/transport.h"

namespace railnet::tcp {

class TcpRecvComm;

class RecvRequest final : public protocol::CommRequest<TcpRecvComm, RecvRequest>, public protocol::PostedReceive {
 public:
  // Bit i: buffer i is GPU memory, landed through staging. Set before the clear-to-send leaves.
  std::atomic<uint8_t> stagedBuffers{0};
  uint64_t serial = 0;            // which receive this is (entries are reused); under the comm's lock
  progress::ProgressMark watch;  // the watchdog's; under the comm's lock
};

class TcpRecvComm final : public RecvComm, private StreamOwner, private progress::Watched {
 public:
  // sendDoneFrames: the sender asked for delivered completion (wire.h kFeatureDeliveredCompletion): each buffer
  // completed by data-stream chunks sends it a done frame.
  // resume: the sender asked for a resumable control channel (wire.h kFeatureResume).
  // dataFailover: the sender sends a failed NIC's chunks again (wire.h kFeatureDataFailover): a failed data stream
  // is not the connection's end, and chunks of receives already finished are dropped.
  TcpRecvComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer, const NicLayout& layout = {},
              bool sendDoneFrames = false, const protocol::ResumeOptions* resume = nullptr, bool dataFailover = false);
  ~TcpRecvComm() override;

  ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                     Request** request) noexcept override;
  ncclResult_t iflush(int n, void** data, const int* sizes, MemoryRegion** mrs, Request** request) noexcept override;
  void expectIdleReceives() noexcept override { idleReceivesExpected_.store(true, std::memory_order_relaxed); }

 private:
  friend class protocol::CommRequest<TcpRecvComm, RecvRequest>;
  MemoryRegistrar& registrar() noexcept override;
  using Ring = protocol::ReceiveRing<RecvRequest>;

  ncclResult_t testRequest(RecvRequest* request, int* done, int* sizes) noexcept;
  // Reads inline and oversize frames and flushes clear-to-sends. Caller holds mutex_.
  void pumpControl();
  bool startFrame();
  // Parses frames and inline payload already in the staging buffer; false on a protocol error (recorded).
  bool consumeBuffered();
  void finishInline();
  bool peerGone() const;
  // Copies landed pieces up and completes what they finish. Caller holds mutex_.
  void pumpStaging();
  // The watchdog's look (proxy/progress/watchdog.h): a receive with no new byte for the limit gets one WARN with
  // everything that could hold it.
  void watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept override;
  void watchPeerHost(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept override;
  void describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept override;
  std::string describeReceive(const RecvRequest& request) const;  // holds mutex_
  std::string stagingState();                               // holds mutex_
  // A chunk for a staged buffer: where in the landing slots, or retryLater() / nullptr (failure recorded).
  char* landStagedChunk(RecvRequest* entry, const protocol::ChunkHeader& header) noexcept;

  char* resolveChunk(const protocol::ChunkHeader& header) noexcept override;
  void chunkReceived(const protocol::ChunkHeader& header) noexcept override;
  void chunkAbandoned(const protocol::ChunkHeader& header) noexcept override;
  // Delivered completion: tells the sender that buffer `slot` of receive `recvId` has all its bytes. Any thread.
  // At most one per buffer in flight is ever queued, far less than a socket buffer holds, so it leaves at once or
  // with the next flush.
  void sendDone(uint32_t recvId, int slot);
  void streamFailed(int streamIndex, const char* why, int err, bool endOfStream) noexcept override;
  // Failback: the sender made data stream `stream` again through a NIC that answers again (session service thread).
  void streamRejoined(int stream, Fd socket, uint32_t failure) noexcept;
  std::vector<uint32_t> nicRecovered_;  // guarded by mutex_: per NIC, the sender's failure count its streams recovered from

  protocol::ControlChannel control_;
  const bool sendDoneFrames_;
  // Every stream and the control socket gone at once may be the sender's NICs failing, not its end (it probes them,
  // or moves to another NIC): only the control channel's resume limit judges the sender gone.
  const bool dataFailover_;
  int nics_ = 1;                                  // local NICs the data streams spread over (stream s: NIC s % nics_)
  std::vector<std::string> nicNames_;
  std::atomic<uint64_t> failedNics_{0};           // bit n: a stream of NIC n failed (WARNed once per NIC)
  CommStaging staging_{"receive"};
  staging::LandingRing landing_;
  DataStreams streams_;
  Ring ring_;                  // posted receives; see receive_ring.h for its threading
  std::mutex mutex_;
  protocol::FrameHeader frame_{};  // frame whose payload is being read from the control channel
  char* inlineDestination_ = nullptr;
  uint64_t inlineLeft_ = 0;
  bool inInline_ = false;
  uint64_t inputGeneration_ = 0;  // guarded by mutex_: the control channel's, when frame_ was begun
  std::atomic<bool> controlClosed_{false};
  std::atomic<int> openStreams_;
  struct CopyingUp {
    staging::LandingRing::LandedPiece landed;
    staging::StagingTelemetry::Clock::time_point submittedAt;
  };
  std::deque<CopyingUp> copyingUp_;  // guarded by mutex_: in the copy queue, in order
  staging::StagingTelemetry telemetry_;  // guarded
  std::atomic<uint64_t> slotWaits_{0};   // chunks a helper found a busy landing slot for (retried later)
  std::vector<staging::LandingRing::LandedPiece> landedScratch_;  // guarded
  std::vector<uint64_t> finishedCopies_;                          // guarded
  uint64_t receives_ = 0;                                         // guarded: receives posted so far
  std::atomic<bool> idleReceivesExpected_{false};                 // expectIdleReceives()
  progress::WatchRegistration watchdog_;                          // last: reset first in the destructor
};

}  // namespace railnet::tcp
