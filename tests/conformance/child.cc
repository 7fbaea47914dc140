#include "child.h"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comms.h"
#include "gin_api.h"
#include "log_capture.h"
#include "transfer.h"

extern char** environ;

namespace conformance {
namespace {

struct ChildOptions {
  bool sender = false;
  std::string handleHex;
  std::string plugin;
  int version = 12;
  int dev = 0;
  size_t size = 1 << 20;
  bool report = false;  // receiver: check every message against the sender's pattern and print a line for it
};

ChildOptions parseChild(int argc, char** argv) {
  ChildOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--report") {
      o.report = true;
      continue;
    }
    if (arg == "--child-receiver" || i + 1 >= argc) continue;
    const std::string value = argv[++i];
    if (arg == "--child-sender") {
      o.sender = true;
      o.handleHex = value;
    } else if (arg == "--plugin")
      o.plugin = value;
    else if (arg == "--version")
      o.version = std::atoi(value.c_str());
    else if (arg == "--dev")
      o.dev = std::atoi(value.c_str());
    else if (arg == "--size")
      o.size = std::strtoull(value.c_str(), nullptr, 10);
  }
  return o;
}

// The child keeps going until killed; this only bounds a child whose parent vanished.
const Deadline& forever() {
  static const Deadline deadline(std::chrono::minutes(10));
  return deadline;
}

// The pattern every child sender writes (and a reporting receiver checks): childPatternSeed().
constexpr uint64_t kChildSeed = 7;

void sendForever(NetApi& net, void* sendComm, size_t size) {
  HostBuffer buffer(size);
  fillPattern(buffer.data(), size, kChildSeed);
  Registration reg(net, sendComm, buffer.data(), size);
  for (;;) {
    void* request = postSend(net, sendComm, buffer.data(), size, 0, reg.handle(), forever());
    REQUIRE_OK(waitRequest(net, request, nullptr, forever()));
  }
}

void receiveForever(NetApi& net, void* recvComm, size_t size, bool report) {
  HostBuffer buffer(size);
  Registration reg(net, recvComm, buffer.data(), size);
  for (;;) {
    if (report) memset(buffer.data(), 0, size);
    void* request = postRecv(net, recvComm, buffer.data(), size, reg.handle(), forever());
    int received = 0;
    REQUIRE_OK(waitRequest(net, request, &received, forever()));
    if (!report) continue;
    const size_t bad = static_cast<size_t>(received) == size ? findMismatch(buffer.data(), size, kChildSeed) : 0;
    if (bad == SIZE_MAX) {
      std::printf("RECEIVED OK\n");
    } else {
      std::printf("RECEIVED BAD size %d, first wrong byte at %zu\n", received, bad);
    }
    std::fflush(stdout);
  }
}

void runChild(const ChildOptions& o) {
  PluginLibrary library(o.plugin);
  std::unique_ptr<NetApi> net = openApi(library, o.version);
  REQUIRE(net != nullptr, "child: version not exported");
  NetContext ctx(*net, 0xC41D);
  if (o.sender) {
    ConnHandle handle;
    REQUIRE(fromHex(o.handleHex, handle.bytes, sizeof(handle.bytes)), "child: bad handle");
    std::printf("CONNECTING\n");  // the kills during connect time themselves from here
    std::fflush(stdout);
    Comm send = connectLoop(*net, ctx.get(), o.dev, handle, forever());
    std::printf("CONNECTED\n");
    std::fflush(stdout);
    sendForever(*net, send.get(), o.size);
  } else {
    ConnHandle handle;
    Comm listener = listenOn(*net, ctx.get(), o.dev, &handle);
    std::printf("HANDLE %s\n", toHex(handle.bytes, sizeof(handle.bytes)).c_str());
    std::fflush(stdout);
    Comm recv = acceptLoop(*net, listener.get(), forever());
    REQUIRE_OK(listener.close());
    receiveForever(*net, recv.get(), o.size, o.report);
  }
}

// ---- the GIN rank (--child-gin-rank) -----------------------------------------------------------------------

struct GinChildOptions {
  std::string rank0HandleHex;
  std::string plugin;
  std::string symbol;
  uint64_t commId = 0;
  size_t windowBytes = 1 << 20;
  size_t checkBytes = 0;
  bool echo = false;  // echo what the plugin logs to stderr (the parent runs --verbose)
};

