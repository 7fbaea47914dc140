// The sending end of a railnet TCP connection. Receiver-driven: isend waits (returns a NULL request) until
// the receiver's clear-to-send for a buffer with the same tag has arrived, so every byte has a known home
// before it leaves. Small messages go inline on the control socket from the calling thread; larger ones
// are split into chunks that the engine's helper threads write on the data streams.
#pragma once

#include <chrono>

#include <mutex>

#include "proxy/protocol/clear_to_send.h"
#include "proxy/protocol/control_channel.h"
#include "proxy/protocol/request_pool.h"
#include "proxy/tcp/data_streams.h"
#include "proxy/transport.h"

namespace railnet::tcp {

class TcpSendComm;

class SendRequest final : public protocol::CommRequest<TcpSendComm, SendRequest> {
 private:
  friend class TcpSendComm;
  std::atomic<int> pendingChunks_{0};
  uint64_t size_ = 0;
};

class TcpSendComm final : public SendComm, private StreamOwner {
 public:
  TcpSendComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer, NicLayout layout = {});
  ~TcpSendComm() override;

  ncclResult_t isend(void* data, size_t size, int tag, MemoryRegion* mr, Request** request) noexcept override;

 private:
  friend class protocol::CommRequest<TcpSendComm, SendRequest>;
  MemoryRegistrar& registrar() noexcept override;
  ncclResult_t testRequest(SendRequest* request, int* done, int* sizes) noexcept;
  // Turns buffered control bytes into posted receives; false on a protocol error (recorded).
  bool parseClearToSends();
  // Reads clear-to-send frames and flushes queued control bytes. Caller holds mutex_.
  void pumpControl();
  void sendStreamed(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot);
  // A fused device's send: planStripes over the NICs, each stripe chunked over its NIC's streams.
  void sendStriped(SendRequest* request, const char* data, uint64_t size, uint32_t recvId, int slot);
  // Queues [offset, offset + bytes) of the message on the least-queued of streams first, first + step, ...
  void enqueueChunks(SendRequest* request, const char* data, uint64_t size, uint64_t offset, uint64_t bytes,
                     uint64_t chunk, int first, int step, uint32_t recvId, int slot);
  void warnIfStalled(int tag);

  char* resolveChunk(const ChunkHeader& header) noexcept override;
  void chunkReceived(const ChunkHeader& header) noexcept override;
  void streamFailed(int streamIndex, const char* why, int err, bool endOfStream) noexcept override;
  bool stealChunk(int thief, SendOp* out) noexcept override;

  protocol::ControlChannel control_;
  DataStreams streams_;
  uint64_t inlineBytes_;
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
};

}  // namespace railnet::tcp
