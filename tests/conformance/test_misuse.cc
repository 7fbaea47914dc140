// Handles of the wrong kind, freed handles and foreign pointers passed to the entry points (group "failure"):
// each must return ncclInvalidUsage with a WARN naming the entry point and what was passed, touch nothing
// (the comm passed by mistake stays usable), and never crash, also under ASan (docs/decisions.md D60).
#include <cstdint>
#include <functional>
#include <vector>

#include "comms.h"
#include "harness.h"
#include "log_capture.h"
#include "transfer.h"

namespace conformance {
namespace {

std::string pointerText(const void* pointer) { return strf("%p", pointer); }

// `call` must return ncclInvalidUsage and log a WARN containing every needle.
void requireRefused(const std::string& what, const std::vector<std::string>& needles,
                    const std::function<ncclResult_t()>& call) {
  const uint64_t mark = logMark();
  const ncclResult_t rc = call();
  REQUIRE(rc == ncclInvalidUsage, what + " returned " + ncclResultName(rc) + ", not ncclInvalidUsage");
  std::string wanted;
  for (const std::string& n : needles) wanted += " \"" + n + "\"";
  REQUIRE(waitForWarning(mark, needles, kWarnGrace),
          "no WARN containing" + wanted + " after " + what + "; WARNs: " + describeWarnings(mark));
}

ncclResult_t isendTo(NetApi& net, void* comm, void* mhandle = nullptr) {
  static uint8_t byte = 0;
  void* request = nullptr;
  return net.isend(comm, &byte, 1, 0, mhandle, &request);
}

ncclResult_t irecvOn(NetApi& net, void* comm, void* mhandle = nullptr) {
  static uint8_t byte = 0;
  void* data = &byte;
  size_t size = 1;
  int tag = 0;
  void* request = nullptr;
  return net.irecv(comm, 1, &data, &size, &tag, &mhandle, &request);
}

ncclResult_t testOf(NetApi& net, void* request) {
  int done = 0;
  int size = 0;
  return net.test(request, &done, &size);
}

}  // namespace

TEST_CASE("failure", "misuse_wrong_kind", Scope::PerVersion) {
  NetApi& net = *env.net;
  LinkedPair pair(net, env.dev);
  void* send = pair.conn.send.get();
  void* recv = pair.conn.recv.get();
  ConnHandle handle;
  Comm listener = listenOn(net, pair.recvCtx(), env.dev, &handle);

  requireRefused("isend on a receive comm", {"isend", pointerText(recv), "is a receive comm"},
                 [&] { return isendTo(net, recv); });
  requireRefused("isend on a listen comm", {"isend", pointerText(listener.get()), "is a listen comm"},
                 [&] { return isendTo(net, listener.get()); });
  requireRefused("irecv on a send comm", {"irecv", pointerText(send), "is a send comm"},
                 [&] { return irecvOn(net, send); });
  requireRefused("test of a listen comm", {"test", pointerText(listener.get()), "is a listen comm"},
                 [&] { return testOf(net, listener.get()); });
  requireRefused("test of a send comm", {"test", pointerText(send), "is a send comm"},
                 [&] { return testOf(net, send); });
  requireRefused("closeRecv of a send comm", {"closeRecv", pointerText(send), "is a send comm"},
                 [&] { return net.closeRecv(send); });
  requireRefused("closeListen of a receive comm", {"closeListen", pointerText(recv), "is a receive comm"},
                 [&] { return net.closeListen(recv); });
  requireRefused("closeSend of a listen comm", {"closeSend", pointerText(listener.get()), "is a listen comm"},
                 [&] { return net.closeSend(listener.get()); });
  requireRefused("accept on a send comm", {"accept", pointerText(send), "is a send comm"}, [&] {
    void* accepted = nullptr;
    DevComm* devComm = nullptr;
    return net.accept(send, &accepted, &devComm);
  });
  REQUIRE_OK(listener.close());
  // Nothing was touched: the connection still moves data, then closes normally.
  runTransfer(net, pair.conn, simplePlan({0, 1000, 1 << 16}, 2, 94));
}

TEST_CASE("failure", "misuse_closed_comm", Scope::PerVersion) {
  NetApi& net = *env.net;
  LinkedPair pair(net, env.dev);
  void* send = pair.conn.send.get();
  REQUIRE_OK(pair.conn.send.close());
  requireRefused("isend on a closed send comm", {"isend", pointerText(send), "is not a live railnet send comm"},
                 [&] { return isendTo(net, send); });
  requireRefused("closeSend of a closed send comm", {"closeSend", pointerText(send), "is not a live railnet"},
                 [&] { return net.closeSend(send); });
  requireRefused("regMr on a closed send comm", {"regMr", pointerText(send), "is not a live railnet"}, [&] {
    static uint8_t byte = 0;
    void* mhandle = nullptr;
    return net.regMr(send, &byte, 1, NCCL_PTR_HOST, &mhandle);
  });

  ConnHandle handle;
  Comm listener = listenOn(net, pair.recvCtx(), env.dev, &handle);
  void* listenComm = listener.get();
  REQUIRE_OK(listener.close());
  requireRefused("accept on a closed listen comm", {"accept", pointerText(listenComm), "is not a live railnet"},
                 [&] {
                   void* accepted = nullptr;
                   DevComm* devComm = nullptr;
                   return net.accept(listenComm, &accepted, &devComm);
                 });
  requireRefused("closeListen of a closed listen comm",
                 {"closeListen", pointerText(listenComm), "is not a live railnet listen comm"},
                 [&] { return net.closeListen(listenComm); });
}

TEST_CASE("failure", "misuse_foreign_pointer", Scope::PerVersion) {
  NetApi& net = *env.net;
  int local = 0;
  std::vector<uint64_t> zeros(64, 0);  // heap, and large enough that reading a tag from it stays in bounds
  requireRefused("isend on the address of a local int", {"isend", pointerText(&local), "is not a live railnet"},
                 [&] { return isendTo(net, &local); });
  requireRefused("isend on a heap block of zeros", {"isend", pointerText(zeros.data()), "is not a live railnet"},
                 [&] { return isendTo(net, zeros.data()); });
  requireRefused("irecv on a heap block of zeros", {"irecv", pointerText(zeros.data()), "is not a live railnet"},
                 [&] { return irecvOn(net, zeros.data()); });
  requireRefused("test of a heap block of zeros",
                 {"test", pointerText(zeros.data()), "is not a live railnet request"},
                 [&] { return testOf(net, zeros.data()); });
  requireRefused("closeSend of the address of a local int", {"closeSend", pointerText(&local)},
                 [&] { return net.closeSend(&local); });
  requireRefused("closeRecv of a heap block of zeros", {"closeRecv", pointerText(zeros.data())},
                 [&] { return net.closeRecv(zeros.data()); });
  requireRefused("closeListen of a heap block of zeros", {"closeListen", pointerText(zeros.data())},
                 [&] { return net.closeListen(zeros.data()); });
  for (uint64_t word : zeros) REQUIRE(word == 0, "the plugin wrote into a foreign block");
}

TEST_CASE("failure", "misuse_mhandle", Scope::PerVersion) {
  NetApi& net = *env.net;
  HostBuffer buffer(4096);  // outlives the comms
  LinkedPair pair(net, env.dev);
  void* send = pair.conn.send.get();
  void* recv = pair.conn.recv.get();
  std::vector<uint64_t> zeros(64, 0);
  requireRefused("isend with a comm as mhandle", {"isend", pointerText(recv), "not a memory handle"},
                 [&] { return isendTo(net, send, recv); });
  requireRefused("irecv with a heap block of zeros as mhandle",
                 {"irecv", pointerText(zeros.data()), "is not a live railnet memory handle"},
                 [&] { return irecvOn(net, recv, zeros.data()); });
  requireRefused("deregMr of a heap block of zeros",
                 {"deregMr", pointerText(zeros.data()), "is not a live railnet memory handle"},
                 [&] { return net.deregMr(send, zeros.data()); });
  {
    // A real registration is still accepted by deregMr, also through the other comm of the pair.
    Registration registration(net, recv, buffer.data(), buffer.size());
    requireRefused("deregMr of a real mhandle through a foreign comm",
                   {"deregMr", pointerText(zeros.data()), "is not a live railnet"},
                   [&] { return net.deregMr(zeros.data(), registration.handle()); });
  }
  runTransfer(net, pair.conn, simplePlan({0, 1000}, 1, 95));
}

}  // namespace conformance