GinChildOptions parseGinChild(int argc, char** argv) {
  GinChildOptions o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--echo") {
      o.echo = true;
      continue;
    }
    if (i + 1 >= argc) continue;
    const std::string value = argv[++i];
    if (arg == "--child-gin-rank")
      o.rank0HandleHex = value;
    else if (arg == "--plugin")
      o.plugin = value;
    else if (arg == "--gin-symbol")
      o.symbol = value;
    else if (arg == "--comm-id")
      o.commId = std::strtoull(value.c_str(), nullptr, 10);
    else if (arg == "--window")
      o.windowBytes = std::strtoull(value.c_str(), nullptr, 10);
    else if (arg == "--check")
      o.checkBytes = std::strtoull(value.c_str(), nullptr, 10);
  }
  return o;
}

void printLine(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

// Rank 1 of the parent's GIN communicator, set up as test_gin.cc's rank threads (and NCCL's ncclGinConnectOnce)
// are; the parent is rank 0. Never torn down: it runs until SIGKILL.
void runGinChild(const GinChildOptions& o) {
  if (o.echo) setLogEcho(true);
  GinLibrary library(o.plugin);
  GinApi* api = nullptr;
  for (GinApi* table : library.tables()) {
    if (o.symbol == table->symbol()) api = table;
  }
  REQUIRE(api != nullptr, "child: the plugin does not export " + o.symbol);
  REQUIRE(o.checkBytes <= o.windowBytes, "child: --check larger than --window");
  void* ctxA = nullptr;  // NCCL's plugin init: connect's context
  void* ctxB = nullptr;  // NCCL's GIN connect init: listen's context
  REQUIRE_OK(api->init(&ctxA, o.commId));
  REQUIRE_OK(api->init(&ctxB, o.commId));
  int ndev = 0;
  REQUIRE_OK(api->devices(&ndev));
  REQUIRE(ndev > 0, "child: GIN devices() reports no device");
  ConnHandle handles[2];
  REQUIRE(fromHex(o.rank0HandleHex, handles[0].bytes, sizeof(handles[0].bytes)), "child: bad rank 0 handle");
  void* listenComm = nullptr;
  REQUIRE_OK(api->listen(ctxB, 0, handles[1].bytes, &listenComm));
  printLine("HANDLE " + toHex(handles[1].bytes, sizeof(handles[1].bytes)));
  void* pointers[2] = {handles[0].bytes, handles[1].bytes};
  GinEndpoint ep;
  REQUIRE_OK(api->connect(ctxA, pointers, 2, 1, listenComm, &ep.collComm));
  REQUIRE_OK(api->closeListen(listenComm));
  REQUIRE_OK(api->createContext(ep.collComm, 1, &ep.ginCtx));
  HostBuffer data(o.windowBytes);
  HostBuffer signals(8 * sizeof(uint64_t));
  // Registered for the rest of the child's life: it is killed, never torn down.
  void* dataMhandle = nullptr;
  void* dataPutHandle = nullptr;
  REQUIRE_OK(api->regMrSym(ep.collComm, data.data(), data.size(), NCCL_PTR_HOST, 0, &dataMhandle, &dataPutHandle));
  void* signalMhandle = nullptr;
  void* signalPutHandle = nullptr;
  REQUIRE_OK(api->regMrSym(ep.collComm, signals.data(), signals.size(), NCCL_PTR_HOST, NCCL_NET_MR_FLAG_FORCE_SO,
                           &signalMhandle, &signalPutHandle));
  printLine("READY");
  const auto* word0 = reinterpret_cast<const uint64_t*>(signals.data());
  uint64_t seen = 0;
  bool progressFailed = false;
  Backoff backoff;
  while (!forever().expired()) {
    const ncclResult_t rc = api->progress(ep);
    if (rc != ncclSuccess && !progressFailed) {
      progressFailed = true;
      printLine(std::string("PROGRESS FAILED ") + ncclResultName(rc));
    }
    const uint64_t value = __atomic_load_n(word0, __ATOMIC_ACQUIRE);
    if (value != seen) {
      seen = value;
      const size_t bad = o.checkBytes ? findMismatch(data.data(), o.checkBytes, kChildSeed) : SIZE_MAX;
      printLine(bad == SIZE_MAX ? strf("SIGNAL %llu OK", static_cast<unsigned long long>(value))
                                : strf("SIGNAL %llu BAD at %zu", static_cast<unsigned long long>(value), bad));
      backoff.progressed();
    }
    backoff.idle();
  }
}

// ---- where a child runs (--netns, --env: childPlacementArgs) ----------------------------------------------------

// Enters the network namespace `ip netns add NAME` made. Before any thread starts: setns(CLONE_NEWNET) moves only the
// calling thread, and threads inherit it from their creator.
void enterNetns(const std::string& name) {
  const std::string path = "/var/run/netns/" + name;
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw TestFailure(strf("--netns: cannot open %s: %s", path.c_str(), std::strerror(errno)));
  const int rc = setns(fd, CLONE_NEWNET);
  const int err = errno;
  close(fd);
  if (rc != 0) throw TestFailure(strf("--netns: setns(%s) failed: %s", path.c_str(), std::strerror(err)));
  // As `ip netns exec` does: a mount namespace of our own whose /sys shows this namespace's interfaces (the plugin
  // reads NIC speeds and PCI paths there). Best effort: without it /sys shows the parent's, and the plugin falls back
  // to default speeds.
  if (unshare(CLONE_NEWNS) == 0 && mount(nullptr, "/", nullptr, MS_SLAVE | MS_REC, nullptr) == 0 &&
      umount2("/sys", MNT_DETACH) == 0) {
    (void)mount(name.c_str(), "/sys", "sysfs", 0, nullptr);
  }
}

// --netns NAME and --env NAME=VALUE, wherever they stand among a role's arguments.
void applyPlacement(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--netns") {
      enterNetns(argv[++i]);
    } else if (arg == "--env") {
      const std::string setting = argv[++i];
      const size_t eq = setting.find('=');
      if (eq == std::string::npos || eq == 0) throw TestFailure("--env wants NAME=VALUE, got " + setting);
      setenv(setting.substr(0, eq).c_str(), setting.substr(eq + 1).c_str(), 1);
    }
  }
}

