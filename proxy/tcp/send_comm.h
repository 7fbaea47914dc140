// The sending end of a railnet TCP connection. Receiver-driven: isend waits (returns a NULL request) until
// the receiver's clear-to-send for a buffer with the same tag has arrived, so every byte has a known home
// before it leaves. Small messages go inline on the control socket from the calling thread; larger ones
// are split into chunks that the engine's helper threads write on the data streams. A message from GPU memory,
// or to a receiver that lands it in staging, moves in pieces: each GPU piece is copied down into a pinned slot
// by the copy engines first, and staged pieces are numbered in the order their chunks are queued.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>

#include "proxy/protocol/clear_to_send.h"
#include "proxy/protocol/control_channel.h"
#include "proxy/protocol/held_group.h"
#include "proxy/protocol/request_pool.h"
#include "proxy/protocol/stripe_plan.h"
#include "proxy/progress/link_watch.h"
#include "proxy/progress/watchdog.h"
#include "proxy/staging/telemetry.h"
#include "proxy/tcp/data_streams.h"
#include "proxy/tcp/gpu_staging.h"
#include "proxy/transport.h"
#include "railnet/settings.h"

namespace railnet::tcp {

class TcpSendComm;

class SendRequest final : public protocol::CommRequest<TcpSendComm, SendRequest> {
 private:
  friend class TcpSendComm;
  std::atomic<int> pendingChunks_{0};
  std::atomic<uint64_t> sentBytes_{0};  // payload in the kernel's socket buffers so far (helper threads add)
  // RAILNET_SEND_COMPLETION=delivered, a send on the data streams: set until the receiver's done frame for buffer
  // slot_ of receive recvId_ has arrived.
  std::atomic<bool> awaitingDone_{false};
  uint32_t recvId_ = 0;
  int slot_ = 0;
  uint64_t size_ = 0;
  uint64_t serial_ = 0;            // which send this is (requests are reused): for the watchdog's report
  progress::ProgressMark watch_;  // guarded by the comm's mutex_
  // Rail failover (the comm's dataFailover_), guarded by the comm's mutex_: every chunk queued for this send and the
  // stream it went to, so that those of a failed NIC can be sent again; false for sends staged through GPU slots,
  // whose bytes are gone once a slot is reused.
  struct QueuedChunk {
    SendOp op;
    int stream;
  };
  std::vector<QueuedChunk> chunks_;
  bool resendable_ = true;
};

class TcpSendComm final : public SendComm, private StreamOwner, private progress::Watched {
 public:
  // resume: the control channel survives a broken socket (RAILNET_FAILOVER; protocol/control_channel.h).
  // delivered: sends complete on the receiver's done frames (RAILNET_SEND_COMPLETION). dataFailover: a NIC whose data
  // streams fail has their chunks sent again over the other NICs (needs delivered; wire.h kFeatureDataFailover).
  TcpSendComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer, NicLayout layout = {},
              const protocol::ResumeOptions* resume = nullptr, bool delivered = false, bool dataFailover = false);
  ~TcpSendComm() override;

  ncclResult_t isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept override;

 private:
  friend class protocol::CommRequest<TcpSendComm, SendRequest>;
  MemoryRegistrar& registrar() noexcept override;
  ncclResult_t testRequest(SendRequest* request, int* done, int* sizes) noexcept;
  // Turns buffered control bytes into posted receives (and, with delivered completion, done frames into completed
  // sends); false on a protocol error (recorded).
  bool parseClearToSends();
  // Reads clear-to-send frames and flushes queued control bytes. Caller holds mutex_.
  void pumpControl();
  // What every chunk of one message (or piece) carries, whichever stream takes it.
  struct ChunkTemplate {
    uint32_t recvId;
    int slot;
    uint64_t messageSize;
    uint8_t flags = 0;
    uint16_t pieceSeq = 0;
    std::atomic<int>* pending;
    std::atomic<int>* slotPending = nullptr;
    std::atomic<uint64_t>* sentBytes = nullptr;
    SendRequest* record = nullptr;  // rail failover: the send whose chunks are kept (QueuedChunk)
  };
  uint64_t chunkBytesFor(uint64_t bytes) const;
  // A fused device's send: planStripes over the NICs, each stripe chunked over its NIC's streams.
  void sendStriped(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot);
  // Queues bytes [offset, offset + bytes) of the message, found at `data`, in chunks of `chunk` on the
  // least-queued of streams first, first + step, ...
  void enqueueChunks(const ChunkTemplate& what, const char* data, uint64_t offset, uint64_t bytes, uint64_t chunk,
                     int first, int step);
  // Queues one chunk on the least-queued live stream among first, first + step, ... (any live stream when none of
  // those lives); returns the stream, kParked when no stream lives but the connection fails over (the chunk waits
  // for a NIC to answer again, or for the move), or -1 when no stream lives (the connection's failure is recorded).
  int placeChunk(const SendOp& op, int first, int step);
  static constexpr int kParked = -2;

