#include "proxy/rma/rma_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/clock.h"
#include "railnet/log.h"

namespace railnet::rma {
namespace {

constexpr int kControlSlots = 16;   // control records posted or in flight per peer and direction
constexpr int kDataInFlight = 16;   // payload sends, and payload receives, per peer (≤ NCCL_NET_MAX_REQUESTS)
constexpr int kTag = kMeshTag;
constexpr int64_t kWaitLogNs = 30'000'000'000LL;  // a registration says what it waits for every 30 s

}  // namespace

struct Window {
  uint32_t id = 0;
  char* base = nullptr;
  size_t size = 0;
  int device = -1;  // the GPU holding it; -1 for host memory
  std::vector<std::unique_ptr<MemoryRegion>> sendRegions;  // by rank: on that peer's data send comm
  std::vector<std::unique_ptr<MemoryRegion>> recvRegions;  // by rank: on that peer's data receive comm
};

struct Operation {
  ControlRecord record;
  Peer* peer = nullptr;
  char* source = nullptr;
  MemoryRegion* sourceRegion = nullptr;
  bool internal = false;       // a window announcement, never handed to NCCL
  bool inlinePayload = false;  // the payload travels in the control message
  int controlSlot = -1;
  Request* controlRequest = nullptr;
  Request* dataRequest = nullptr;
  bool controlDone = false;
  bool dataDone = false;
  bool finished = false;
  ncclResult_t result = ncclSuccess;
  bool hasData() const { return record.kind == RecordKind::kPut && record.size > 0 && !inlinePayload; }
};

// A put announced by a peer, waiting for its payload (and then for its turn to signal).
struct Incoming {
  char* destination = nullptr;
  int destinationDevice = -1;
  std::vector<char> inlineBytes;  // an inline payload, written in order by the target writer
  MemoryRegion* region = nullptr;
  size_t size = 0;
  Request* request = nullptr;
  bool landed = false;
  uint64_t* signalWord = nullptr;
  int signalDevice = -1;
  SignalOp signalOp = SignalOp::kNone;
  uint64_t signalValue = 0;
};

struct Peer {
  int rank = -1;
  std::unique_ptr<SendComm> controlSend;
  std::unique_ptr<SendComm> dataSend;
  std::unique_ptr<RecvComm> controlRecv;
  std::unique_ptr<RecvComm> dataRecv;
  // Registered control messages (a record, then an inline payload): kControlSlots to send from, kControlSlots
  // posted to receive into.
  std::unique_ptr<char[]> sendSlots;
  std::unique_ptr<char[]> recvSlots;
  char* sendSlot(int slot) const { return sendSlots.get() + static_cast<size_t>(slot) * kControlMessageBytes; }
  char* recvSlot(int slot) const { return recvSlots.get() + static_cast<size_t>(slot) * kControlMessageBytes; }
  std::unique_ptr<MemoryRegion> sendRecordsRegion;
  std::unique_ptr<MemoryRegion> recvRecordsRegion;
  bool sendSlotBusy[kControlSlots] = {};

  std::deque<Operation*> outgoing;  // in issue order, until finished
  uint32_t nextSequence = 0;
  int dataSendsInFlight = 0;