std::string selfPath() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) throw TestFailure("cannot read /proc/self/exe");
  path[n] = '\0';
  return path;
}

}  // namespace

bool isChildInvocation(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--child-sender") == 0 || std::strcmp(argv[i], "--child-receiver") == 0 ||
        std::strcmp(argv[i], "--child-gin-rank") == 0) {
      return true;
    }
  }
  return isCampaignReceiverInvocation(argc, argv);
}

int childMain(int argc, char** argv) {
  // Never outlive the harness, even if it dies without killing us.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  bool gin = false;
  for (int i = 1; i < argc; ++i) gin = gin || std::strcmp(argv[i], "--child-gin-rank") == 0;
  try {
    // Before the plugin loads and before any thread starts.
    applyPlacement(argc, argv);
    if (gin)
      runGinChild(parseGinChild(argc, argv));
    else if (isCampaignReceiverInvocation(argc, argv))
      runCampaignReceiver(argc, argv);
    else
      runChild(parseChild(argc, argv));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "conformance child: %s\n", e.what());
    // The parent may be waiting for this (group host_loss): the failure and the plugin's first WARN.
    // The WARN that failed the connection ("... failed: why"), else the first one (a watchdog's "no progress" may
    // come before it).
    const std::vector<LogRecord> warnings = warningsSince(0);
    auto failure = std::find_if(warnings.begin(), warnings.end(),
                                [](const LogRecord& w) { return w.text.find(" failed: ") != std::string::npos; });
    if (failure == warnings.end()) failure = warnings.begin();
    if (failure == warnings.end()) {
      std::printf("FAILED %s; WARN: none\n", e.what());
    } else {
      std::printf("FAILED %s; WARN: %s%s%lld\n", e.what(), failure->text.c_str(), kWarnedAtMarker,
                  static_cast<long long>(
                      std::chrono::duration_cast<std::chrono::nanoseconds>(failure->at.time_since_epoch()).count()));
    }
    std::fflush(stdout);
    return 1;
  }
  return 0;
}

std::optional<std::chrono::steady_clock::time_point> childWarnedAt(const std::string& failedLine) {
  const size_t at = failedLine.rfind(kWarnedAtMarker);
  if (at == std::string::npos) return std::nullopt;
  const long long ns = std::strtoll(failedLine.c_str() + at + std::strlen(kWarnedAtMarker), nullptr, 10);
  return std::chrono::steady_clock::time_point(std::chrono::nanoseconds(ns));
}

ChildProcess::ChildProcess(const std::vector<std::string>& args, bool withInput) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw TestFailure("pipe2 failed");
  int input[2] = {-1, -1};
  if (withInput && socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, input) != 0) {
    close(fds[0]);
    close(fds[1]);
    throw TestFailure("socketpair failed");
  }
  const std::string exe = selfPath();
  std::vector<std::string> all = {exe};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);

  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], STDOUT_FILENO);
  if (withInput) posix_spawn_file_actions_adddup2(&actions, input[1], STDIN_FILENO);
  // A separate process holds none of our sockets, as a real remote peer would not.
  posix_spawn_file_actions_addclosefrom_np(&actions, 3);
  const int rc = posix_spawn(&pid_, exe.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  close(fds[1]);
  stdoutFd_ = fds[0];
  if (withInput) {
    close(input[1]);
    stdinFd_ = input[0];
  }
  if (rc != 0) {
    pid_ = -1;
    throw TestFailure(strf("posix_spawn(%s) failed: %s", exe.c_str(), std::strerror(rc)));
  }
}

