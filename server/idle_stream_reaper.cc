#include "server/idle_stream_reaper.h"

#include <algorithm>

namespace infoflow::server {

using Clock = std::chrono::steady_clock;

IdleStreamReaper::IdleStreamReaper(std::chrono::milliseconds idle) : idle_(idle) {
  if (idle_.count() > 0) thread_ = std::thread([this] { Run(); });
}

IdleStreamReaper::~IdleStreamReaper() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void IdleStreamReaper::Run() {
  // Checks a few times per idle period: a stream is reaped between `idle`
  // and 1.25 x `idle` after its client last sent.
  const auto period = std::clamp<std::chrono::milliseconds>(
      idle_ / 4, std::chrono::milliseconds(10), std::chrono::milliseconds(1000));
  std::unique_lock<std::mutex> l(mu_);
  while (!stop_) {
    cv_.wait_for(l, period);
    const Clock::time_point now = Clock::now();
    for (Entry& e : entries_) {
      if (e.waiting && !e.reaped && now - e.since >= idle_) {
        e.reaped = true;
        e.ctx->TryCancel();  // its Read() returns false; the handler ends
      }
    }
  }
}

IdleStreamReaper::Watch::Watch(IdleStreamReaper* reaper, grpc::ServerContext* ctx, bool waiting)
    : reaper_(reaper) {
  std::lock_guard<std::mutex> l(reaper_->mu_);
  entry_ = reaper_->entries_.insert(reaper_->entries_.end(), Entry{ctx, waiting, Clock::now()});
}

IdleStreamReaper::Watch::~Watch() {
  std::lock_guard<std::mutex> l(reaper_->mu_);
  reaper_->entries_.erase(entry_);
}

void IdleStreamReaper::Watch::Working() {
  std::lock_guard<std::mutex> l(reaper_->mu_);
  entry_->waiting = false;
}

void IdleStreamReaper::Watch::Waiting() {
  std::lock_guard<std::mutex> l(reaper_->mu_);
  entry_->waiting = true;
  entry_->since = Clock::now();
}

bool IdleStreamReaper::Watch::reaped() const {
  std::lock_guard<std::mutex> l(reaper_->mu_);
  return entry_->reaped;
}

}  // namespace infoflow::server
