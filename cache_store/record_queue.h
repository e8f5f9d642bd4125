// RecordQueue: a FIFO of verified records (key + shared value) bounded in
// bytes, the hand-off between a request thread and one background worker
// (the shared tier's local fill and its write-behind, docs/DESIGN.md §13).
// Internal to cache_store; a header of its own so it can be tested alone.
//
// Thread-safe: any number of producers, one consumer. The consumer looks at
// the head (Front) and removes what it has finished (Remove), so an item
// stays queued -- counted in bytes() and visible to Contains() -- while it
// is being written. Values are shared, never copied: the queue holds the
// same ChunkValue the RAM tier and readers hold.
#ifndef INFOFLOW_CACHE_STORE_RECORD_QUEUE_H_
#define INFOFLOW_CACHE_STORE_RECORD_QUEUE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache_store/chunk_key.h"
#include "cache_store/chunk_store.h"

namespace infoflow::store {

class RecordQueue {
 public:
  struct Item {
    ChunkKey key;
    std::shared_ptr<const ChunkValue> value;
  };
  enum class PushResult {
    kQueued,
    kAlreadyQueued,  // the key is queued already (same content: nothing to do)
    kFull,           // would exceed max_bytes; not queued
  };

  // A record larger than `max_bytes` is never queued (kFull).
  explicit RecordQueue(uint64_t max_bytes) : max_bytes_(max_bytes) {}
  RecordQueue(const RecordQueue&) = delete;
  RecordQueue& operator=(const RecordQueue&) = delete;

  // Appends (key, value) unless the key is queued or it does not fit.
  // Never blocks on the consumer.
  PushResult Push(const ChunkKey& key, std::shared_ptr<const ChunkValue> value);

  // Up to `max_items` items from the head whose bytes sum to at most
  // `max_bytes` (at least one item when any is queued), oldest first. Waits
  // until the queue is non-empty, Close() is called or `deadline` passes;
  // empty on the last two.
  std::vector<Item> Front(size_t max_items, uint64_t max_bytes,
                          std::chrono::steady_clock::time_point deadline);

  // Removes `key`; false if it was not queued (already removed).
  bool Remove(const ChunkKey& key);
  // Removes and returns everything queued.
  std::vector<Item> RemoveAll();
  bool Contains(const ChunkKey& key) const;

  // Waits until the queue is empty or `deadline` passes; true if empty.
  bool WaitEmpty(std::chrono::steady_clock::time_point deadline);
  // Wakes Front() callers, which then return empty at once from now on.
  void Close();

  uint64_t bytes() const;
  size_t size() const;
  uint64_t max_bytes() const { return max_bytes_; }

 private:
  void EraseLocked(std::list<Item>::iterator it);

  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::condition_variable changed_;  // pushed, removed or closed
  std::list<Item> items_;            // front = oldest
  absl::flat_hash_map<ChunkKey, std::list<Item>::iterator> index_;
  uint64_t bytes_ = 0;
  bool closed_ = false;
};

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_RECORD_QUEUE_H_