ChildProcess::~ChildProcess() {
  kill();
  if (stdoutFd_ >= 0) close(stdoutFd_);
  if (stdinFd_ >= 0) close(stdinFd_);
}

void ChildProcess::writeLine(const std::string& line) {
  if (stdinFd_ < 0) throw TestFailure("writeLine: the child was started without input");
  const std::string text = line + "\n";
  for (size_t done = 0; done < text.size();) {
    const ssize_t n = send(stdinFd_, text.data() + done, text.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw TestFailure(strf("writing to the child process failed: %s", std::strerror(errno)));
    done += static_cast<size_t>(n);
  }
}

void ChildProcess::kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
}

std::string ChildProcess::readLine(const Deadline& deadline) {
  for (;;) {
    const size_t newline = pending_.find('\n');
    if (newline != std::string::npos) {
      std::string line = pending_.substr(0, newline);
      pending_.erase(0, newline + 1);
      return line;
    }
    deadline.check("a line from the child process");
    pollfd pfd{stdoutFd_, POLLIN, 0};
    if (poll(&pfd, 1, 100) <= 0) continue;
    char chunk[512];
    const ssize_t n = read(stdoutFd_, chunk, sizeof(chunk));
    if (n == 0) throw TestFailure("the child process exited before printing its line (see stderr)");
    if (n > 0) pending_.append(chunk, static_cast<size_t>(n));
  }
}

std::vector<std::string> childSenderArgs(const std::string& handleHex, int version, int dev, size_t size) {
  return {"--child-sender",        handleHex, "--plugin",          options().plugin, "--version",
          std::to_string(version), "--dev",   std::to_string(dev), "--size",         std::to_string(size)};
}

std::vector<std::string> childReceiverArgs(int version, int dev, size_t size, bool report) {
  std::vector<std::string> args = {"--child-receiver", "--plugin", options().plugin,      "--version",
                                   std::to_string(version), "--dev", std::to_string(dev), "--size",
                                   std::to_string(size)};
  if (report) args.push_back("--report");
  return args;
}

uint64_t childPatternSeed() { return kChildSeed; }

std::vector<std::string> childPlacementArgs(const std::string& netns, const std::vector<std::string>& env) {
  std::vector<std::string> args;
  if (!netns.empty()) args.insert(args.end(), {"--netns", netns});
  for (const std::string& setting : env) args.insert(args.end(), {"--env", setting});
  return args;
}

std::vector<std::string> childGinRankArgs(const std::string& symbol, const std::string& rank0HandleHex, uint64_t commId,
                                          size_t windowBytes, size_t checkBytes) {
  std::vector<std::string> args = {"--child-gin-rank", rank0HandleHex,
                                   "--plugin",         options().plugin,
                                   "--gin-symbol",     symbol,
                                   "--comm-id",        std::to_string(commId),
                                   "--window",         std::to_string(windowBytes),
                                   "--check",          std::to_string(checkBytes)};
  if (options().verbose) args.push_back("--echo");
  return args;
}

Comm acceptFromChildSender(NetApi& net, void* ctx, int version, int dev, size_t size,
                           std::unique_ptr<ChildProcess>* child, int* listenPort, int childDev) {
  ConnHandle handle;
  Comm listener = listenOn(net, ctx, dev, &handle);
  if (listenPort != nullptr) *listenPort = handleAddress(handle).port;
  *child = std::make_unique<ChildProcess>(childSenderArgs(toHex(handle.bytes, sizeof(handle.bytes)), version,
                                                                  childDev >= 0 ? childDev : dev, size));
  Comm recv = acceptLoop(net, listener.get(), Deadline());
  REQUIRE_OK(listener.close());
  return recv;
}

Comm connectToChildReceiver(NetApi& net, void* ctx, int dev, ChildProcess& child, int* childPort) {
  const std::string line = child.readLine(Deadline());
  ConnHandle handle;
  REQUIRE(line.rfind("HANDLE ", 0) == 0 && fromHex(line.substr(7), handle.bytes, sizeof(handle.bytes)),
          "the child receiver printed no handle: " + line);
  if (childPort != nullptr) *childPort = handleAddress(handle).port;
  return connectLoop(net, ctx, dev, handle, Deadline());
}

void ChildProcess::stop() {
  if (pid_ > 0) ::kill(pid_, SIGSTOP);
}

void ChildProcess::resume() {
  if (pid_ > 0) ::kill(pid_, SIGCONT);
}

}  // namespace conformance