  Request* controlReceives[kControlSlots] = {};
  int controlHead = 0;  // the oldest posted control receive
  int controlPosted = 0;
  std::deque<Incoming> incoming;  // announced puts, in the peer's order
  int dataReceivesInFlight = 0;
  uint32_t expectedSequence = 0;
  std::unordered_map<uint32_t, uint64_t> windowSizes;  // the peer's size of each window id
  std::unordered_map<uint32_t, WindowKey> windowKeys;  // what the peer announced with a window id, if anything
  std::string failure;
};

RmaComm::RmaComm(RmaListen& listen, void* const* handles, int nranks, int rank) : nranks_(nranks), rank_(rank) {
  if (nranks < 1 || rank < 0 || rank >= nranks || handles == nullptr) {
    fail(ncclInvalidArgument, "NET/railnet: one-sided connect: rank %d of %d ranks, handles %p", rank, nranks,
         static_cast<const void*>(handles));
  }
  for (int peer = 0; peer < nranks; ++peer) {
    if (handles[peer] == nullptr) fail(ncclInvalidArgument, "NET/railnet: one-sided connect: NULL handle of rank %d", peer);
    peers_.push_back(std::make_unique<Peer>());
    peers_.back()->rank = peer;
  }
  std::vector<PeerLinks> links = connectMesh(listen, handles, nranks, rank);
  for (auto& peer : peers_) {
    PeerLinks& link = links[static_cast<size_t>(peer->rank)];
    peer->controlSend = std::move(link.controlSend);
    peer->dataSend = std::move(link.dataSend);
    peer->controlRecv = std::move(link.controlRecv);
    peer->dataRecv = std::move(link.dataRecv);
    constexpr size_t kSlotsBytes = kControlSlots * kControlMessageBytes;
    peer->sendSlots = std::make_unique<char[]>(kSlotsBytes);
    peer->recvSlots = std::make_unique<char[]>(kSlotsBytes);
    peer->sendRecordsRegion = peer->controlSend->regMr(peer->sendSlots.get(), kSlotsBytes, NCCL_PTR_HOST);
    peer->recvRecordsRegion = peer->controlRecv->regMr(peer->recvSlots.get(), kSlotsBytes, NCCL_PTR_HOST);
    peer->controlRecv->expectIdleReceives();  // its posted control receives wait as long as the GIN context idles
  }
  RN_INFO(NCCL_INIT | NCCL_NET, "NET/railnet: one-sided: rank %d connected to %d rank(s) over %s device %d", rank, nranks,
          listen.transport().name(), listen.dev());
}

RmaComm::~RmaComm() {
  std::lock_guard<std::mutex> lock(mutex_);
  windows_.clear();  // their regions belong to the comms below
  for (auto& peer : peers_) {
    peer->sendRecordsRegion.reset();
    peer->recvRecordsRegion.reset();
  }
}

// ---- windows -------------------------------------------------------------------------------------------------

void* RmaComm::registerWindow(void* data, size_t size, int type, bool dmabuf, uint64_t dmabufOffset, int fd,
                              const WindowKey* announce) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!failure_.empty()) fail(failureCode_, "NET/railnet: one-sided: registration on a failed comm: %s", failure_.c_str());
  if (data == nullptr && size > 0) fail(ncclInvalidArgument, "NET/railnet: one-sided: registration of NULL (%zu bytes)", size);
  if (type != NCCL_PTR_HOST && type != NCCL_PTR_CUDA) {
    fail(ncclInvalidArgument, "NET/railnet: one-sided: registration of memory type %d (HOST or CUDA only)", type);
  }
  auto window = std::make_unique<Window>();
  window->id = nextWindowId_++;
  window->base = static_cast<char*>(data);
  window->size = size;
  if (type == NCCL_PTR_CUDA) window->device = writer_.prepareDevice(data);
  for (auto& peer : peers_) {
    auto registerOn = [&](Comm& comm) {
      return dmabuf ? comm.regMrDmaBuf(data, size, type, dmabufOffset, fd) : comm.regMr(data, size, type);
    };
    window->sendRegions.push_back(registerOn(*peer->dataSend));
    window->recvRegions.push_back(registerOn(*peer->dataRecv));
  }
  // Every rank learns every rank's size of this window, so a put is checked where it is issued.
  const uint32_t id = window->id;
  for (auto& peer : peers_) {
    Operation* announcement = newOperation();
    announcement->internal = true;
    announcement->peer = peer.get();
    announcement->record.kind = RecordKind::kWindow;
    announcement->record.window = id;
    announcement->record.size = size;
    if (announce != nullptr) {
      announcement->record.flags |= kWindowKey;
      announcement->record.offset = announce->address;
      announcement->record.signalValue = announce->key;
    }
    peer->outgoing.push_back(announcement);
  }
  void* handle = window.get();
  windowsById_[id] = window.get();
  windows_[handle] = std::move(window);

  int64_t nextLog = monotonicNs() + kWaitLogNs;
  while (true) {
    progressLocked();
    if (!failure_.empty()) fail(failureCode_, "NET/railnet: one-sided: registration failed: %s", failure_.c_str());
    std::string missing;
    for (const auto& peer : peers_) {
      if (peer->windowSizes.count(id) == 0) missing += " " + std::to_string(peer->rank);
    }
    if (missing.empty()) break;
    if (monotonicNs() > nextLog) {
      nextLog = monotonicNs() + kWaitLogNs;
      RN_WARN("NET/railnet: one-sided: rank %d's registration of window %u still waits for rank(s)%s", rank_, id,
              missing.c_str());
    }
    lock.unlock();
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    lock.lock();
  }
  RN_INFO(NCCL_NET, "NET/railnet: one-sided: rank %d registered window %u: %zu bytes of %s memory at %p", rank_, id, size,
          type == NCCL_PTR_CUDA ? "GPU" : "host", data);
  return handle;
}

