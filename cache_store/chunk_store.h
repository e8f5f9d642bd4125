// ChunkStore: a persistent, content-addressed map from ChunkKey to an encoded
// KV record (kv_record.h), with a byte-bounded RAM tier in front.
//
// A ChunkStore is safe for concurrent use from multiple threads without any
// external synchronisation. Reads never block each other except while two of
// them miss on the same key, in which case only one reads the disk and the
// others wait for its result (single-flight). Writes (Put, Delete, eviction)
// are serialised among themselves; they do not block readers except briefly.
//
// Storage layout and why:
//  * One RocksDB at options.path with two column families:
//      "default": raw 32-byte chunk key -> encoded record. Large values go to
//                 BlobDB blob files (enable_blob_files, min_blob_size), so the
//                 LSM holds only small blob references and compaction does
//                 not rewrite megabytes of KV.
//      "index":   raw chunk key -> small metadata (size, write time, access
//                 sequence, model fingerprint). Written in the same atomic
//                 WriteBatch as the record; scanned once at Open to rebuild
//                 the in-memory accounting (capacity, LRU order, per-model
//                 stats) without touching any blob.
//  * Not a column family per model fingerprint: CFs are heavyweight (each has
//    its own memtables and SST set, all must be listed at every Open, and the
//    shared WAL cannot be recycled until every CF flushed), and models come
//    and go at runtime, so their number is unbounded. Not a fingerprint key
//    prefix either: the chunk key is a hash that already commits to the
//    fingerprint (chunk_key.h), so a lookup by key alone is unambiguous, and
//    the fetch path (DESIGN §2.2) has only keys. Per-model accounting and a
//    future "drop model" come from the index CF instead.
//  * Every record is verified (checksum + recomputed content key) when it is
//    read from disk; the RAM tier only ever holds verified records. Because
//    that check is end to end, record reads skip RocksDB's own blob CRC
//    (software CRC32C in Debian's build halved read throughput).
//  * Processes that read many large records should call
//    TuneMallocForLargeValues() (malloc_tuning.h) at startup; without it
//    glibc re-faults every freed record buffer (measured 20x slower reads).
//
// Optional shared tier (options.remote, docs/DESIGN.md §13): a Redis Cluster
// behind RAM and disk that every replica reads on a local miss (verified
// like a disk read). Neither direction is on the caller's path: a fetched
// record is used at once and put in RAM, and its local write is queued for a
// background thread (bounded; dropped and counted when full); what Put and
// GetOrCompute store locally is queued for a write-behind thread (bounded,
// retried with backoff) that writes it to the cluster. Its faults are
// misses, never errors; the local store is authoritative.
//
// Durability: with options.sync = true (default) a Put that returned OK
// survives a process or machine crash. With sync = false it survives a
// process crash (WAL is always on) but may be lost on power failure.
#ifndef INFOFLOW_CACHE_STORE_CHUNK_STORE_H_
#define INFOFLOW_CACHE_STORE_CHUNK_STORE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache_store/chunk_key.h"
#include "cache_store/kv_record.h"
#include "cache_store/redis_cluster.h"

namespace rocksdb {
class DB;
class ColumnFamilyHandle;
}  // namespace rocksdb

