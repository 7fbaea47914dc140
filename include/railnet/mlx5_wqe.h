// mlx5 send-queue work queue entries (WQEs) and doorbell values, built by railnet itself so that a GPU kernel (or
// host code) can post RDMA WRITEs and atomics straight to a ConnectX NIC's send queue ("IBGDA", issue 15). The
// layouts and values follow rdma-core's <infiniband/mlx5dv.h> and its mlx5 provider (providers/mlx5/qp.c), which
// tests/unit/test_mlx5_wqe.cc checks byte for byte. This header does not include mlx5dv.h (railnet loads
// rdma-core at run time) and compiles as CUDA device code: every function is RAILNET_HOST_DEVICE and inline, and
// nothing here calls the C or C++ library.
//
// NOT RUN ON HARDWARE: only compared with rdma-core's own helpers and structs, never posted to a real mlx5 NIC.
//
// Public because kernels include it (railnet/doorbell_device.cuh, the direct path of railnet/doorbell_direct.h).
// This file is the pure part: bytes of a WQE, of the doorbell record and of the doorbell register write. Queue
// setup (proxy/doorbell/direct.*) and the device-side producer (railnet/doorbell_direct_producer.h) are elsewhere.
//
// Ring and indices. The send queue (SQ) is a ring of `depth` (a power of two) 64-byte WQE basic blocks
// (WQEBBs). The producer index `pi` counts WQEBBs, not WQEs, modulo 2^16: a WQE that starts at pi sits in slot
// pi & (depth - 1) (wqebbAt) and carries pi & 0xffff in its ctrl segment; it advances pi by its WQEBB count
// (what the build* functions return). A WQE of more than one WQEBB continues in the next slot, which is slot 0
// after the last one, so every builder takes one pointer per WQEBB (`bbs[i]` = slot of pi + i) rather than one
// contiguous buffer. Bytes of a WQEBB past the WQE's ds * 16 are left as they were: the NIC reads ds units only.
//
// Doorbell ordering a device producer must follow (rdma-core's CPU rule in providers/mlx5/qp.c post_send_db:
// WQE -> barrier -> DBR -> WC barrier -> DB/BF -> flush; NVSHMEM, DeepEP and DOCA GPUNetIO do the same on GPU):
//   1. reserve WQEBBs by an atomic add on the producer counter;
//   2. write the WQE(s) with plain stores (the build* functions);
//   3. fence: __threadfence() (GPU scope) or stronger, so that the WQE is written before any index naming it;
//   4. mark the WQEs ready in order (other producers may be behind), then, holding the per-QP doorbell lock:
//      a. write the doorbell record: dbrec[1] (MLX5_SND_DBR) = doorbellRecordValue(pi after the last WQE),
//         a system-scope store (st.release.sys);
//      b. release fence at system scope (fence.acq_rel.sys);
//      c. ring: one 8-byte store of doorbellRegisterValue(ctrl of the last WQE) to the UAR doorbell register
//         (MMIO; st.mmio.relaxed.sys or a volatile 64-bit store). Note the two indices differ: the record holds
//         the next free pi, the register value the index of the last WQE posted (as rdma-core does).
//   BlueFlame variant (low latency, one WQE): instead of 4c, copy the whole WQE (ds * 16 rounded up to 64 bytes)
//   to the BlueFlame register in 8-byte stores, in order, ring-wrapping like the WQE itself.
//
// Byte order: every multi-byte field the NIC reads is big-endian. Arguments to the writers are in host order
// (addresses, keys, lengths, atomic operands) except `immediate`, which is stored as given, like
// mlx5dv_set_ctrl_seg and ibv_send_wr.imm_data: pass it already in network order.
#pragma once

#include <cstddef>
#include <cstdint>

#include "railnet/host_device.h"