bool RmaComm::peerKey(int rank, void* handle, WindowKey* key) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto window = windows_.find(handle);
  if (window == windows_.end() || rank < 0 || rank >= nranks_) return false;
  const auto& keys = peers_[static_cast<size_t>(rank)]->windowKeys;
  auto found = keys.find(window->second->id);
  if (found == keys.end()) return false;
  *key = found->second;
  return true;
}

void RmaComm::deregisterWindow(void* handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = windows_.find(handle);
  if (handle == nullptr || found == windows_.end()) {
    fail(ncclInvalidUsage, "NET/railnet: one-sided: deregistration of %p, which is no window of this comm", handle);
  }
  windowsById_.erase(found->second->id);
  windows_.erase(found);
}

Window* RmaComm::windowOf(void* handle) const {
  auto found = windows_.find(handle);
  return found == windows_.end() ? nullptr : found->second.get();
}

// ---- puts ----------------------------------------------------------------------------------------------------

Operation* RmaComm::newOperation() {
  if (freeOperations_.empty()) {
    operations_.push_back(std::make_unique<Operation>());
    return operations_.back().get();
  }
  Operation* reused = freeOperations_.back();
  freeOperations_.pop_back();
  *reused = Operation{};
  return reused;
}

ncclResult_t RmaComm::checkPut(const PutArguments& arguments, Window** src, Window** dst, Window** signal) const {
  if (arguments.rank >= static_cast<uint32_t>(nranks_)) {
    RN_WARN("NET/railnet: one-sided: put to rank %u; the comm has %d ranks", arguments.rank, nranks_);
    return ncclInvalidArgument;
  }
  const Peer& peer = *peers_[arguments.rank];
  auto peerSize = [&](const Window* window) {
    auto found = peer.windowSizes.find(window->id);
    return found == peer.windowSizes.end() ? uint64_t{0} : found->second;
  };
  if (arguments.size > 0) {
    *src = windowOf(arguments.srcHandle);
    *dst = windowOf(arguments.dstHandle);
    if (*src == nullptr || *dst == nullptr) {
      RN_WARN("NET/railnet: one-sided: put of %zu bytes to rank %u with %s handle %p, which is no window of this comm",
              arguments.size, arguments.rank, *src == nullptr ? "source" : "destination",
              *src == nullptr ? arguments.srcHandle : arguments.dstHandle);
      return ncclInvalidArgument;
    }
    if (!fitsWindow(arguments.srcOffset, arguments.size, (*src)->size)) {
      RN_WARN("NET/railnet: one-sided: put of %zu bytes from offset %llu of window %u (%zu bytes): outside the window",
              arguments.size, static_cast<unsigned long long>(arguments.srcOffset), (*src)->id, (*src)->size);
      return ncclInvalidArgument;
    }
    if (!fitsWindow(arguments.dstOffset, arguments.size, peerSize(*dst))) {
      RN_WARN("NET/railnet: one-sided: put of %zu bytes to offset %llu of rank %u's window %u (%llu bytes): outside the "
              "window", arguments.size, static_cast<unsigned long long>(arguments.dstOffset), arguments.rank,
              (*dst)->id, static_cast<unsigned long long>(peerSize(*dst)));
      return ncclInvalidArgument;
    }
  }
  if (arguments.signalOp != SignalOp::kNone) {
    if (arguments.signalOp != SignalOp::kInc && arguments.signalOp != SignalOp::kAdd) {
      RN_WARN("NET/railnet: one-sided: unknown signal op %u", static_cast<unsigned>(arguments.signalOp));
      return ncclInvalidArgument;
    }
    *signal = windowOf(arguments.signalHandle);
    if (*signal == nullptr || arguments.signalOffset % sizeof(uint64_t) != 0 ||
        !fitsWindow(arguments.signalOffset, sizeof(uint64_t), peerSize(*signal))) {
      RN_WARN("NET/railnet: one-sided: signal at offset %llu of handle %p on rank %u: %s",
              static_cast<unsigned long long>(arguments.signalOffset), arguments.signalHandle, arguments.rank,
              *signal == nullptr ? "no window of this comm"
              : arguments.signalOffset % sizeof(uint64_t) != 0 ? "not 8-byte aligned" : "outside the window");
      return ncclInvalidArgument;
    }
  }
  return ncclSuccess;
}

