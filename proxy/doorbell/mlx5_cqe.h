// mlx5 completion queue entries (CQEs) as railnet's host poller reads them for the direct path
// (railnet/doorbell_direct.h): which CQE software owns, what it reports, the CQ's doorbell record, and how a CQE
// advances a queue's 64-bit `completed`. Pure functions over bytes, following rdma-core's <infiniband/mlx5dv.h>
// (struct mlx5_cqe64, struct mlx5_err_cqe) and providers/mlx5/cq.c; tests/unit/test_doorbell_direct.cc compares
// them with mlx5dv.h's structs and helpers. Does not include mlx5dv.h (railnet loads rdma-core at run time).
//
// Assumes 64-byte CQEs without compression (the CQ created without MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE) and a
// send queue whose every WQE asks for a CQE (kCtrlCqUpdate), so each CQE is one WQE.
//
// Reading order: the NIC writes a CQE by DMA, op_own (the last byte) included. Read the other fields only after
// ready() held and a from-device read barrier (rdma-core's udma_from_device_barrier: a compiler barrier on x86, a
// load barrier on Arm); release the entry with the CQ doorbell record after reading it.
//
// NOT RUN ON HARDWARE: never read from a real ConnectX CQ.
#pragma once

#include <cstddef>
#include <cstdint>

#include "railnet/mlx5_wqe.h"

namespace railnet::doorbell::mlx5::cqe {

inline constexpr uint32_t kBytes = 64;

// CQE opcodes (op_own >> 4; MLX5_CQE_*): a send completion, a send error, a receive error, and an entry not yet
// written by the NIC.
inline constexpr uint8_t kOpcodeReq = 0x0;
inline constexpr uint8_t kOpcodeReqErr = 0xd;
inline constexpr uint8_t kOpcodeRespErr = 0xe;
inline constexpr uint8_t kOpcodeInvalid = 0xf;

// Byte offsets in a 64-byte CQE (struct mlx5_cqe64 / struct mlx5_err_cqe).
inline constexpr size_t kVendorSyndromeOffset = 0x36;  // err: vendor_err_synd
inline constexpr size_t kSyndromeOffset = 0x37;        // err: syndrome (MLX5_CQE_SYNDROME_*)
inline constexpr size_t kQpnOffset = 0x38;             // BE32 sop_drop_qpn / s_wqe_opcode_qpn; qpn in the low 24 bits
inline constexpr size_t kWqeCounterOffset = 0x3c;      // BE16 wqe_counter: the WQE index of the completed WQE
inline constexpr size_t kOpOwnOffset = 0x3f;           // opcode << 4 | ... | owner bit

// The CQ doorbell record: dbrec[kSetCi] = BE32(ci & 0xffffff) (MLX5_CQ_SET_CI, providers/mlx5/mlx5.h).
inline constexpr uint32_t kSetCi = 0;

namespace detail {

inline const unsigned char* bytes(const void* cqe) { return static_cast<const unsigned char*>(cqe); }

inline uint32_t bigEndian16(const unsigned char* at) { return static_cast<uint32_t>(at[0]) << 8 | at[1]; }

inline uint32_t bigEndian32(const unsigned char* at) {
  return static_cast<uint32_t>(at[0]) << 24 | static_cast<uint32_t>(at[1]) << 16 |
         static_cast<uint32_t>(at[2]) << 8 | at[3];
}

}  // namespace detail

// The CQE of consumer index `ci` in a CQ buffer of `count` (a power of two) 64-byte entries.
inline const void* at(const void* cqBuffer, uint32_t count, uint32_t ci) {
  return detail::bytes(cqBuffer) + static_cast<size_t>(ci & (count - 1)) * kBytes;
}

inline uint8_t opOwn(const void* cqe) { return detail::bytes(cqe)[kOpOwnOffset]; }
inline uint8_t opcode(const void* cqe) { return static_cast<uint8_t>(opOwn(cqe) >> 4); }  // mlx5dv_get_cqe_opcode
inline uint8_t owner(const void* cqe) { return opOwn(cqe) & 1; }                         // mlx5dv_get_cqe_owner

// Whether software owns the CQE at consumer index `ci` (get_sw_cqe in providers/mlx5/cq.c): the NIC flips the owner
// bit on each pass over the buffer, so on pass ci / count it writes (ci / count) & 1; an INVALID opcode is an entry
// it has not written (or one software reset).
inline bool ready(const void* cqe, uint32_t ci, uint32_t count) {
  return opcode(cqe) != kOpcodeInvalid && owner(cqe) == ((ci / count) & 1);
}

inline bool isError(const void* cqe) {
  const uint8_t op = opcode(cqe);
  return op == kOpcodeReqErr || op == kOpcodeRespErr;
}

inline uint16_t wqeCounter(const void* cqe) {
  return static_cast<uint16_t>(detail::bigEndian16(detail::bytes(cqe) + kWqeCounterOffset));
}
inline uint32_t qpn(const void* cqe) { return detail::bigEndian32(detail::bytes(cqe) + kQpnOffset) & 0xffffff; }
// Error CQEs only.
inline uint8_t syndrome(const void* cqe) { return detail::bytes(cqe)[kSyndromeOffset]; }
inline uint8_t vendorSyndrome(const void* cqe) { return detail::bytes(cqe)[kVendorSyndromeOffset]; }

// What to store in the CQ's dbrec[kSetCi] after consuming every CQE before `ci`.
inline uint32_t doorbellRecordValue(uint32_t ci) { return toBigEndian32(ci & 0xffffff); }

// WQEBBs of the WQE at `wqe` (its first WQEBB in the send queue), from its ctrl segment's ds: what a CQE's WQE
// frees. The poller may read it: the slot is not reused before `completed` passes it.
inline uint32_t wqebbsOfWqe(const void* wqe) {
  return wqebbsForDs(detail::bigEndian32(detail::bytes(wqe) + offsetof(Ctrl, qpnDs)) & kMaxDs);
}

// The 64-bit `completed` after a CQE for the WQE of `wqebbs` WQEBBs that starts at 16-bit index `wqeCounter`: the
// WQE's start is the first value at or after `lastCompleted` whose low 16 bits are wqeCounter (CQEs come in order
// and a send queue holds at most 2^15 WQEBBs, so that start lies less than 2^16 ahead), plus its WQEBBs.
inline uint64_t completedAfter(uint64_t lastCompleted, uint16_t wqeCounter, uint32_t wqebbs) {
  const uint64_t ahead = static_cast<uint16_t>(wqeCounter - static_cast<uint16_t>(lastCompleted));
  return lastCompleted + ahead + wqebbs;
}

}  // namespace railnet::doorbell::mlx5::cqe
