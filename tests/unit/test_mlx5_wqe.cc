// railnet's mlx5 send WQEs (include/railnet/mlx5_wqe.h) against rdma-core's own definitions: each WQE is built
// twice, once by railnet into a buffer full of garbage (0xa5) and once with <infiniband/mlx5dv.h>'s helpers
// (mlx5dv_set_ctrl_seg, mlx5dv_set_data_seg) and structs filled with htobe* into a zeroed buffer, as
// providers/mlx5/qp.c fills them; the first ds * 16 bytes must be identical, so railnet also writes every byte
// it owns (reserved fields, padding), and must leave the rest of the WQEBB alone. Not run on hardware.
#include <catch2/catch.hpp>

#include <endian.h>
#include <infiniband/mlx5dv.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "railnet/mlx5_wqe.h"

namespace mlx5 = railnet::doorbell::mlx5;

namespace {

constexpr unsigned char kGarbage = 0xa5;
constexpr size_t kBufferBytes = 16 * MLX5_SEND_WQE_BB;

struct alignas(64) Buffer {
  unsigned char bytes[kBufferBytes];
};

Buffer filled(unsigned char value) {
  Buffer buffer;
  std::memset(buffer.bytes, value, sizeof(buffer.bytes));
  return buffer;
}

// "" when the first `n` bytes are equal, else where they first differ.
std::string difference(const void* railnet, const void* rdmaCore, size_t n) {
  if (std::memcmp(railnet, rdmaCore, n) == 0) return "";
  const auto* a = static_cast<const unsigned char*>(railnet);
  const auto* b = static_cast<const unsigned char*>(rdmaCore);
  size_t i = 0;
  while (a[i] == b[i]) ++i;
  char text[96];
  std::snprintf(text, sizeof(text), "byte %zu of %zu: railnet 0x%02x, rdma-core 0x%02x", i, n, a[i], b[i]);
  return text;
}

// true when bytes [from, to) still hold kGarbage.
bool untouched(const Buffer& buffer, size_t from, size_t to) {
  for (size_t i = from; i < to; ++i)
    if (buffer.bytes[i] != kGarbage) return false;
  return true;
}

constexpr uint16_t kWqeIndices[] = {0, 1, 0x00ff, 0x0100, 0x1234, 0xfffe, 0xffff};
constexpr uint32_t kQpns[] = {0x000001, 0x00abcd, 0x123456, 0xffffff};
constexpr uint8_t kFlags[] = {0, MLX5_WQE_CTRL_CQ_UPDATE, MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_SOLICITED,
                              MLX5_WQE_CTRL_CQ_UPDATE | MLX5_WQE_CTRL_FENCE, MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE};
constexpr uint64_t kAddresses[] = {0, 0x1000, 0x00007f1234567890ull, 0x0123456789abcdefull, 0xfffffffffffffff8ull};
constexpr uint32_t kKeys[] = {0, 0x12345678, 0xdeadbeef, 0xffffffff};

// rdma-core's raddr segment, as set_raddr_seg in providers/mlx5/qp.c fills it.
void rdmaCoreRaddr(void* at, uint64_t address, uint32_t rkey) {
  auto* seg = static_cast<mlx5_wqe_raddr_seg*>(at);
  seg->raddr = htobe64(address);
  seg->rkey = htobe32(rkey);
  seg->reserved = 0;
}

// The same RDMA WRITE (with immediate when opcode says so) through rdma-core: ctrl + raddr + data.
void rdmaCoreWrite(unsigned char* wqe, uint16_t index, uint8_t opcode, uint32_t qpn, uint8_t flags, uint64_t local,
                   uint32_t lkey, uint64_t remote, uint32_t rkey, uint32_t bytes, uint32_t imm) {
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(wqe), index, opcode, 0, qpn, flags, 3, 0, imm);
  rdmaCoreRaddr(wqe + sizeof(mlx5_wqe_ctrl_seg), remote, rkey);
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(wqe + 32), bytes, lkey, local);
}

