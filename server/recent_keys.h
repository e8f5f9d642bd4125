// A bounded memory of recently seen keys, for PrefixStorePolicy::kRepeated:
// a prefix is stored the second time it misses, and only if its first miss
// is among the last `capacity` remembered.

#ifndef INFOFLOW_SERVER_RECENT_KEYS_H_
#define INFOFLOW_SERVER_RECENT_KEYS_H_

#include <cstddef>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>

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
    if (auto it = where_.find(key); it != where_.end()) {
      order_.erase(it->second);
      where_.erase(it);
      return true;
    }
    if (capacity_ == 0) return false;
    if (order_.size() >= capacity_) {
      where_.erase(order_.front());
      order_.pop_front();
    }
    order_.push_back(key);
    where_.emplace(key, std::prev(order_.end()));
    return false;
  }

  // Keys remembered now.
  size_t size() const {
    std::lock_guard<std::mutex> lock(mu_);
    return order_.size();
  }

 private:
  const size_t capacity_;
  mutable std::mutex mu_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, std::list<std::string>::iterator> where_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_RECENT_KEYS_H_