ncclResult_t RmaComm::put(const PutArguments& arguments, void** request) noexcept {
  *request = nullptr;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return failureCode_;  // logged when it happened
    Window* src = nullptr;
    Window* dst = nullptr;
    Window* signal = nullptr;
    if (ncclResult_t result = checkPut(arguments, &src, &dst, &signal); result != ncclSuccess) return result;
    Peer& peer = *peers_[arguments.rank];
    Operation* op = newOperation();
    op->peer = &peer;
    ControlRecord& record = op->record;
    record.kind = RecordKind::kPut;
    record.signalOp = arguments.signalOp;
    record.sequence = peer.nextSequence++;
    record.window = dst != nullptr ? dst->id : 0;
    record.offset = arguments.dstOffset;
    record.size = arguments.size;
    record.signalWindow = signal != nullptr ? signal->id : 0;
    record.context = static_cast<uint32_t>(arguments.context);
    record.signalOffset = arguments.signalOffset;
    record.signalValue = arguments.signalValue;
    if (src != nullptr) {
      op->source = src->base + arguments.srcOffset;
      op->sourceRegion = src->sendRegions[arguments.rank].get();
      op->inlinePayload = src->device < 0 && arguments.size <= kInlinePutBytes;
      if (op->inlinePayload) record.flags |= kInlinePayload;
    }
    peer.outgoing.push_back(op);
    liveRequests_.insert(op);
    *request = op;
    pumpOutgoing(peer);  // at once: a signal-only put leaves before the call returns
    return ncclSuccess;
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: one-sided: put to rank %u: %s", arguments.rank, error.what());
    return ncclSystemError;
  }
}

ncclResult_t RmaComm::test(void* request, int* done) noexcept {
  *done = 0;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (request == nullptr || liveRequests_.count(request) == 0) {
      RN_WARN("NET/railnet: one-sided: test of %p, which is no pending request of this comm", request);
      return ncclInvalidUsage;
    }
    auto* op = static_cast<Operation*>(request);
    if (!op->finished) progressLocked();
    if (!op->finished) return ncclSuccess;
    *done = 1;
    const ncclResult_t result = op->result;
    liveRequests_.erase(request);
    freeOperations_.push_back(op);
    return result;
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: one-sided: test: %s", error.what());
    return ncclSystemError;
  }
}

ncclResult_t RmaComm::completedRequest(void** request) noexcept {
  *request = nullptr;
  try {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.empty()) return failureCode_;
    Operation* op = newOperation();
    op->finished = true;
    liveRequests_.insert(op);
    *request = op;
    return ncclSuccess;
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: one-sided: flush: %s", error.what());
    return ncclSystemError;
  }
}

ncclResult_t RmaComm::progress() noexcept {
  try {
    // Blocking, not try_lock: measured on 16 cores, a progress thread that skipped its round whenever another thread
    // held the comm moved small puts at 0.2-0.3x isend instead of 0.7-0.9x (docs/performance.md §10).
    std::lock_guard<std::mutex> lock(mutex_);
    progressLocked();
    return failure_.empty() ? ncclSuccess : failureCode_;
  } catch (const std::exception& error) {
    RN_WARN("NET/railnet: one-sided: progress: %s", error.what());
    return ncclSystemError;
  }
}

bool RmaComm::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return !failure_.empty();
}

// ---- progress ------------------------------------------------------------------------------------------------

void RmaComm::failPeer(Peer& peer, const std::string& why) {
  if (!peer.failure.empty()) return;
  peer.failure = why;
  RN_WARN("NET/railnet: one-sided: rank %d: exchange with rank %d failed: %s", rank_, peer.rank, why.c_str());
  if (failure_.empty()) {
    failure_ = "rank " + std::to_string(peer.rank) + ": " + why;
    failureCode_ = ncclRemoteError;
  }
  for (Operation* op : peer.outgoing) {
    op->finished = true;
    op->result = ncclRemoteError;
    if (op->internal) freeOperations_.push_back(op);
  }
  peer.outgoing.clear();
  peer.incoming.clear();
}

void RmaComm::progressLocked() {
  for (auto& peer : peers_) {
    if (!peer->failure.empty()) continue;
    pumpOutgoing(*peer);
    if (peer->failure.empty()) pumpIncoming(*peer);
  }
  std::string why;
  if (!writer_.progress(&why) && failure_.empty()) {
    failure_ = "applying a signal: " + why;
    failureCode_ = ncclSystemError;
    RN_WARN("NET/railnet: one-sided: rank %d: %s", rank_, failure_.c_str());
  }
}

