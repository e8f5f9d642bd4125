// RamTier: the in-memory LRU in front of RocksDB. Internal to cache_store;
// exposed as a header so it can be tested on its own.
//
// Thread-safe. Sharded by key hash so concurrent readers of different keys
// rarely contend; each shard is a std::mutex-protected LRU whose critical
// sections are O(1) pointer work (no payload copies: values are
// shared_ptr<const ChunkValue>). std::mutex rather than absl::Mutex on
// purpose: Debian's prebuilt absl is not TSan-annotated, so absl::Mutex
// would make ThreadSanitizer report false races in our code.
#ifndef INFOFLOW_CACHE_STORE_RAM_TIER_H_
#define INFOFLOW_CACHE_STORE_RAM_TIER_H_

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache_store/chunk_key.h"
#include "cache_store/chunk_store.h"

namespace infoflow::store {

class RamTier {
 public:
  // `counters` (hits are counted by the caller; ram_evictions, ram_bytes and
  // ram_entries here) must outlive the tier.
  RamTier(uint64_t capacity_bytes, StoreCounters* counters);

  RamTier(const RamTier&) = delete;
  RamTier& operator=(const RamTier&) = delete;

  // The value for `key` (and marks it most recently used), or null.
  std::shared_ptr<const ChunkValue> Lookup(const ChunkKey& key);

  // Inserts or replaces, evicting least recently used entries of the shard
  // until it fits. Values larger than a shard's budget are not cached.
  void Insert(const ChunkKey& key, std::shared_ptr<const ChunkValue> value);

  void Erase(const ChunkKey& key);
  void Clear();

  uint64_t capacity_bytes() const { return capacity_; }

 private:
  struct Entry {
    ChunkKey key;
    std::shared_ptr<const ChunkValue> value;
    uint64_t charge;
  };
  struct Shard {
    std::mutex mu;
    std::list<Entry> lru;  // front = least recently used
    absl::flat_hash_map<ChunkKey, std::list<Entry>::iterator> map;
    uint64_t bytes = 0;
  };

  Shard& ShardFor(const ChunkKey& key);
  void EraseLocked(Shard& shard, std::list<Entry>::iterator it);

  const uint64_t capacity_;
  uint64_t shard_capacity_ = 0;
  StoreCounters* const counters_;
  std::vector<std::unique_ptr<Shard>> shards_;
};

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_RAM_TIER_H_
