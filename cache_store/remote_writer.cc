#include "cache_store/remote_writer.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache_store/background_priority.h"

namespace infoflow::store {
namespace {

using Clock = std::chrono::steady_clock;

void Add(std::atomic<uint64_t>& c, uint64_t n = 1) { c.fetch_add(n, std::memory_order_relaxed); }

}  // namespace

RemoteWriter::RemoteWriter(RedisCluster* cluster, RemoteWriterOptions options,
                           StoreCounters* counters,
                           std::function<void(const absl::Status&)> count_error)
    : cluster_(cluster),
      options_(std::move(options)),
      counters_(counters),
      count_error_(std::move(count_error)),
      queue_(options_.queue_bytes),
      thread_([this] { Run(); }) {}

RemoteWriter::~RemoteWriter() {
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  queue_.Close();
  thread_.join();
  std::vector<RecordQueue::Item> left = queue_.RemoveAll();
  Publish();
  if (left.empty()) return;
  uint64_t bytes = 0;
  for (const RecordQueue::Item& item : left) bytes += item.value->bytes().size();
  Add(counters_->remote_write_failed, left.size());
  std::fprintf(stderr,
               "event=remote_write_abandoned count=%zu bytes=%llu (store closed before the "
               "shared tier took them; the local copies are intact)\n",
               left.size(), static_cast<unsigned long long>(bytes));
}

void RemoteWriter::Publish() {
  counters_->remote_pending_bytes.store(queue_.bytes(), std::memory_order_relaxed);
  counters_->remote_pending_writes.store(queue_.size(), std::memory_order_relaxed);
}

RemoteWriteState RemoteWriter::Enqueue(const ChunkKey& key,
                                       std::shared_ptr<const ChunkValue> value) {
  const RecordQueue::PushResult r = queue_.Push(key, std::move(value));
  Publish();
  if (r == RecordQueue::PushResult::kFull) {
    Add(counters_->remote_write_dropped);
    Remember(key, RemoteWriteState::kFailed);
    return RemoteWriteState::kFailed;
  }
  return RemoteWriteState::kPending;
}

RemoteWriteState RemoteWriter::State(const ChunkKey& key) const {
  if (queue_.Contains(key)) return RemoteWriteState::kPending;
  std::lock_guard<std::mutex> lock(outcomes_mu_);
  auto it = outcomes_.find(key);
  return it == outcomes_.end() ? RemoteWriteState::kUnknown : it->second;
}

void RemoteWriter::Remember(const ChunkKey& key, RemoteWriteState state) {
  std::lock_guard<std::mutex> lock(outcomes_mu_);
  auto [it, fresh] = outcomes_.insert_or_assign(key, state);
  if (!fresh) return;  // keeps its place in the order: forgotten a bit early at worst
  outcome_order_.push_back(key);
  if (outcome_order_.size() > kRememberedOutcomes) {
    outcomes_.erase(outcome_order_.front());
    outcome_order_.pop_front();
  }
}

std::vector<UnwrittenRecord> RemoteWriter::Drain(std::chrono::milliseconds timeout) {
  std::vector<UnwrittenRecord> out;
  const bool empty = queue_.WaitEmpty(Clock::now() + timeout);
  std::lock_guard<std::mutex> apply(outcome_apply_mu_);
  if (empty) return out;
  for (RecordQueue::Item& item : queue_.RemoveAll()) {
    Remember(item.key, RemoteWriteState::kFailed);
    out.push_back(UnwrittenRecord{item.key, item.value->bytes().size()});
  }
  Add(counters_->remote_write_failed, out.size());
  Publish();
  return out;
}

void RemoteWriter::Run() {
  LowerThisThreadPriority();
  Clock::time_point retry_at = Clock::time_point::min();
  while (true) {
    {
      // Backoff after a failed batch; a stop cuts it short.
      std::unique_lock<std::mutex> lock(stop_mu_);
      if (retry_at != Clock::time_point::min()) {
        stop_cv_.wait_until(lock, retry_at, [&] { return stop_; });
      }
      if (stop_) return;
    }
    std::vector<RecordQueue::Item> batch =
        queue_.Front(kBatchItems, kBatchBytes, Clock::now() + std::chrono::seconds(1));
    if (batch.empty()) {
      retry_at = Clock::time_point::min();
      continue;  // idle wake-up, or closed (then stop_ is set)
    }
    // Forget tries of items no longer at the head (written, abandoned).
    absl::flat_hash_map<ChunkKey, Attempts> kept;
    for (const RecordQueue::Item& item : batch) {
      if (auto it = attempts_.find(item.key); it != attempts_.end()) kept.insert(*it);
    }
    attempts_ = std::move(kept);
    const Clock::time_point next = WriteBatch(batch);
    retry_at = next == Clock::time_point::max() ? Clock::time_point::min() : next;
  }
}

Clock::time_point RemoteWriter::WriteBatch(const std::vector<RecordQueue::Item>& batch) {
  std::vector<std::string> keys;
  keys.reserve(batch.size());
  for (const RecordQueue::Item& item : batch) {
    keys.push_back(options_.key_prefix);
    keys.back().append(item.key.AsBytes());
  }
  const std::string ttl = absl::StrCat(options_.ttl_seconds);
  std::vector<RedisCommand> cmds(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    cmds[i].args = {"SET", keys[i], batch[i].value->bytes()};
    if (options_.ttl_seconds > 0) {
      cmds[i].args.push_back("EX");
      cmds[i].args.push_back(ttl);
    }
  }
  std::vector<absl::StatusOr<RedisReply>> replies = cluster_->Execute(cmds);

  const Clock::time_point now = Clock::now();
  Clock::time_point retry_at = Clock::time_point::max();
  std::lock_guard<std::mutex> apply(outcome_apply_mu_);
  for (size_t i = 0; i < batch.size(); ++i) {
    const RecordQueue::Item& item = batch[i];
    absl::Status s = replies[i].status();
    if (s.ok() && replies[i]->type != RedisReply::Type::kStatus) {
      s = absl::InternalError(absl::StrCat("redis SET: ", replies[i]->str));
    }
    if (s.ok()) {
      attempts_.erase(item.key);
      // Not queued any more: Drain abandoned it meanwhile (and counted it).
      if (!queue_.Remove(item.key)) continue;
      Add(counters_->remote_writes);
      Add(counters_->remote_bytes_written, item.value->bytes().size());
      Remember(item.key, RemoteWriteState::kWritten);
      continue;
    }
    Add(counters_->remote_write_errors);
    count_error_(s);
    Attempts& a = attempts_[item.key];
    if (a.tries++ == 0) a.first = now;
    if (a.tries < options_.max_attempts && now - a.first < options_.give_up_after) {
      auto backoff = options_.retry_initial * (int64_t{1} << std::min(a.tries - 1, 20));
      backoff = std::min<std::chrono::milliseconds>(backoff, options_.retry_max);
      retry_at = std::min(retry_at, now + backoff);
      continue;
    }
    const int tries = a.tries;
    attempts_.erase(item.key);
    if (!queue_.Remove(item.key)) continue;
    Add(counters_->remote_write_failed);
    Remember(item.key, RemoteWriteState::kFailed);
    std::fprintf(stderr,
                 "event=remote_write_failed key=%s attempts=%d error=\"%s\" (given up; the "
                 "local copy is intact)\n",
                 item.key.Hex().c_str(), tries, std::string(s.message()).c_str());
  }
  Publish();
  return retry_at;
}

}  // namespace infoflow::store
