#include "cache_store/record_queue.h"

#include <utility>

namespace infoflow::store {

RecordQueue::PushResult RecordQueue::Push(const ChunkKey& key,
                                          std::shared_ptr<const ChunkValue> value) {
  const uint64_t size = value->bytes().size();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (index_.contains(key)) return PushResult::kAlreadyQueued;
    if (size > max_bytes_ || bytes_ + size > max_bytes_) return PushResult::kFull;
    items_.push_back(Item{key, std::move(value)});
    index_.emplace(key, std::prev(items_.end()));
    bytes_ += size;
  }
  changed_.notify_all();
  return PushResult::kQueued;
}

std::vector<RecordQueue::Item> RecordQueue::Front(size_t max_items, uint64_t max_bytes,
                                                  std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  changed_.wait_until(lock, deadline, [&] { return closed_ || !items_.empty(); });
  std::vector<Item> out;
  if (closed_) return out;
  uint64_t taken = 0;
  for (const Item& item : items_) {
    if (out.size() >= max_items) break;
    const uint64_t size = item.value->bytes().size();
    if (!out.empty() && taken + size > max_bytes) break;
    out.push_back(item);
    taken += size;
  }
  return out;
}

void RecordQueue::EraseLocked(std::list<Item>::iterator it) {
  bytes_ -= it->value->bytes().size();
  index_.erase(it->key);
  items_.erase(it);
}

bool RecordQueue::Remove(const ChunkKey& key) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    EraseLocked(it->second);
  }
  changed_.notify_all();
  return true;
}

std::vector<RecordQueue::Item> RecordQueue::RemoveAll() {
  std::vector<Item> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    out.assign(std::make_move_iterator(items_.begin()), std::make_move_iterator(items_.end()));
    items_.clear();
    index_.clear();
    bytes_ = 0;
  }
  changed_.notify_all();
  return out;
}

bool RecordQueue::Contains(const ChunkKey& key) const {
  std::lock_guard<std::mutex> lock(mu_);
  return index_.contains(key);
}

bool RecordQueue::WaitEmpty(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  return changed_.wait_until(lock, deadline, [&] { return items_.empty(); });
}

void RecordQueue::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  changed_.notify_all();
}

uint64_t RecordQueue::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

size_t RecordQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return items_.size();
}

}  // namespace infoflow::store
