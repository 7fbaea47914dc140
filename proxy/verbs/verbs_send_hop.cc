// VerbsSendComm's NVLink hop (nvlink_hop.h; docs/design.md, "Routes"): a hopped message is cut into pieces
// (staging::PiecePipeline); each piece takes a staging slot on the routed port's GPU, is copied there by the comm's
// GPU's copy engine, and leaves from the slot as the striped RDMA WRITEs and notices of any message, to the same
// place in the receiver's buffer. The slot frees when the piece's notices complete. The receiver cannot tell.
#include "proxy/verbs/verbs_send_comm.h"

#include "railnet/log.h"

namespace railnet::verbs {

void VerbsSendComm::addHopMessage(VerbsSendRequest* request, const char* data, uint64_t size,
                                  const protocol::ClearToSendQueue::Destination& destination) {
  request->hopPieces_ = hopPipeline_->add(HopMessage{request, reinterpret_cast<uint64_t>(data), size, destination}, size);
}

bool VerbsSendComm::pumpHop() {
  protocol::ControlChannel& control = connection_.control();
  std::vector<uint64_t> copied;
  std::string why;
  for (;;) {
    copied.clear();
    if (!hop_->finished(&copied, &why)) {
      control.recordFailure("NVLink hop (" + hop_->route() + "): " + why, protocol::FailureKind::kLocal);
      return false;
    }
    for (uint64_t slot : copied) sendHopPiece(static_cast<int>(slot));
    bool started = false;
    while (!control.failed() && !hop_->copyQueueFull()) {
      std::optional<HopPiece> piece = hopPipeline_->start();
      if (!piece) break;
      hopSlots_[static_cast<size_t>(piece->slot)] = HopSlot{*piece, 0};
      if (!hop_->copy(piece->slot, piece->message.source + piece->offset, piece->bytes, &why)) {
        control.recordFailure("NVLink hop (" + hop_->route() + "): " + why, protocol::FailureKind::kLocal);
        return false;
      }
      started = true;
    }
    // Copies that finish at once (the host test mode) leave in the same call; GPU copies in a later one.
    if (!started || control.failed()) return !control.failed();
  }
}

void VerbsSendComm::sendHopPiece(int slot) {
  HopSlot& state = hopSlots_[static_cast<size_t>(slot)];
  const HopPiece& piece = state.piece;
  VerbsSendRequest* request = piece.message.request;
  int posted = 0;
  // Byte `at` of the message is at slot + (at - piece.offset): unsigned arithmetic, exact modulo 2^64.
  const uint64_t localBase = hop_->slotAddress(slot) - piece.offset;
  postStripes(request, 0, localBase, nullptr, hop_->slotKey(), piece.message.size, piece.offset, piece.bytes,
              piece.message.destination, kHopWrTag | static_cast<uint64_t>(slot), &posted);
  --request->hopPieces_;
  state.pendingStripes = posted;
  if (posted == 0) hopPipeline_->release(slot);  // the post failed (recorded): nothing will complete
}

void VerbsSendComm::onHopNotice(int slot) {
  if (slot < 0 || static_cast<size_t>(slot) >= hopSlots_.size() || hopSlots_[static_cast<size_t>(slot)].pendingStripes <= 0) {
    connection_.control().recordFailure("internal error: a completion for NVLink hop slot " + std::to_string(slot) +
                                        ", which has no stripe in flight", protocol::FailureKind::kLocal);
    return;
  }
  HopSlot& state = hopSlots_[static_cast<size_t>(slot)];
  VerbsSendRequest* request = state.piece.message.request;
  --request->pendingStripes_;
  ++request->completedStripes_;
  if (--state.pendingStripes == 0) hopPipeline_->release(slot);
}

}  // namespace railnet::verbs