// The same atomic through rdma-core: ctrl + raddr + atomic + data (8 bytes into the sink).
void rdmaCoreAtomic(unsigned char* wqe, uint16_t index, uint8_t opcode, uint32_t qpn, uint8_t flags, uint64_t sink,
                    uint32_t lkey, uint64_t remote, uint32_t rkey, uint64_t swapAdd, uint64_t compare) {
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(wqe), index, opcode, 0, qpn, flags, 4, 0, 0);
  rdmaCoreRaddr(wqe + 16, remote, rkey);
  auto* atomic = reinterpret_cast<mlx5_wqe_atomic_seg*>(wqe + 32);
  atomic->swap_add = htobe64(swapAdd);
  atomic->compare = htobe64(compare);
  mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(wqe + 48), 8, lkey, sink);
}

// The same inline RDMA WRITE through rdma-core, in contiguous memory: ctrl + raddr + inline header + bytes.
void rdmaCoreWriteInline(unsigned char* wqe, uint16_t index, uint32_t qpn, uint8_t flags, uint64_t remote,
                         uint32_t rkey, const unsigned char* data, uint32_t bytes, uint8_t ds) {
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(wqe), index, MLX5_OPCODE_RDMA_WRITE, 0, qpn, flags, ds, 0,
                      0);
  rdmaCoreRaddr(wqe + 16, remote, rkey);
  auto* header = reinterpret_cast<mlx5_wqe_inl_data_seg*>(wqe + 32);
  header->byte_count = htobe32(bytes | MLX5_INLINE_SEG);
  std::memcpy(wqe + 32 + sizeof(mlx5_wqe_inl_data_seg), data, bytes);
}

std::vector<unsigned char> pattern(uint32_t bytes, unsigned seed) {
  std::vector<unsigned char> data(bytes);
  for (uint32_t i = 0; i < bytes; ++i) data[i] = static_cast<unsigned char>((i * 37u + seed * 11u + 1u) & 0xff);
  return data;
}

}  // namespace

TEST_CASE("mlx5 constants equal rdma-core's", "[mlx5]") {
  CHECK(mlx5::kOpcodeNop == MLX5_OPCODE_NOP);
  CHECK(mlx5::kOpcodeRdmaWrite == MLX5_OPCODE_RDMA_WRITE);
  CHECK(mlx5::kOpcodeRdmaWriteImm == MLX5_OPCODE_RDMA_WRITE_IMM);
  CHECK(mlx5::kOpcodeRdmaRead == MLX5_OPCODE_RDMA_READ);
  CHECK(mlx5::kOpcodeAtomicCs == MLX5_OPCODE_ATOMIC_CS);
  CHECK(mlx5::kOpcodeAtomicFa == MLX5_OPCODE_ATOMIC_FA);
  CHECK(mlx5::kCtrlCqUpdate == MLX5_WQE_CTRL_CQ_UPDATE);
  CHECK(mlx5::kCtrlSolicited == MLX5_WQE_CTRL_SOLICITED);
  CHECK(mlx5::kCtrlFence == MLX5_WQE_CTRL_FENCE);
  CHECK(mlx5::kCtrlInitiatorSmallFence == MLX5_WQE_CTRL_INITIATOR_SMALL_FENCE);
  CHECK(mlx5::kWqebbBytes == MLX5_SEND_WQE_BB);
  CHECK(mlx5::kWqebbBytes == 1u << MLX5_SEND_WQE_SHIFT);
  CHECK(mlx5::kInlineSegment == static_cast<uint32_t>(MLX5_INLINE_SEG));
  CHECK(mlx5::kSegmentBytes == sizeof(mlx5_wqe_ctrl_seg));
}

