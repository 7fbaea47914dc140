// How a fused device (several NICs behind one NCCL device, ABI v9+ makeVDevice) spreads one message over its
// NICs (one per physical NIC; a verbs connection stripes over its paths the same way). Shared by the TCP and
// verbs transports so both fuse the same way.
//
// Threshold scheduler: a message smaller than 2 x minStripeBytes goes whole to one NIC, chosen round-robin by
// the message's sequence number (small messages gain nothing from splitting and would pay one more work
// request or chunk header per NIC). A larger message is cut into at most `nics` stripes at 128-byte-aligned
// offsets (NCCL's and NICs' preferred alignment), each at least minStripeBytes, the last one taking the rest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

namespace railnet::protocol {

inline constexpr size_t kStripeAlignment = 128;
inline constexpr int kMaxStripeNics = 8;  // NCCL merges at most 8 devices per vNIC (ABI v12)

struct Stripe {
  int nic;
  size_t offset;
  size_t bytes;
};

// Fills out[0..n) and returns n (1 <= n <= nics; 1 for an empty message). nics is clamped to
// 1..kMaxStripeNics and minStripeBytes rounded up to a multiple of kStripeAlignment. Every stripe but the last
// is the same multiple of 128 bytes (so every offset is 128-aligned) and the last takes the rest, which makes
// every stripe at least minStripeBytes; stripes cover [0, bytes) in order without overlap, on distinct NICs.
inline int planStripes(size_t bytes, int nics, uint64_t sequence, size_t minStripeBytes, Stripe* out) {
  nics = std::clamp(nics, 1, kMaxStripeNics);
  minStripeBytes = std::max(minStripeBytes, kStripeAlignment);
  minStripeBytes = (minStripeBytes + kStripeAlignment - 1) / kStripeAlignment * kStripeAlignment;
  const int first = static_cast<int>(sequence % static_cast<uint64_t>(nics));
  if (nics == 1 || bytes < 2 * minStripeBytes) {
    out[0] = Stripe{first, 0, bytes};
    return 1;
  }
  const size_t stripesByMinimum = bytes / minStripeBytes;
  const int count = static_cast<int>(std::min<size_t>(static_cast<size_t>(nics), stripesByMinimum));
  // Rounded down: bytes / count >= minStripeBytes, a multiple of 128, so each >= minStripeBytes too.
  const size_t each = bytes / static_cast<size_t>(count) / kStripeAlignment * kStripeAlignment;
  size_t offset = 0;
  for (int i = 0; i < count; ++i) {
    const size_t length = i + 1 == count ? bytes - offset : each;
    // Start at a rotating nic so that back-to-back messages split in fewer stripes than nics still use all.
    out[i] = Stripe{(first + i) % nics, offset, length};
    offset += length;
  }
  return count;
}

}  // namespace railnet::protocol
