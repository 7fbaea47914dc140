// Every RAILNET_* setting, declared once: type, field, environment variable, default, allowed values, and what
// it does. Values are parsed once, from the environment, the first time settings() is called. A value that does
// not parse or is out of range is not replaced: it is listed in settingsErrors(), and plugin init fails with one
// WARN per bad setting (docs/decisions.md D59).
#pragma once

#include <sys/socket.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace railnet {

// Typed values of the enum-like settings; their spellings live in the table below.
enum class TransportChoice { kAuto, kTcp, kVerbs };
// RAILNET_IB_FLUSH: auto (flush receives into GPU memory), 0 (never), 1 (always, host memory too: lets the
// conformance harness run the real READ on soft-RoCE).
enum class FlushMode { kAuto, kNever, kAlways };
enum class SendCompletion { kAuto, kWritten, kDelivered };
// The AF_* value itself, so call sites can pass static_cast<int>(family) to the socket API.
enum class AddressFamily : int { kAny = AF_UNSPEC, kInet = AF_INET, kInet6 = AF_INET6 };

// Upper ends of ranges with no natural limit: kIntMax where the value ends up in an int (socket options,
// milliseconds, Mb/s), kSizeMax for byte counts kept in 64 bits.
inline constexpr int64_t kIntMax = INT32_MAX;
inline constexpr int64_t kSizeMax = INT64_MAX;

}  // namespace railnet

