// The verbs sender's side of path failover (docs/failover.md "Verbs"): a failed path's work requests whose fate is
// unknown are queried once the path is drained; what the receiver lacks goes again over the live paths; a failed
// path is probed and made again with new QPs when its NIC is back.
#include <algorithm>
#include <cstring>

#include "proxy/verbs/verbs_send_comm.h"
#include "railnet/error.h"
#include "railnet/log.h"
#include "railnet/settings.h"

namespace railnet::verbs {
namespace {
std::chrono::steady_clock::time_point answerDeadline() {
  return std::chrono::steady_clock::now() + std::chrono::milliseconds(settings().failoverResumeMs);
}
}  // namespace

void VerbsSendComm::advanceFailover() {
  protocol::ControlChannel& control = connection_.control();
  connection_.watchPorts();
  // The control socket's silence (D94): a clock read per call, a look every eighth of the limit.
  connection_.watchControl(workStarted_, freeWork_.size() != work_.size() || !connection_.allLive());
  connection_.failIfStranded();
  if (control.failed() || connection_.allLive()) return;  // the usual case: nothing is out
  const auto now = std::chrono::steady_clock::now();
  bool awaitingAnswer = false;
  for (int path = 0; path < connection_.paths(); ++path) {
    switch (connection_.state(path)) {
      case PathState::kDraining:
        if (connection_.sendsInFlight(path) == 0) sendQuery(path);
        awaitingAnswer = true;
        break;
      case PathState::kQuerying:
        awaitingAnswer = true;
        if (now > pathDeadline_[static_cast<size_t>(path)]) {
          control.recordFailure("path " + std::to_string(path) + " (" + connection_.nicName(path) + ") failed and the "
                                "receiver did not say within " + std::to_string(settings().failoverResumeMs) +
                                " ms which of its chunks landed");
          return;
        }
        break;
      case PathState::kRenewing:
        awaitingAnswer = true;
        if (now > pathDeadline_[static_cast<size_t>(path)]) {
          connection_.probeRefused(path, "the receiver did not answer within " +
                                             std::to_string(settings().failoverResumeMs) + " ms");
        }
        break;
      case PathState::kDown:
        if (connection_.probeDue(path, now)) startRenew(path);
        break;
      case PathState::kLive:
        break;
    }
  }
  if (awaitingAnswer) pumpControl();
}

void VerbsSendComm::sendQuery(int path) {
  // Group notices are asked about member by member: each member is a chunk of its own receive.
  std::vector<Unknown>& items = unknown_[static_cast<size_t>(path)];
  std::vector<Unknown> expanded;
  std::vector<protocol::ChunkHeader> headers;
  for (const Unknown& item : items) {
    if (item.work >= 0) {
      expanded.push_back(item);
      headers.push_back(work_[static_cast<size_t>(item.work)].header);
      continue;
    }
    const std::vector<HeldMember>& members = groupMembers_[static_cast<size_t>(item.group)];
    for (size_t m = 0; m < members.size(); ++m) {
      expanded.push_back({-1, item.group, static_cast<int>(m)});
      protocol::ChunkHeader header{};
      header.recvId = members[m].destination.recvId;
      header.slot = static_cast<uint8_t>(members[m].destination.slot);
      header.messageSize = members[m].size;
      header.length = members[m].size;
      headers.push_back(header);
    }
  }
  items = std::move(expanded);
  connection_.sendPathFrame(protocol::FrameType::kPathQuery, path, headers.data(),
                            headers.size() * sizeof(protocol::ChunkHeader));
  connection_.setState(path, PathState::kQuerying);
  pathDeadline_[static_cast<size_t>(path)] = answerDeadline();
}

bool VerbsSendComm::applyAnswer(int path, const char* answer, size_t count) {
  std::vector<Unknown>& items = unknown_[static_cast<size_t>(path)];
  if (count != items.size()) {
    connection_.control().recordFailure("protocol error: " + std::to_string(count) + " answers to a query of " +
                                        std::to_string(items.size()) + " chunks");
    return false;
  }
  uint64_t resentBytes = 0;
  uint64_t resent = 0;
  std::vector<int> groups;
  for (size_t i = 0; i < count && !connection_.control().failed(); ++i) {
    const Unknown item = items[i];
    const bool placed = answer[i] != 0;
    uint32_t index = 0;
    if (item.work >= 0) {
      index = static_cast<uint32_t>(item.work);
      if (placed) {
        completeWork(index);
        continue;
      }
    } else {
      if (item.member == 0) groups.push_back(item.group);
      const HeldMember& member = groupMembers_[static_cast<size_t>(item.group)][static_cast<size_t>(item.member)];
      if (placed) {
        --member.request->pendingStripes_;
        ++member.request->completedStripes_;
        continue;
      }
      // A missing member goes again on its own, as a chunk that is its whole message (the member's count of
      // pending work carries over to it).
      index = newWork();
      SentWork& work = work_[index];
      work.kind = SentWork::Kind::kStripe;
      work.request = member.request;
      work.localBase = reinterpret_cast<uint64_t>(member.data);
      work.region = member.region;
      work.header.recvId = member.destination.recvId;
      work.header.slot = static_cast<uint8_t>(member.destination.slot);
      work.header.messageSize = member.size;
      work.header.length = member.size;
      work.destination = member.destination;
    }
    SentWork& work = work_[index];
    uint64_t& from = work.request->pathBytes_[path];
    from -= std::min(from, work.header.length);
    resentBytes += work.header.length;
    ++resent;
    parked_.push_back(index);  // sent below, or once a path is made again when none is live (the standby)
  }
  for (int group : groups) {
    groupMembers_[static_cast<size_t>(group)].clear();
    freeGroupNotices_.push_back(group);
  }
  items.clear();
  if (connection_.control().failed()) return true;
  sendParked();
  if (connection_.retiring(path)) {
    RN_INFO(NCCL_NET, "NET/railnet: send connection with %s: standby path %d (%s) handed its traffic back; %llu of %zu "
            "chunks in flight on it, %llu B, went again over %s", connection_.control().peerName().c_str(), path,
            connection_.nicName(path).c_str(), static_cast<unsigned long long>(resent), count,
            static_cast<unsigned long long>(resentBytes), connection_.liveNicNames().c_str());
    connection_.markDown(path);  // rests
    return true;
  }
  connection_.counters(path).addResent(resentBytes);
  connection_.markDown(path);
  const std::string over = connection_.livePaths() == 0 && connection_.standbyPath() >= 0
                               ? "its standby path (" + connection_.nicName(connection_.standbyPath()) + ") once it is made"
                               : connection_.liveNicNames();
  RN_WARN("NET/railnet: send connection with %s: path %d (%s) failed (%s); the receiver lacked %llu of %zu chunks in "
          "flight on it, %llu B, sent again over %s; %d of %d paths carry traffic, the failed one is probed from 1 s",
          connection_.control().peerName().c_str(), path, connection_.nicName(path).c_str(),
          connection_.whyDown(path).c_str(), static_cast<unsigned long long>(resent), count,
          static_cast<unsigned long long>(resentBytes), over.c_str(), connection_.livePaths(),
          connection_.paths());
  return true;
}

void VerbsSendComm::sendParked() {
  // In the order they were parked; the rest stay when no path is live (the standby is being made).
  size_t sent = 0;
  for (; sent < parked_.size() && !connection_.control().failed(); ++sent) {
    const int to = connection_.livePath(messages_++);
    if (to < 0) break;
    SentWork& work = work_[parked_[sent]];
    work.request->pathBytes_[to] += work.header.length;
    postWork(parked_[sent], to);
  }
  parked_.erase(parked_.begin(), parked_.begin() + static_cast<std::ptrdiff_t>(sent));
}

void VerbsSendComm::startRenew(int path) {
  try {
    connection_.replaceQps(path);
  } catch (const std::exception& error) {
    connection_.probeRefused(path, error.what());
    return;
  }
  for (size_t i = 0; i < kClearToSendBuffers; ++i) postClearToSendBuffer(path, i);
  QpInfo info = connection_.qps(path).localInfo();
  info.path = static_cast<uint8_t>(path);
  info.paths = static_cast<uint8_t>(connection_.paths());
  connection_.sendPathFrame(protocol::FrameType::kPathRenew, path, &info, sizeof(info));
  connection_.setState(path, PathState::kRenewing);
  pathDeadline_[static_cast<size_t>(path)] = answerDeadline();
}

void VerbsSendComm::applyRenew(int path, const char* record, size_t bytes, bool portDown) {
  if (connection_.state(path) != PathState::kRenewing) return;  // a late answer to a renewal given up on
  if (bytes == 0) {
    if (connection_.livePaths() == 0 && portDown) {
      // No path is live and the receiver cannot take this one (its port is down): fail now rather than at the
      // stranded limit, so a peer whose every NIC is gone is reported within 2 s (D96).
      connection_.control().recordFailure("every path failed; the receiver cannot make path " + std::to_string(path) +
                                          " (" + connection_.nicName(path) + ") either (its port is down)");
      return;
    }
    connection_.probeRefused(path, "the receiver cannot take it back yet");
    return;
  }
  if (bytes != sizeof(QpInfo)) {
    connection_.control().recordFailure("protocol error: a QP record of " + std::to_string(bytes) + " bytes");
    return;
  }
  QpInfo remote;
  memcpy(&remote, record, sizeof(remote));
  try {
    connection_.connectPath(path, remote);
  } catch (const std::exception& error) {
    connection_.probeRefused(path, error.what());
    return;
  }
  // The receiver may send its clear-to-sends here from now on.
  connection_.sendPathFrame(protocol::FrameType::kPathReady, path, nullptr, 0);
  sendParked();
  const int standby = connection_.standbyPath();
  if (standby >= 0 && standby != path && connection_.live(standby)) {
    connection_.failPath(standby, "path " + std::to_string(path) + " (" + connection_.nicName(path) +
                                      ") answers again");
  }
}

bool VerbsSendComm::applyPathFrame(const protocol::FrameHeader& frame, const char* payload) {
  protocol::ControlChannel& control = connection_.control();
  bool current = false;
  const int path = connection_.framePath(frame, &current);
  if (path < 0 || !current) return path >= 0;
  switch (static_cast<protocol::FrameType>(frame.type)) {
    case protocol::FrameType::kPathDown:
      connection_.failPath(path, "the receiver took it out", false);
      return true;
    case protocol::FrameType::kPathAnswer:
      if (connection_.state(path) != PathState::kQuerying) {
        control.recordFailure("protocol error: an answer about path " + std::to_string(path) + ", which was not queried");
        return false;
      }
      return applyAnswer(path, payload, frame.size);
    case protocol::FrameType::kPathRenew:
      applyRenew(path, payload, frame.size, (frame.extraKeys & protocol::kRenewPortDown) != 0);
      return !control.failed();
    default:
      return connection_.unexpectedFrame(frame);
  }
}

}  // namespace railnet::verbs
