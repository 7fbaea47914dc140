#include "proxy/tcp/data_streams.h"

namespace railnet::tcp {

void DataStreams::setCounters(const NicLayout& layout) {
  counters_.clear();
  if (layout.nics.empty()) return;
  for (size_t i = 0; i < pending_.size(); ++i) counters_.push_back(layout.nics[i % layout.nics.size()]);
}

void DataStreams::start(StreamOwner* owner) {
  started_ = true;
  if (pending_.empty()) return;
  engine_ = progress::Engine::acquire();
  for (size_t i = 0; i < pending_.size(); ++i) {
    NicCounters* counters = i < counters_.size() ? counters_[i] : nullptr;
    streams_.push_back(std::make_unique<Stream>(std::move(pending_[i]), owner, static_cast<int>(i), counters));
  }
  pending_.clear();
  for (auto& stream : streams_) engine_->attach(stream.get());
}

void DataStreams::stop() {
  if (!started_) return;
  started_ = false;
  for (auto& stream : streams_) engine_->detach(stream.get());
  streams_.clear();
  engine_.reset();
}

}  // namespace railnet::tcp
