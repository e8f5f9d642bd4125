// A bounded memory of recently seen keys, for PrefixStorePolicy::kRepeated:
// a prefix is stored the second time it misses, and only if its first miss
// is among the last `capacity` remembered.

#ifndef INFOFLOW_SERVER_RECENT_KEYS_H_
#define INFOFLOW_SERVER_RECENT_KEYS_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

namespace infoflow::server {

// Thread-safe. Holds at most `capacity` keys; the oldest remembered goes
// first. A key taken back out (SeenBefore true) leaves no trace behind, so a
// later miss of it starts fresh and is dropped only when it is itself the
// oldest.
class RecentKeys {
 public:
  explicit RecentKeys(size_t capacity) : capacity_(capacity) {}

  RecentKeys(const RecentKeys&) = delete;
  RecentKeys& operator=(const RecentKeys&) = delete;

  // True when `key` is remembered: it is forgotten then (its next miss is a
  // first one again). Else remembers it, forgetting the oldest key past the
  // capacity, and returns false.
  bool SeenBefore(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    if (keys_.erase(key) > 0) return true;
    if (capacity_ == 0) return false;
    // Entries of keys taken back out, or remembered again since, are stale:
    // their sequence number no longer matches. Skip them so that the bound
    // counts live keys.
    while (keys_.size() >= capacity_) {
      const auto& [oldest, seq] = order_.front();
      auto it = keys_.find(oldest);
      if (it != keys_.end() && it->second == seq) keys_.erase(it);
      order_.pop_front();
    }
    keys_.emplace(key, next_seq_);
    order_.emplace_back(key, next_seq_);
    ++next_seq_;
    // Keys taken back out leave stale entries anywhere in the queue; once
    // the queue is twice the capacity, keep only the live ones (amortized
    // O(1) a call: at least `capacity` calls come between two compactions).
    if (order_.size() > 2 * capacity_) {
      std::deque<std::pair<std::string, uint64_t>> live;
      for (auto& entry : order_) {
        auto it = keys_.find(entry.first);
        if (it != keys_.end() && it->second == entry.second) live.push_back(std::move(entry));
      }
      order_.swap(live);
    }
    return false;
  }

  // Keys remembered now.
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return keys_.size();
  }

  // Entries in the FIFO, stale ones included: at most 2 x capacity + 1.
  size_t queued() const {
    std::lock_guard<std::mutex> lock(mu_);
    return order_.size();
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::unordered_map<std::string, uint64_t> keys_;      // key -> its entry's sequence number
  std::deque<std::pair<std::string, uint64_t>> order_;  // oldest first, stale entries included
  uint64_t next_seq_ = 0;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_RECENT_KEYS_H_