namespace infoflow::store {

// Compression of stored records. KV activations are near-incompressible
// floats; store_bench measures the trade-off (see kDefaultCompression).
enum class Compression { kNone, kLz4, kZstd };

// Chosen from store_bench (tests/store/store_bench.cc, bf16 N(0,1) values,
// 8 x 1 MiB MultiGet, RAM tier off, 2-core dev VM): none 1.66 GB/s warm,
// lz4 1.88 GB/s but stores 0.4% *more* bytes (nothing to find in float
// mantissas), zstd 0.68 GB/s for 22% fewer bytes. Only zstd saves space and
// it misses the >= 1 GB/s read target, so records are stored uncompressed;
// pick kZstd for disk-bound deployments that read mostly from the RAM tier.
inline constexpr Compression kDefaultCompression = Compression::kNone;

// The optional shared tier behind the local ones (docs/DESIGN.md §13): a
// Redis Cluster that every replica reads and writes, so a chunk prefilled
// by one replica is served to all. Off when cluster.seeds is empty.
struct RemoteTierOptions {
  RedisClusterOptions cluster;
  // Cluster key of a chunk = key_prefix + its 32 raw ChunkKey bytes.
  std::string key_prefix = "ifkv:";
  // Expiry of written records in the cluster; 0 = none (rely on maxmemory
  // with an LRU policy).
  int64_t ttl_seconds = 0;
  // The served model's fingerprint: a record read from the cluster that is
  // valid but belongs to another model is counted as remote_wrong_model
  // rather than remote_corrupt. Empty: not told apart.
  std::string model_fingerprint;
  // Records fetched from the cluster wait here, at most this many bytes, to
  // be written to local RocksDB by a background thread; a fetch that does
  // not fit is not filled locally (counted, remote_fill_dropped) but still
  // served, and stays in the RAM tier while it fits there.
  uint64_t fill_queue_bytes = uint64_t{256} << 20;
  // Write-behind to the cluster (cache_store/remote_writer.h): at most this
  // many bytes queued (more is refused and counted, remote_write_dropped);
  // a failed SET is retried with backoff from write_retry_initial doubling
  // up to write_retry_max, at most write_max_attempts times and for at most
  // write_give_up_after after its first try.
  uint64_t write_queue_bytes = uint64_t{256} << 20;
  int write_max_attempts = 10;
  std::chrono::milliseconds write_retry_initial{100};
  std::chrono::milliseconds write_retry_max{5000};
  std::chrono::milliseconds write_give_up_after{60000};

  bool enabled() const { return !cluster.seeds.empty(); }
};

struct ChunkStoreOptions {
  // Directory of the RocksDB instance; created if missing and
  // create_if_missing is set.
  std::string path = "./data/kv";
  bool create_if_missing = true;
  // Put waits for the WAL to reach stable storage before returning.
  bool sync = true;
  // Upper bound on the sum of stored record sizes (encoded bytes, before
  // compression); 0 = unbounded. A Put that would exceed it first evicts
  // the least recently accessed records. On-disk usage follows once
  // compaction and blob GC reclaim the space (see Compact()).
  uint64_t capacity_bytes = 0;
  // Records older than this (since their Put) read as NOT_FOUND and are
  // removed lazily and by Compact(); 0 = no expiry.
  int64_t ttl_seconds = 0;
  // RAM tier budget in bytes of record data; 0 disables the tier.
  uint64_t ram_tier_bytes = uint64_t{512} << 20;
  // Also place records written by Put into the RAM tier. Off by default so
  // bulk ingest does not flush the working set of queries; GetOrCompute
  // always inserts what it computed (it is about to be used).
  bool ram_insert_on_put = false;
  // RocksDB block cache (index/filter/data blocks of both CFs).
  uint64_t block_cache_bytes = uint64_t{64} << 20;
  Compression compression = kDefaultCompression;
  // Values at least this large are written to blob files.
  uint64_t min_blob_size = 4096;
  uint64_t blob_file_size = uint64_t{256} << 20;
  // Seconds since the epoch; overridable so TTL can be tested. Defaults to
  // the system clock.
  std::function<int64_t()> clock_seconds;
  // When the existing store cannot be opened because its files are damaged
  // (DATA_LOSS), move the directory aside to <path>.quarantined-<unix time>
  // and start empty instead of failing. For a cache this is usually the
  // right trade; the default keeps "refuse to open".
  bool quarantine_if_damaged = false;
  // Put refuses (ResourceExhausted, retryable) a record that would leave
  // less than this many bytes free on the store's filesystem; 0 = no check
  // (the server sets it, --min-free-disk-bytes).
  uint64_t min_free_disk_bytes = 0;
  // Shared tier (off by default: exactly the local store).
  RemoteTierOptions remote;
};

// A verified record held in memory. Immutable and shared: the RAM tier and
// any number of readers hold the same instance through
// shared_ptr<const ChunkValue>, so a hit copies no payload bytes.
class ChunkValue {
 public:
  // Takes ownership of `bytes` and decodes it. DataLoss (IsCorruptRecord)
  // when the bytes are not a valid record.
  static absl::StatusOr<std::shared_ptr<const ChunkValue>> Create(
      std::string bytes, DecodeOptions options = {});

  // As Create, for bytes in a RecordBuffers buffer (a record read from the
  // shared tier): when the value goes, they go back to
  // RecordBuffers::Default() for the next read (record_buffers.h).
  static absl::StatusOr<std::shared_ptr<const ChunkValue>> CreateRecycling(std::string bytes);

  ChunkValue(const ChunkValue&) = delete;
  ChunkValue& operator=(const ChunkValue&) = delete;
  ~ChunkValue();

