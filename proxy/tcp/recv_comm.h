// The receiving end of a railnet TCP connection. irecv publishes each posted buffer to the sender in a
// clear-to-send frame; data then arrives inline on the control socket (read by the calling thread) or as
// self-describing chunks on the data streams (read by helper threads straight into the posted buffer).
#pragma once

#include "proxy/tcp/connection.h"

namespace railnet::tcp {

class TcpRecvComm;

class RecvRequest final : public Request {
 public:
  ncclResult_t test(int* done, int* sizes) noexcept override;

 private:
  friend class TcpRecvComm;
  struct Slot {
    char* data = nullptr;
    uint64_t capacity = 0;
    int tag = 0;
    std::atomic<uint64_t> received{0};
    std::atomic<uint64_t> size{0};
  };
  TcpRecvComm* comm_ = nullptr;
  std::atomic<uint32_t> postedId_{0};  // the receive this entry serves; published after the slots are set
  int count_ = 0;
  Slot slots_[kMaxRecvs];
  std::atomic<int> pendingSlots_{0};
  std::atomic<bool> oversize_{false};
  bool inUse_ = false;  // guarded by the comm's mutex
};

class TcpRecvComm final : public RecvComm, private StreamOwner {
 public:
  TcpRecvComm(Fd control, std::vector<Fd> data, const SocketAddress& peer, const LaneLayout& layout = {});
  ~TcpRecvComm() override;

  std::unique_ptr<MemoryRegion> regMr(void* data, size_t size, int type) override;
  std::unique_ptr<MemoryRegion> regMrDmaBuf(void* data, size_t size, int type, uint64_t offset, int fd) override;
  ncclResult_t irecv(int n, void** data, const size_t* sizes, const int* tags, MemoryRegion** mrs,
                     Request** request) noexcept override;
  ncclResult_t iflush(int n, void** data, const int* sizes, MemoryRegion** mrs, Request** request) noexcept override;

 private:
  friend class RecvRequest;
  // Receives are numbered per connection; entry recvId % kRing serves receive recvId. NCCL keeps at most 32
  // in flight, so 64 entries never run out in practice (and irecv says "retry" if they do).
  static constexpr uint32_t kRing = 2 * NCCL_NET_MAX_REQUESTS;

  ncclResult_t testRequest(RecvRequest* request, int* done, int* sizes) noexcept;
  // Reads inline and oversize frames and flushes clear-to-sends. Caller holds mutex_.
  void pumpControl();
  bool startFrame();
  // Parses frames and inline payload already in the staging buffer; false on a protocol error (recorded).
  bool consumeBuffered();
  void finishInline();
  void completeSlot(RecvRequest& request, int slot, uint64_t size);
  RecvRequest* postedRequest(uint32_t recvId, int slot);
  bool peerGone() const;

  char* resolveChunk(const ChunkHeader& header) noexcept override;
  void chunkReceived(const ChunkHeader& header) noexcept override;
  void streamFailed(int streamIndex, const char* why, bool endOfStream) noexcept override;

  Connection link_;
  RecvRequest ring_[kRing];
  std::mutex mutex_;
  uint32_t nextRecvId_ = 0;  // guarded by mutex_
  FrameHeader frame_{};      // frame whose payload is being read from the control socket
  char* inlineDestination_ = nullptr;
  uint64_t inlineLeft_ = 0;
  bool inInline_ = false;
  std::atomic<bool> controlClosed_{false};
  std::atomic<int> openStreams_;
};

}  // namespace railnet::tcp
