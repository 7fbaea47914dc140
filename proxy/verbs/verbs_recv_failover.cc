// The verbs receiver's side of path failover (docs/failover.md "Verbs"): a failed path is drained before the sender's
// query about it is answered from the receive ring's ledgers, clear-to-sends move to a live path, and a path the
// sender makes again gets new QPs here too.
#include <cstring>

#include "proxy/verbs/verbs_recv_comm.h"
#include "railnet/log.h"

namespace railnet::verbs {

void VerbsRecvComm::advanceFailover() {
  connection_.watchPorts();
  connection_.failIfStranded();
  // The usual case: nothing is out (a query takes its path out; clear-to-sends move only off a path that is out,
  // which may be a standby resting again).
  if (connection_.control().failed() || (connection_.allLive() && connection_.live(clearToSendPath_))) return;
  for (int path = 0; path < connection_.paths(); ++path) {
    if (connection_.state(path) == PathState::kDraining && connection_.drained(path)) connection_.markDown(path);
    if (queried_[static_cast<size_t>(path)] && connection_.state(path) == PathState::kDown) answerQuery(path);
  }
  moveClearToSends();
}

void VerbsRecvComm::moveClearToSends() {
  if (connection_.live(clearToSendPath_) || connection_.sendsInFlight(clearToSendPath_) != 0) return;
  int next = -1;
  for (int path = 0; path < connection_.paths() && next < 0; ++path) {
    if (connection_.live(path) && carriedNotice_[static_cast<size_t>(path)]) next = path;
  }
  if (next < 0) return;  // none yet: a path the sender made again takes them once it has carried a notice
  const int from = clearToSendPath_;
  clearToSendPath_ = next;
  // A receive already finished had its clear-to-send arrive; the others go again, in their order.
  std::deque<uint32_t> unacknowledged;
  unacknowledged.swap(unackedClearToSends_);
  for (uint32_t recvId : unacknowledged) {
    if (ring_.find(recvId, 0) != nullptr) unackedClearToSends_.push_back(recvId);
  }
  RN_INFO(NCCL_NET, "NET/railnet: receive connection with %s: clear-to-sends move from path %d (%s) to path %d (%s); "
          "%zu go again", connection_.control().peerName().c_str(), from, connection_.nicName(from).c_str(), next,
          connection_.nicName(next).c_str(), unackedClearToSends_.size());
  const std::deque<uint32_t> again = unackedClearToSends_;
  for (uint32_t recvId : again) {
    if (!connection_.live(clearToSendPath_) || !postClearToSend(recvId)) return;
  }
}

void VerbsRecvComm::answerQuery(int path) {
  // Every notice that arrived on the path is counted (it is drained), so the ledgers say what landed.
  std::vector<protocol::ChunkHeader>& headers = queries_[static_cast<size_t>(path)];
  std::vector<char> placed(headers.size());
  for (size_t i = 0; i < headers.size(); ++i) placed[i] = ring_.placed(headers[i]) ? 1 : 0;
  connection_.sendPathFrame(protocol::FrameType::kPathAnswer, path, placed.data(), placed.size());
  headers.clear();
  queried_[static_cast<size_t>(path)] = false;
}

void VerbsRecvComm::applyRenew(int path, const char* record, size_t bytes) {
  const uint32_t generation = connection_.generation(path);
  auto refuse = [&](const std::string& why, bool portDown = false) {
    RN_INFO(NCCL_NET, "NET/railnet: receive connection with %s: path %d (%s) cannot be made again yet: %s",
            connection_.control().peerName().c_str(), path, connection_.nicName(path).c_str(), why.c_str());
    connection_.sendPathFrame(protocol::FrameType::kPathRenew, path, nullptr, 0, generation,
                              portDown ? protocol::kRenewPortDown : 0);
  };
  if (bytes != sizeof(QpInfo)) {
    connection_.control().recordFailure("protocol error: a QP record of " + std::to_string(bytes) + " bytes");
    return;
  }
  if (connection_.state(path) == PathState::kDraining || queried_[static_cast<size_t>(path)]) {
    refuse("it is still draining");
    return;
  }
  if (!connection_.nicUp(path)) {
    refuse("the port of " + connection_.nicName(path) + " is down", true);
    return;
  }
  QpInfo remote;
  memcpy(&remote, record, sizeof(remote));
  try {
    connection_.replaceQps(path);
    postNotices(path);
    QpInfo info = connection_.qps(path).localInfo();
    info.path = static_cast<uint8_t>(path);
    info.paths = static_cast<uint8_t>(connection_.paths());
    // At RTS before the sender hears of it, so its first WRITE finds the QPs ready.
    connection_.connectPath(path, remote);
    carriedNotice_[static_cast<size_t>(path)] = false;
    connection_.sendPathFrame(protocol::FrameType::kPathRenew, path, &info, sizeof(info), generation);
  } catch (const std::exception& error) {
    refuse(error.what());
  }
}

bool VerbsRecvComm::applyPathFrame(const protocol::FrameHeader& frame, const char* payload) {
  protocol::ControlChannel& control = connection_.control();
  bool current = false;
  const int path = connection_.framePath(frame, &current);
  if (path < 0 || !current) return path >= 0;
  switch (static_cast<protocol::FrameType>(frame.type)) {
    case protocol::FrameType::kPathDown:
      connection_.failPath(path, "the sender took it out", false);
      return !control.failed();
    case protocol::FrameType::kPathQuery: {
      if (frame.size % sizeof(protocol::ChunkHeader) != 0) {
        control.recordFailure("protocol error: a path query of " + std::to_string(frame.size) + " bytes");
        return false;
      }
      connection_.failPath(path, "the sender took it out", false);
      std::vector<protocol::ChunkHeader>& headers = queries_[static_cast<size_t>(path)];
      headers.resize(frame.size / sizeof(protocol::ChunkHeader));
      if (!headers.empty()) memcpy(headers.data(), payload, frame.size);
      queried_[static_cast<size_t>(path)] = true;
      // Drained already (a standby resting again is out of advanceFailover's sight): answered now.
      if (connection_.state(path) == PathState::kDown) answerQuery(path);
      return !control.failed();
    }
    case protocol::FrameType::kPathReady:
      // The sender's QPs of the path are at RTS: clear-to-sends may move there.
      carriedNotice_[static_cast<size_t>(path)] = true;
      return true;
    case protocol::FrameType::kPathRenew:
      applyRenew(path, payload, frame.size);
      return !control.failed();
    default:
      return connection_.unexpectedFrame(frame);
  }
}

}  // namespace railnet::verbs
