// RemoteWriter: the shared tier's write-behind (docs/DESIGN.md §13). A
// record stored locally is queued here and written to the Redis Cluster by
// one background thread, so no ingest or query waits for the cluster.
//
//  * Bounded in bytes (RemoteWriterOptions::queue_bytes). When a record does
//    not fit, it is refused at once -- never queued, never blocking -- and
//    counted (remote_write_dropped). Refusing the newest rather than
//    dropping the oldest: the caller learns it now (the ingest reply says
//    FAILED), and nothing already reported PENDING silently vanishes.
//  * Batches of up to kBatchItems / kBatchBytes go out as one Execute (one
//    pipeline per master, in parallel). A failed SET is retried with
//    exponential backoff (retry_initial doubling up to retry_max) until it
//    has had max_attempts tries or give_up_after has passed since its first
//    try; then it is given up (remote_write_failed, logged).
//  * Only what reached the cluster is lost on a crash: the local copy is
//    authoritative, and a lookup that misses in the cluster just recomputes.
//
// Thread-safe: any thread may call any method.
#ifndef INFOFLOW_CACHE_STORE_REMOTE_WRITER_H_
#define INFOFLOW_CACHE_STORE_REMOTE_WRITER_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "cache_store/chunk_key.h"
#include "cache_store/chunk_store.h"
#include "cache_store/record_queue.h"
#include "cache_store/redis_cluster.h"

namespace infoflow::store {

struct RemoteWriterOptions {
  uint64_t queue_bytes = uint64_t{256} << 20;
  int max_attempts = 10;
  std::chrono::milliseconds retry_initial{100};
  std::chrono::milliseconds retry_max{5000};
  std::chrono::milliseconds give_up_after{60000};
  std::string key_prefix;   // cluster key = prefix + 32 raw key bytes
  int64_t ttl_seconds = 0;  // SET ... EX when > 0
};

class RemoteWriter {
 public:
  static constexpr size_t kBatchItems = 32;
  static constexpr uint64_t kBatchBytes = uint64_t{32} << 20;
  // Outcomes of this many recent writes are remembered for State().
  static constexpr size_t kRememberedOutcomes = 65536;

  // `cluster` and `counters` must outlive the writer. `count_error` is
  // called for each failed attempt (to count it by kind and log it).
  // Starts the background thread.
  RemoteWriter(RedisCluster* cluster, RemoteWriterOptions options, StoreCounters* counters,
               std::function<void(const absl::Status&)> count_error);
  // Stops the thread (after its current batch, at most one command timeout
  // per attempt); what is still queued is abandoned: counted as failed and
  // logged in one line. Call Drain first for a graceful stop.
  ~RemoteWriter();
  RemoteWriter(const RemoteWriter&) = delete;
  RemoteWriter& operator=(const RemoteWriter&) = delete;

  // Queues the write of `value` under `key`. kPending when queued (or queued
  // already), kFailed when the queue is full (dropped, counted). Never blocks.
  RemoteWriteState Enqueue(const ChunkKey& key, std::shared_ptr<const ChunkValue> value);

  // kPending while queued or being written; kWritten / kFailed for one of
  // the last kRememberedOutcomes writes; kUnknown otherwise.
  RemoteWriteState State(const ChunkKey& key) const;

  // Waits up to `timeout` until the queue is empty (every queued write done
  // or given up). What is left then is abandoned (removed, counted failed,
  // State kFailed) and returned, oldest first; a write of it already on the
  // wire may still land. The writer keeps serving later Enqueues.
  std::vector<UnwrittenRecord> Drain(std::chrono::milliseconds timeout);

  uint64_t pending_bytes() const { return queue_.bytes(); }
  size_t pending_writes() const { return queue_.size(); }

 private:
  struct Attempts {
    int tries = 0;
    std::chrono::steady_clock::time_point first;
  };

  void Run();
  // Writes one batch; returns when its failed items may be tried again
  // (time_point::max() when none failed).
  std::chrono::steady_clock::time_point WriteBatch(const std::vector<RecordQueue::Item>& batch);
  void Remember(const ChunkKey& key, RemoteWriteState state);
  void Publish();  // pending gauges

  RedisCluster* const cluster_;
  const RemoteWriterOptions options_;
  StoreCounters* const counters_;
  const std::function<void(const absl::Status&)> count_error_;
  RecordQueue queue_;

  // Retry bookkeeping of the items at the head; worker thread only.
  absl::flat_hash_map<ChunkKey, Attempts> attempts_;
  // Held while a batch's outcomes are applied (queue removal + counters)
  // and while Drain abandons, so Drain never sees an item gone from the
  // queue whose outcome is not counted yet.
  std::mutex outcome_apply_mu_;

  mutable std::mutex outcomes_mu_;
  absl::flat_hash_map<ChunkKey, RemoteWriteState> outcomes_;
  std::deque<ChunkKey> outcome_order_;  // oldest first, for forgetting

  std::mutex stop_mu_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_REMOTE_WRITER_H_