  // The encoded record exactly as stored.
  const std::string& bytes() const { return bytes_; }
  // Decoded view; record().payload and K()/V() point into bytes().
  const KvRecord& record() const { return record_; }

 private:
  ChunkValue() = default;
  static absl::StatusOr<std::shared_ptr<const ChunkValue>> Make(std::string bytes,
                                                                DecodeOptions options,
                                                                bool recycle);
  std::string bytes_;
  KvRecord record_;
  bool recycle_bytes_ = false;  // CreateRecycling: bytes_ go back to RecordBuffers
};

enum class GetStatus {
  kFound,
  kNotFound,  // never stored, deleted, evicted or expired
  // Stored bytes failed verification (checksum, header, size, or they are a
  // valid record of a different key). Treat as a miss: recompute and Put,
  // which replaces the corrupt record.
  kCorrupt,
};

struct GetResult {
  GetStatus status = GetStatus::kNotFound;
  // Non-null iff status == kFound. Shared, immutable; keep it alive as long
  // as you use views into it.
  std::shared_ptr<const ChunkValue> value;
  bool from_ram = false;   // served by the RAM tier
  bool computed = false;   // produced by GetOrCompute's compute callback
  // Fetched from the shared tier now; its local write is queued (or was
  // dropped, remote_fill_dropped), it is in the RAM tier if it fits there.
  bool from_remote = false;
};

// Where a record's copy in the shared tier stands (ChunkStore::RemoteState).
enum class RemoteWriteState : uint8_t {
  kNotConfigured,  // no shared tier
  kUnknown,        // no write of it queued by this process, or long forgotten
  kPending,        // queued or being written (retried on failure)
  kWritten,        // the cluster acknowledged the SET
  kFailed,         // not written: queue full, attempts exhausted or abandoned
};

// A record the write-behind could not write (ChunkStore::DrainRemoteWrites).
struct UnwrittenRecord {
  ChunkKey key;
  uint64_t bytes = 0;
};

enum class PutResult {
  kStored,          // written (new, or replaced a corrupt/expired record)
  kAlreadyPresent,  // an intact record with this key exists; nothing written
};

// Monotonic counters and gauges, updated with relaxed atomics so the
// metrics layer can read them at any time without locking.
struct StoreCounters {
  std::atomic<uint64_t> ram_hits{0};
  std::atomic<uint64_t> disk_hits{0};
  std::atomic<uint64_t> misses{0};
  std::atomic<uint64_t> corrupt{0};
  std::atomic<uint64_t> ram_evictions{0};
  std::atomic<uint64_t> capacity_evictions{0};
  std::atomic<uint64_t> ttl_expirations{0};
  std::atomic<uint64_t> bytes_read{0};     // record bytes read from RocksDB
  std::atomic<uint64_t> bytes_written{0};  // record bytes written to RocksDB
  std::atomic<uint64_t> puts_stored{0};
  std::atomic<uint64_t> puts_already_present{0};
  std::atomic<uint64_t> deletes{0};
  std::atomic<uint64_t> single_flight_waits{0};  // reads that joined a flight
  std::atomic<uint64_t> computes{0};             // GetOrCompute callbacks run
  std::atomic<uint64_t> put_errors{0};           // GetOrCompute write-backs
  std::atomic<uint64_t> write_errors{0};   // RocksDB writes that failed (disk full, I/O)
  std::atomic<uint64_t> write_resumes{0};  // recoveries from such a failure
  // Gauges.
  std::atomic<uint64_t> records{0};
  std::atomic<uint64_t> bytes{0};  // sum of stored record sizes
  std::atomic<uint64_t> ram_bytes{0};
  std::atomic<uint64_t> ram_entries{0};
  std::atomic<uint64_t> quarantined{0};  // 1 when Open moved a damaged store aside

