// Loading, properties, and the connection calls on their own (group "basic").
#include <cstdlib>
#include <arpa/inet.h>
#include <sys/socket.h>

#include <cstring>
#include <set>
#include <thread>

#include "comms.h"
#include "harness.h"
#include "transfer.h"

namespace conformance {
namespace {

DeviceProps propsOf(NetApi& net, int dev) {
  DeviceProps props;
  REQUIRE_OK(net.getProperties(dev, &props));
  return props;
}

int deviceCount(NetApi& net) {
  int ndev = -1;
  REQUIRE_OK(net.devices(&ndev));
  return ndev;
}

}  // namespace

TEST_CASE("basic", "exports", Scope::Once) {
  PluginLibrary library(*env.pluginPath);
  REQUIRE(library.newestVersion() == 12,
          strf("NCCL's loader (newest first) would pick v%d, expected v12", library.newestVersion()));
  for (int v : kSupportedVersions) {
    std::unique_ptr<NetApi> net = openApi(library, v);
    REQUIRE(net != nullptr, symbolName(v) + " is not exported");
    REQUIRE(
        net->name() && std::strcmp(net->name(), "railnet") == 0,
        strf("%s.name is \"%s\", expected \"railnet\"", symbolName(v).c_str(), net->name() ? net->name() : "(null)"));
    std::string missing;
    for (const std::string& fn : net->missingFunctions()) missing += " " + fn;
    REQUIRE(missing.empty(), symbolName(v) + " has NULL entries:" + missing);
  }
}

TEST_CASE("basic", "init_devices", Scope::PerVersion) {
  NetContext first(*env.net, nextCommId());
  REQUIRE(deviceCount(*env.net) >= 1, "devices() must report at least one device with RAILNET_IFNAME=lo");
  // A second communicator while the first is alive, then finalize in creation order.
  NetContext second(*env.net, nextCommId());
  REQUIRE(deviceCount(*env.net) >= 1, "devices() changed after a second init");
  if (env.version >= 11) REQUIRE(first.get() != second.get(), "two communicators got the same context");
  first.finalize();
  second.finalize();
}

TEST_CASE("basic", "properties", Scope::PerVersion) {
  NetContext ctx(*env.net, nextCommId());
  const int ndev = deviceCount(*env.net);
  std::set<std::string> names;
  for (int dev = 0; dev < ndev; ++dev) {
    const DeviceProps p = propsOf(*env.net, dev);
    const std::string where = strf("dev %d: ", dev);
    REQUIRE(p.name && p.name[0], where + "empty name");
    REQUIRE(names.insert(p.name).second, where + "name \"" + p.name + "\" is not unique");
    REQUIRE(p.ptrSupport & NCCL_PTR_HOST, where + strf("ptrSupport 0x%x lacks NCCL_PTR_HOST", p.ptrSupport));
    REQUIRE(p.maxRecvs == 8, where + strf("maxRecvs %d, expected 8", p.maxRecvs));
    REQUIRE(p.maxComms >= 1024, where + strf("maxComms %d caps NCCL's channels; expected >= 1024", p.maxComms));
    REQUIRE(p.netDeviceType == NCCL_NET_DEVICE_HOST, where + strf("netDeviceType %d, expected HOST", p.netDeviceType));
    if (p.reportsMaxP2pBytes) {
      REQUIRE(p.maxP2pBytes > 0 && p.maxP2pBytes <= NCCL_MAX_NET_SIZE_BYTES,
              where + strf("maxP2pBytes %zu outside (0, 1 TiB]: NCCL's setup fails", p.maxP2pBytes));
      REQUIRE(p.vNdevs == 1 && p.vDevs[0] == dev,
              where + strf("vProps {ndevs %d, devs[0] %d}, expected {1, %d} for a plain device", p.vNdevs, p.vDevs[0],
                           dev));
    }
    if (env.version >= 11) REQUIRE(p.maxMultiRequestSize >= 1, where + "maxMultiRequestSize < 1");
  }
  // NCCL calls getProperties from several threads: answers must be stable and race-free.
  const std::string expected = propsOf(*env.net, 0).name;
  ThreadGroup threads;
  for (int t = 0; t < 4; ++t) {
    threads.spawn([&] {
      for (int i = 0; i < 200; ++i) {
        const DeviceProps p = propsOf(*env.net, 0);
        REQUIRE(p.name && expected == p.name, "concurrent getProperties returned a different name");
      }
    });
  }
  threads.join();
}

TEST_CASE("basic", "listen_unaccepted", Scope::PerVersion) {
  NetContext ctx(*env.net, nextCommId());
  // Shared comms: NCCL closes some listen comms without ever accepting on them.
  std::vector<Comm> listeners;
  std::set<int> ports;
  for (int i = 0; i < 16; ++i) {
    ConnHandle handle;
    listeners.push_back(listenOn(*env.net, ctx.get(), env.dev, &handle));
    const HandleAddress address = handleAddress(handle);
    REQUIRE(address.family == AF_INET || address.family == AF_INET6,
            strf("handle byte 8 holds address family %d, expected a sockaddr_in/in6", address.family));
    REQUIRE(address.port > 0, "the handle's sockaddr has port 0");
    ports.insert(address.port);
  }
  REQUIRE(ports.size() == listeners.size(), "two open listen comms share a port");
  for (Comm& listener : listeners) REQUIRE_OK(listener.close());
}

TEST_CASE("basic", "connect_accept", Scope::PerVersion) {
  NetContext sendCtx(*env.net, nextCommId());
  NetContext recvCtx(*env.net, nextCommId());
  ConnHandle handle;
  Comm listener = listenOn(*env.net, recvCtx.get(), env.dev, &handle);
  const HandleAddress address = handleAddress(handle);
  // TCP listens on the RAILNET_IFNAME interface (lo here); verbs meets on its RoCE port's own IP, which the
  // soft-RoCE rig exports as RAILNET_RXE_IP.
  const char* rxeIp = getenv("RAILNET_RXE_IP");
  const bool verbs = verbsTransport();
  REQUIRE(verbs ? (rxeIp != nullptr && address.ip == rxeIp) : (address.ip == "127.0.0.1" || address.ip == "::1"),
          "the handle should carry the " + std::string(verbs ? "RoCE port's" : "loopback") + " address, got " +
              address.ip);

  // Before anyone accepts, connect() and accept() must return at once ("not yet" or a comm), never block.
  const Deadline deadline;
  Comm send;
  const auto probeEnd = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
  while (!send && std::chrono::steady_clock::now() < probeEnd) {
    void* comm = nullptr;
    DevComm* devComm = nullptr;
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_OK(env.net->connect(sendCtx.get(), env.dev, handle.bytes, &comm, &devComm));
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500), "connect() blocked");
    send = Comm(env.net, Comm::Kind::Send, comm);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  Comm recv = acceptLoop(*env.net, listener.get(), deadline);
  REQUIRE_OK(listener.close());
  if (!send) send = connectLoop(*env.net, sendCtx.get(), env.dev, handle, deadline);
  Connection conn{std::move(send), std::move(recv)};
  runTransfer(*env.net, conn, simplePlan({1, 4096, 0, 100000}, 1, 11));
  REQUIRE_OK(conn.send.close());
  REQUIRE_OK(conn.recv.close());
}