TEST_CASE("mlx5 segment layouts equal rdma-core's", "[mlx5]") {
  CHECK(sizeof(mlx5::Ctrl) == sizeof(mlx5_wqe_ctrl_seg));
  CHECK(offsetof(mlx5::Ctrl, opmodIdxOpcode) == offsetof(mlx5_wqe_ctrl_seg, opmod_idx_opcode));
  CHECK(offsetof(mlx5::Ctrl, qpnDs) == offsetof(mlx5_wqe_ctrl_seg, qpn_ds));
  CHECK(offsetof(mlx5::Ctrl, signature) == offsetof(mlx5_wqe_ctrl_seg, signature));
  CHECK(offsetof(mlx5::Ctrl, dciStreamChannelId) == offsetof(mlx5_wqe_ctrl_seg, dci_stream_channel_id));
  CHECK(sizeof(mlx5::Ctrl::dciStreamChannelId) == sizeof(mlx5_wqe_ctrl_seg::dci_stream_channel_id));
  CHECK(offsetof(mlx5::Ctrl, fmCeSe) == offsetof(mlx5_wqe_ctrl_seg, fm_ce_se));
  CHECK(offsetof(mlx5::Ctrl, imm) == offsetof(mlx5_wqe_ctrl_seg, imm));
  CHECK(sizeof(mlx5::Raddr) == sizeof(mlx5_wqe_raddr_seg));
  CHECK(offsetof(mlx5::Raddr, rkey) == offsetof(mlx5_wqe_raddr_seg, rkey));
  CHECK(offsetof(mlx5::Raddr, reserved) == offsetof(mlx5_wqe_raddr_seg, reserved));
  CHECK(sizeof(mlx5::Data) == sizeof(mlx5_wqe_data_seg));
  CHECK(offsetof(mlx5::Data, lkey) == offsetof(mlx5_wqe_data_seg, lkey));
  CHECK(offsetof(mlx5::Data, address) == offsetof(mlx5_wqe_data_seg, addr));
  CHECK(sizeof(mlx5::Atomic) == sizeof(mlx5_wqe_atomic_seg));
  CHECK(offsetof(mlx5::Atomic, compare) == offsetof(mlx5_wqe_atomic_seg, compare));
  CHECK(sizeof(mlx5::InlineHeader) == sizeof(mlx5_wqe_inl_data_seg));
}

TEST_CASE("mlx5 byte swaps equal htobe32 and htobe64", "[mlx5]") {
  constexpr uint32_t k32[] = {0, 1, 0x12345678, 0x80000000, 0xdeadbeef, 0xffffffff, 0x000000ff};
  for (const uint32_t v : k32) {
    CAPTURE(v);
    CHECK(mlx5::toBigEndian32(v) == htobe32(v));
    CHECK(mlx5::byteSwap32(v) == htobe32(v));  // this host is little-endian
  }
  constexpr uint64_t k64[] = {0, 1, 0x0123456789abcdefull, 0x8000000000000000ull, 0xffffffffffffffffull, 0xff};
  for (const uint64_t v : k64) {
    CAPTURE(v);
    CHECK(mlx5::toBigEndian64(v) == htobe64(v));
    CHECK(mlx5::byteSwap64(v) == htobe64(v));
  }
  static_assert(mlx5::byteSwap32(0x11223344u) == 0x44332211u);  // usable in constant expressions
  static_assert(mlx5::byteSwap64(0x1122334455667788ull) == 0x8877665544332211ull);
}

