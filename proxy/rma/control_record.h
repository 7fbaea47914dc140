// The one message of railnet's one-sided (RMA / GIN) protocol: a 64-byte control record, sent on a peer's control
// connection ahead of the payload it announces. Pure: encoded and checked here, unit-tested in
// tests/unit/test_rma.cc. docs/design.md "One-sided puts (GIN)" describes the exchange.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

namespace railnet::rma {

enum class RecordKind : uint16_t {
  kHello = 1,   // first message on every connection of the mesh: who connects, and on which lane
  kWindow = 2,  // a collective registration: the sender's window `window` is `size` bytes
  kPut = 3,     // `size` bytes for the receiver's window `window` at `offset` follow on the data connection
};

enum class Lane : uint32_t { kControl = 0, kData = 1 };

// What a put does to the target's signal word once its payload (and every earlier put's) has landed.
enum class SignalOp : uint16_t { kNone = 0, kInc = 1, kAdd = 2 };  // kInc/kAdd = NCCL_NET_SIGNAL_OP_INC/ADD

struct ControlRecord {
  static constexpr uint32_t kMagic = 0x4e494752;  // "RGIN"
  uint32_t magic = kMagic;
  RecordKind kind = RecordKind::kPut;
  SignalOp signalOp = SignalOp::kNone;
  uint32_t sequence = 0;       // put: per (sender, receiver) count from 0; hello: the sender's rank
  uint32_t window = 0;         // put: target window id; window: its id; hello: the lane
  uint64_t offset = 0;         // put: byte offset in the target window
  uint64_t size = 0;           // put: payload bytes; window: window bytes; hello: the mesh's rank count
  uint32_t signalWindow = 0;   // put with a signal: the target window holding the signal word
  uint32_t context = 0;        // put: the NCCL context it was issued on (diagnostics)
  uint64_t signalOffset = 0;   // byte offset of the 64-bit signal word in signalWindow
  uint64_t signalValue = 0;    // kAdd: the value added (kInc adds 1)
  uint32_t flags = 0;          // kInlinePayload (put), kWindowKey (window)
  uint32_t reserved = 0;
};
static_assert(sizeof(ControlRecord) == 64);

// A put of at most this many bytes from host memory travels inside its control message, right after the record,
// so it needs no payload receive (and no clear-to-send round trip). NCCL's inline puts (putValue, <= 8 bytes) and
// small puts take this path.
constexpr uint32_t kInlinePayload = 1;
// A window record that carries its sender's key for the window: address in `offset`, key in `signalValue`.
constexpr uint32_t kWindowKey = 2;
constexpr size_t kControlMessageBytes = 4096;
constexpr size_t kInlinePutBytes = kControlMessageBytes - sizeof(ControlRecord);

// Empty when `record` is well formed, else why not (the receiver drops the connection's peer with that reason).
inline std::string malformedReason(const ControlRecord& record) {
  if (record.magic != ControlRecord::kMagic) return "bad magic";
  switch (record.kind) {
    case RecordKind::kHello:
    case RecordKind::kWindow: return {};
    case RecordKind::kPut:
      if ((record.flags & kInlinePayload) != 0 && record.size > kInlinePutBytes) {
        return "inline payload of " + std::to_string(record.size) + " bytes";
      }
      if (record.signalOp != SignalOp::kNone && record.signalOp != SignalOp::kInc &&
          record.signalOp != SignalOp::kAdd) {
        return "unknown signal op " + std::to_string(static_cast<unsigned>(record.signalOp));
      }
      return {};
  }
  return "unknown record kind " + std::to_string(static_cast<unsigned>(record.kind));
}

// True when [offset, offset + bytes) lies inside a window of `windowBytes` (no overflow for any input).
inline bool fitsWindow(uint64_t offset, uint64_t bytes, uint64_t windowBytes) {
  return offset <= windowBytes && bytes <= windowBytes - offset;
}

// The value a signal word holds after `op` with `value` (64-bit wrap-around, as a NIC's fetch-and-add).
inline uint64_t applySignal(uint64_t current, SignalOp op, uint64_t value) {
  return op == SignalOp::kInc ? current + 1 : op == SignalOp::kAdd ? current + value : current;
}

}  // namespace railnet::rma
