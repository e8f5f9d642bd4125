#include "cache_store/record_buffers.h"

#include <iterator>
#include <utility>

namespace infoflow::store {

RecordBuffers& RecordBuffers::Default() {
  static RecordBuffers* const instance = new RecordBuffers();
  return *instance;
}

RecordBuffers::RecordBuffers(size_t retain_bytes) : retain_bytes_(retain_bytes) {}

std::string RecordBuffers::Take(size_t n) {
  if (n < kMinBytes) return std::string(n, '\0');
  std::string kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = kept_.lower_bound(n);
    if (it != kept_.end() && it->first <= n + n / 4) {
      kept = std::move(it->second);
      stats_.cached_bytes -= it->first;
      --stats_.cached_buffers;
      kept_.erase(it);
      ++stats_.reused;
      stats_.reused_bytes += n;
    } else {
      ++stats_.fresh;
      stats_.fresh_bytes += n;
    }
  }
  if (kept.empty()) return std::string(n, '\0');  // fresh: zero-filled, outside the lock
  // Kept buffers are stored at size == capacity (Give), so this only
  // shortens the string: nothing is written.
  kept.resize(n);
  return kept;
}

void RecordBuffers::Give(std::string&& buffer) {
  const size_t capacity = buffer.capacity();
  if (capacity < kMinBytes) return;
  std::string kept = std::move(buffer);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stats_.cached_bytes + capacity > retain_bytes_) return;  // `kept` frees it
  }
  // Full length, so a later Take(n <= capacity) never has to zero-fill: the
  // tail past the old size is written once here, outside the lock.
  kept.resize(capacity);
  std::lock_guard<std::mutex> lock(mu_);
  if (stats_.cached_bytes + capacity > retain_bytes_) return;
  stats_.cached_bytes += capacity;
  ++stats_.cached_buffers;
  kept_.emplace(capacity, std::move(kept));
}

size_t RecordBuffers::TrimLocked(size_t keep_bytes) {
  size_t freed = 0;
  while (stats_.cached_bytes > keep_bytes && !kept_.empty()) {
    auto it = std::prev(kept_.end());
    stats_.cached_bytes -= it->first;
    --stats_.cached_buffers;
    freed += it->first;
    kept_.erase(it);
  }
  return freed;
}

size_t RecordBuffers::Trim(size_t keep_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return TrimLocked(keep_bytes);
}

void RecordBuffers::set_retain_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  retain_bytes_ = bytes;
  TrimLocked(bytes);
}

RecordBufferStats RecordBuffers::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

}  // namespace infoflow::store