TEST_CASE("basic", "accept_before_connect", Scope::PerVersion) {
  NetContext sendCtx(*env.net, nextCommId());
  NetContext recvCtx(*env.net, nextCommId());
  ConnHandle handle;
  Comm listener = listenOn(*env.net, recvCtx.get(), env.dev, &handle);
  // Nobody has connected: accept() must say "not yet" promptly.
  for (int i = 0; i < 20; ++i) {
    void* comm = nullptr;
    DevComm* devComm = nullptr;
    const auto start = std::chrono::steady_clock::now();
    REQUIRE_OK(env.net->accept(listener.get(), &comm, &devComm));
    REQUIRE(std::chrono::steady_clock::now() - start < std::chrono::milliseconds(500), "accept() blocked");
    REQUIRE(comm == nullptr, "accept() returned a comm although nobody connected");
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const Deadline deadline;
  Connection conn;
  ThreadGroup threads;
  threads.spawn([&] { conn.send = connectLoop(*env.net, sendCtx.get(), env.dev, handle, deadline); });
  conn.recv = acceptLoop(*env.net, listener.get(), deadline);
  threads.join();
  REQUIRE_OK(listener.close());
  runTransfer(*env.net, conn, simplePlan({7, 0, 65536}, 2, 12));
}

TEST_CASE("basic", "register_memory", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  HostBuffer big(8 << 20);
  for (void* comm : {pair.conn.send.get(), pair.conn.recv.get()}) {
    // Whole buffers, unaligned sub-ranges, overlapping and repeated registrations: all independent.
    std::vector<std::unique_ptr<Registration>> regs;
    regs.push_back(std::make_unique<Registration>(*env.net, comm, big.data(), big.size()));
    regs.push_back(std::make_unique<Registration>(*env.net, comm, big.data() + 13, 4093));
    regs.push_back(std::make_unique<Registration>(*env.net, comm, big.data() + 4096, 1 << 20));
    regs.push_back(std::make_unique<Registration>(*env.net, comm, big.data(), big.size()));
    regs.push_back(std::make_unique<Registration>(*env.net, comm, big.data() + 1, 1));
    regs.clear();  // deregMr in reverse order
  }
}

TEST_CASE("basic", "iflush_host", Scope::PerVersion) {
  LinkedPair pair(*env.net, env.dev);
  runTransfer(*env.net, pair.conn, simplePlan({4096}, 1, 13));
  HostBuffer buffer(1 << 16);
  Registration reg(*env.net, pair.conn.recv.get(), buffer.data(), buffer.size());
  void* data[2] = {buffer.data(), buffer.data() + 4096};
  int sizes[2] = {4096, 100};
  void* mhandles[2] = {reg.handle(), reg.handle()};
  for (int n : {1, 2}) {
    void* request = nullptr;  // NCCL's slot is NULL here (cleared when the receive completed)
    REQUIRE_OK(env.net->iflush(pair.conn.recv.get(), n, data, sizes, mhandles, &request));
    REQUIRE(request == nullptr, strf("iflush(n=%d) on host memory must return *request == NULL", n));
  }
}

}  // namespace conformance