  // Shared tier (RemoteTierOptions). A lookup goes to the cluster only
  // after missing locally; `misses` above counts lookups found nowhere.
  std::atomic<uint64_t> remote_enabled{0};       // gauge: 1 when configured
  std::atomic<uint64_t> remote_hits{0};          // verified records fetched
  std::atomic<uint64_t> remote_misses{0};        // key not in the cluster
  std::atomic<uint64_t> remote_corrupt{0};       // failed verification
  std::atomic<uint64_t> remote_wrong_model{0};   // valid record of another model
  // Failed cluster operations (reads and writes) by kind (RedisErrorKind).
  std::atomic<uint64_t> remote_errors_timeout{0};
  std::atomic<uint64_t> remote_errors_connection{0};
  std::atomic<uint64_t> remote_errors_redirect{0};
  std::atomic<uint64_t> remote_errors_circuit_open{0};
  std::atomic<uint64_t> remote_errors_server{0};
  std::atomic<uint64_t> remote_bytes_read{0};
  std::atomic<uint64_t> remote_bytes_written{0};
  // Write-behind (RemoteTierOptions::write_*): records written, SET
  // attempts that failed (each retry counts), records given up after their
  // attempts or abandoned at close, records refused because the queue was
  // full; gauges of what is queued.
  std::atomic<uint64_t> remote_writes{0};
  std::atomic<uint64_t> remote_write_errors{0};
  std::atomic<uint64_t> remote_write_failed{0};
  std::atomic<uint64_t> remote_write_dropped{0};
  std::atomic<uint64_t> remote_pending_bytes{0};
  std::atomic<uint64_t> remote_pending_writes{0};
  // Local fill of fetched records (RemoteTierOptions::fill_queue_bytes):
  // records written to local RocksDB, records not queued because the queue
  // was full, gauge of queued bytes. A failed fill counts in put_errors.
  std::atomic<uint64_t> remote_fills{0};
  std::atomic<uint64_t> remote_fill_dropped{0};
  std::atomic<uint64_t> remote_fill_queue_bytes{0};
  // Latency of one batched fetch (all of a lookup's keys, in parallel):
  // counts per upper bound in ms (cumulative is computed by the exporter),
  // the last slot is +Inf.
  static constexpr double kRemoteFetchBucketsMs[] = {0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000};
  static constexpr size_t kRemoteFetchBuckets = sizeof(kRemoteFetchBucketsMs) / sizeof(double);
  std::atomic<uint64_t> remote_fetch_bucket[kRemoteFetchBuckets + 1] = {};
  std::atomic<uint64_t> remote_fetch_count{0};
  std::atomic<uint64_t> remote_fetch_sum_us{0};
  RedisClusterCounters redis;  // the cluster client's own counters
};

struct ModelStats {
  uint64_t records = 0;
  uint64_t bytes = 0;
};

// A consistent-enough snapshot for the Admin API (counters are read one by
// one, not atomically as a group).
struct StoreStats {
  uint64_t records = 0;
  uint64_t bytes = 0;
  std::map<std::string, ModelStats> per_model;  // by model fingerprint
  uint64_t ram_hits = 0, disk_hits = 0, misses = 0, corrupt = 0;
  uint64_t ram_evictions = 0, capacity_evictions = 0, ttl_expirations = 0;
  uint64_t bytes_read = 0, bytes_written = 0;
  uint64_t ram_bytes = 0, ram_entries = 0;
  uint64_t disk_bytes = 0;  // SST + blob files as RocksDB reports them
  // Shared tier (all 0 when off).
  uint64_t remote_hits = 0, remote_misses = 0, remote_corrupt = 0, remote_errors = 0;
  uint64_t remote_bytes_read = 0, remote_bytes_written = 0;
  uint64_t remote_pending_writes = 0, remote_pending_bytes = 0;
  uint64_t remote_writes = 0, remote_write_failed = 0, remote_write_dropped = 0;
  uint64_t remote_fill_dropped = 0;
};

class ChunkStore {
 public:
  // Opens (or creates) the store at options.path. Returns an error if the
  // directory cannot be opened, is locked by another process, or its index
  // is unreadable (DataLoss; with options.quarantine_if_damaged the damaged
  // store is moved aside instead, see quarantined_path()).
  static absl::StatusOr<std::unique_ptr<ChunkStore>> Open(
      ChunkStoreOptions options);

  // Where Open moved a damaged store, with why; empty if it did not.
  const std::string& quarantined_path() const { return quarantined_path_; }
  const std::string& quarantine_reason() const { return quarantine_reason_; }

  // Persists access order and closes the database. Callers must have
  // finished all calls on other threads first.
  ~ChunkStore();

  ChunkStore(const ChunkStore&) = delete;
  ChunkStore& operator=(const ChunkStore&) = delete;