// Posts control records in order, then payloads in order (a receiver posts its payload receives in the order of
// the records, and each connection matches in order), then collects completions.
void RmaComm::pumpOutgoing(Peer& peer) {
  for (Operation* op : peer.outgoing) {
    if (op->controlRequest != nullptr || op->controlDone) continue;
    int slot = 0;
    while (slot < kControlSlots && peer.sendSlotBusy[slot]) ++slot;
    if (slot == kControlSlots) break;
    char* message = peer.sendSlot(slot);
    std::memcpy(message, &op->record, sizeof(ControlRecord));
    size_t bytes = sizeof(ControlRecord);
    if (op->inlinePayload) {
      std::memcpy(message + bytes, op->source, op->record.size);
      bytes += op->record.size;
    }
    ncclResult_t result =
        peer.controlSend->isend(message, bytes, kTag, peer.sendRecordsRegion.get(), &op->controlRequest);
    if (result != ncclSuccess) return failPeer(peer, "sending a control record failed");
    if (op->controlRequest == nullptr) break;
    peer.sendSlotBusy[slot] = true;
    op->controlSlot = slot;
  }
  for (Operation* op : peer.outgoing) {
    if (!op->hasData() || op->dataRequest != nullptr || op->dataDone) continue;
    if (op->controlRequest == nullptr && !op->controlDone) break;  // its record has not left: keep the order
    if (peer.dataSendsInFlight >= kDataInFlight) break;
    ncclResult_t result = peer.dataSend->isend(op->source, op->record.size, kTag, op->sourceRegion, &op->dataRequest);
    if (result != ncclSuccess) return failPeer(peer, "sending a payload failed");
    if (op->dataRequest == nullptr) break;
    ++peer.dataSendsInFlight;
  }
  for (auto it = peer.outgoing.begin(); it != peer.outgoing.end();) {
    Operation* op = *it;
    int done = 0;
    if (op->controlRequest != nullptr) {
      if (op->controlRequest->test(&done, nullptr) != ncclSuccess) return failPeer(peer, "a control record failed");
      if (done) {
        op->controlRequest = nullptr;
        op->controlDone = true;
        peer.sendSlotBusy[op->controlSlot] = false;
      }
    }
    if (op->dataRequest != nullptr) {
      done = 0;
      if (op->dataRequest->test(&done, nullptr) != ncclSuccess) return failPeer(peer, "a payload failed");
      if (done) {
        op->dataRequest = nullptr;
        op->dataDone = true;
        --peer.dataSendsInFlight;
      }
    }
    if (op->controlDone && (!op->hasData() || op->dataDone)) {
      op->finished = true;
      if (op->internal) freeOperations_.push_back(op);
      it = peer.outgoing.erase(it);
    } else {
      ++it;
    }
  }
}

void RmaComm::takeRecord(Peer& peer, const ControlRecord& record, const char* inlinePayload) {
  if (std::string why = malformedReason(record); !why.empty()) return failPeer(peer, "malformed control record: " + why);
  if (record.kind == RecordKind::kWindow) {
    peer.windowSizes[record.window] = record.size;
    if ((record.flags & kWindowKey) != 0) peer.windowKeys[record.window] = WindowKey{record.offset, record.signalValue};
    return;
  }
  if (record.kind != RecordKind::kPut) return failPeer(peer, "unexpected hello after setup");
  if (record.sequence != peer.expectedSequence) {
    return failPeer(peer, "put " + std::to_string(record.sequence) + " arrived where " +
                              std::to_string(peer.expectedSequence) + " was due");
  }
  ++peer.expectedSequence;
  Incoming put;
  put.size = record.size;
  if (record.size > 0) {
    auto found = windowsById_.find(record.window);
    if (found == windowsById_.end() || !fitsWindow(record.offset, record.size, found->second->size)) {
      return failPeer(peer, "put of " + std::to_string(record.size) + " bytes at offset " + std::to_string(record.offset) +
                                " outside window " + std::to_string(record.window));
    }
    put.destination = found->second->base + record.offset;
    put.destinationDevice = found->second->device;
    put.region = found->second->recvRegions[static_cast<size_t>(peer.rank)].get();
    if ((record.flags & kInlinePayload) != 0) put.inlineBytes.assign(inlinePayload, inlinePayload + record.size);
  }
  if (record.signalOp != SignalOp::kNone) {
    auto found = windowsById_.find(record.signalWindow);
    if (found == windowsById_.end() || record.signalOffset % sizeof(uint64_t) != 0 ||
        !fitsWindow(record.signalOffset, sizeof(uint64_t), found->second->size)) {
      return failPeer(peer, "signal at offset " + std::to_string(record.signalOffset) + " outside window " +
                                std::to_string(record.signalWindow));
    }
    put.signalWord = reinterpret_cast<uint64_t*>(found->second->base + record.signalOffset);
    put.signalDevice = found->second->device;
    put.signalOp = record.signalOp;
    put.signalValue = record.signalValue;
  }
  peer.incoming.push_back(put);
}

