// Every RAILNET_* setting, declared once: type, field, environment variable, default, and what it does.
// Values come from the environment the first time settings() is called; a value that does not parse is
// reported (WARN) and the default is used instead.
#pragma once

#include <cstdint>
#include <span>
#include <string>

// X(type, field, ENV_NAME, default, doc)
#define RAILNET_SETTINGS(X)                                                                                       \
  X(String, ifname, "RAILNET_IFNAME", "",                                                                         \
    "Interfaces railnet may use, NCCL_SOCKET_IFNAME syntax: comma-separated prefixes, '^' to exclude, '=' for "   \
    "exact names. Empty: every interface that is up except lo and docker*, or lo when nothing else is up.")       \
  X(String, socketFamily, "RAILNET_SOCKET_FAMILY", "",                                                            \
    "AF_INET or AF_INET6 to force the address family of each interface; empty prefers IPv4.")                     \
  X(Int, tcpStreams, "RAILNET_TCP_STREAMS", 8,                                                                    \
    "Data streams (TCP connections) per railnet connection; large messages are split across them. 1..64.")        \
  X(Int, tcpThreads, "RAILNET_TCP_THREADS", 0,                                                                    \
    "Helper threads in the process-wide pool that moves data-stream bytes; 0 picks min(streams, cores, 16).")     \
  X(Int, tcpInlineBytes, "RAILNET_TCP_INLINE_BYTES", 65536,                                                       \
    "Messages up to this size travel inline on the control connection, sent by the calling thread.")              \
  X(Int, tcpMinChunkBytes, "RAILNET_TCP_MIN_CHUNK_BYTES", 65536,                                                  \
    "Smallest piece a large message is split into across data streams (rounded to 4 KiB).")                       \
  X(Int, tcpSpinUs, "RAILNET_TCP_SPIN_US", 0,                                                                     \
    "How long a helper thread busy-polls its sockets before it sleeps in epoll_wait. 0 (sleep at once) moved "   \
    "as many bytes for a third less CPU in the measurements (docs/performance.md).")                              \
  X(Int, tcpSocketBufferBytes, "RAILNET_TCP_SOCKET_BUFFER_BYTES", 0,                                              \
    "SO_SNDBUF/SO_RCVBUF for data streams; 0 keeps the kernel's auto-tuning.")                                    \
  X(Int, tcpNotSentLowat, "RAILNET_TCP_NOTSENT_LOWAT", 0,                                                         \
    "TCP_NOTSENT_LOWAT for data streams in bytes; 0 leaves it unset.")                                            \
  X(Int, peerTimeoutMs, "RAILNET_PEER_TIMEOUT_MS", 30000,                                                         \
    "A peer host that answers nothing, not even TCP keepalive probes, for about this long fails its "            \
    "connections. A live peer process never trips it, however long it is stopped or slow: its kernel answers "   \
    "the probes (a process that dies is noticed at once by its kernel's FIN/RST). 0 turns keepalive off.")        \
  X(Int, strayTimeoutMs, "RAILNET_STRAY_TIMEOUT_MS", 10000,                                                       \
    "An accepted connection that has not sent a valid hello in this time is dropped and logged.")                 \
  X(String, transport, "RAILNET_TRANSPORT", "auto",                                                               \
    "auto: the verbs transport when an RDMA device is active, else TCP; tcp or verbs force one (verbs fails "     \
    "init when no RDMA device can be used).")                                                                     \
  X(String, ibHca, "RAILNET_IB_HCA", "",                                                                          \
    "RDMA devices railnet may use, NCCL_IB_HCA syntax: prefixes, '^' excludes, '=' exact, ':port' picks a port.")  \
  X(Int, ibGidIndex, "RAILNET_IB_GID_INDEX", -1,                                                                  \
    "GID index for RoCE; -1 picks a RoCE v2 GID of the family in RAILNET_IB_ADDR_FAMILY.")                        \
  X(String, ibAddrFamily, "RAILNET_IB_ADDR_FAMILY", "AF_INET",                                                     \
    "Address family of the RoCE v2 GID picked automatically: AF_INET or AF_INET6.")                               \
  X(Int, ibTrafficClass, "RAILNET_IB_TC", 0, "Traffic class of railnet's QPs (RoCE: DSCP << 2).")                 \
  X(Int, ibServiceLevel, "RAILNET_IB_SL", 0, "Service level of railnet's QPs.")                                    \
  X(Int, ibTimeout, "RAILNET_IB_TIMEOUT", 20,                                                                     \
    "QP ACK timeout exponent: 4.096 us * 2^value before a retry.")                                                \
  X(Int, ibRetryCount, "RAILNET_IB_RETRY_CNT", 7, "QP transport retries before a send fails.")                     \
  X(Int, ibQpsPerConnection, "RAILNET_IB_QPS_PER_CONNECTION", 2,                                                  \
    "Data QPs per connection; messages are striped over them in 128-byte-aligned pieces.")                        \
  X(String, ibFlush, "RAILNET_IB_FLUSH", "auto",                                                                  \
    "iflush by a 1-byte RDMA READ on a loopback QP: auto (receives into GPU memory only), 0 (never), 1 (always, " \
    "host memory too; for testing).")                                                                             \
  X(String, topoXml, "RAILNET_TOPO_XML", "",                                                                      \
    "A hwloc XML file (lstopo --of xml) to use instead of this machine's topology: for tests, and to reproduce "  \
    "another host's GPU/NIC layout. Empty: discover the live machine.")                                           \
  X(String, rails, "RAILNET_RAILS", "",                                                                           \
    "Rail ids by NIC name, e.g. mlx5_0:0,mlx5_1:1 (verbs or netdev names, or TCP device names such as "           \
    "lo@127.0.1.1:0). Named NICs take these rails; NICs it does not name get none. Empty: rails from the "         \
    "topology (docs/topology.md).")                                                                               \
  X(Int, writeNcclTopo, "RAILNET_WRITE_NCCL_TOPO", 1,                                                             \
    "1: when a device without a PCI function (loopback rail, virtual interface) has a rail, write an NCCL "       \
    "topology XML that puts it next to its rail's GPU and set NCCL_TOPO_FILE to it, unless NCCL_TOPO_FILE is "    \
    "already set; 0: never.")                                                                                     \
  X(Int, tcpSpeedMbps, "RAILNET_TCP_SPEED_MBPS", 0,                                                               \
    "Speed reported to NCCL for TCP devices; 0 reads /sys/class/net/<if>/speed (100000 for loopback).")               \
  X(String, tcpAddresses, "RAILNET_TCP_ADDRESSES", "",                                                            \
    "Comma-separated local IP addresses, each one TCP device named <if>@<address> that listens and connects "    \
    "from that address, rail = its position (e.g. 127.0.1.1,127.0.2.1 emulates two rails on lo). Empty: one "    \
    "device per interface (RAILNET_IFNAME).")                                                                    \
  X(Int, fusionMinStripeBytes, "RAILNET_FUSION_MIN_STRIPE_BYTES", 262144,                                        \
    "Fused (makeVDevice) devices: messages under twice this go whole to one NIC, round-robin; larger ones are "  \
    "split into one 128-byte-aligned stripe per NIC of at least this size.")                                     \
  X(String, tuner, "RAILNET_TUNER", "on",                                                                         \
    "on: railnet's tuner edits NCCL's algorithm/protocol cost table; off: it leaves every table as NCCL "         \
    "filled it (NCCL_TUNER_PLUGIN=none turns off any tuner).")                                                    \
  X(String, tunerFile, "RAILNET_TUNER_FILE", "",                                                                  \
    "Calibration CSV for the tuner (NCCL's example tuner format plus time_us, busbw_gbs, chunk_bytes; see "       \
    "docs/tuner.md). Empty: the model alone. A missing or bad file is logged and ignored.")                       \
  X(String, tunerModel, "RAILNET_TUNER_MODEL", "on",                                                              \
    "on: where no measurement covers a size, the tuner's latency/bandwidth model may override NCCL's pick "      \
    "(only when it predicts a >10% gain); off: only calibration rows act.")                                      \
  X(Int, tunerNicGbps, "RAILNET_TUNER_NIC_GBPS", 0,                                                               \
    "Per-node network bandwidth (Gb/s, all NICs) for the tuner's model; 0 sums railnet's devices.")

namespace railnet {

struct Settings {
#define RAILNET_SETTING_FIELD_String(field, def) std::string field = def;
#define RAILNET_SETTING_FIELD_Int(field, def) int64_t field = def;
#define RAILNET_SETTING_FIELD(type, field, env, def, doc) RAILNET_SETTING_FIELD_##type(field, def)
  RAILNET_SETTINGS(RAILNET_SETTING_FIELD)
#undef RAILNET_SETTING_FIELD
};

// One row of the table, for documentation and tools.
struct SettingInfo {
  const char* type;
  const char* env;
  const char* defaultValue;
  const char* doc;
};

// The process-wide values, read from the environment on first use.
const Settings& settings();

// Parse `env` (a getenv-like lookup) into a Settings; used by settings() and by tests.
Settings loadSettings(const char* (*lookup)(const char* name));

std::span<const SettingInfo> settingsTable();

}  // namespace railnet