  // ---- rail failover (docs/failover.md); caller holds mutex_ ----
  // NICs whose streams failed since the last call: their chunks of sends not yet delivered go again over the others.
  void sendAgainFromFailedNics();
  int nicOf(int stream) const { return stream % nics_; }
  bool nicAlive(int nic) const { return (failedNics_.load(std::memory_order_acquire) >> nic & 1) == 0; }
  // Bit n: NIC n is in the connection.
  uint64_t liveNics() const {
    return ~failedNics_.load(std::memory_order_acquire) & ((uint64_t{1} << nics_) - 1);
  }
  void cutIfDue(int stream, uint64_t bytes);  // RAILNET_FAULT_NIC_CUT
  // Failback (docs/failover.md): probes due NICs (the watchdog thread, holding mutex_); a stream made again or not
  // (the session service's thread).
  void probeFailedNics(std::chrono::steady_clock::time_point now);
  void streamRejoined(int stream, Fd socket) noexcept;
  uint32_t nicFailures_[protocol::kMaxStripeNics] = {};  // guarded by mutex_: per NIC, its failures so far (kNicFailed)
  void rejoinFailed(int stream, const std::string& why) noexcept;
  // The OS says a link changed (the link watch's thread): a NIC whose link went down is taken out at once, one whose
  // link came back is probed at once.
  void linkChanged(const std::string& interface, bool up) noexcept;
  std::string nicName(int nic) const {
    return static_cast<size_t>(nic) < nicNames_.size() ? nicNames_[static_cast<size_t>(nic)] : "NIC " + std::to_string(nic);
  }
  // Chunks recorded on the NICs of `nics` (a mask) for every send still waiting for its done frame go again over the
  // live streams; per NIC, the bytes are added to resent[nic]. Returns the sends touched (0 when no stream lives: the
  // failure is recorded).
  uint64_t sendChunksAgain(uint64_t nics, uint64_t resent[protocol::kMaxStripeNics]);
  // Every NIC of a fused device failed (allDown_): new sends wait, every failed NIC is probed at once, and the
  // connection fails when none answers within RAILNET_FAILOVER_RESUME_MS. Caller holds mutex_.
  void whileAllNicsDown(std::chrono::steady_clock::time_point now);
  // Adds the time NIC `nic` has been out of the connection to its counters (at failback, or the comm's close).
  void countDegraded(int nic, std::chrono::steady_clock::time_point now);