TEST_CASE("mlx5 ctrl segment equals mlx5dv_set_ctrl_seg", "[mlx5]") {
  constexpr uint8_t kOpcodes[] = {MLX5_OPCODE_NOP, MLX5_OPCODE_RDMA_WRITE, MLX5_OPCODE_RDMA_WRITE_IMM,
                                  MLX5_OPCODE_ATOMIC_CS, MLX5_OPCODE_ATOMIC_FA};
  constexpr uint8_t kOpmods[] = {0, 0x08, 0xff};
  constexpr uint8_t kDs[] = {1, 2, 3, 4, 9, 0x3f};
  constexpr uint32_t kImms[] = {0, 0x01020304, 0xffffffff};
  int cases = 0;
  for (const uint16_t index : kWqeIndices)
    for (const uint32_t qpn : kQpns)
      for (const uint8_t opcode : kOpcodes)
        for (const uint8_t opmod : kOpmods)
          for (const uint8_t flags : kFlags)
            for (const uint8_t ds : kDs)
              for (const uint32_t imm : kImms) {
                Buffer ours = filled(kGarbage);
                Buffer theirs = filled(0);
                mlx5::writeCtrl(reinterpret_cast<mlx5::Ctrl*>(ours.bytes), index, opcode, opmod, qpn, flags, ds, imm);
                mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(theirs.bytes), index, opcode, opmod, qpn,
                                    flags, ds, 0, imm);
                const std::string diff = difference(ours.bytes, theirs.bytes, 16);
                if (!diff.empty()) {
                  CAPTURE(index, qpn, +opcode, +opmod, +flags, +ds, imm);
                  FAIL_CHECK(diff);
                }
                ++cases;
              }
  CHECK(cases > 10000);
  // A 32-bit producer counter past 0xffff wraps to index 0 in the segment.
  Buffer wrapped = filled(kGarbage);
  Buffer zero = filled(kGarbage);
  const uint32_t counter = 0x10000;
  mlx5::writeCtrl(reinterpret_cast<mlx5::Ctrl*>(wrapped.bytes), static_cast<uint16_t>(counter), 0x08, 0, 7, 0, 3, 0);
  mlx5::writeCtrl(reinterpret_cast<mlx5::Ctrl*>(zero.bytes), 0, 0x08, 0, 7, 0, 3, 0);
  CHECK(difference(wrapped.bytes, zero.bytes, 16).empty());
  CHECK(untouched(wrapped, 16, kBufferBytes));
}

TEST_CASE("mlx5 data segment equals mlx5dv_set_data_seg", "[mlx5]") {
  constexpr uint32_t kLengths[] = {1, 8, 4096, 0x7fffffff, 0x80000000, 0xffffffff};
  for (const uint32_t length : kLengths)
    for (const uint32_t lkey : kKeys)
      for (const uint64_t address : kAddresses) {
        CAPTURE(length, lkey, address);
        Buffer ours = filled(kGarbage);
        Buffer theirs = filled(0);
        mlx5::writeData(reinterpret_cast<mlx5::Data*>(ours.bytes), length, lkey, address);
        mlx5dv_set_data_seg(reinterpret_cast<mlx5_wqe_data_seg*>(theirs.bytes), length, lkey, address);
        CHECK(difference(ours.bytes, theirs.bytes, 16).empty());
        CHECK(untouched(ours, 16, 64));
      }
}

TEST_CASE("mlx5 raddr and atomic segments equal rdma-core's", "[mlx5]") {
  for (const uint32_t rkey : kKeys)
    for (const uint64_t address : kAddresses) {
      CAPTURE(rkey, address);
      Buffer ours = filled(kGarbage);
      Buffer theirs = filled(0);
      mlx5::writeRaddr(reinterpret_cast<mlx5::Raddr*>(ours.bytes), address, rkey);
      rdmaCoreRaddr(theirs.bytes, address, rkey);
      CHECK(difference(ours.bytes, theirs.bytes, 16).empty());
    }
  constexpr uint64_t kOperands[] = {0, 1, 0x0123456789abcdefull, 0xffffffffffffffffull};
  for (const uint64_t a : kOperands)
    for (const uint64_t b : kOperands) {
      CAPTURE(a, b);
      Buffer ours = filled(kGarbage);
      Buffer theirs = filled(0);
      mlx5::writeFetchAdd(reinterpret_cast<mlx5::Atomic*>(ours.bytes), a);
      reinterpret_cast<mlx5_wqe_atomic_seg*>(theirs.bytes)->swap_add = htobe64(a);  // compare stays 0
      CHECK(difference(ours.bytes, theirs.bytes, 16).empty());
      mlx5::writeCompareSwap(reinterpret_cast<mlx5::Atomic*>(ours.bytes), a, b);
      reinterpret_cast<mlx5_wqe_atomic_seg*>(theirs.bytes)->swap_add = htobe64(b);
      reinterpret_cast<mlx5_wqe_atomic_seg*>(theirs.bytes)->compare = htobe64(a);
      CHECK(difference(ours.bytes, theirs.bytes, 16).empty());
    }
}