namespace railnet::doorbell::mlx5 {

// Opcodes (low byte of the ctrl segment's opmod_idx_opcode; MLX5_OPCODE_*).
inline constexpr uint8_t kOpcodeNop = 0x00;
inline constexpr uint8_t kOpcodeRdmaWrite = 0x08;
inline constexpr uint8_t kOpcodeRdmaWriteImm = 0x09;
inline constexpr uint8_t kOpcodeRdmaRead = 0x10;
inline constexpr uint8_t kOpcodeAtomicCs = 0x11;
inline constexpr uint8_t kOpcodeAtomicFa = 0x12;

// ctrl segment fm_ce_se bits (MLX5_WQE_CTRL_*): CE = 2 ("always") in bits 2-3, SE in bit 1, fence mode in bits
// 5-7.
inline constexpr uint8_t kCtrlCqUpdate = 0x08;   // a CQE for this WQE
inline constexpr uint8_t kCtrlSolicited = 0x02;  // solicited event at the responder
inline constexpr uint8_t kCtrlFence = 0x80;      // what IBV_SEND_FENCE sets: wait for earlier READs, atomics
inline constexpr uint8_t kCtrlInitiatorSmallFence = 0x20;

inline constexpr uint32_t kWqebbBytes = 64;    // MLX5_SEND_WQE_BB
inline constexpr uint32_t kSegmentBytes = 16;  // ds unit ("octoword")
inline constexpr uint32_t kSegmentsPerWqebb = kWqebbBytes / kSegmentBytes;
inline constexpr uint32_t kInlineSegment = 0x80000000u;  // MLX5_INLINE_SEG, or'ed into an inline byte count
inline constexpr uint32_t kMaxDs = 0x3f;                 // ds is 6 bits (the provider reads qpn_ds & 0x3f)
inline constexpr uint32_t kAtomicBytes = 8;              // 64-bit atomics only

// ---- byte order -------------------------------------------------------------------------------------------

RAILNET_HOST_DEVICE constexpr inline uint32_t byteSwap32(uint32_t v) {
#if defined(__CUDA_ARCH__)
  return (v >> 24) | ((v >> 8) & 0x0000ff00u) | ((v << 8) & 0x00ff0000u) | (v << 24);  // one PRMT
#else
  return __builtin_bswap32(v);
#endif
}

RAILNET_HOST_DEVICE constexpr inline uint64_t byteSwap64(uint64_t v) {
#if defined(__CUDA_ARCH__)
  return (static_cast<uint64_t>(byteSwap32(static_cast<uint32_t>(v))) << 32) |
         byteSwap32(static_cast<uint32_t>(v >> 32));
#else
  return __builtin_bswap64(v);
#endif
}

// Host (or device) order to big-endian. GPUs are little-endian; so are the hosts railnet runs on, but a
// big-endian host compiles to the identity.
RAILNET_HOST_DEVICE constexpr inline uint32_t toBigEndian32(uint32_t v) {
#if !defined(__CUDA_ARCH__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return v;
#else
  return byteSwap32(v);
#endif
}

RAILNET_HOST_DEVICE constexpr inline uint64_t toBigEndian64(uint64_t v) {
#if !defined(__CUDA_ARCH__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_BIG_ENDIAN__
  return v;
#else
  return byteSwap64(v);
#endif
}

// ---- segments (16 bytes each except InlineHeader; all multi-byte fields big-endian) -----------------------

// struct mlx5_wqe_ctrl_seg. dci_stream_channel_id (a BE16 at byte 9) is two bytes here so that the struct needs
// no packing.
struct Ctrl {
  uint32_t opmodIdxOpcode;  // opmod << 24 | wqe index << 8 | opcode
  uint32_t qpnDs;           // qpn << 8 | ds (number of 16-byte units in the WQE, ctrl included)
  uint8_t signature;
  uint8_t dciStreamChannelId[2];
  uint8_t fmCeSe;
  uint32_t imm;  // immediate data, as given (network order)
};
static_assert(sizeof(Ctrl) == 16);
static_assert(offsetof(Ctrl, qpnDs) == 4 && offsetof(Ctrl, signature) == 8);
static_assert(offsetof(Ctrl, dciStreamChannelId) == 9 && offsetof(Ctrl, fmCeSe) == 11 && offsetof(Ctrl, imm) == 12);

// struct mlx5_wqe_raddr_seg.
struct Raddr {
  uint64_t remoteAddress;
  uint32_t rkey;
  uint32_t reserved;
};
static_assert(sizeof(Raddr) == 16);
static_assert(offsetof(Raddr, rkey) == 8 && offsetof(Raddr, reserved) == 12);

// struct mlx5_wqe_data_seg (a pointer to local memory: the source of a write, the sink of an atomic).
struct Data {
  uint32_t byteCount;
  uint32_t lkey;
  uint64_t address;
};
static_assert(sizeof(Data) == 16);
static_assert(offsetof(Data, lkey) == 4 && offsetof(Data, address) == 8);

// struct mlx5_wqe_atomic_seg. Fetch-and-add: swapAdd = the addend, compare unused (written 0).
struct Atomic {
  uint64_t swapAdd;
  uint64_t compare;
};
static_assert(sizeof(Atomic) == 16);
static_assert(offsetof(Atomic, compare) == 8);

// struct mlx5_wqe_inl_data_seg: BE32(bytes | kInlineSegment), then the bytes themselves, padded to 16.
struct InlineHeader {
  uint32_t byteCount;
};
static_assert(sizeof(InlineHeader) == 4);

// ---- segment writers ----------------------------------------------------------------------------------------

// Exactly what mlx5dv_set_ctrl_seg(seg, wqeIndex, opcode, opmod, qpn, fmCeSe, ds, 0, immediate) writes, plus
// dci_stream_channel_id = 0 (which mlx5dv_set_ctrl_seg leaves alone and the provider zeroes), so that every byte
// of the segment is written. qpn is 24 bits; ds at most kMaxDs.
RAILNET_HOST_DEVICE inline void writeCtrl(Ctrl* seg, uint16_t wqeIndex, uint8_t opcode, uint8_t opmod, uint32_t qpn,
                                          uint8_t fmCeSe, uint8_t ds, uint32_t immediate) {
  seg->opmodIdxOpcode =
      toBigEndian32((static_cast<uint32_t>(opmod) << 24) | (static_cast<uint32_t>(wqeIndex) << 8) | opcode);
  seg->qpnDs = toBigEndian32((qpn << 8) | ds);
  seg->signature = 0;
  seg->dciStreamChannelId[0] = 0;
  seg->dciStreamChannelId[1] = 0;
  seg->fmCeSe = fmCeSe;
  seg->imm = immediate;
}

// set_raddr_seg in providers/mlx5/qp.c.
RAILNET_HOST_DEVICE inline void writeRaddr(Raddr* seg, uint64_t remoteAddress, uint32_t rkey) {
  seg->remoteAddress = toBigEndian64(remoteAddress);
  seg->rkey = toBigEndian32(rkey);
  seg->reserved = 0;
}

// mlx5dv_set_data_seg.
RAILNET_HOST_DEVICE inline void writeData(Data* seg, uint32_t length, uint32_t lkey, uint64_t address) {
  seg->byteCount = toBigEndian32(length);
  seg->lkey = toBigEndian32(lkey);
  seg->address = toBigEndian64(address);
}

// Fetch-and-add operands (_set_atomic_seg in providers/mlx5/qp.c; compare, which it leaves alone, is zeroed).
RAILNET_HOST_DEVICE inline void writeFetchAdd(Atomic* seg, uint64_t add) {
  seg->swapAdd = toBigEndian64(add);
  seg->compare = 0;
}

// Compare-and-swap operands: the target becomes `swap` if it equals `compare`.
RAILNET_HOST_DEVICE inline void writeCompareSwap(Atomic* seg, uint64_t compare, uint64_t swap) {
  seg->swapAdd = toBigEndian64(swap);
  seg->compare = toBigEndian64(compare);
}

// 16-byte units an inline segment of `bytes` occupies (header + data, padded to 16); 0 for 0 bytes, which
// posts no inline segment at all (as set_data_inl_seg in providers/mlx5/qp.c).
RAILNET_HOST_DEVICE constexpr inline uint32_t inlineSegments(uint32_t bytes) {
  return bytes == 0 ? 0 : (static_cast<uint32_t>(sizeof(InlineHeader)) + bytes + kSegmentBytes - 1) / kSegmentBytes;
}

// An inline segment in contiguous memory (the caller knows it does not cross the end of the SQ ring; the
// builders below handle the crossing): header, `bytes` of data, and zeros up to the next 16-byte boundary, so
// the segment's bytes do not depend on what the slot held. Returns inlineSegments(bytes); writes nothing for 0.
RAILNET_HOST_DEVICE inline uint32_t writeInline(InlineHeader* seg, const void* data, uint32_t bytes) {
  if (bytes == 0) return 0;
  seg->byteCount = toBigEndian32(bytes | kInlineSegment);
  const uint32_t units = inlineSegments(bytes);
  unsigned char* out = reinterpret_cast<unsigned char*>(seg + 1);
  const unsigned char* in = static_cast<const unsigned char*>(data);
  const uint32_t padded = units * kSegmentBytes - static_cast<uint32_t>(sizeof(InlineHeader));
  for (uint32_t i = 0; i < bytes; ++i) out[i] = in[i];
  for (uint32_t i = bytes; i < padded; ++i) out[i] = 0;
  return units;
}

// ---- whole WQEs ---------------------------------------------------------------------------------------------

// The ring slot of WQEBB `index` in an SQ of `depth` (a power of two) WQEBBs starting at `sqBase`.
RAILNET_HOST_DEVICE inline void* wqebbAt(void* sqBase, uint32_t depth, uint32_t index) {
  return static_cast<unsigned char*>(sqBase) + static_cast<size_t>(index & (depth - 1)) * kWqebbBytes;
}

// The fields every WQE's ctrl segment takes from its post: the WQE's index (producer index of its first WQEBB),
// the QP number, and the fm_ce_se flags (kCtrlCqUpdate for a CQE, fence bits).
struct Post {
  uint16_t wqeIndex;
  uint32_t qpn;
  uint8_t fmCeSe;
};

struct LocalBuffer {  // registered local memory (host order)
  uint64_t address;
  uint32_t lkey;
};

struct RemoteBuffer {  // the peer's memory (host order)
  uint64_t address;
  uint32_t rkey;
};

// WQEBBs a WQE of `ds` units takes.
RAILNET_HOST_DEVICE constexpr inline uint32_t wqebbsForDs(uint32_t ds) {
  return (ds + kSegmentsPerWqebb - 1) / kSegmentsPerWqebb;
}

namespace detail {

RAILNET_HOST_DEVICE inline uint32_t buildRdmaWrite(void* bb, const Post& post, uint8_t opcode, LocalBuffer source,
                                                   RemoteBuffer target, uint32_t bytes, uint32_t immediate) {
  unsigned char* wqe = static_cast<unsigned char*>(bb);
  // A zero-length write carries no data segment (the provider skips zero-length SGEs).
  const uint8_t ds = bytes == 0 ? 2 : 3;
  writeCtrl(reinterpret_cast<Ctrl*>(wqe), post.wqeIndex, opcode, 0, post.qpn, post.fmCeSe, ds, immediate);
  writeRaddr(reinterpret_cast<Raddr*>(wqe + kSegmentBytes), target.address, target.rkey);
  if (bytes != 0) writeData(reinterpret_cast<Data*>(wqe + 2 * kSegmentBytes), bytes, source.lkey, source.address);
  return 1;
}

// ctrl + raddr + (atomic, left to the caller) + data pointing at the 8-byte sink; returns the atomic segment.
RAILNET_HOST_DEVICE inline Atomic* buildAtomicFrame(void* bb, const Post& post, uint8_t opcode, LocalBuffer sink,
                                                    RemoteBuffer target) {
  unsigned char* wqe = static_cast<unsigned char*>(bb);
  writeCtrl(reinterpret_cast<Ctrl*>(wqe), post.wqeIndex, opcode, 0, post.qpn, post.fmCeSe, 4, 0);
  writeRaddr(reinterpret_cast<Raddr*>(wqe + kSegmentBytes), target.address, target.rkey);
  writeData(reinterpret_cast<Data*>(wqe + 3 * kSegmentBytes), kAtomicBytes, sink.lkey, sink.address);
  return reinterpret_cast<Atomic*>(wqe + 2 * kSegmentBytes);
}

}  // namespace detail

// RDMA WRITE of `bytes` from `source` to `target`: ctrl + raddr + data, ds = 3 (2 for 0 bytes), one WQEBB.
// Returns the WQEBB count (1).
RAILNET_HOST_DEVICE inline uint32_t buildWrite(void* bb, const Post& post, LocalBuffer source, RemoteBuffer target,
                                               uint32_t bytes) {
  return detail::buildRdmaWrite(bb, post, kOpcodeRdmaWrite, source, target, bytes, 0);
}

// RDMA WRITE with immediate (`immediate` in network order, stored as given). Same layout as buildWrite.
RAILNET_HOST_DEVICE inline uint32_t buildWriteImm(void* bb, const Post& post, LocalBuffer source, RemoteBuffer target,
                                                  uint32_t bytes, uint32_t immediate) {
  return detail::buildRdmaWrite(bb, post, kOpcodeRdmaWriteImm, source, target, bytes, immediate);
}

// RDMA READ of `bytes` from the peer's `source` into local `sink`. Same layout as buildWrite (the provider builds
// READ and WRITE alike): ctrl + raddr + data, one WQEBB.
RAILNET_HOST_DEVICE inline uint32_t buildRead(void* bb, const Post& post, LocalBuffer sink, RemoteBuffer source,
                                              uint32_t bytes) {
  return detail::buildRdmaWrite(bb, post, kOpcodeRdmaRead, sink, source, bytes, 0);
}

// ds of an inline RDMA WRITE of `bytes`: ctrl + raddr + the inline segment.
RAILNET_HOST_DEVICE constexpr inline uint32_t inlineWriteDs(uint32_t bytes) { return 2 + inlineSegments(bytes); }

// The largest inline write a WQE can describe (ds fits 6 bits): 972 bytes, 16 WQEBBs. The QP's own limit
// (max_inline_data, fixed when it is created) is usually lower and is the caller's to respect.
inline constexpr uint32_t kMaxInlineWriteBytes =
    (kMaxDs - 2) * kSegmentBytes - static_cast<uint32_t>(sizeof(InlineHeader));
static_assert(inlineWriteDs(kMaxInlineWriteBytes) == kMaxDs);

// WQEBBs an inline write of `bytes` takes, ds * 16 rounded up to 64: 1 for 0-28 bytes, 2 for 29-92, 3 for
// 93-156, and one more per 64 bytes after that.
RAILNET_HOST_DEVICE constexpr inline uint32_t inlineWriteWqebbs(uint32_t bytes) {
  return wqebbsForDs(inlineWriteDs(bytes));
}

// RDMA WRITE of `bytes` carried in the WQE itself (no lkey needed; the data is copied now, so `data` may be
// reused on return): ctrl + raddr + inline segment. bbs[i] is the ring slot of WQEBB i of this WQE (slot of
// post.wqeIndex + i, wrapping at the end of the SQ: see wqebbAt); bbs must hold inlineWriteWqebbs(bytes)
// pointers. Returns that count, or 0 (nothing written) if bytes > kMaxInlineWriteBytes.
RAILNET_HOST_DEVICE inline uint32_t buildWriteInline(void* const* bbs, const Post& post, RemoteBuffer target,
                                                     const void* data, uint32_t bytes) {
  if (bytes > kMaxInlineWriteBytes) return 0;
  const uint32_t ds = inlineWriteDs(bytes);
  const uint32_t wqebbs = wqebbsForDs(ds);
  unsigned char* first = static_cast<unsigned char*>(bbs[0]);
  writeCtrl(reinterpret_cast<Ctrl*>(first), post.wqeIndex, kOpcodeRdmaWrite, 0, post.qpn, post.fmCeSe,
            static_cast<uint8_t>(ds), 0);
  writeRaddr(reinterpret_cast<Raddr*>(first + kSegmentBytes), target.address, target.rkey);
  if (bytes == 0) return wqebbs;
  reinterpret_cast<InlineHeader*>(first + 2 * kSegmentBytes)->byteCount = toBigEndian32(bytes | kInlineSegment);
  // Data and padding from WQE byte 36 to ds * 16, each byte into the WQEBB it falls in.
  const unsigned char* in = static_cast<const unsigned char*>(data);
  const uint32_t begin = 2 * kSegmentBytes + static_cast<uint32_t>(sizeof(InlineHeader));
  const uint32_t end = ds * kSegmentBytes;
  for (uint32_t at = begin; at < end; ++at) {
    const uint32_t i = at - begin;
    static_cast<unsigned char*>(bbs[at / kWqebbBytes])[at % kWqebbBytes] = i < bytes ? in[i] : 0;
  }
  return wqebbs;
}

// Atomic fetch-and-add of `add` to the 8-byte-aligned 64-bit word at `target`; the old value lands in the
// 8-byte `sink`. ctrl + raddr + atomic + data, ds = 4, one WQEBB. Returns 1.
RAILNET_HOST_DEVICE inline uint32_t buildFetchAdd(void* bb, const Post& post, LocalBuffer sink, RemoteBuffer target,
                                                  uint64_t add) {
  writeFetchAdd(detail::buildAtomicFrame(bb, post, kOpcodeAtomicFa, sink, target), add);
  return 1;
}

// Atomic compare-and-swap: the word at `target` becomes `swap` if it equals `compare`; the old value lands in
// `sink`. Same layout as buildFetchAdd. Returns 1.
RAILNET_HOST_DEVICE inline uint32_t buildCompareSwap(void* bb, const Post& post, LocalBuffer sink, RemoteBuffer target,
                                                     uint64_t compare, uint64_t swap) {
  writeCompareSwap(detail::buildAtomicFrame(bb, post, kOpcodeAtomicCs, sink, target), compare, swap);
  return 1;
}

// ---- doorbells ----------------------------------------------------------------------------------------------

// What goes in the QP's doorbell record dbrec[1] (MLX5_SND_DBR): the producer index after the last WQE posted
// (the next free WQEBB), big-endian, as providers/mlx5/qp.c post_send_db writes it.
RAILNET_HOST_DEVICE constexpr inline uint32_t doorbellRecordValue(uint16_t producerIndex) {
  return toBigEndian32(static_cast<uint32_t>(producerIndex) & 0xffffu);
}

// The 64-bit value whose native store writes the first 8 bytes of `ctrl` (opmod_idx_opcode, qpn_ds) in memory
// order: what the provider writes to the UAR doorbell register (mmio_write64_be(reg, *(__be64*)ctrl)) for the
// last WQE of a batch.
RAILNET_HOST_DEVICE inline uint64_t doorbellRegisterValue(const Ctrl* ctrl) {
  uint64_t value = 0;
  const unsigned char* in = reinterpret_cast<const unsigned char*>(ctrl);
  unsigned char* out = reinterpret_cast<unsigned char*>(&value);
  for (int i = 0; i < 8; ++i) out[i] = in[i];
  return value;
}

}  // namespace railnet::doorbell::mlx5