// X(type, field, ENV_NAME, default, allowed, doc)
//   String: allowed is ().
//   Int:    allowed is (min, max), both inclusive; values may end in k, m or g (KiB, MiB, GiB).
//   Enum:   allowed is (C++ type, {"spelling", value}, ...); the first spelling of a value is how it is shown.
#define RAILNET_SETTINGS(X)                                                                                      \
  X(String, ifname, "RAILNET_IFNAME", "", (),                                                                    \
    "Interfaces railnet may use, NCCL_SOCKET_IFNAME syntax: comma-separated prefixes, '^' to exclude, '=' for "  \
    "exact names. Empty: NCCL's order, the first that finds any of ib*; all but docker*, lo, virbr*; docker*; lo.") \
  X(Enum, socketFamily, "RAILNET_SOCKET_FAMILY", AddressFamily::kAny,                                            \
    (AddressFamily, {"", AddressFamily::kAny}, {"AF_INET", AddressFamily::kInet},                                \
     {"AF_INET6", AddressFamily::kInet6}, {"4", AddressFamily::kInet}, {"ipv4", AddressFamily::kInet},           \
     {"6", AddressFamily::kInet6}, {"ipv6", AddressFamily::kInet6}),                                             \
    "AF_INET or AF_INET6 to force the address family of each interface; empty prefers IPv4.")                    \
  X(Int, tcpStreams, "RAILNET_TCP_STREAMS", 8, (1, 64) /* proxy/tcp/wire.h kMaxStreams */,                       \
    "Data streams (TCP connections) per railnet connection; large messages are split across them.")              \
  X(Int, tcpThreads, "RAILNET_TCP_THREADS", 0, (0, 64),                                                          \
    "Helper threads in the process-wide pool that moves data-stream bytes; 0: min(2 x streams, cores, 16).")     \
  X(Int, tcpInlineBytes, "RAILNET_TCP_INLINE_BYTES", 65536, (0, kSizeMax),                                       \
    "Messages up to this size travel inline on the control connection, sent by the calling thread.")             \
  X(Int, maxRecvs, "RAILNET_MAX_RECVS", 8, (1, 8) /* proxy/protocol/wire.h kMaxRecvs */,                        \
    "Receives NCCL may group into one call (the devices' maxRecvs); 1: NCCL posts every receive on its own, "   \
    "which turns multireceive aggregation off.")                                                                \
  X(Int, groupWaitUs, "RAILNET_GROUP_WAIT_US", 20, (0, 1000000),                                                \
    "Multireceive aggregation: a small send into a grouped receive (maxRecvs > 1) waits up to this long for the "\
    "group's other sends, so they travel as one transfer; 0 sends each member on its own.")                     \
  X(Int, forward, "RAILNET_FORWARD", 1, (0, 1),                                                                 \
    "PXN-style routing: a connection to a peer NIC on another rail leaves from this host's NIC on that rail "    \
    "when there is one (TCP; verbs: RAILNET_IB_NVLINK_HOP says how for GPUDirect ports; docs/design.md, "       \
    "Routes); 0: always from the device NCCL chose.")                                                                                    \
  X(Int, doorbellDirect, "RAILNET_DOORBELL_DIRECT", 0, (0, 1),                                                  \
    "1: railnet's GPU doorbells post straight to mlx5 NICs (kernels write the send queues' WQEs and ring their "  \
    "doorbells: IBGDA) when every rank of a context can, else the descriptor ring; 0: always the ring. Not run on " \
    "hardware yet, hence off by default (docs/decisions.md D73).")                                              \
  X(Int, gin, "RAILNET_GIN", 1, (0, 1),                                                                          \
    "1: the plugin exports NCCL's GIN proxy backend and RMA plugin (one-sided puts and signals for NCCL's "       \
    "device API, over railnet's transport); 0: its GIN/RMA tables report no device, so NCCL has no GIN from it.") \
  X(Int, shapeNicMbps, "RAILNET_SHAPE_NIC_MBPS", 0, (0, kIntMax),                                                \
    "Test feature, fabric emulation (docs/fabric-shaping.md): every NIC of a host sends at most this many Mb/s "\
    "on TCP data streams; 0: unlimited.")                                                                       \
  X(Int, shapeSpineMbps, "RAILNET_SHAPE_SPINE_MBPS", 0, (0, kIntMax),                                            \
    "Test feature, fabric emulation: traffic between NICs of different rails shares this many Mb/s per host, "  \
    "as a rail-optimized fabric's spine; 0: unlimited.")                                                        \
  X(Int, tcpMinChunkBytes, "RAILNET_TCP_MIN_CHUNK_BYTES", 65536, (4096, kSizeMax),                               \
    "Smallest piece a large message is split into across data streams (rounded to 4 KiB).")                      \
  X(Int, tcpSpinUs, "RAILNET_TCP_SPIN_US", 0, (0, 1000000),                                                      \
    "How long a helper thread busy-polls its sockets before it sleeps in epoll_wait. 0 (sleep at once) moved "  \
    "as many bytes for a third less CPU in the measurements (docs/performance.md).")                             \
  X(Int, tcpPassBytes, "RAILNET_TCP_PASS_BYTES", 131072, (0, kSizeMax),                                         \
    "Most bytes a helper thread writes or reads on one socket before it turns to its next one (so bytes it "    \
    "writes are read back while still in its cache, and no socket starves the others); 0: until it blocks.")     \
  X(Int, tcpSocketBufferBytes, "RAILNET_TCP_SOCKET_BUFFER_BYTES", 0, (0, kIntMax),                               \
    "SO_SNDBUF/SO_RCVBUF for data streams; 0 keeps the kernel's auto-tuning.")                                   \
  X(Int, tcpNotSentLowat, "RAILNET_TCP_NOTSENT_LOWAT", 0, (0, kIntMax),                                          \
    "TCP_NOTSENT_LOWAT for data streams in bytes; 0 leaves it unset.")                                           \
  X(Int, tcpGpu, "RAILNET_TCP_GPU", 0, (0, 1),                                                                  \
    "1: the TCP transport offers NCCL GPU memory (NCCL_PTR_CUDA) and moves it through pinned host staging with " \
    "the copy engines when libcuda is usable; 0: host memory only, NCCL stages through host memory itself "     \
    "(measured faster through NCCL: docs/performance.md section 11). GIN windows in GPU memory work either way.") \
  X(Int, tcpStagingPieceBytes, "RAILNET_TCP_STAGING_PIECE_BYTES", 1048576, (65536, 67108864),                  \
    "GPU messages move in pieces of this size (rounded down to a power of two), one copy and one staging slot " \
    "each; both ends of a connection must use the same value.")                                                 \
  X(Int, tcpStagingSlots, "RAILNET_TCP_STAGING_SLOTS", 8, (2, 256),                                              \
    "Pinned staging slots of one piece each, per comm that moves GPU memory (rounded down to a power of two).") \
  X(Enum, sendCompletion, "RAILNET_SEND_COMPLETION", SendCompletion::kAuto,                                     \
    (SendCompletion, {"auto", SendCompletion::kAuto}, {"written", SendCompletion::kWritten},                     \
     {"delivered", SendCompletion::kDelivered}),                                                                 \
    "When a TCP send completes: written (its bytes are in the kernel's socket buffers) or delivered (the "      \
    "receiver has them all: it sends a done frame per buffer, as rail failover needs; docs/failover.md); auto: " \
    "delivered while RAILNET_FAILOVER=1 on fused devices and on single-NIC devices whose host has another NIC "  \
    "(their sends survive a NIC's failure), else written. "                                                      \
    "The sending side decides; verbs sends always complete on delivery.")                                        \
  X(Int, failover, "RAILNET_FAILOVER", 1, (0, 1),                                                                \
    "1: a TCP connection survives a broken control socket (control frames are numbered and kept until "          \
    "acknowledged, the sending side re-makes the socket and each side sends again what the other lacks), a "     \
    "fused device survives a NIC whose data streams fail (their chunks of sends not yet delivered go again over " \
    "the other NICs), and a single-NIC device moves to another NIC of its host when its own fails, and back "    \
    "when it answers; a fused verbs device survives a path whose QPs fail (the receiver says which chunks in "   \
    "flight landed, the rest go again over the other paths; new QPs when its port is back), and its control "   \
    "socket is re-made off a failed or silent NIC; a single-NIC verbs device moves to a standby path on its "   \
    "host's nearest other port, and back when its own answers (docs/failover.md); "                              \
    "0: any of these failures fails the connection with ncclRemoteError. The sending side decides.")            \
  X(Int, failoverSilenceMs, "RAILNET_FAILOVER_SILENCE_MS", 2000, (100, kIntMax),                                 \
    "A TCP NIC whose sockets wait this long for an acknowledgement is taken out of the connection: a fused "    \
    "device's (while another NIC answers) sends its chunks again over the others, a single-NIC device moves to " \
    "another NIC (or fails within RAILNET_FAILOVER_RESUME_MS when none reaches the peer): a silent path, not a " \
    "slow peer, whose kernel acknowledges. A sender waiting for the receiver sends a keep-alive every quarter "  \
    "of it, so a path silent one way is seen too. A fused verbs sender's control socket silent this long while " \
    "a path works is re-made through another NIC (a keep-alive every quarter of it while work is out).")        \
  X(Int, failoverProbes, "RAILNET_FAILOVER_PROBES", 0, (0, kIntMax),                                             \
    "Failback: a failed TCP NIC is probed (a fused device's: its data streams made again through it; a moved "   \
    "single-NIC connection's: its streams made again over its own NIC once its sends in flight are delivered; "  \
    "a verbs path: new QPs offered to the receiver), 1 s after the failure, then with the wait doubling up to "  \
    "30 s, and at once when the OS (verbs: the port's event) says its link is up again, at most this many "     \
    "times per connection; 0: for as long as the connection lives.")                                             \
  X(Int, failoverResumeMs, "RAILNET_FAILOVER_RESUME_MS", 2000, (10, kIntMax),                                    \
    "A broken control socket that is not re-made within this many ms fails its connection (ncclRemoteError, "   \
    "naming the peer); so does a verbs receiver that does not answer within it which chunks of a failed path "  \
    "landed.")                                                                                                    \
  X(Int, faultNicCut, "RAILNET_FAULT_NIC_CUT", -1, (-1, 63),                                                    \
    "Test feature: TCP send comms that fail over (fused devices, single-NIC devices that can move) cut the "     \
    "data streams of their local NIC N (shutdown, both ways; NIC 0's control socket too) once "                  \
    "RAILNET_FAULT_NIC_CUT_BYTES have been queued on it, as a failing NIC would; -1: off.")                       \
  X(Int, faultNicCutBytes, "RAILNET_FAULT_NIC_CUT_BYTES", 1048576, (0, kSizeMax),                               \
    "Test feature: bytes queued on RAILNET_FAULT_NIC_CUT's NIC before its streams are cut.")                     \
  X(Int, faultControlCut, "RAILNET_FAULT_CONTROL_CUT", 0, (0, kIntMax),                                         \
    "Test feature: every N-th control frame a resumable TCP connection sends leaves half written and its socket " \
    "is cut (shutdown), to exercise re-making it; 0: off.")                                                     \
  X(Int, tcpOwnCopyContext, "RAILNET_TCP_OWN_COPY_CONTEXT", 1, (0, 1),                                        \
    "1: staging copies run in a CUDA context of railnet's own per GPU: never queued behind the NCCL kernel that " \
    "waits for them (D64), but one under 32 KiB into GPU memory waits for a GPU time slice while a kernel of "  \
    "another context runs (D70); 0: in the context of the comm's memory: no such wait, but a copy may queue "  \
    "behind that kernel for ever when the application uses many CUDA streams. The verbs NVLink hop's copies "  \
    "follow it too.")                                                                                            \
  X(Int, peerTimeoutMs, "RAILNET_PEER_TIMEOUT_MS", 30000, (0, kIntMax),                                          \
    "A peer host that acknowledges nothing for this long fails its connections: not keepalive probes on an "    \
    "idle connection, not data or window probes in flight (noticed within a second more). A live peer process "  \
    "never trips it, however long it is stopped or slow: its kernel acknowledges (a process that dies is "       \
    "noticed at once by its kernel's FIN/RST). 0 turns both checks off.")                                       \
  X(Int, watchdogMs, "RAILNET_WATCHDOG_MS", 10000, (0, 86400000),                                               \
    "A request that moves no byte for this long gets one WARN naming the peer, the request, the bytes done and "  \
    "when the last byte moved; it is not failed (a slow peer is not a dead one). 0: no reports.")                 \
  X(String, dumpFile, "RAILNET_DUMP_FILE", "/tmp/railnet-dump.%p", (),                                            \
    "Creating this file (%p: the process id) makes railnet log every open comm's state at WARN through NCCL's "  \
    "logger, then delete the file; empty: no trigger.")                                                          \
  X(Int, strayTimeoutMs, "RAILNET_STRAY_TIMEOUT_MS", 10000, (1, kIntMax),                                        \
    "An accepted connection that has not sent a valid hello in this time is dropped and logged.")                \
  X(Enum, transport, "RAILNET_TRANSPORT", TransportChoice::kAuto,                                                \
    (TransportChoice, {"auto", TransportChoice::kAuto}, {"tcp", TransportChoice::kTcp},                          \
     {"verbs", TransportChoice::kVerbs}),                                                                        \
    "auto: the verbs transport when an RDMA device is active, else TCP; tcp or verbs force one (verbs fails "    \
    "init when no RDMA device can be used).")                                                                    \
  X(String, ibHca, "RAILNET_IB_HCA", "", (),                                                                     \
    "RDMA devices railnet may use, NCCL_IB_HCA syntax: prefixes, '^' excludes, '=' exact, ':port' picks a "      \
    "port.")                                                                                                     \
  X(Int, ibGidIndex, "RAILNET_IB_GID_INDEX", -1, (-1, 255) /* ibv_global_route::sgid_index is a uint8_t */,     \
    "GID index for RoCE; -1 picks a RoCE v2 GID of the family in RAILNET_IB_ADDR_FAMILY.")                       \
  X(Enum, ibAddrFamily, "RAILNET_IB_ADDR_FAMILY", AddressFamily::kInet,                                          \
    (AddressFamily, {"AF_INET", AddressFamily::kInet}, {"AF_INET6", AddressFamily::kInet6}),                     \
    "Address family of the RoCE v2 GID picked automatically.")                                                   \
  X(Int, ibTrafficClass, "RAILNET_IB_TC", 0, (0, 255) /* an 8-bit field */,                                      \
    "Traffic class of railnet's QPs (RoCE: DSCP << 2).")                                                         \
  X(Int, ibServiceLevel, "RAILNET_IB_SL", 0, (0, 15) /* a 4-bit field */, "Service level of railnet's QPs.")    \
  X(Int, ibTimeout, "RAILNET_IB_TIMEOUT", 20, (1, 31),                                                           \
    "QP ACK timeout exponent: 4.096 us * 2^value before a retry.")                                               \
  X(Int, ibRetryCount, "RAILNET_IB_RETRY_CNT", 7, (0, 7), "QP transport retries before a send fails.")          \
  X(Int, ibQpsPerConnection, "RAILNET_IB_QPS_PER_CONNECTION", 2, (1, 8) /* proxy/verbs/queue_pairs.h kMaxQps */, \
    "Data QPs per connection; messages are striped over them in 128-byte-aligned pieces.")                       \
  X(Int, ibNvlinkHop, "RAILNET_IB_NVLINK_HOP", 1, (0, 2),                                                      \
    "Verbs routing of GPUDirect ports (RAILNET_FORWARD): 1: a connection to a peer on another rail leaves from "  \
    "this host's port on that rail, its GPU bytes first copied over NVLink into staging on that port's GPU, "     \
    "when that GPU is visible and reachable by peer access (not run on hardware); 0: GPUDirect ports are not "   \
    "routed; 2 (test feature): routed host-memory connections also send through host staging slots, so the "     \
    "hop's verbs path runs on soft-RoCE.")                                                                       \
  X(Int, ibHopPieceBytes, "RAILNET_IB_HOP_PIECE_BYTES", 1048576, (65536, 67108864),                              \
    "The NVLink hop moves a message in pieces of this size (rounded down to a power of two), one copy and one "  \
    "staging slot each.")                                                                                        \
  X(Int, ibHopSlots, "RAILNET_IB_HOP_SLOTS", 8, (2, 256),                                                        \
    "Staging slots of one piece each on the routed port's GPU, per send comm that hops.")                       \
  X(Enum, ibFlush, "RAILNET_IB_FLUSH", FlushMode::kAuto,                                                         \
    (FlushMode, {"auto", FlushMode::kAuto}, {"0", FlushMode::kNever}, {"1", FlushMode::kAlways},                 \
     {"", FlushMode::kAuto}),                                                                                    \
    "iflush by a 1-byte RDMA READ on a loopback QP: auto (receives into GPU memory only), 0 (never), 1 "         \
    "(always, host memory too; for testing).")                                                                   \
  X(String, topoXml, "RAILNET_TOPO_XML", "", (),                                                                 \
    "A hwloc XML file (lstopo --of xml) to use instead of this machine's topology: for tests, and to "           \
    "reproduce another host's GPU/NIC layout. Empty: discover the live machine.")                                \
  X(String, rails, "RAILNET_RAILS", "", (),                                                                      \
    "Rail ids by NIC name, e.g. mlx5_0:0,mlx5_1:1 (verbs or netdev names, or TCP device names such as "          \
    "lo@127.0.1.1:0). Named NICs take these rails; NICs it does not name get none. Empty: rails from the "        \
    "topology (docs/topology.md).")                                                                              \
  X(Int, writeNcclTopo, "RAILNET_WRITE_NCCL_TOPO", 1, (0, 1),                                                    \
    "1: when a device without a PCI function (loopback rail, virtual interface) has a rail, write an NCCL "      \
    "topology XML that puts it next to its rail's GPU and set NCCL_TOPO_FILE to it, unless NCCL_TOPO_FILE is "   \
    "already set; 0: never.")                                                                                    \
  X(Int, tcpSpeedMbps, "RAILNET_TCP_SPEED_MBPS", 0, (0, kIntMax),                                                \
    "Speed reported to NCCL for TCP devices; 0 reads /sys/class/net/<if>/speed (100000 for loopback).")          \
  X(String, tcpAddresses, "RAILNET_TCP_ADDRESSES", "", (),                                                       \
    "Comma-separated local IP addresses, each one TCP device named <if>@<address> that listens and connects "   \
    "from that address, rail = its position (e.g. 127.0.1.1,127.0.2.1 emulates two rails on lo). Empty: one "   \
    "device per interface (RAILNET_IFNAME).")                                                                   \
  X(Int, fusionMinStripeBytes, "RAILNET_FUSION_MIN_STRIPE_BYTES", 262144, (0, kSizeMax),                         \
    "Fused (makeVDevice) devices: messages under twice this go whole to one NIC, round-robin; larger ones are " \
    "split into one 128-byte-aligned stripe per NIC of at least this size.")                                    \
  X(Enum, tuner, "RAILNET_TUNER", true,                                                                          \
    (bool, {"on", true}, {"off", false}, {"1", true}, {"0", false}, {"yes", true}, {"no", false},                \
     {"true", true}, {"false", false}),                                                                          \
    "on: railnet's tuner edits NCCL's algorithm/protocol cost table; off: it leaves every table as NCCL "        \
    "filled it (NCCL_TUNER_PLUGIN=none turns off any tuner).")                                                   \
  X(String, tunerFile, "RAILNET_TUNER_FILE", "", (),                                                             \
    "Calibration CSV for the tuner (NCCL's example tuner format plus time_us, busbw_gbs, chunk_bytes; see "      \
    "docs/tuner.md). Empty: NCCL's choices stand. A missing or bad file is logged and ignored.")                 \
  X(Enum, tunerModel, "RAILNET_TUNER_MODEL", false,                                                              \
    (bool, {"on", true}, {"off", false}, {"1", true}, {"0", false}, {"yes", true}, {"no", false},                \
     {"true", true}, {"false", false}),                                                                          \
    "on: where no measurement covers a size, the tuner's latency/bandwidth model may override NCCL's pick "     \
    "(only when it predicts a >10% gain); off (default): only calibration rows act (docs/decisions.md D63).")   \
  X(Int, tunerNicGbps, "RAILNET_TUNER_NIC_GBPS", 0, (0, kIntMax),                                                \
    "Per-node network bandwidth (Gb/s, all NICs) for the tuner's model; 0 sums railnet's devices.")

