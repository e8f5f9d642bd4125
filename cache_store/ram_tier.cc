#include "cache_store/ram_tier.h"

#include <algorithm>
#include <cstring>

namespace infoflow::store {
namespace {

// Each shard must hold many records or hash imbalance evicts early; KV
// records are ~0.1-30 MiB, so aim for >= 64 MiB per shard and at most 16
// shards (enough to keep 8-16 reader threads off each other's locks).
constexpr uint64_t kMinShardBytes = uint64_t{64} << 20;
constexpr size_t kMaxShards = 16;
// Bookkeeping per entry (list node, map slot, ChunkValue, KvRecord), so a
// flood of tiny records cannot blow far past the byte budget.
constexpr uint64_t kEntryOverhead = 256;

}  // namespace

RamTier::RamTier(uint64_t capacity_bytes, StoreCounters* counters)
    : capacity_(capacity_bytes), counters_(counters) {
  const size_t n = static_cast<size_t>(
      std::clamp<uint64_t>(capacity_bytes / kMinShardBytes, 1, kMaxShards));
  shard_capacity_ = capacity_bytes / n;
  shards_.reserve(n);
  for (size_t i = 0; i < n; ++i) shards_.push_back(std::make_unique<Shard>());
}

RamTier::Shard& RamTier::ShardFor(const ChunkKey& key) {
  // The key is already a uniform hash: its first 8 bytes pick the shard.
  uint64_t h;
  std::memcpy(&h, key.bytes.data(), sizeof(h));
  return *shards_[h % shards_.size()];
}

void RamTier::EraseLocked(Shard& shard, std::list<Entry>::iterator it) {
  shard.bytes -= it->charge;
  counters_->ram_bytes.fetch_sub(it->charge, std::memory_order_relaxed);
  counters_->ram_entries.fetch_sub(1, std::memory_order_relaxed);
  shard.map.erase(it->key);
  shard.lru.erase(it);
}

std::shared_ptr<const ChunkValue> RamTier::Lookup(const ChunkKey& key) {
  if (capacity_ == 0) return nullptr;
  Shard& shard = ShardFor(key);
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(key);
  if (it == shard.map.end()) return nullptr;
  shard.lru.splice(shard.lru.end(), shard.lru, it->second);
  return it->second->value;
}

void RamTier::Insert(const ChunkKey& key,
                     std::shared_ptr<const ChunkValue> value) {
  if (capacity_ == 0 || value == nullptr) return;
  const uint64_t charge = value->bytes().size() + kEntryOverhead;
  if (charge > shard_capacity_) return;
  // Values evicted here are destroyed after the lock is released: freeing
  // megabytes under the shard lock would stall its readers.
  std::vector<std::shared_ptr<const ChunkValue>> evicted;
  Shard& shard = ShardFor(key);
  {
    std::lock_guard<std::mutex> lock(shard.mu);
    if (auto it = shard.map.find(key); it != shard.map.end()) {
      evicted.push_back(std::move(it->second->value));
      EraseLocked(shard, it->second);
    }
    while (shard.bytes + charge > shard_capacity_ && !shard.lru.empty()) {
      evicted.push_back(std::move(shard.lru.front().value));
      EraseLocked(shard, shard.lru.begin());
      counters_->ram_evictions.fetch_add(1, std::memory_order_relaxed);
    }
    shard.lru.push_back(Entry{key, std::move(value), charge});
    shard.map[key] = std::prev(shard.lru.end());
    shard.bytes += charge;
    counters_->ram_bytes.fetch_add(charge, std::memory_order_relaxed);
    counters_->ram_entries.fetch_add(1, std::memory_order_relaxed);
  }
}

void RamTier::Erase(const ChunkKey& key) {
  if (capacity_ == 0) return;
  std::shared_ptr<const ChunkValue> doomed;
  Shard& shard = ShardFor(key);
  std::lock_guard<std::mutex> lock(shard.mu);
  auto it = shard.map.find(key);
  if (it == shard.map.end()) return;
  doomed = std::move(it->second->value);
  EraseLocked(shard, it->second);
}

void RamTier::Clear() {
  for (auto& shard : shards_) {
    std::list<Entry> doomed;
    {
      std::lock_guard<std::mutex> lock(shard->mu);
      for (const Entry& e : shard->lru) {
        counters_->ram_bytes.fetch_sub(e.charge, std::memory_order_relaxed);
        counters_->ram_entries.fetch_sub(1, std::memory_order_relaxed);
      }
      doomed.swap(shard->lru);
      shard->map.clear();
      shard->bytes = 0;
    }
  }
}

}  // namespace infoflow::store