  // ---- a single-NIC device moving to another NIC and back (send_move.cc, docs/failover.md "Single-NIC devices");
  // caller holds mutex_ ----
  using Route = protocol::ControlChannel::Route;
  // Its NIC failed: new sends wait (moving_) until every data stream is made again over the path the re-made control
  // connection found; then the chunks of sends in flight go again over them.
  void advanceMove();
  // Failback of a moved connection (the watchdog thread): a due probe holds new sends, and once every send in flight
  // is delivered, makes the data streams again over the original path.
  void probeOriginalPath(std::chrono::steady_clock::time_point now);
  void advanceReturn();
  // Nothing of a send in flight is still on its way.
  bool sendsDelivered();
  // A stream of the move or the return made (the session service's thread), or not.
  void movedStreamRejoined(int stream, Fd socket, uint32_t failure) noexcept;
  void movedRejoinFailed(int stream, uint32_t failure, const std::string& why) noexcept;
  // Every stream of the move or return made: the connection carries traffic over `route`.
  void moveFinished(const Route& route);
  const NicLayout::Spare* spareOf(const Route& route) const;  // the spare a path leaves from (null: its own NIC)
  NicCounters* countersOf(const Route& route) const;  // the local NIC's of a path
  shaping::EgressShaping shapingOf(const Route& route) const;  // fabric emulation: the local NIC's of a path
  std::string localNicName(const Route& route) const;
  bool movable_ = false;                 // a single-NIC device with other NICs to move to
  std::vector<NicLayout::Spare> spares_;  // its host's other NICs, nearest first (ResumeOptions::locals[1..])
  int16_t peerRail_ = -1;
  std::atomic<bool> moving_{false};      // new sends wait: the streams are being made over another path
  std::atomic<bool> allDown_{false};     // a fused device's every NIC failed: new sends wait (whileAllNicsDown)
  std::chrono::steady_clock::time_point allDownSince_{};  // guarded by mutex_
  std::chrono::milliseconds resumeLimit_{2000};           // RAILNET_FAILOVER_RESUME_MS
  bool returning_ = false;               // guarded by mutex_: a failback probe waits for sends in flight
  Route dataRoute_{};                    // guarded by mutex_: the path the data streams use ({0, 0}: the original)
  Route targetRoute_{};                  // guarded by mutex_: the path the streams being made go over
  std::vector<Route> streamRoutes_;      // guarded by mutex_: per stream, the path it was made over
  std::vector<uint32_t> streamMadeFor_;  // guarded by mutex_: per stream, nicFailures_[0] when it was last made
  static constexpr std::chrono::milliseconds kLongestProbeWait{30000};

