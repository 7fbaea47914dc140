// The receiving end of a railnet TCP connection. irecv publishes each posted buffer to the sender in a
// clear-to-send frame; data then arrives inline on the control channel (read by the calling thread) or as
// self-describing chunks on the data streams (read by helper threads straight into the posted buffer).
#pragma once

#include <mutex>

#include "proxy/protocol/control_channel.h"
#include "proxy/protocol/receive_ring.h"
#include "proxy/protocol/request_pool.h"
#include "proxy/tcp/data_streams.h"
#include "proxy/transport.h"

namespace railnet::tcp {

class TcpRecvComm;

class RecvRequest final : public protocol::CommRequest<TcpRecvComm, RecvRequest>, public protocol::PostedReceive {
  // All its state is the posted receive's (protocol/receive_ring.h).
};

class TcpRecvComm final : public RecvComm, private StreamOwner {
 public:
  TcpRecvComm(Fd control, std::vector<Fd> data, const protocol::SocketAddress& peer, const NicLayout& layout = {});
  ~TcpRecvComm() override;

  ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                     Request** request) noexcept override;
  ncclResult_t iflush(int n, void** data, const int* sizes, MemoryRegion** mrs, Request** request) noexcept override;

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

  char* resolveChunk(const protocol::ChunkHeader& header) noexcept override;
  void chunkReceived(const protocol::ChunkHeader& header) noexcept override;
  void streamFailed(int streamIndex, const char* why, int err, bool endOfStream) noexcept override;

  protocol::ControlChannel control_;
  DataStreams streams_;
  Ring ring_;                  // posted receives; see receive_ring.h for its threading
  std::mutex mutex_;
  protocol::FrameHeader frame_{};  // frame whose payload is being read from the control channel
  char* inlineDestination_ = nullptr;
  uint64_t inlineLeft_ = 0;
  bool inInline_ = false;
  std::atomic<bool> controlClosed_{false};
  std::atomic<int> openStreams_;
};

}  // namespace railnet::tcp