void RmaComm::pumpIncoming(Peer& peer) {
  // Keep kControlSlots control receives posted; take finished ones in order (a connection matches in order).
  while (true) {
    while (peer.controlPosted < kControlSlots) {
      const int slot = (peer.controlHead + peer.controlPosted) % kControlSlots;
      void* data = peer.recvSlot(slot);
      size_t size = kControlMessageBytes;
      int tag = kTag;
      MemoryRegion* region = peer.recvRecordsRegion.get();
      Request* request = nullptr;
      if (peer.controlRecv->irecv(1, &data, &size, &tag, &region, &request) != ncclSuccess) {
        return failPeer(peer, "posting a control receive failed");
      }
      if (request == nullptr) break;
      peer.controlReceives[slot] = request;
      ++peer.controlPosted;
    }
    if (peer.controlPosted == 0) break;
    int done = 0;
    int received = 0;
    if (peer.controlReceives[peer.controlHead]->test(&done, &received) != ncclSuccess) {
      return failPeer(peer, "a control receive failed (the peer closed or died)");
    }
    if (!done) break;
    const char* message = peer.recvSlot(peer.controlHead);
    ControlRecord record;
    std::memcpy(&record, message, sizeof record);
    const size_t expected =
        sizeof(ControlRecord) + ((record.flags & kInlinePayload) != 0 ? static_cast<size_t>(record.size) : 0);
    if (received < static_cast<int>(sizeof(ControlRecord)) || static_cast<size_t>(received) != expected) {
      return failPeer(peer, "a control message of " + std::to_string(received) + " bytes (" + std::to_string(expected) +
                                " expected)");
    }
    takeRecord(peer, record, message + sizeof(ControlRecord));
    peer.controlReceives[peer.controlHead] = nullptr;
    peer.controlHead = (peer.controlHead + 1) % kControlSlots;
    --peer.controlPosted;
    if (!peer.failure.empty()) return;
  }
  // Payload receives straight into the windows, in the records' order.
  for (Incoming& put : peer.incoming) {
    if (put.size == 0 || !put.inlineBytes.empty() || put.request != nullptr || put.landed) continue;
    if (peer.dataReceivesInFlight >= kDataInFlight) break;
    void* data = put.destination;
    size_t size = put.size;
    int tag = kTag;
    MemoryRegion* region = put.region;
    if (peer.dataRecv->irecv(1, &data, &size, &tag, &region, &put.request) != ncclSuccess) {
      return failPeer(peer, "posting a payload receive failed");
    }
    if (put.request == nullptr) break;
    ++peer.dataReceivesInFlight;
  }
  for (Incoming& put : peer.incoming) {
    if (put.request == nullptr) continue;
    int done = 0;
    int received = 0;
    if (put.request->test(&done, &received) != ncclSuccess) return failPeer(peer, "a payload receive failed");
    if (!done) continue;
    put.request = nullptr;
    put.landed = true;
    --peer.dataReceivesInFlight;
    if (static_cast<size_t>(received) != put.size) {
      return failPeer(peer, "a payload of " + std::to_string(received) + " bytes where " + std::to_string(put.size) +
                                " were announced");
    }
  }
  // A signal goes once its payload and every earlier one from this peer have landed; an inline payload is written
  // in the same order, just before its signal.
  while (!peer.incoming.empty()) {
    Incoming& put = peer.incoming.front();
    if (put.size > 0 && put.inlineBytes.empty() && !put.landed) break;
    writer_.queueCopy(put.destination, put.destinationDevice, std::move(put.inlineBytes));
    writer_.queueSignal(put.signalWord, put.signalDevice, put.signalOp, put.signalValue);
    peer.incoming.pop_front();
  }
}

}  // namespace railnet::rma