TEST_CASE("mlx5 RDMA WRITE WQE equals rdma-core's", "[mlx5]") {
  int cases = 0;
  for (const uint16_t index : kWqeIndices)
    for (const uint32_t qpn : kQpns)
      for (const uint8_t flags : kFlags)
        for (const uint64_t address : kAddresses)
          for (const uint32_t key : kKeys)
            for (const uint32_t bytes : {1u, 4096u, 0x40000000u}) {
              const uint64_t remote = ~address & ~0x7ull;
              const uint32_t rkey = key ^ 0x5a5a5a5a;
              const mlx5::Post post{index, qpn, flags};
              Buffer ours = filled(kGarbage);
              Buffer theirs = filled(0);
              const uint32_t wqebbs = mlx5::buildWrite(ours.bytes, post, {address, key}, {remote, rkey}, bytes);
              rdmaCoreWrite(theirs.bytes, index, MLX5_OPCODE_RDMA_WRITE, qpn, flags, address, key, remote, rkey, bytes,
                            0);
              std::string diff = difference(ours.bytes, theirs.bytes, 48);
              if (wqebbs != 1 || !diff.empty() || !untouched(ours, 48, kBufferBytes)) {
                CAPTURE(index, qpn, +flags, address, key, bytes, wqebbs);
                FAIL_CHECK("write: " << diff);
              }
              const uint32_t imm = htobe32(key + 1);
              ours = filled(kGarbage);
              theirs = filled(0);
              const uint32_t immWqebbs =
                  mlx5::buildWriteImm(ours.bytes, post, {address, key}, {remote, rkey}, bytes, imm);
              rdmaCoreWrite(theirs.bytes, index, MLX5_OPCODE_RDMA_WRITE_IMM, qpn, flags, address, key, remote, rkey,
                            bytes, imm);
              diff = difference(ours.bytes, theirs.bytes, 48);
              if (immWqebbs != 1 || !diff.empty() || !untouched(ours, 48, kBufferBytes)) {
                CAPTURE(index, qpn, +flags, address, key, bytes, immWqebbs);
                FAIL_CHECK("write with immediate: " << diff);
              }
              ++cases;
            }
  CHECK(cases > 1000);
}

TEST_CASE("mlx5 RDMA READ WQE equals rdma-core's", "[mlx5]") {
  // rdma-core's provider builds an RDMA READ as it builds a WRITE (ctrl, raddr of the peer's source, data of the
  // local sink), with the READ opcode.
  int cases = 0;
  for (const uint16_t index : kWqeIndices)
    for (const uint32_t qpn : kQpns)
      for (const uint8_t flags : kFlags)
        for (const uint64_t address : kAddresses)
          for (const uint32_t bytes : {1u, 8u, 4096u}) {
            const uint64_t remote = ~address & ~0x7ull;
            const mlx5::Post post{index, qpn, flags};
            Buffer ours = filled(kGarbage);
            Buffer theirs = filled(0);
            const uint32_t wqebbs = mlx5::buildRead(ours.bytes, post, {address, 0x1234}, {remote, 0x5678}, bytes);
            rdmaCoreWrite(theirs.bytes, index, MLX5_OPCODE_RDMA_READ, qpn, flags, address, 0x1234, remote, 0x5678,
                          bytes, 0);
            const std::string diff = difference(ours.bytes, theirs.bytes, 48);
            if (wqebbs != 1 || !diff.empty() || !untouched(ours, 48, kBufferBytes)) {
              CAPTURE(index, qpn, +flags, address, bytes, wqebbs);
              FAIL_CHECK("read: " << diff);
            }
            ++cases;
          }
  CHECK(cases > 100);
}

TEST_CASE("mlx5 zero-byte WRITE has no data segment", "[mlx5]") {
  // As the provider does for a zero-length SGE: ctrl + raddr only, ds = 2.
  Buffer ours = filled(kGarbage);
  Buffer theirs = filled(0);
  CHECK(mlx5::buildWrite(ours.bytes, {5, 0x123, MLX5_WQE_CTRL_CQ_UPDATE}, {0x1000, 1}, {0x2000, 2}, 0) == 1);
  mlx5dv_set_ctrl_seg(reinterpret_cast<mlx5_wqe_ctrl_seg*>(theirs.bytes), 5, MLX5_OPCODE_RDMA_WRITE, 0, 0x123,
                      MLX5_WQE_CTRL_CQ_UPDATE, 2, 0, 0);
  rdmaCoreRaddr(theirs.bytes + 16, 0x2000, 2);
  CHECK(difference(ours.bytes, theirs.bytes, 32).empty());
  CHECK(untouched(ours, 32, kBufferBytes));
}