  // Stores `record` (an encoded KV record) under `key`. Idempotent: if an
  // intact, unexpired record with `key` exists, writes nothing and returns
  // kAlreadyPresent. A record stored (kStored) is also queued for the shared
  // tier when configured (write-behind: RemoteState says how far it got);
  // nothing about the shared tier is ever returned. A record that a Get
  // reported kCorrupt is replaced.
  // InvalidArgument if `record` does not decode or is not the record of
  // `key`; ResourceExhausted if it alone exceeds capacity_bytes; other
  // errors are RocksDB I/O failures. Durable on return when options.sync.
  absl::StatusOr<PutResult> Put(const ChunkKey& key, std::string record);

  // Looks `key` up in the RAM tier, then on disk, then (when configured) in
  // the shared tier. The returned status is non-OK only for local I/O
  // errors; missing and corrupt records are values (GetResult::status), and
  // so is every fault of the shared tier (a miss, counted by kind). A record
  // from the shared tier is verified exactly like one from disk (checksum,
  // header, recomputed key), inserted into RAM and queued for its local
  // write (which the caller does not wait for). Corrupt results are counted.
  absl::StatusOr<GetResult> Get(const ChunkKey& key);

  // Get for each of `keys` (a query's chunk list), batching the disk reads.
  // Results are in the order of `keys`; duplicates are allowed.
  std::vector<absl::StatusOr<GetResult>> MultiGet(
      absl::Span<const ChunkKey> keys);

  // Get, and on kNotFound/kCorrupt run `compute` (which must return the
  // encoded record of `key`), store its result and return it as kFound with
  // computed = true. Concurrent calls for one key run `compute` once; the
  // others wait and share its result. Returns compute's error if it fails,
  // InvalidArgument if it returns a record of another key. A failure to
  // persist the computed record is counted (put_errors) but not returned:
  // the caller still gets its KV.
  //
  // With a shared tier: a local miss is looked up in the cluster first,
  // and the computed record is queued for the cluster (write-behind, after
  // the waiters are released). `just_missed`: the
  // caller has just looked `key` up (e.g. one MultiGet for a query's
  // chunks) and did not find it, so the first lookup is skipped (the
  // compute leader still re-checks the local tiers, never the cluster).
  absl::StatusOr<GetResult> GetOrCompute(
      const ChunkKey& key,
      const std::function<absl::StatusOr<std::string>()>& compute,
      bool just_missed = false);

  // Removes `key` from disk and RAM, and cancels its queued local fill.
  // Returns true if it was present (on disk or queued). The shared tier's
  // copy stays (and may be fetched again).
  absl::StatusOr<bool> Delete(const ChunkKey& key);

  // How far the shared-tier copy of `key` got (kNotConfigured when off).
  RemoteWriteState RemoteState(const ChunkKey& key) const;

  // Waits up to `timeout` for the write-behind queue to empty (every write
  // done or given up); what is left then is abandoned -- counted as failed,
  // RemoteState kFailed -- and returned, oldest first, for the caller to
  // log. The local copies are untouched. Empty when off or drained. Meant
  // for a graceful shutdown, after the last Put; later Puts queue again.
  std::vector<UnwrittenRecord> DrainRemoteWrites(std::chrono::milliseconds timeout);

  // Waits up to `timeout` until every queued local fill has been written;
  // true if so. For tests and benchmarks that need the fill on disk.
  bool WaitForLocalFills(std::chrono::milliseconds timeout);

  StoreStats Stats() const;
  // Live counters for the metrics exporter. Valid for the store's lifetime.
  const StoreCounters& counters() const;

  // Removes expired records, persists access order, flushes memtables and
  // compacts both column families with forced blob garbage collection, so
  // deleted/evicted records give their disk space back.
  absl::Status Compact();

  // Test hooks: the raw database and the data column family (bypassing the
  // codec), and a way to drop the RAM tier so the next read hits disk.
  rocksdb::DB* db_for_testing() const;
  rocksdb::ColumnFamilyHandle* data_cf_for_testing() const;
  void ClearRamTierForTesting();
  // Holds the local-fill thread (true) so tests can fill its queue
  // deterministically; false lets it run again.
  void PauseLocalFillsForTesting(bool paused);
  // The shared tier's client; null when off.
  RedisCluster* remote_cluster() const;
  // The cluster key of `key` (prefix + raw key bytes).
  std::string RemoteKey(const ChunkKey& key) const;

 private:
  class Impl;
  explicit ChunkStore(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
  std::string quarantined_path_;
  std::string quarantine_reason_;
};

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_CHUNK_STORE_H_