// NCCL's names for the settings that mean the same thing (issue 16): when the RAILNET_* variable is unset, railnet
// reads NCCL's, with NCCL's grammar, so a job that already tunes NCCL's sockets or IB needs nothing new. A value
// NCCL takes but railnet's range does not is clamped to it, and one railnet cannot read keeps the default: both
// with a WARN, never a failed init (the job was valid for NCCL). Y(RAILNET name, NCCL name).
#define RAILNET_NCCL_FALLBACKS(Y)                                 \
  Y("RAILNET_IFNAME", "NCCL_SOCKET_IFNAME")                       \
  Y("RAILNET_SOCKET_FAMILY", "NCCL_SOCKET_FAMILY")                \
  Y("RAILNET_IB_HCA", "NCCL_IB_HCA")                              \
  Y("RAILNET_IB_GID_INDEX", "NCCL_IB_GID_INDEX")                  \
  Y("RAILNET_IB_ADDR_FAMILY", "NCCL_IB_ADDR_FAMILY")              \
  Y("RAILNET_IB_TC", "NCCL_IB_TC")                                \
  Y("RAILNET_IB_SL", "NCCL_IB_SL")                                \
  Y("RAILNET_IB_TIMEOUT", "NCCL_IB_TIMEOUT")                      \
  Y("RAILNET_IB_RETRY_CNT", "NCCL_IB_RETRY_CNT")                  \
  Y("RAILNET_IB_QPS_PER_CONNECTION", "NCCL_IB_QPS_PER_CONNECTION")