TEST_CASE("mlx5 inline WRITE WQE equals rdma-core's", "[mlx5]") {
  struct Size {
    uint32_t bytes, ds, wqebbs;
  };
  // ds = 2 (ctrl + raddr) + ceil((4 + bytes) / 16); WQEBBs = ceil(ds / 4).
  constexpr Size kSizes[] = {{1, 3, 1},   {12, 3, 1},   {13, 4, 1},   {28, 4, 1},   {29, 5, 2},
                             {44, 5, 2},  {45, 6, 2},   {60, 6, 2},   {92, 8, 2},   {93, 9, 3},
                             {100, 9, 3}, {156, 12, 3}, {157, 13, 4}, {220, 16, 4}, {972, 63, 16}};
  for (const Size& size : kSizes)
    for (const uint16_t index : {uint16_t{0}, uint16_t{0x1234}, uint16_t{0xffff}})
      for (const uint32_t qpn : {1u, 0xffffffu}) {
        CAPTURE(size.bytes, index, qpn);
        CHECK(mlx5::inlineWriteDs(size.bytes) == size.ds);
        CHECK(mlx5::inlineWriteWqebbs(size.bytes) == size.wqebbs);
        const std::vector<unsigned char> data = pattern(size.bytes, index);
        Buffer ours = filled(kGarbage);
        Buffer theirs = filled(0);
        void* bbs[16];
        for (int i = 0; i < 16; ++i) bbs[i] = ours.bytes + i * MLX5_SEND_WQE_BB;  // contiguous: no ring wrap
        const mlx5::Post post{index, qpn, MLX5_WQE_CTRL_CQ_UPDATE};
        CHECK(mlx5::buildWriteInline(bbs, post, {0x00007f0000001000ull, 0xabcdef01}, data.data(), size.bytes) ==
              size.wqebbs);
        rdmaCoreWriteInline(theirs.bytes, index, qpn, MLX5_WQE_CTRL_CQ_UPDATE, 0x00007f0000001000ull, 0xabcdef01,
                            data.data(), size.bytes, static_cast<uint8_t>(size.ds));
        CHECK(difference(ours.bytes, theirs.bytes, size.ds * 16).empty());
        CHECK(untouched(ours, size.ds * 16, kBufferBytes));
      }
  // No inline segment for 0 bytes (as the provider), and nothing written past what ds can describe.
  Buffer ours = filled(kGarbage);
  void* bbs[16];
  for (int i = 0; i < 16; ++i) bbs[i] = ours.bytes + i * MLX5_SEND_WQE_BB;
  CHECK(mlx5::inlineWriteDs(0) == 2);
  CHECK(mlx5::buildWriteInline(bbs, {1, 2, 0}, {3, 4}, nullptr, 0) == 1);
  CHECK(untouched(ours, 32, kBufferBytes));
  CHECK(mlx5::kMaxInlineWriteBytes == 972);
  ours = filled(kGarbage);
  const std::vector<unsigned char> big(mlx5::kMaxInlineWriteBytes + 1, 1);
  CHECK(mlx5::buildWriteInline(bbs, {1, 2, 0}, {3, 4}, big.data(), mlx5::kMaxInlineWriteBytes + 1) == 0);
  CHECK(untouched(ours, 0, kBufferBytes));
}

