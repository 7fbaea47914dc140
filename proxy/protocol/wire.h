// railnet's wire formats, shared by both transports: the 128-byte listen handle, the hello every socket opens
// with, the control frames, the clear-to-send entries and the header in front of each data chunk (TCP data
// streams; verbs notices). All integers are little-endian host order: both ends
// are x86-64/aarch64 little-endian hosts running the same wire version, which the hello checks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "proxy/protocol/socket.h"
#include "railnet/nccl/common.h"

namespace railnet::protocol {

constexpr uint32_t kHandleMagic = 0x43544e52;  // "RNTC"
constexpr uint32_t kHelloMagic = 0x4c484e52;   // "RNHL"
constexpr uint16_t kWireVersion = 3;  // 2: Hello::features, FrameType::kDone; 3: resumable control (kFeatureResume)
constexpr int kMaxStreams = 64;
constexpr int kMaxRecvs = 8;
constexpr int kMaxKeysPerBuffer = 8;  // rkeys per clear-to-send buffer: one per verbs path

// What listen() writes into NCCL's handle buffer; NCCL carries it to the connecting peer.
struct Handle {
  uint32_t magic;
  uint16_t version;
  uint16_t addressCount; // listening addresses (NICs) of the device: 0 or 1 for a physical device
  uint8_t address[28];  // sockaddr_in or sockaddr_in6 of the (first) listening socket
  int16_t railId;       // rail of the (first) listening NIC; -1 when unknown
  uint16_t nicCount;     // NICs behind the device when they share one listening address (a fused verbs
                         // device: its RDMA ports); 0 means 1
  uint64_t secret[2];    // random; a connection must present it in its hello
  uint64_t connectToken; // 0 as listen writes it; connect() keeps its in-progress state's id here
  uint8_t moreAddresses[64];  // a fused device's further listening addresses: HandleAddress4 or HandleAddress6
};
static_assert(sizeof(Handle) == NCCL_NET_HANDLE_MAXSIZE);
static_assert(offsetof(Handle, address) == 8);
static_assert(offsetof(Handle, railId) == 36);
static_assert(offsetof(Handle, secret) == 40);
static_assert(offsetof(Handle, moreAddresses) == 64);

// Further listening addresses of a fused device, same family and (IPv6) scope as the first one.
struct HandleAddress4 {
  uint8_t address[4];
  uint16_t port;  // network order
  int16_t railId;
};
struct HandleAddress6 {
  uint8_t address[16];
  uint16_t port;  // network order
  int16_t railId;
};
static_assert(sizeof(HandleAddress4) == 8 && sizeof(HandleAddress6) == 20);
constexpr int kMaxHandleAddresses4 = 1 + static_cast<int>(sizeof(Handle::moreAddresses) / sizeof(HandleAddress4));  // 9
constexpr int kMaxHandleAddresses6 = 1 + static_cast<int>(sizeof(Handle::moreAddresses) / sizeof(HandleAddress6));  // 4

// One listening NIC of a device: its address and rail.
struct ListenAddress {
  SocketAddress address;
  int16_t railId = -1;
};

// Writes addresses[0] into address/railId and the rest into moreAddresses. Throws ncclInvalidUsage when they do
// not fit (more than 9 IPv4 or 4 IPv6 addresses) or mix families.
void writeHandleAddresses(Handle* handle, const std::vector<ListenAddress>& addresses);
// The listening addresses a handle names (at least one). Throws ncclInvalidUsage on a malformed handle.
std::vector<ListenAddress> handleAddresses(const Handle& handle);

// kResume: a control socket re-made for a connection whose control socket broke (docs/failover.md, "The session
// layer"); it goes to the receiving side's session listener (SessionService), never to a listen comm.
// kRejoin: a data stream made again through a NIC that had failed and answers again (failback), to the receiver's
// session listener of that NIC; streamIndex names the stream it replaces. Nothing answers it: the sender writes
// chunks right after the hello.
enum class StreamRole : uint16_t { kControl = 0, kData = 1, kResume = 2, kRejoin = 3 };

// First bytes on every socket, client to server.
struct Hello {
  uint32_t magic;
  uint16_t version;
  uint16_t role;  // StreamRole
  uint64_t secret[2];
  uint64_t connectionId;  // random per connect(); groups the sockets of one connection
  uint16_t streamIndex;   // data streams: 0..streamCount-1
  uint16_t streamCount;   // data streams in this connection (0: control socket only)
  int16_t railId;         // sender's rail, for telemetry
  uint16_t nicCount;      // control socket: ConnectOptions::nicCount of the connecting device (0 means 1)
  uint32_t features;      // control socket: what the connecting (sending) side asks of the receiver (kFeature*)
  uint32_t resumeProcessed;  // kResume: control frames of the other side the connecting side has processed (mod
                             // 2^32), so the other side sends again exactly the ones after them; else 0
};
static_assert(sizeof(Hello) == 48);

// Hello::features. kFeatureDeliveredCompletion: the receiver sends a kDone frame when a buffer that data-stream
// chunks fill has all its bytes, and the sender completes that send on it (RAILNET_SEND_COMPLETION=delivered;
// docs/failover.md). Inline sends complete at once: their bytes are copied.
// kFeatureResume: control frames are numbered and kept until acknowledged, so a broken control socket is re-made
// and what the other side lacks is sent again (RAILNET_FAILOVER; docs/failover.md). The receiver answers with a
// kSession frame naming where a re-made control socket goes. Verbs asks for it with kFeaturePathFailover and numbers
// frames from the end of the QP records (D94).
inline constexpr uint32_t kFeatureDeliveredCompletion = 1;
inline constexpr uint32_t kFeatureResume = 2;
// kFeatureDataFailover (with both above): when a NIC's data streams fail, the sender sends their chunks of sends not
// yet delivered again over the other NICs; the receiver takes a failed data stream as that, not as the peer's end,
// and drops chunks of receives it has already finished (copies of chunks that had arrived).
inline constexpr uint32_t kFeatureDataFailover = 4;
// kFeatureMove (with kFeatureDataFailover, a sender whose device has one NIC): when that NIC fails, the connection
// moves to another NIC of either host, so the receiver lists its other NICs' session listeners after the
// connection's in its kSession frame (docs/failover.md "Single-NIC devices"). With kFeatureDataFailover the receiver
// never takes every stream and the control socket closed as the sender's end: the sender may be probing its NICs or
// moving; the control channel's resume limit decides.
inline constexpr uint32_t kFeatureMove = 8;
// kFeatureStandIn (any socket's hello, with kFeatureDataFailover on the connection): this socket stands in for one
// whose pair of NICs could not connect (a fused connection made while one of its NICs was down), so it arrives on
// another listener of the fused device than its index names; the sender takes that NIC out at once and probes it.
inline constexpr uint32_t kFeatureStandIn = 16;
// kFeaturePathFailover (verbs, RAILNET_FAILOVER): when a path's QPs fail, the sender asks the receiver which of the
// chunks on them landed and sends the rest over the other paths; a failed path is made again with new QPs when its
// NIC answers (kPathDown, kPathQuery, kPathAnswer, kPathRenew frames; clear-to-sends move off a failed path).
inline constexpr uint32_t kFeaturePathFailover = 32;
// kFeatureStandbyPath (verbs, with kFeaturePathFailover, between two single-NIC devices): the connection has one more
// path than its NICs give, its standby, on each host's nearest other NIC of the same kind (or its own NIC when it has
// none). It carries nothing until every other path has failed; then the sender makes it (kPathRenew), and hands the
// traffic back once the original path answers again (docs/failover.md "Single-NIC devices on verbs", D96).
inline constexpr uint32_t kFeatureStandbyPath = 64;
inline constexpr uint32_t kKnownFeatures = kFeatureDeliveredCompletion | kFeatureResume | kFeatureDataFailover |
                                           kFeatureMove | kFeatureStandIn | kFeaturePathFailover |
                                           kFeatureStandbyPath;

// Checks a hello against the listener's secret; returns nullptr when valid, else why not.
const char* validateHello(const Hello& hello, const uint64_t secret[2]);

// Control frames. Receiver -> sender: kClearToSend, kDone (only when the sender asked: kFeatureDeliveredCompletion).
// Sender -> receiver: kInline, kOversize. With kFeatureResume, both ways: kAck (size: frames of the other side
// processed so far, mod 2^32), kResume (the first frame on a re-made control socket, from the side that accepted
// it; size: its processed count), and receiver -> sender kSession (size: bytes of a sockaddr that follow, the
// receiver's session listeners, kSessionEntryBytes each: a sockaddr, zero-padded; extraKeys: how many of them are the
// connection's NICs, the rest being its host's other NICs a single-NIC connection may move to; 0: all). kAck and kResume are not numbered;
// every other frame is, in sending order from 0.
enum class FrameType : uint8_t {
  kClearToSend = 1, kInline = 2, kOversize = 3, kDone = 4, kAck = 5, kResume = 6, kSession = 7, kNicFailed = 8,
  kPathDown = 9, kPathQuery = 10, kPathAnswer = 11, kPathRenew = 12, kPathReady = 13
};
// Verbs path failover (kFeaturePathFailover; docs/failover.md "Verbs"), on the verbs control socket. In each, slot is
// the path and recvId its generation (how many times it was made again), so a frame about an earlier incarnation of
// a path never touches a later one; size counts the payload that follows:
// - kPathDown (either way, no payload): this end took the path out (its QPs are in the error state).
// - kPathQuery (sender -> receiver): size/32 chunk headers (ChunkHeader) whose work requests on the path failed;
//   the receiver answers once every notice that arrived on the path is counted.
// - kPathAnswer (receiver -> sender): one byte per queried header, 1 when its bytes are placed (or its receive
//   finished), 0 when missing; only missing chunks are sent again, so a copy never lands in a finished buffer.
// - kPathRenew: sender -> receiver, the path's new QP record (QpInfo); the answer carries the receiver's record,
//   or no payload when it cannot take the path back yet (its NIC is down, or the path still drains); a refusal
//   because its NIC is down says so with kRenewPortDown in extraKeys.
// - kPathReady (sender -> receiver, no payload): the sender's new QPs of the path are at RTS, so the receiver may send
//   its clear-to-sends there (before, one could arrive at a QP not yet ready and wait for the transport's retry).
// kNicFailed (sender -> receiver, kFeatureDataFailover): the sender took its NIC `slot` out, for the recvId-th time
// (its failures are counted per NIC); the receiver shuts that NIC's streams down, so a chunk still arriving on them
// cannot land after its copy did. A data stream made again after that failure carries the same count in its
// kRejoin hello (resumeProcessed), so a late kNicFailed never shuts the new streams.

inline constexpr uint16_t kRenewPortDown = 1;

struct FrameHeader {
  uint8_t type;    // FrameType
  uint8_t slot;    // buffer index within the grouped receive (kInline/kOversize); buffer count for kClearToSend
                   // kDone: the buffer (of receive recvId) that has all its bytes
  uint16_t extraKeys;  // kClearToSend from a fused verbs receiver: rkeys per buffer beyond the entry's (else 0)
  uint32_t recvId; // sequence number of the receive, per connection
  uint64_t size;   // payload bytes (kInline), sender's size (kOversize); unused for kClearToSend
};
static_assert(sizeof(FrameHeader) == 16);

// Follows a kClearToSend header, one per buffer of the receive. address/rkey let an RDMA sender write
// straight into the buffer; the TCP transport leaves them 0. When extraKeys = k > 0 (a verbs connection of
// k + 1 paths), the n entries are followed by n x k uint32 rkeys: buffer i's keys for paths 1..k.
struct ClearToSendEntry {
  int32_t tag;
  uint32_t rkey;
  uint64_t capacity;
  uint64_t address;
};
static_assert(sizeof(ClearToSendEntry) == 24);

inline constexpr size_t kSessionEntryBytes = 28;  // sizeof(sockaddr_in6): one session listener in a kSession frame
inline constexpr size_t kMaxSessionEntries = 16;

// The whole length of the frame `header` starts (header and what follows it), or 0 for an unknown type.
uint64_t frameLength(const FrameHeader& header);
// Frames the replay log keeps and the receiver counts: all but kAck and kResume.
inline bool numberedFrame(uint8_t type) {
  return type != static_cast<uint8_t>(FrameType::kAck) && type != static_cast<uint8_t>(FrameType::kResume);
}

// In front of every chunk on a data stream; chunks are self-describing, so any stream may carry any chunk.
struct ChunkHeader {
  uint32_t recvId;
  uint8_t slot;
  uint8_t flags;      // kChunkStaged: the chunk belongs to piece pieceSeq of a receive into GPU memory
  uint16_t pieceSeq;  // staged pieces are numbered per connection in the order the sender queued them (mod 2^16)
  uint64_t messageSize;  // total bytes of the message this chunk belongs to
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(ChunkHeader) == 32);
inline constexpr uint8_t kChunkStaged = 2;  // TCP's; flag 1 is verbs' kPayloadFollows (verbs/notice.h)

// Splitting a message of `size` bytes over `streams` streams: piece size, a multiple of 4 KiB, at least
// minChunk, and at most ceil(size / streams) rounded up so every stream gets work.
uint64_t chunkSizeFor(uint64_t size, int streams, uint64_t minChunk);

}  // namespace railnet::protocol