  // ---- pieces (GPU memory at either end); caller holds mutex_ ----
  struct Piece {
    SendRequest* request;
    const char* source;  // the message's first byte (GPU or host)
    bool fromGpu;
    bool staged;         // the receiver lands it in staging: numbered chunks
    uint64_t messageSize;
    uint64_t offset;
    uint64_t bytes;
    uint32_t recvId;
    int slot;
    staging::StagingTelemetry::Clock::time_point queuedAt;
  };
  // Splits the message into pieces of `pieceBytes` and starts what it can; the request's chunk count is set.
  void sendPieces(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot, bool fromGpu,
                  uint64_t stagedPieceBytes);
  // Hands finished copies' pieces to the streams and starts copies into free slots, in piece order.
  void pumpStaging();
  void queuePiece(const Piece& piece, const char* data, std::atomic<int>* slotPending);
  int freeStagingSlot();
  void warnIfStalled(int tag);
  // The watchdog's look (proxy/progress/watchdog.h): a send that wrote no byte for the limit gets one WARN with
  // its pieces, copies, slots and streams.
  void watch(progress::WatchClock::time_point now, std::chrono::milliseconds limit) noexcept override;
  void watchPeerHost(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept override;
  void watchPaths(progress::WatchClock::time_point now, std::chrono::milliseconds silenceLimit) noexcept override;
  // Takes NIC `nic` out: shuts its data streams down (and, for NIC 0, the control connection it carries), so their
  // helpers fail them and their chunks go again over the other NICs. Caller holds mutex_.
  void takeNicOut(int nic);
  void describe(progress::WatchClock::time_point now, std::vector<std::string>* lines) noexcept override;
  void reportStalled(const SendRequest& request, progress::WatchClock::time_point now);  // holds mutex_
  std::string stagingState();  // holds mutex_

  char* resolveChunk(const ChunkHeader& header) noexcept override;
  void chunkReceived(const ChunkHeader& header) noexcept override;
  void streamFailed(int streamIndex, const char* why, int err, bool endOfStream) noexcept override;
  bool stealChunk(int thief, SendOp* out) noexcept override;

  protocol::ControlChannel control_;
  CommStaging staging_{"send"};
  DataStreams streams_;
  uint64_t inlineBytes_;
  const bool delivered_;        // sends complete on the receiver's done frames (RAILNET_SEND_COMPLETION)
  const bool dataFailover_;     // a failed NIC's chunks are sent again over the others
  std::atomic<uint64_t> failedNics_{0};   // bit n: NIC n's streams failed (set by helpers)
  std::atomic<bool> failoverDue_{false};  // failedNics_ has bits sendAgainFromFailedNics has not handled
  uint64_t handledNics_ = 0;              // guarded by mutex_
  std::vector<std::string> nicNames_;
  std::vector<NicCounters*> nicCounters_;
  int cutNic_ = -1;                  // RAILNET_FAULT_NIC_CUT
  uint64_t cutAfterBytes_ = 0;
  uint64_t queuedOnCutNic_ = 0;      // guarded by mutex_
  std::vector<protocol::AckSilence> pathSilence_;  // guarded by mutex_: [0] control, [1 + s] data stream s
  struct NicProbe {  // a failed NIC's failback, guarded by mutex_
    std::chrono::steady_clock::time_point failedAt{};
    std::chrono::steady_clock::time_point nextProbe{};
    std::chrono::milliseconds wait{1000};
    uint64_t probes = 0;
    bool probing = false;   // its streams are being made again
    int rejoined = 0;       // streams of this probe made so far
  };
  std::vector<NicProbe> probes_;
  uint64_t probeCap_ = 0;  // RAILNET_FAILOVER_PROBES
  std::chrono::milliseconds keepAliveInterval_{500};  // a quarter of RAILNET_FAILOVER_SILENCE_MS
  std::vector<protocol::DoneFrame> done_;  // guarded by mutex_: parse's scratch
  protocol::ControlEvents events_;         // guarded by mutex_: parse's scratch
  std::atomic<std::chrono::steady_clock::time_point> lastDonePoll_{};  // test()'s last look for done frames
  shaping::EgressShaping controlShaping_;  // NIC 0's: inline messages wait for it (fabric emulation)
  shaping::EgressShaping ownShaping_;      // NIC 0's, kept while a single-NIC connection is moved
  uint64_t minChunkBytes_;

  std::mutex mutex_;
  protocol::ClearToSendQueue posted_;  // guarded by mutex_
  protocol::RequestPool<SendRequest> requests_;  // guarded by mutex_
  uint32_t nextStream_ = 0;
  int nics_ = 1;               // local NICs the data streams spread over (stream s: NIC s % nics_)
  uint64_t minStripeBytes_ = 0;
  uint64_t stripedMessages_ = 0;  // guarded by mutex_; planStripes' round-robin sequence
  std::chrono::steady_clock::time_point stalledSince_{};
  bool stallWarned_ = false;

  // ---- multireceive aggregation (docs/design.md "Multireceive"); caller holds mutex_ ----
  // A small send into a grouped receive whose other members have no send yet: its frame waits in held_ until the
  // group is complete, a send for anything else comes (order is kept), or RAILNET_GROUP_WAIT_US passes (checked
  // by isend and test); then every held frame leaves in one write.
  struct HeldMember {
    SendRequest* request;
    protocol::FrameHeader header;
    const void* data;
  };
  void flushHeld();
  // Guarded, but anyHeld(): test() then takes the lock to check the wait.
  protocol::HeldGroup<HeldMember> held_{std::chrono::microseconds(settings().groupWaitUs)};

  std::deque<Piece> pieces_;  // guarded by mutex_: not yet started, in order
  struct CopyingPiece {
    Piece piece;
    int stagingSlot;
    staging::StagingTelemetry::Clock::time_point submittedAt;
  };
  std::deque<CopyingPiece> copying_;  // guarded: in the copy queue, in submission order
  std::unique_ptr<std::atomic<int>[]> slotChunks_;  // per staging slot: its chunks not yet written
  std::vector<bool> slotCopying_;                   // guarded
  int lastSlot_ = 0;                                // guarded
  uint16_t nextPieceSeq_ = 0;                       // guarded
  std::vector<uint64_t> finishedCopies_;            // guarded; poll's scratch
  std::atomic<bool> stagingWork_{false};            // pieces_ or copying_ hold something
  staging::StagingTelemetry telemetry_;             // guarded
  uint64_t sends_ = 0;                              // guarded: sends so far (SendRequest::serial_)
  progress::LinkSubscription links_;       // reset first in the destructor
  progress::WatchRegistration watchdog_;  // last: reset first in the destructor
};

}  // namespace railnet::tcp