TEST_CASE("mlx5 inline WRITE wraps around the SQ ring", "[mlx5]") {
  // A 4-WQEBB ring; a 3-WQEBB WQE (100 bytes inline) posted at producer index 0xfffe lands in slots 2, 3, 0.
  constexpr uint32_t kDepth = 4;
  constexpr uint32_t kBytes = 100;
  constexpr uint32_t kDs = 9;
  for (const uint32_t producer : {0xfffeu, 0x0003u, 0x0007u}) {
    CAPTURE(producer);
    Buffer ring = filled(kGarbage);
    void* bbs[3];
    for (uint32_t i = 0; i < 3; ++i) bbs[i] = mlx5::wqebbAt(ring.bytes, kDepth, producer + i);
    CHECK(bbs[0] == ring.bytes + (producer & (kDepth - 1)) * 64);
    const std::vector<unsigned char> data = pattern(kBytes, producer);
    const mlx5::Post post{static_cast<uint16_t>(producer), 0xfedcba, MLX5_WQE_CTRL_CQ_UPDATE};
    REQUIRE(mlx5::buildWriteInline(bbs, post, {0x2000, 0x77}, data.data(), kBytes) == 3);
    // Unwrap the ring into one contiguous WQE and compare that with rdma-core's contiguous build.
    Buffer unwrapped = filled(0);
    for (uint32_t i = 0; i < 3; ++i) std::memcpy(unwrapped.bytes + i * 64, bbs[i], 64);
    Buffer theirs = filled(0);
    rdmaCoreWriteInline(theirs.bytes, static_cast<uint16_t>(producer), 0xfedcba, MLX5_WQE_CTRL_CQ_UPDATE, 0x2000, 0x77,
                        data.data(), kBytes, kDs);
    CHECK(difference(unwrapped.bytes, theirs.bytes, kDs * 16).empty());
    // The fourth slot, not part of the WQE, is untouched; so is the last WQEBB past ds * 16.
    unsigned char* spare = static_cast<unsigned char*>(mlx5::wqebbAt(ring.bytes, kDepth, producer + 3));
    for (int i = 0; i < 64; ++i) CHECK(spare[i] == kGarbage);
    for (uint32_t i = kDs * 16 - 128; i < 64; ++i) CHECK(static_cast<unsigned char*>(bbs[2])[i] == kGarbage);
  }
}

TEST_CASE("mlx5 writeInline pads the segment to 16 bytes", "[mlx5]") {
  for (const uint32_t bytes : {1u, 12u, 13u, 44u, 45u, 60u, 100u}) {
    CAPTURE(bytes);
    const std::vector<unsigned char> data = pattern(bytes, 3);
    Buffer ours = filled(kGarbage);
    Buffer theirs = filled(0);
    const uint32_t units = mlx5::writeInline(reinterpret_cast<mlx5::InlineHeader*>(ours.bytes), data.data(), bytes);
    CHECK(units == (4 + bytes + 15) / 16);
    auto* header = reinterpret_cast<mlx5_wqe_inl_data_seg*>(theirs.bytes);
    header->byte_count = htobe32(bytes | MLX5_INLINE_SEG);
    std::memcpy(header + 1, data.data(), bytes);
    CHECK(difference(ours.bytes, theirs.bytes, units * 16).empty());
    CHECK(untouched(ours, units * 16, kBufferBytes));
  }
  Buffer ours = filled(kGarbage);
  CHECK(mlx5::writeInline(reinterpret_cast<mlx5::InlineHeader*>(ours.bytes), nullptr, 0) == 0);
  CHECK(untouched(ours, 0, kBufferBytes));
}

