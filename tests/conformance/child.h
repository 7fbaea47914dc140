// Peer processes for the killed- and stopped-peer tests: the harness re-executes itself (/proc/self/exe) as a sender or
// a receiver that moves data, or as rank 1 of a GIN communicator that progresses, until the parent kills it with
// SIGKILL; and the failure campaign's receiver (child_campaign.cc), which may run in another network namespace.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comms.h"
#include "harness.h"

namespace conformance {

// True when argv asks for a child role (--child-sender HEX / --child-receiver / --child-gin-rank HEX /
// --child-campaign-receiver).
bool isChildInvocation(int argc, char** argv);
// Runs the child role; returns the exit code (it normally runs until killed). A child whose call fails prints
// "FAILED <why>; WARN: <the plugin's first WARN>" on stdout before it exits, that WARN followed by kWarnedAtMarker
// and when it was logged (steady clock, ns since its epoch: the same clock in every process of this machine).
int childMain(int argc, char** argv);
inline constexpr const char* kWarnedAtMarker = " @warned-ns ";
// When the WARN of a child's "FAILED ..." line was logged; nullopt when the line carries no time.
std::optional<std::chrono::steady_clock::time_point> childWarnedAt(const std::string& failedLine);

// Options every child role takes, applied before anything else in the child: `--netns NAME` enters the network
// namespace /var/run/netns/NAME (made by `ip netns add`; /sys is remounted for it where the child may, as `ip netns
// exec` does) and each `--env NAME=VALUE` is set before the plugin loads (it reads its settings once per process).
// Append them to any role's arguments; an empty `netns` stays in ours.
std::vector<std::string> childPlacementArgs(const std::string& netns, const std::vector<std::string>& env);

// A copy of this executable with the given arguments, stdout piped to us (and, `withInput`, its stdin from us:
// writeLine); SIGKILLed and reaped on destruction.
class ChildProcess {
 public:
  explicit ChildProcess(const std::vector<std::string>& args, bool withInput = false);
  ~ChildProcess();
  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  pid_t pid() const { return pid_; }
  // One line of the child's stdout (without the newline); throws TestFailure on EOF or at the deadline.
  std::string readLine(const Deadline& deadline);
  // One line (a newline is added) to the child's stdin (withInput); throws TestFailure when the child is gone.
  void writeLine(const std::string& line);
  // SIGKILL and reap.
  void kill();
  // SIGSTOP / SIGCONT: a peer that is alive but not running (descheduled, swapped, in a debugger).
  void stop();
  void resume();

 private:
  pid_t pid_ = -1;
  int stdoutFd_ = -1;
  int stdinFd_ = -1;  // our end of a socketpair (a pipe would raise SIGPIPE, which the harness treats as fatal)
  std::string pending_;
};

// The arguments for a child that prints "CONNECTING", connects with `handle`, prints "CONNECTED" and sends
// `size`-byte messages forever.
std::vector<std::string> childSenderArgs(const std::string& handleHex, int version, int dev, size_t size);
// The arguments for a child that listens, prints "HANDLE <hex>", accepts and receives forever. With `report`,
// it checks each message against childPatternSeed() and prints "RECEIVED OK" (or "RECEIVED BAD ...").
std::vector<std::string> childReceiverArgs(int version, int dev, size_t size, bool report = false);
// The fillPattern seed of every child sender's messages.
uint64_t childPatternSeed();

// The arguments for the failure campaign's receiver (test_campaign.cc, child_campaign.cc). It loads the plugin, makes
// a virtual device of devices 0..fuse-1 when `fuse` > 1 (else uses device 0), listens, prints "HANDLE <hex>",
// accepts, and takes its orders from stdin, one per line:
//   "MSG <index> <size>"  a message is coming: post a receive of `maxSize` bytes for it (at most `window` at once).
//                         Each completed receive prints "RECEIVED OK <index> <size>" when it holds `size` bytes of
//                         the pattern of campaignPatternSeed(index), else "RECEIVED BAD <index> <why>".
//   "END"                 once every announced message arrived: close the receive comm, print "CLOSED", listen again
//                         and print the next "HANDLE <hex>".
//   "QUIT"                once every announced message arrived: close, print "DONE" and exit 0.
// It prints "WARN <text>" for every WARN the plugin logs (within 0.1 s, and after each close). A receive that
// makes no progress for `deadlineSec` fails the child ("FAILED ...", as every role).
std::vector<std::string> childCampaignReceiverArgs(int version, int fuse, size_t maxSize, int window, int deadlineSec);
// The fillPattern seed of the campaign's message `index` (a pattern of its own per message: a chunk that lands in the
// wrong message cannot pass).
uint64_t campaignPatternSeed(uint64_t index);
// The campaign receiver's role (child_campaign.cc); childMain calls it. Throws on failure.
bool isCampaignReceiverInvocation(int argc, char** argv);
void runCampaignReceiver(int argc, char** argv);

// The arguments for a child that is rank 1 of a 2-rank GIN communicator whose rank 0 (the caller) listened with
// `rank0HandleHex` on device 0. The child loads options().plugin, drives the table `symbol` (kGinSymbols) as
// NCCL's GIN proxy does (two inits with `commId`, listen on the second, connect on the first), and prints:
//   "HANDLE <hex>"  its own listen handle, before it calls the collective connect (which needs rank 0's too);
//   "READY"         after connect, createContext (v13/v14: 1 context), and the collective regMrSym of a data
//                   window of `windowBytes` host bytes and then a signal window of 8 words (FORCE_SO);
//   "SIGNAL <v> OK" or "SIGNAL <v> BAD at <byte>"  whenever signal word 0 changes to v: whether the first
//                   `checkBytes` of the data window hold the fillPattern of childPatternSeed().
// Then it calls the progress function in a loop, as NCCL's GIN progress thread does, until it is killed.
std::vector<std::string> childGinRankArgs(const std::string& symbol, const std::string& rank0HandleHex, uint64_t commId,
                                          size_t windowBytes, size_t checkBytes);

// The receive comm of a connection from a child sender of `size`-byte messages: listens on `dev`, starts the
// child (*child) with the handle, accepts and closes the listener. *listenPort: the port the child connected to.
// The child sends from `childDev` (-1: `dev` too).
Comm acceptFromChildSender(NetApi& net, void* ctx, int version, int dev, size_t size,
                           std::unique_ptr<ChildProcess>* child, int* listenPort = nullptr, int childDev = -1);
// The send comm of a connection to a child receiver: reads its "HANDLE <hex>" line and connects. *childPort: the
// port the child listened on.
Comm connectToChildReceiver(NetApi& net, void* ctx, int dev, ChildProcess& child, int* childPort = nullptr);

}  // namespace conformance