#define RAILNET_SETTING_FIRST(first, ...) first
#define RAILNET_SETTING_SECOND(first, second, ...) second
#define RAILNET_SETTING_REST(first, ...) __VA_ARGS__

namespace railnet {

struct Settings {
#define RAILNET_SETTING_FIELD_String(field, def, allowed) std::string field = def;
#define RAILNET_SETTING_FIELD_Int(field, def, allowed) int64_t field = def;
#define RAILNET_SETTING_FIELD_Enum(field, def, allowed) RAILNET_SETTING_FIRST allowed field = def;
#define RAILNET_SETTING_FIELD(type, field, env, def, allowed, doc) RAILNET_SETTING_FIELD_##type(field, def, allowed)
  RAILNET_SETTINGS(RAILNET_SETTING_FIELD)
#undef RAILNET_SETTING_FIELD
};

// Values plus what was wrong with them. A field whose value was rejected keeps its default, but a caller that
// finds errors must not run with it: each error reads RAILNET_X="value": <why>; allowed: <range or values>.
// A setting the environment decided: which variable (the RAILNET_* one or NCCL's) and the value taken.
struct SettingSource {
  std::string setting;   // RAILNET_X
  std::string variable;  // RAILNET_X or NCCL_Y
  std::string value;     // as written, or as clamped
};

struct LoadedSettings {
  Settings values;
  std::vector<std::string> errors;
  std::vector<std::string> warnings;    // NCCL-named values railnet clamped or could not read (not fatal)
  std::vector<SettingSource> sources;   // every setting the environment decided, in table order
  operator const Settings&() const { return values; }  // NOLINT: lets `Settings s = loadSettings(...)` read
};

// One row of the table, for documentation and tools.
struct SettingInfo {
  const char* type;  // "String", "Int" or "Enum"
  const char* env;
  std::string defaultValue;
  std::string allowed;  // "1..64", ">= 0", "auto, tcp, verbs", "any string"
  const char* doc;
};

// The process-wide values, read from the environment on first use.
const Settings& settings();
// What was wrong with the process-wide values; empty when every RAILNET_* setting is valid.
const std::vector<std::string>& settingsErrors();
// NCCL-named values that were clamped or ignored, and which variable decided each setting (process-wide).
const std::vector<std::string>& settingsWarnings();
const std::vector<SettingSource>& settingsSources();
// NCCL's name for a RAILNET_* setting (RAILNET_NCCL_FALLBACKS), or nullptr.
const char* ncclFallbackFor(const char* railnetName);

// Parse every setting through `lookup` (a getenv-like lookup); used by settings() and by tests. Logs nothing.
LoadedSettings loadSettings(const char* (*lookup)(const char* name));

// Parse one variable's text into its field of *out. False with *error (the format above) when it is rejected
// (*out unchanged), or when `env` is not a RAILNET_* setting.
bool parseSetting(const char* env, const char* text, Settings* out, std::string* error);

std::span<const SettingInfo> settingsTable();

}  // namespace railnet