TEST_CASE("mlx5 atomic WQEs equal rdma-core's", "[mlx5]") {
  constexpr uint64_t kOperands[] = {1, 0x100000000ull, 0xffffffffffffffffull};
  int cases = 0;
  for (const uint16_t index : kWqeIndices)
    for (const uint32_t qpn : kQpns)
      for (const uint8_t flags : kFlags)
        for (const uint64_t add : kOperands)
          for (const uint32_t key : kKeys) {
            const uint64_t sink = 0x00007f00deadbee8ull;
            const uint64_t target = 0x0000100000000040ull + key;
            const uint32_t rkey = ~key;
            const mlx5::Post post{index, qpn, flags};
            Buffer ours = filled(kGarbage);
            Buffer theirs = filled(0);
            const uint32_t wqebbs = mlx5::buildFetchAdd(ours.bytes, post, {sink, key}, {target, rkey}, add);
            rdmaCoreAtomic(theirs.bytes, index, MLX5_OPCODE_ATOMIC_FA, qpn, flags, sink, key, target, rkey, add, 0);
            std::string diff = difference(ours.bytes, theirs.bytes, 64);
            if (wqebbs != 1 || !diff.empty() || !untouched(ours, 64, kBufferBytes)) {
              CAPTURE(index, qpn, +flags, add, key, wqebbs);
              FAIL_CHECK("fetch-add: " << diff);
            }
            const uint64_t compare = add ^ 0x0f0f0f0f0f0f0f0full;
            ours = filled(kGarbage);
            theirs = filled(0);
            const uint32_t csWqebbs =
                mlx5::buildCompareSwap(ours.bytes, post, {sink, key}, {target, rkey}, compare, add);
            rdmaCoreAtomic(theirs.bytes, index, MLX5_OPCODE_ATOMIC_CS, qpn, flags, sink, key, target, rkey, add,
                           compare);
            diff = difference(ours.bytes, theirs.bytes, 64);
            if (csWqebbs != 1 || !diff.empty() || !untouched(ours, 64, kBufferBytes)) {
              CAPTURE(index, qpn, +flags, add, key, csWqebbs);
              FAIL_CHECK("compare-and-swap: " << diff);
            }
            ++cases;
          }
  CHECK(cases > 1000);
}

TEST_CASE("mlx5 doorbell record and register values", "[mlx5]") {
  for (const uint16_t pi : kWqeIndices) {
    CAPTURE(pi);
    // providers/mlx5/qp.c post_send_db: qp->db[MLX5_SND_DBR] = htobe32(qp->sq.cur_post & 0xffff).
    CHECK(mlx5::doorbellRecordValue(pi) == htobe32(pi & 0xffff));
    uint32_t dbrec[2] = {0x11111111, 0x22222222};
    dbrec[MLX5_SND_DBR] = mlx5::doorbellRecordValue(pi);
    const unsigned char expected[4] = {0, 0, static_cast<unsigned char>(pi >> 8), static_cast<unsigned char>(pi)};
    CHECK(std::memcmp(&dbrec[1], expected, 4) == 0);
    CHECK(dbrec[0] == 0x11111111);
  }
  // The register value is the ctrl segment's first 8 bytes (mmio_write64_be(reg, *(__be64 *)ctrl)).
  for (const uint16_t index : kWqeIndices)
    for (const uint32_t qpn : kQpns) {
      CAPTURE(index, qpn);
      Buffer ours = filled(kGarbage);
      mlx5::buildFetchAdd(ours.bytes, {index, qpn, MLX5_WQE_CTRL_CQ_UPDATE}, {0x1000, 1}, {0x2000, 2}, 1);
      mlx5_wqe_ctrl_seg theirs{};
      mlx5dv_set_ctrl_seg(&theirs, index, MLX5_OPCODE_ATOMIC_FA, 0, qpn, MLX5_WQE_CTRL_CQ_UPDATE, 4, 0, 0);
      uint64_t rdmaCoreValue = 0;
      std::memcpy(&rdmaCoreValue, &theirs, sizeof(rdmaCoreValue));
      const uint64_t value = mlx5::doorbellRegisterValue(reinterpret_cast<const mlx5::Ctrl*>(ours.bytes));
      CHECK(value == rdmaCoreValue);
      unsigned char stored[8];
      std::memcpy(stored, &value, 8);  // what one native 8-byte store puts on the bus, in address order
      const unsigned char expected[8] = {0,
                                         static_cast<unsigned char>(index >> 8),
                                         static_cast<unsigned char>(index),
                                         MLX5_OPCODE_ATOMIC_FA,
                                         static_cast<unsigned char>(qpn >> 16),
                                         static_cast<unsigned char>(qpn >> 8),
                                         static_cast<unsigned char>(qpn),
                                         4};
      CHECK(std::memcmp(stored, expected, 8) == 0);
    }
}
