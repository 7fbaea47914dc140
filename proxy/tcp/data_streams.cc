#include "proxy/tcp/data_streams.h"

#include <algorithm>
#include <atomic>

#include "railnet/log.h"

namespace railnet::tcp {
namespace {
// Started sets of streams in the process: the helper telemetry is logged when the last one stops, which is when
// the helper pool stops and logs its own.
std::atomic<int> gStarted{0};
}  // namespace

void DataStreams::setCounters(const NicLayout& layout) {
  counters_.clear();
  shaping_.clear();
  if (layout.nics.empty()) return;
  for (size_t i = 0; i < pending_.size(); ++i) counters_.push_back(layout.nics[i % layout.nics.size()]);
  if (layout.shaping.size() != layout.nics.size()) return;
  for (size_t i = 0; i < pending_.size(); ++i) shaping_.push_back(layout.shaping[i % layout.shaping.size()]);
}

bool DataStreams::rejoin(int index, Fd socket) {
  const size_t at = static_cast<size_t>(index);
  return rejoin(index, std::move(socket), at < counters_.size() ? counters_[at] : nullptr,
                at < shaping_.size() ? shaping_[at] : shaping::EgressShaping{});
}

bool DataStreams::rejoin(int index, Fd socket, NicCounters* counters, const shaping::EgressShaping& shaping) {
  Stream& stream = *streams_.at(static_cast<size_t>(index));
  const bool wasDead = stream.dead();
  engine_->detach(&stream);
  stream.restart(std::move(socket));
  stream.setCounters(counters);
  stream.setShaping(shaping);
  engine_->attach(&stream);
  stream.revive();
  return wasDead;
}

void DataStreams::start(StreamOwner* owner, bool releaseOnFailure) {
  started_ = true;
  if (pending_.empty()) return;
  gStarted.fetch_add(1, std::memory_order_relaxed);
  engine_ = progress::Engine::acquire();
  for (size_t i = 0; i < pending_.size(); ++i) {
    NicCounters* counters = i < counters_.size() ? counters_[i] : nullptr;
    streams_.push_back(std::make_unique<Stream>(std::move(pending_[i]), owner, static_cast<int>(i), counters,
                                                i < shaping_.size() ? shaping_[i] : shaping::EgressShaping{}));
    if (releaseOnFailure) streams_.back()->releaseOnFailure();
  }
  pending_.clear();
  std::vector<int> helpers;
  for (auto& stream : streams_) {
    engine_->attach(stream.get());
    helpers.push_back(stream->helper());
  }
  std::sort(helpers.begin(), helpers.end());
  helpersServing_ = static_cast<int>(std::unique(helpers.begin(), helpers.end()) - helpers.begin());
}

void DataStreams::stop() {
  if (!started_) return;
  if (streams_.empty()) {
    started_ = false;
    return;
  }
  // Until the last stream is detached its siblings' helpers may still look at the set (a stream that drains
  // takes chunks from a sibling), so the set stays whole and started_ unchanged until then.
  for (auto& stream : streams_) engine_->detach(stream.get());
  for (auto& stream : streams_) stream->foldTelemetry();
  started_ = false;
  streams_.clear();
  engine_.reset();
  if (gStarted.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    RN_INFO(NCCL_NET, "NET/railnet: TCP data streams: %s", streamTelemetryLine().c_str());
  }
}

std::optional<std::string> DataStreams::peerHostLost(int controlFd, std::chrono::steady_clock::time_point now,
                                                     std::chrono::milliseconds limit) {
  silenceFds_.assign(1, controlFd);
  for (int s = 0; s < count(); ++s) silenceFds_.push_back((*this)[s].fd());
  const auto silent = hostSilence_.look(silenceFds_, now, limit);
  if (!silent) return std::nullopt;
  return protocol::describeHostSilence(*silent);
}

}  // namespace railnet::tcp
