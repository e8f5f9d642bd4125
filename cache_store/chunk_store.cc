#include "cache_store/chunk_store.h"

#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/options.h>
#include <rocksdb/table.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <filesystem>
#include <list>
#include <mutex>
#include <system_error>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "cache_store/background_priority.h"
#include "cache_store/ram_tier.h"
#include "cache_store/record_buffers.h"
#include "cache_store/record_queue.h"
#include "cache_store/remote_writer.h"

namespace infoflow::store {
namespace {

constexpr char kIndexCf[] = "index";
constexpr uint8_t kIndexValueVersion = 1;

absl::Status FromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", s.ToString());
  if (s.IsNotFound()) return absl::NotFoundError(msg);
  if (s.IsCorruption()) return absl::DataLossError(msg);
  if (s.IsInvalidArgument()) return absl::InvalidArgumentError(msg);
  // Disk full: the client can retry once space is freed; the store resumes
  // writing by itself then (ChunkStore::Impl::Write).
  if (s.IsNoSpace()) return absl::ResourceExhaustedError(absl::StrCat(msg, " (disk full)"));
  if (s.IsBusy() || s.IsTryAgain() || s.IsIOError()) return absl::UnavailableError(msg);
  return absl::InternalError(msg);
}

rocksdb::Slice ToSlice(std::string_view s) {
  return rocksdb::Slice(s.data(), s.size());
}

rocksdb::CompressionType ToRocks(Compression c) {
  switch (c) {
    case Compression::kNone:
      return rocksdb::kNoCompression;
    case Compression::kLz4:
      return rocksdb::kLZ4Compression;
    case Compression::kZstd:
      return rocksdb::kZSTD;
  }
  return rocksdb::kNoCompression;
}

// Metadata kept per record in the "index" CF (and in memory).
struct IndexValue {
  uint64_t size = 0;
  int64_t write_time_s = 0;
  uint64_t access_seq = 0;
  std::string model_fingerprint;
};

void AppendFixed64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}
uint64_t ReadFixed64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

std::string EncodeIndexValue(uint64_t size, int64_t write_time_s,
                             uint64_t access_seq, std::string_view fp) {
  std::string out;
  out.reserve(1 + 8 * 3 + 2 + fp.size());
  out.push_back(static_cast<char>(kIndexValueVersion));
  AppendFixed64(&out, size);
  AppendFixed64(&out, static_cast<uint64_t>(write_time_s));
  AppendFixed64(&out, access_seq);
  out.push_back(static_cast<char>(fp.size() & 0xff));
  out.push_back(static_cast<char>(fp.size() >> 8));
  out.append(fp);
  return out;
}

bool DecodeIndexValue(std::string_view in, IndexValue* out) {
  constexpr size_t kFixed = 1 + 8 * 3 + 2;
  if (in.size() < kFixed || static_cast<uint8_t>(in[0]) != kIndexValueVersion) {
    return false;
  }
  out->size = ReadFixed64(in.data() + 1);
  out->write_time_s = static_cast<int64_t>(ReadFixed64(in.data() + 9));
  out->access_seq = ReadFixed64(in.data() + 17);
  const size_t fp_len = static_cast<uint8_t>(in[25]) |
                        (static_cast<size_t>(static_cast<uint8_t>(in[26])) << 8);
  if (in.size() != kFixed + fp_len) return false;
  out->model_fingerprint.assign(in.data() + kFixed, fp_len);
  return true;
}

// One in-progress load or compute for a key; followers block on `cv` until
// the leader publishes `result`.
struct Flight {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::StatusOr<GetResult> result;
};

class FlightGroup {
 public:
  // Returns the flight for `key` and whether the caller leads it (must then
  // call Finish exactly once).
  std::pair<std::shared_ptr<Flight>, bool> Join(const ChunkKey& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& slot = flights_[key];
    if (slot != nullptr) return {slot, false};
    slot = std::make_shared<Flight>();
    return {slot, true};
  }

  void Finish(const ChunkKey& key, const std::shared_ptr<Flight>& flight,
              absl::StatusOr<GetResult> result) {
    {
      // Unregister first: a caller arriving after this starts a fresh
      // flight and sees the state the leader just wrote.
      std::lock_guard<std::mutex> lock(mu_);
      flights_.erase(key);
    }
    {
      std::lock_guard<std::mutex> lock(flight->mu);
      flight->result = std::move(result);
      flight->done = true;
    }
    flight->cv.notify_all();
  }

  static absl::StatusOr<GetResult> Wait(const std::shared_ptr<Flight>& flight) {
    std::unique_lock<std::mutex> lock(flight->mu);
    flight->cv.wait(lock, [&] { return flight->done; });
    absl::StatusOr<GetResult> r = flight->result;
    if (r.ok()) {
      // A follower neither read the disk nor computed: the leader did, and
      // only the leader's caller may count that work.
      r->from_ram = false;
      r->computed = false;
      r->from_remote = false;
    }
    return r;
  }

 private:
  std::mutex mu_;
  absl::flat_hash_map<ChunkKey, std::shared_ptr<Flight>> flights_;
};

enum class ReadVerdict { kOk, kCorrupt, kWrongModel };

}  // namespace

absl::StatusOr<std::shared_ptr<const ChunkValue>> ChunkValue::Make(std::string bytes,
                                                                   DecodeOptions options,
                                                                   bool recycle) {
  // Decode only after the bytes sit at their final address: the record's
  // views point into bytes_. A recycled buffer goes back even when the
  // bytes do not decode (the destructor gives it back).
  std::shared_ptr<ChunkValue> v(new ChunkValue());
  v->bytes_ = std::move(bytes);
  v->recycle_bytes_ = recycle;
  absl::StatusOr<KvRecord> rec = DecodeRecord(v->bytes_, options);
  if (!rec.ok()) return rec.status();
  v->record_ = *std::move(rec);
  return std::shared_ptr<const ChunkValue>(std::move(v));
}

absl::StatusOr<std::shared_ptr<const ChunkValue>> ChunkValue::Create(std::string bytes,
                                                                     DecodeOptions options) {
  return Make(std::move(bytes), options, /*recycle=*/false);
}

absl::StatusOr<std::shared_ptr<const ChunkValue>> ChunkValue::CreateRecycling(std::string bytes) {
  return Make(std::move(bytes), {}, /*recycle=*/true);
}

ChunkValue::~ChunkValue() {
  // record_'s views into bytes_ are not read again: only destroyed.
  if (recycle_bytes_) RecordBuffers::Default().Give(std::move(bytes_));
}

class ChunkStore::Impl {
 public:
  explicit Impl(ChunkStoreOptions options)
      : options_(std::move(options)),
        ram_(options_.ram_tier_bytes, &counters_) {}

  ~Impl() {
    // Background writers first: they write into db_ and count into counters_.
    writer_.reset();
    StopLocalFills();
    if (db_ == nullptr) return;
    // Best effort: losing access order only degrades eviction choices.
    (void)PersistAccessOrder();
    for (rocksdb::ColumnFamilyHandle* h : {data_cf_, index_cf_}) {
      if (h != nullptr) (void)db_->DestroyColumnFamilyHandle(h);
    }
    (void)db_->Close();
  }

  absl::Status Open();
  // Creates the shared tier's client when configured (an unreachable
  // cluster is not an error: its faults are misses).
  absl::Status OpenRemote() {
    if (!options_.remote.enabled()) return absl::OkStatus();
    absl::StatusOr<std::unique_ptr<RedisCluster>> c =
        RedisCluster::Create(options_.remote.cluster, &counters_.redis);
    if (!c.ok()) return c.status();
    remote_ = *std::move(c);
    counters_.remote_enabled.store(1, std::memory_order_relaxed);
    const RemoteTierOptions& r = options_.remote;
    RemoteWriterOptions wo;
    wo.queue_bytes = r.write_queue_bytes;
    wo.max_attempts = std::max(1, r.write_max_attempts);
    wo.retry_initial = r.write_retry_initial;
    wo.retry_max = r.write_retry_max;
    wo.give_up_after = r.write_give_up_after;
    wo.key_prefix = r.key_prefix;
    wo.ttl_seconds = r.ttl_seconds;
    writer_ = std::make_unique<RemoteWriter>(remote_.get(), std::move(wo), &counters_,
                                             [this](const absl::Status& s) {
                                               CountRemoteError(s, "set");
                                             });
    fills_ = std::make_unique<RecordQueue>(r.fill_queue_bytes);
    fill_thread_ = std::thread([this] { RunLocalFills(); });
    return absl::OkStatus();
  }
  RemoteWriteState RemoteState(const ChunkKey& key) const {
    return writer_ == nullptr ? RemoteWriteState::kNotConfigured : writer_->State(key);
  }
  std::vector<UnwrittenRecord> DrainRemoteWrites(std::chrono::milliseconds timeout) {
    if (writer_ == nullptr) return {};
    return writer_->Drain(timeout);
  }
  bool WaitForLocalFills(std::chrono::milliseconds timeout) {
    if (fills_ == nullptr) return true;
    if (!fills_->WaitEmpty(std::chrono::steady_clock::now() + timeout)) return false;
    // The last fill left the queue under write_mu_; its counters are
    // updated before write_mu_ is released.
    std::lock_guard<std::mutex> w(write_mu_);
    return true;
  }
  void PauseLocalFills(bool paused) {
    {
      std::lock_guard<std::mutex> lock(fill_mu_);
      fill_paused_ = paused;
    }
    fill_cv_.notify_all();
  }
  absl::StatusOr<PutResult> Put(const ChunkKey& key, std::string record);
  absl::StatusOr<GetResult> Get(const ChunkKey& key);
  std::vector<absl::StatusOr<GetResult>> MultiGet(
      absl::Span<const ChunkKey> keys);
  absl::StatusOr<GetResult> GetOrCompute(
      const ChunkKey& key,
      const std::function<absl::StatusOr<std::string>()>& compute,
      bool just_missed);
  absl::StatusOr<bool> Delete(const ChunkKey& key);
  std::vector<absl::StatusOr<GetResult>> MultiGet(
      absl::Span<const ChunkKey> keys, bool use_remote);
  std::string RemoteKey(const ChunkKey& key) const {
    std::string k = options_.remote.key_prefix;
    k.append(key.AsBytes());
    return k;
  }
  StoreStats Stats() const;
  absl::Status Compact();

  StoreCounters counters_;
  ChunkStoreOptions options_;
  RamTier ram_;
  std::unique_ptr<rocksdb::DB> db_;
  rocksdb::ColumnFamilyHandle* data_cf_ = nullptr;
  rocksdb::ColumnFamilyHandle* index_cf_ = nullptr;
  std::unique_ptr<RedisCluster> remote_;  // the shared tier; null when off
  // With the shared tier: its write-behind, and the queue of fetched
  // records waiting for their local write (drained by fill_thread_).
  std::unique_ptr<RemoteWriter> writer_;
  std::unique_ptr<RecordQueue> fills_;

 private:
  struct Entry {
    uint64_t size = 0;
    int64_t write_time_s = 0;
    uint64_t access_seq = 0;
    uint64_t persisted_access_seq = 0;
    bool corrupt = false;  // set by a read that failed verification
    std::map<std::string, ModelStats>::iterator model;
    std::list<ChunkKey>::iterator lru;  // position in lru_
  };

  // What a read learns from the index before touching RAM or disk.
  enum class Presence { kAbsent, kPresent, kCorrupt, kExpired };

  int64_t Now() const {
    if (options_.clock_seconds) return options_.clock_seconds();
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
  bool ExpiredLocked(const Entry& e, int64_t now) const {
    return options_.ttl_seconds > 0 &&
           now - e.write_time_s >= options_.ttl_seconds;
  }

  Presence CheckAndTouch(const ChunkKey& key);
  void MarkCorrupt(const ChunkKey& key);
  // Reads `keys` (all led flights) from RocksDB and verifies them.
  std::vector<absl::StatusOr<GetResult>> ReadFromDisk(
      absl::Span<const ChunkKey> keys);
  absl::StatusOr<GetResult> LoadSingleFlight(const ChunkKey& key);
  // The one check of a record read from outside RAM (disk or the shared
  // tier): it decodes (checksum, header, sizes) and is the record of `key`
  // (recomputed content key, which commits to the model fingerprint).
  // `recycle`: the bytes are a RecordBuffers buffer (ChunkValue::CreateRecycling).
  std::shared_ptr<const ChunkValue> VerifyRead(const ChunkKey& key, std::string bytes, bool recycle,
                                               ReadVerdict* verdict) const;
  // Fetches `keys` (all led flights, missing or corrupt locally with
  // `local` status) from the shared tier in one parallel batch, verifies
  // them and stores the good ones locally. Never fails: faults are misses.
  std::vector<absl::StatusOr<GetResult>> ReadFromRemote(absl::Span<const ChunkKey> keys,
                                                        const std::vector<GetStatus>& local);
  // Queues a stored or computed record for the shared tier (write-behind).
  void WriteBehind(const ChunkKey& key, const std::shared_ptr<const ChunkValue>& value);
  // Queues the local write of a record fetched from the shared tier, or
  // counts it dropped when the queue is full (it is still served, from RAM).
  void QueueLocalFill(const ChunkKey& key, const std::shared_ptr<const ChunkValue>& value);
  // fill_thread_: writes queued fills until StopLocalFills, which lets it
  // finish what is queued first (local writes: bounded and quick).
  void RunLocalFills();
  void StopLocalFills();
  void CountRemoteError(const absl::Status& s, const char* what);
  // Writes a verified value. Requires write_mu_.
  absl::StatusOr<PutResult> PutVerifiedLocked(
      const ChunkKey& key, const std::shared_ptr<const ChunkValue>& value,
      bool insert_into_ram);
  absl::Status DeleteKeysLocked(absl::Span<const ChunkKey> keys,
                                std::atomic<uint64_t>* reason_counter,
                                uint64_t* removed);
  void EraseEntryLocked(const ChunkKey& key);
  absl::Status PersistAccessOrder();
  absl::StatusOr<std::shared_ptr<const ChunkValue>> VerifyForPut(
      const ChunkKey& key, std::string record) const;

  rocksdb::WriteOptions WriteOpts() const {
    rocksdb::WriteOptions wo;
    wo.sync = options_.sync;
    return wo;
  }
  // Every write goes through here: it first resumes a DB that a failed write
  // left read-only, so the store recovers by itself once space is back.
  rocksdb::Status Write(rocksdb::WriteBatch* batch);
  // Counts a failed write, flush or compaction and marks the DB for
  // ResumeAfterBackgroundError; returns `s`.
  rocksdb::Status TrackWrite(rocksdb::Status s);
  // ResourceExhausted when writing `record_bytes` would leave less than
  // options_.min_free_disk_bytes free. Why a guard: Debian's RocksDB 7.8 is
  // built with assertions, and a WAL append that hits ENOSPC followed by its
  // fsync aborts the process (WritableFileWriter::
  // AssertFalseAndGetStatusForPrevError), so the store must not get there.
  absl::Status CheckFreeDisk(uint64_t record_bytes);
  void ResumeAfterBackgroundError();

  std::atomic<bool> write_failed_{false};
  std::mutex resume_mu_;  // guards last_resume_
  std::chrono::steady_clock::time_point last_resume_{};

  // Serialises every change of membership (put, delete, eviction, expiry),
  // so capacity decisions made under index_mu_ stay valid until the
  // RocksDB write lands. Never held while waiting on a flight.
  std::mutex write_mu_;
  // Guards index_, lru_, models_, next_seq_, total_bytes_.
  mutable std::mutex index_mu_;
  absl::flat_hash_map<ChunkKey, Entry> index_;
  std::list<ChunkKey> lru_;  // front = least recently accessed
  std::map<std::string, ModelStats> models_;
  uint64_t next_seq_ = 1;
  uint64_t total_bytes_ = 0;

  FlightGroup loads_;
  FlightGroup computes_;

  std::mutex fill_mu_;  // guards fill_paused_, fill_stop_
  std::condition_variable fill_cv_;
  bool fill_paused_ = false;
  bool fill_stop_ = false;
  std::thread fill_thread_;
};

absl::Status ChunkStore::Impl::Open() {
  if (options_.create_if_missing) {
    // RocksDB creates only the last path component; "./data/kv" on a fresh
    // checkout needs its parent too.
    std::error_code ec;
    std::filesystem::create_directories(options_.path, ec);
    if (ec) {
      return absl::InternalError(absl::StrCat("create ", options_.path, ": ", ec.message()));
    }
  }
  rocksdb::DBOptions db_opts;
  db_opts.create_if_missing = options_.create_if_missing;
  db_opts.create_missing_column_families = true;
  db_opts.max_background_jobs = 2;
  // Flushes and compactions at nice 19, like the store's own fill and
  // write-behind threads (background_priority.h): a shared-tier hit queues
  // tens of MB of local writes, whose flush must not take a query's cores.
  // Process-wide (Env::Default's pools) and idempotent; best effort.
  for (rocksdb::Env::Priority pool : {rocksdb::Env::Priority::LOW, rocksdb::Env::Priority::HIGH}) {
    (void)rocksdb::Env::Default()->LowerThreadPoolCPUPriority(pool, rocksdb::CpuPriority::kLow);
  }
  // Records are large; keep the WAL from growing without bound between
  // flushes of a write-heavy ingest.
  db_opts.max_total_wal_size = uint64_t{256} << 20;

  std::shared_ptr<rocksdb::Cache> cache =
      rocksdb::NewLRUCache(static_cast<size_t>(options_.block_cache_bytes));
  rocksdb::BlockBasedTableOptions table;
  table.block_cache = cache;
  table.cache_index_and_filter_blocks = true;

  rocksdb::ColumnFamilyOptions data_opts;
  data_opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  data_opts.enable_blob_files = true;
  data_opts.min_blob_size = options_.min_blob_size;
  data_opts.blob_file_size = options_.blob_file_size;
  data_opts.blob_compression_type = ToRocks(options_.compression);
  data_opts.compression = ToRocks(options_.compression);
  data_opts.enable_blob_garbage_collection = true;
  data_opts.write_buffer_size = 64 << 20;

  rocksdb::ColumnFamilyOptions index_opts;
  index_opts.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  index_opts.compression = rocksdb::kLZ4Compression;

  std::vector<rocksdb::ColumnFamilyDescriptor> cfs = {
      {rocksdb::kDefaultColumnFamilyName, data_opts}, {kIndexCf, index_opts}};
  std::vector<rocksdb::ColumnFamilyHandle*> handles;
  rocksdb::DB* raw = nullptr;
  rocksdb::Status s =
      rocksdb::DB::Open(db_opts, options_.path, cfs, &handles, &raw);
  if (!s.ok()) return FromRocks(s, absl::StrCat("open ", options_.path));
  db_.reset(raw);
  data_cf_ = handles[0];
  index_cf_ = handles[1];

  // Rebuild accounting from the index CF (small values; no blob is read).
  struct Loaded {
    ChunkKey key;
    IndexValue v;
  };
  std::vector<Loaded> loaded;
  std::unique_ptr<rocksdb::Iterator> it(
      db_->NewIterator(rocksdb::ReadOptions(), index_cf_));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    absl::StatusOr<ChunkKey> key =
        ChunkKey::FromBytes(std::string_view(it->key().data(), it->key().size()));
    Loaded l;
    if (!key.ok() ||
        !DecodeIndexValue(std::string_view(it->value().data(),
                                           it->value().size()),
                          &l.v)) {
      // An unreadable index entry: forget it; the record (if any) is then
      // invisible and gets overwritten by the next Put of its key.
      continue;
    }
    l.key = *key;
    loaded.push_back(std::move(l));
  }
  if (!it->status().ok()) return FromRocks(it->status(), "scan index");
  std::sort(loaded.begin(), loaded.end(), [](const Loaded& a, const Loaded& b) {
    return a.v.access_seq < b.v.access_seq;
  });
  std::lock_guard<std::mutex> lock(index_mu_);
  for (Loaded& l : loaded) {
    Entry e;
    e.size = l.v.size;
    e.write_time_s = l.v.write_time_s;
    e.access_seq = e.persisted_access_seq = l.v.access_seq;
    e.model = models_.try_emplace(l.v.model_fingerprint).first;
    e.model->second.records++;
    e.model->second.bytes += e.size;
    e.lru = lru_.insert(lru_.end(), l.key);
    next_seq_ = std::max(next_seq_, l.v.access_seq + 1);
    total_bytes_ += e.size;
    index_.emplace(l.key, std::move(e));
  }
  counters_.records.store(index_.size(), std::memory_order_relaxed);
  counters_.bytes.store(total_bytes_, std::memory_order_relaxed);
  return absl::OkStatus();
}

ChunkStore::Impl::Presence ChunkStore::Impl::CheckAndTouch(
    const ChunkKey& key) {
  const int64_t now = Now();
  std::lock_guard<std::mutex> lock(index_mu_);
  auto it = index_.find(key);
  if (it == index_.end()) return Presence::kAbsent;
  Entry& e = it->second;
  if (ExpiredLocked(e, now)) return Presence::kExpired;
  if (e.corrupt) return Presence::kCorrupt;
  e.access_seq = next_seq_++;
  lru_.splice(lru_.end(), lru_, e.lru);
  return Presence::kPresent;
}

void ChunkStore::Impl::MarkCorrupt(const ChunkKey& key) {
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    auto it = index_.find(key);
    if (it != index_.end()) it->second.corrupt = true;
  }
  ram_.Erase(key);
}

std::vector<absl::StatusOr<GetResult>> ChunkStore::Impl::ReadFromDisk(
    absl::Span<const ChunkKey> keys) {
  const size_t n = keys.size();
  std::vector<rocksdb::Slice> rkeys;
  rkeys.reserve(n);
  for (const ChunkKey& k : keys) rkeys.push_back(ToSlice(k.AsBytes()));
  // Each PinnableSlice writes into its own std::string when RocksDB cannot
  // pin the value, so we can take that buffer without a second copy.
  std::vector<std::string> bufs(n);
  std::vector<rocksdb::PinnableSlice> values;
  values.reserve(n);
  for (size_t i = 0; i < n; ++i) values.emplace_back(&bufs[i]);
  std::vector<rocksdb::Status> statuses(n);
  rocksdb::ReadOptions ro;
  // Every record carries its own xxh64 over all of its bytes, verified
  // below, and that check is end to end (it also catches bytes corrupted
  // before or after RocksDB). RocksDB's per-blob CRC32C on top of it is
  // redundant and, in Debian's portable build (no SSE4.2 CRC), costs more
  // CPU than the rest of the read path together: store_bench measured
  // ~0.5 vs ~1 GB/s. Skip it for record reads.
  ro.verify_checksums = false;
  db_->MultiGet(ro, data_cf_, n, rkeys.data(), values.data(),
                statuses.data());

  std::vector<absl::StatusOr<GetResult>> out;
  out.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const rocksdb::Status& s = statuses[i];
    GetResult r;
    if (s.IsNotFound()) {
      // The index said present but the record is gone (only possible after
      // out-of-band edits): report a miss.
      counters_.misses.fetch_add(1, std::memory_order_relaxed);
      out.push_back(r);
      continue;
    }
    if (s.IsCorruption()) {
      MarkCorrupt(keys[i]);
      counters_.corrupt.fetch_add(1, std::memory_order_relaxed);
      r.status = GetStatus::kCorrupt;
      out.push_back(r);
      continue;
    }
    if (!s.ok()) {
      out.push_back(FromRocks(s, "read chunk"));
      continue;
    }
    std::string bytes;
    if (values[i].IsPinned()) {
      bytes.assign(values[i].data(), values[i].size());
    } else {
      bytes = std::move(bufs[i]);
      bytes.resize(values[i].size());
    }
    values[i].Reset();
    counters_.bytes_read.fetch_add(bytes.size(), std::memory_order_relaxed);
    ReadVerdict verdict;
    std::shared_ptr<const ChunkValue> v =
        VerifyRead(keys[i], std::move(bytes), /*recycle=*/false, &verdict);
    if (v == nullptr) {
      MarkCorrupt(keys[i]);
      counters_.corrupt.fetch_add(1, std::memory_order_relaxed);
      r.status = GetStatus::kCorrupt;
      out.push_back(r);
      continue;
    }
    counters_.disk_hits.fetch_add(1, std::memory_order_relaxed);
    ram_.Insert(keys[i], v);
    r.status = GetStatus::kFound;
    r.value = std::move(v);
    out.push_back(std::move(r));
  }
  return out;
}

std::shared_ptr<const ChunkValue> ChunkStore::Impl::VerifyRead(const ChunkKey& key,
                                                               std::string bytes, bool recycle,
                                                               ReadVerdict* verdict) const {
  absl::StatusOr<std::shared_ptr<const ChunkValue>> v =
      recycle ? ChunkValue::CreateRecycling(std::move(bytes))
              : ChunkValue::Create(std::move(bytes));
  if (!v.ok()) {
    *verdict = ReadVerdict::kCorrupt;
    return nullptr;
  }
  // A valid record under the wrong key is corruption too (e.g. a value
  // written to the wrong slot): content addressing makes it checkable. The
  // key commits to the model fingerprint, so a record of another model
  // fails here as well; it is told apart for the metrics.
  if ((*v)->record().Key() != key) {
    const std::string& want = options_.remote.model_fingerprint;
    *verdict = !want.empty() && (*v)->record().header.model_fingerprint != want
                   ? ReadVerdict::kWrongModel
                   : ReadVerdict::kCorrupt;
    return nullptr;
  }
  *verdict = ReadVerdict::kOk;
  return *std::move(v);
}

void ChunkStore::Impl::CountRemoteError(const absl::Status& s, const char* what) {
  const std::string_view kind = RedisErrorKind(s);
  std::atomic<uint64_t>* c = &counters_.remote_errors_server;
  if (kind == "timeout") c = &counters_.remote_errors_timeout;
  else if (kind == "connection") c = &counters_.remote_errors_connection;
  else if (kind == "redirect_exhausted") c = &counters_.remote_errors_redirect;
  else if (kind == "circuit_open") c = &counters_.remote_errors_circuit_open;
  c->fetch_add(1, std::memory_order_relaxed);
  // Log at most one line every 10 s: a dead cluster must not flood stderr.
  static std::atomic<int64_t> last_log_s{0};
  const int64_t now = std::chrono::duration_cast<std::chrono::seconds>(
                          std::chrono::steady_clock::now().time_since_epoch())
                          .count();
  int64_t last = last_log_s.load(std::memory_order_relaxed);
  if (now - last >= 10 && last_log_s.compare_exchange_strong(last, now)) {
    std::fprintf(stderr, "event=remote_tier_error op=%s kind=%s error=\"%s\"\n", what,
                 std::string(kind).c_str(), std::string(s.message()).c_str());
  }
}

std::vector<absl::StatusOr<GetResult>> ChunkStore::Impl::ReadFromRemote(
    absl::Span<const ChunkKey> keys, const std::vector<GetStatus>& local) {
  std::vector<std::string> rkeys;
  rkeys.reserve(keys.size());
  for (const ChunkKey& k : keys) rkeys.push_back(RemoteKey(k));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<absl::StatusOr<std::optional<std::string>>> got = remote_->MultiGet(rkeys);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  size_t bucket = 0;
  while (bucket < StoreCounters::kRemoteFetchBuckets &&
         ms > StoreCounters::kRemoteFetchBucketsMs[bucket]) {
    ++bucket;
  }
  counters_.remote_fetch_bucket[bucket].fetch_add(1, std::memory_order_relaxed);
  counters_.remote_fetch_count.fetch_add(1, std::memory_order_relaxed);
  counters_.remote_fetch_sum_us.fetch_add(static_cast<uint64_t>(ms * 1000),
                                          std::memory_order_relaxed);

  std::vector<absl::StatusOr<GetResult>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    GetResult r;
    r.status = local[i];
    // A lookup found nowhere is a miss; a locally corrupt one was counted.
    auto miss = [&] {
      if (local[i] == GetStatus::kNotFound) {
        counters_.misses.fetch_add(1, std::memory_order_relaxed);
      }
    };
    if (!got[i].ok()) {
      CountRemoteError(got[i].status(), "get");
      miss();
      out.push_back(r);
      continue;
    }
    if (!got[i]->has_value()) {
      counters_.remote_misses.fetch_add(1, std::memory_order_relaxed);
      miss();
      out.push_back(r);
      continue;
    }
    counters_.remote_bytes_read.fetch_add((*got[i])->size(), std::memory_order_relaxed);
    ReadVerdict verdict;
    // The cluster's reply was read into a RecordBuffers buffer: it goes
    // back there when the record does.
    std::shared_ptr<const ChunkValue> v =
        VerifyRead(keys[i], **std::move(got[i]), /*recycle=*/true, &verdict);
    if (v == nullptr) {
      // Reported as corrupt: the caller recomputes, and the write-through
      // of the recomputed record overwrites the bad value in the cluster.
      (verdict == ReadVerdict::kWrongModel ? counters_.remote_wrong_model
                                           : counters_.remote_corrupt)
          .fetch_add(1, std::memory_order_relaxed);
      r.status = GetStatus::kCorrupt;
      out.push_back(r);
      continue;
    }
    // In RAM before the flight finishes, so a lookup arriving after it is a
    // RAM hit; the disk write is the fill thread's, off this query's path.
    ram_.Insert(keys[i], v);
    QueueLocalFill(keys[i], v);
    counters_.remote_hits.fetch_add(1, std::memory_order_relaxed);
    r.status = GetStatus::kFound;
    r.value = std::move(v);
    r.from_remote = true;
    out.push_back(std::move(r));
  }
  return out;
}

void ChunkStore::Impl::WriteBehind(const ChunkKey& key,
                                   const std::shared_ptr<const ChunkValue>& value) {
  if (writer_ != nullptr) writer_->Enqueue(key, value);
}

void ChunkStore::Impl::QueueLocalFill(const ChunkKey& key,
                                      const std::shared_ptr<const ChunkValue>& value) {
  if (fills_->Push(key, value) == RecordQueue::PushResult::kFull) {
    counters_.remote_fill_dropped.fetch_add(1, std::memory_order_relaxed);
  }
  counters_.remote_fill_queue_bytes.store(fills_->bytes(), std::memory_order_relaxed);
}

void ChunkStore::Impl::RunLocalFills() {
  LowerThisThreadPriority();
  while (true) {
    bool stopping;
    {
      std::unique_lock<std::mutex> lock(fill_mu_);
      fill_cv_.wait(lock, [&] { return fill_stop_ || !fill_paused_; });
      stopping = fill_stop_;
    }
    // While running, wake up now and then to see a pause or stop; when
    // stopping, take only what is queued already.
    const auto deadline = std::chrono::steady_clock::now() +
                          (stopping ? std::chrono::milliseconds(0) : std::chrono::milliseconds(200));
    std::vector<RecordQueue::Item> next = fills_->Front(1, UINT64_MAX, deadline);
    if (next.empty()) {
      if (stopping) return;
      continue;
    }
    {
      // Paused while we waited for the item: hold it.
      std::lock_guard<std::mutex> lock(fill_mu_);
      if (fill_paused_ && !fill_stop_) continue;
    }
    const RecordQueue::Item& item = next[0];
    {
      std::lock_guard<std::mutex> w(write_mu_);
      // Delete removes a queued fill under write_mu_ too: a deleted record
      // is never written back by a fill that was already queued.
      if (!fills_->Contains(item.key)) continue;
      absl::StatusOr<PutResult> put = PutVerifiedLocked(item.key, item.value,
                                                        /*insert_into_ram=*/false);
      fills_->Remove(item.key);
      if (!put.ok()) {
        counters_.put_errors.fetch_add(1, std::memory_order_relaxed);
      } else if (*put == PutResult::kStored) {
        counters_.remote_fills.fetch_add(1, std::memory_order_relaxed);
      }
      counters_.remote_fill_queue_bytes.store(fills_->bytes(), std::memory_order_relaxed);
    }
  }
}

void ChunkStore::Impl::StopLocalFills() {
  if (!fill_thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(fill_mu_);
    fill_stop_ = true;
  }
  fill_cv_.notify_all();
  fill_thread_.join();
}

absl::StatusOr<GetResult> ChunkStore::Impl::Get(const ChunkKey& key) {
  std::vector<absl::StatusOr<GetResult>> r = MultiGet(absl::MakeSpan(&key, 1), true);
  return std::move(r[0]);
}

std::vector<absl::StatusOr<GetResult>> ChunkStore::Impl::MultiGet(
    absl::Span<const ChunkKey> keys) {
  return MultiGet(keys, /*use_remote=*/true);
}

std::vector<absl::StatusOr<GetResult>> ChunkStore::Impl::MultiGet(
    absl::Span<const ChunkKey> keys, bool use_remote) {
  const size_t n = keys.size();
  std::vector<absl::StatusOr<GetResult>> out(n);
  std::vector<bool> settled(n, false);
  std::vector<ChunkKey> expired;
  // Flights this call leads / follows, by position in `keys`.
  std::vector<size_t> led_pos;
  std::vector<ChunkKey> led_keys;
  std::vector<std::shared_ptr<Flight>> led_flights;
  std::vector<std::pair<size_t, std::shared_ptr<Flight>>> followed;
  absl::flat_hash_map<ChunkKey, size_t> first_pos;  // duplicate keys
  // Flights this call leads to the shared tier, with the local status.
  const bool remote = use_remote && remote_ != nullptr;
  std::vector<size_t> remote_pos;
  std::vector<ChunkKey> remote_keys;
  std::vector<std::shared_ptr<Flight>> remote_flights;
  std::vector<GetStatus> remote_local;
  // Joins (or follows) the shared-tier flight for keys[i]; true if handled.
  // A RAM hit on keys[i] (counted), for a key the index does not vouch for.
  // Only a fetched record whose local fill is pending or was dropped is in
  // RAM without an index entry, and it was verified like any other.
  auto ram_hit = [&](size_t i) {
    std::shared_ptr<const ChunkValue> v = ram_.Lookup(keys[i]);
    if (v == nullptr) return false;
    counters_.ram_hits.fetch_add(1, std::memory_order_relaxed);
    GetResult r;
    r.status = GetStatus::kFound;
    r.value = std::move(v);
    r.from_ram = true;
    out[i] = std::move(r);
    settled[i] = true;
    return true;
  };
  // `ram_ok`: a RAM copy may be served (false for an expired key, whose RAM
  // copy is the expired record until the cleanup below erases it).
  auto go_remote = [&](size_t i, GetStatus local, bool ram_ok) {
    auto [flight, leader] = loads_.Join(keys[i]);
    if (!leader) {
      counters_.single_flight_waits.fetch_add(1, std::memory_order_relaxed);
      followed.emplace_back(i, std::move(flight));
      return;
    }
    // A fetch of this key may have finished between our look at RAM and
    // Join (it inserted into RAM first): one cluster trip per burst.
    if (ram_ok && ram_hit(i)) {
      loads_.Finish(keys[i], flight, out[i]);
      return;
    }
    remote_pos.push_back(i);
    remote_keys.push_back(keys[i]);
    remote_flights.push_back(std::move(flight));
    remote_local.push_back(local);
  };

  for (size_t i = 0; i < n; ++i) {
    const ChunkKey& key = keys[i];
    if (auto [it, fresh] = first_pos.try_emplace(key, i); !fresh) {
      continue;  // filled from the first occurrence at the end
    }
    GetResult r;
    const Presence presence = CheckAndTouch(key);
    switch (presence) {
      case Presence::kExpired:
        expired.push_back(key);
        [[fallthrough]];
      case Presence::kAbsent:
        if (remote) {
          const bool ram_ok = presence == Presence::kAbsent;
          if (ram_ok && ram_hit(i)) continue;
          go_remote(i, GetStatus::kNotFound, ram_ok);  // counted there
          continue;
        }
        counters_.misses.fetch_add(1, std::memory_order_relaxed);
        out[i] = r;
        settled[i] = true;
        continue;
      case Presence::kCorrupt:
        counters_.corrupt.fetch_add(1, std::memory_order_relaxed);
        if (remote) {
          // RAM never holds the corrupt bytes (MarkCorrupt erased them); a
          // copy there is a good record fetched since, its fill pending.
          go_remote(i, GetStatus::kCorrupt, /*ram_ok=*/true);
          continue;
        }
        r.status = GetStatus::kCorrupt;
        out[i] = r;
        settled[i] = true;
        continue;
      case Presence::kPresent:
        break;
    }
    if (std::shared_ptr<const ChunkValue> v = ram_.Lookup(key)) {
      counters_.ram_hits.fetch_add(1, std::memory_order_relaxed);
      r.status = GetStatus::kFound;
      r.value = std::move(v);
      r.from_ram = true;
      out[i] = std::move(r);
      settled[i] = true;
      continue;
    }
    auto [flight, leader] = loads_.Join(key);
    if (leader) {
      // A flight for this key may have completed between our RAM lookup
      // and Join; it inserted into RAM before unregistering, so looking
      // again makes "one disk read per burst of misses" exact.
      if (std::shared_ptr<const ChunkValue> v = ram_.Lookup(key)) {
        counters_.ram_hits.fetch_add(1, std::memory_order_relaxed);
        r.status = GetStatus::kFound;
        r.value = std::move(v);
        r.from_ram = true;
        loads_.Finish(key, flight, r);
        out[i] = std::move(r);
        settled[i] = true;
        continue;
      }
      led_pos.push_back(i);
      led_keys.push_back(key);
      led_flights.push_back(std::move(flight));
    } else {
      counters_.single_flight_waits.fetch_add(1, std::memory_order_relaxed);
      followed.emplace_back(i, std::move(flight));
    }
  }

  // Finish what we lead before waiting on anyone else's flight, so two
  // MultiGets with overlapping keys cannot wait on each other.
  if (!led_keys.empty()) {
    std::vector<absl::StatusOr<GetResult>> read = ReadFromDisk(led_keys);
    for (size_t j = 0; j < led_keys.size(); ++j) {
      out[led_pos[j]] = read[j];
      settled[led_pos[j]] = true;
      loads_.Finish(led_keys[j], led_flights[j], std::move(read[j]));
    }
  }
  if (!remote_keys.empty()) {
    std::vector<absl::StatusOr<GetResult>> read = ReadFromRemote(remote_keys, remote_local);
    for (size_t j = 0; j < remote_keys.size(); ++j) {
      out[remote_pos[j]] = read[j];
      settled[remote_pos[j]] = true;
      loads_.Finish(remote_keys[j], remote_flights[j], std::move(read[j]));
    }
  }
  for (auto& [pos, flight] : followed) {
    out[pos] = FlightGroup::Wait(flight);
    settled[pos] = true;
  }
  for (size_t i = 0; i < n; ++i) {
    if (!settled[i]) out[i] = out[first_pos[keys[i]]];
  }
  if (!expired.empty()) {
    std::lock_guard<std::mutex> w(write_mu_);
    {
      // Re-check under write_mu_: a Put may have replaced the record since.
      const int64_t now = Now();
      std::lock_guard<std::mutex> lock(index_mu_);
      expired.erase(std::remove_if(expired.begin(), expired.end(),
                                   [&](const ChunkKey& k) {
                                     auto it = index_.find(k);
                                     // A queued fill replaces it anyway;
                                     // deleting would drop its RAM copy.
                                     return it == index_.end() ||
                                            !ExpiredLocked(it->second, now) ||
                                            (fills_ != nullptr && fills_->Contains(k));
                                   }),
                    expired.end());
    }
    uint64_t removed = 0;
    // Expiry is lazy cleanup; a failure here just leaves the record for
    // the next read or Compact() to remove.
    (void)DeleteKeysLocked(expired, &counters_.ttl_expirations, &removed);
  }
  return out;
}

absl::StatusOr<std::shared_ptr<const ChunkValue>> ChunkStore::Impl::VerifyForPut(
    const ChunkKey& key, std::string record) const {
  absl::StatusOr<std::shared_ptr<const ChunkValue>> v =
      ChunkValue::Create(std::move(record));
  if (!v.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a valid KV record: ", v.status().message()));
  }
  if ((*v)->record().Key() != key) {
    return absl::InvalidArgumentError(absl::StrCat(
        "record is the record of ", (*v)->record().Key().Hex(), ", not of ",
        key.Hex()));
  }
  return v;
}

absl::StatusOr<PutResult> ChunkStore::Impl::Put(const ChunkKey& key,
                                                std::string record) {
  // Verify before taking any lock: it is the O(payload) part.
  absl::StatusOr<std::shared_ptr<const ChunkValue>> v =
      VerifyForPut(key, std::move(record));
  if (!v.ok()) return v.status();
  absl::StatusOr<PutResult> put;
  {
    std::lock_guard<std::mutex> w(write_mu_);
    put = PutVerifiedLocked(key, *v, options_.ram_insert_on_put);
  }
  if (put.ok() && *put == PutResult::kStored) WriteBehind(key, *v);
  return put;
}

absl::StatusOr<PutResult> ChunkStore::Impl::PutVerifiedLocked(
    const ChunkKey& key, const std::shared_ptr<const ChunkValue>& value,
    bool insert_into_ram) {
  const uint64_t size = value->bytes().size();
  const int64_t now = Now();
  if (absl::Status s = CheckFreeDisk(size); !s.ok()) return s;
  if (options_.capacity_bytes > 0 && size > options_.capacity_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("record of ", size, " bytes exceeds store capacity ",
                     options_.capacity_bytes));
  }
  std::vector<ChunkKey> victims;
  uint64_t seq;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    uint64_t replaced_size = 0;
    if (auto it = index_.find(key); it != index_.end()) {
      if (!it->second.corrupt && !ExpiredLocked(it->second, now)) {
        counters_.puts_already_present.fetch_add(1, std::memory_order_relaxed);
        return PutResult::kAlreadyPresent;
      }
      replaced_size = it->second.size;
    }
    if (options_.capacity_bytes > 0) {
      uint64_t projected = total_bytes_ - replaced_size + size;
      for (auto lit = lru_.begin();
           projected > options_.capacity_bytes && lit != lru_.end(); ++lit) {
        if (*lit == key) continue;  // being replaced; already discounted
        projected -= index_.at(*lit).size;
        victims.push_back(*lit);
      }
    }
    seq = next_seq_++;
  }

  rocksdb::WriteBatch batch;
  for (const ChunkKey& victim : victims) {
    batch.Delete(data_cf_, ToSlice(victim.AsBytes()));
    batch.Delete(index_cf_, ToSlice(victim.AsBytes()));
  }
  const std::string& fp = value->record().header.model_fingerprint;
  batch.Put(data_cf_, ToSlice(key.AsBytes()), ToSlice(value->bytes()));
  batch.Put(index_cf_, ToSlice(key.AsBytes()),
            EncodeIndexValue(size, now, seq, fp));
  rocksdb::Status s = Write(&batch);
  if (!s.ok()) return FromRocks(s, "write chunk");

  {
    std::lock_guard<std::mutex> lock(index_mu_);
    for (const ChunkKey& victim : victims) EraseEntryLocked(victim);
    EraseEntryLocked(key);  // a replaced corrupt/expired entry
    Entry e;
    e.size = size;
    e.write_time_s = now;
    e.access_seq = e.persisted_access_seq = seq;
    e.model = models_.try_emplace(fp).first;
    e.model->second.records++;
    e.model->second.bytes += size;
    e.lru = lru_.insert(lru_.end(), key);
    total_bytes_ += size;
    index_.emplace(key, std::move(e));
    counters_.records.store(index_.size(), std::memory_order_relaxed);
    counters_.bytes.store(total_bytes_, std::memory_order_relaxed);
  }
  for (const ChunkKey& victim : victims) ram_.Erase(victim);
  counters_.capacity_evictions.fetch_add(victims.size(),
                                         std::memory_order_relaxed);
  counters_.bytes_written.fetch_add(size, std::memory_order_relaxed);
  counters_.puts_stored.fetch_add(1, std::memory_order_relaxed);
  if (insert_into_ram) ram_.Insert(key, value);
  return PutResult::kStored;
}

void ChunkStore::Impl::EraseEntryLocked(const ChunkKey& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return;
  Entry& e = it->second;
  e.model->second.records--;
  e.model->second.bytes -= e.size;
  if (e.model->second.records == 0) models_.erase(e.model);
  total_bytes_ -= e.size;
  lru_.erase(e.lru);
  index_.erase(it);
}

absl::Status ChunkStore::Impl::DeleteKeysLocked(
    absl::Span<const ChunkKey> keys, std::atomic<uint64_t>* reason_counter,
    uint64_t* removed) {
  *removed = 0;
  std::vector<ChunkKey> present;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    for (const ChunkKey& k : keys) {
      if (index_.contains(k)) present.push_back(k);
    }
  }
  if (present.empty()) return absl::OkStatus();
  rocksdb::WriteBatch batch;
  for (const ChunkKey& k : present) {
    batch.Delete(data_cf_, ToSlice(k.AsBytes()));
    batch.Delete(index_cf_, ToSlice(k.AsBytes()));
  }
  rocksdb::Status s = Write(&batch);
  if (!s.ok()) return FromRocks(s, "delete chunks");
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    for (const ChunkKey& k : present) EraseEntryLocked(k);
    counters_.records.store(index_.size(), std::memory_order_relaxed);
    counters_.bytes.store(total_bytes_, std::memory_order_relaxed);
  }
  for (const ChunkKey& k : present) ram_.Erase(k);
  reason_counter->fetch_add(present.size(), std::memory_order_relaxed);
  *removed = present.size();
  return absl::OkStatus();
}

absl::StatusOr<bool> ChunkStore::Impl::Delete(const ChunkKey& key) {
  std::lock_guard<std::mutex> w(write_mu_);
  // Under write_mu_, like the fill thread's write: a fill is either done
  // (and deleted below) or cancelled here.
  const bool queued = fills_ != nullptr && fills_->Remove(key);
  if (queued) {
    counters_.remote_fill_queue_bytes.store(fills_->bytes(), std::memory_order_relaxed);
  }
  uint64_t removed = 0;
  absl::Status s =
      DeleteKeysLocked(absl::MakeSpan(&key, 1), &counters_.deletes, &removed);
  if (!s.ok()) return s;
  ram_.Erase(key);  // also a RAM-only copy of a fetched record
  if (queued && removed == 0) counters_.deletes.fetch_add(1, std::memory_order_relaxed);
  return removed > 0 || queued;
}

absl::StatusOr<GetResult> ChunkStore::Impl::GetOrCompute(
    const ChunkKey& key,
    const std::function<absl::StatusOr<std::string>()>& compute,
    bool just_missed) {
  if (!just_missed) {
    absl::StatusOr<GetResult> got = Get(key);
    if (!got.ok() || got->status == GetStatus::kFound) return got;
  }

  auto [flight, leader] = computes_.Join(key);
  if (!leader) {
    counters_.single_flight_waits.fetch_add(1, std::memory_order_relaxed);
    return FlightGroup::Wait(flight);
  }
  absl::StatusOr<GetResult> result = [&]() -> absl::StatusOr<GetResult> {
    // Another caller's compute may have finished between our Get and Join
    // (its result is local by now: no second trip to the shared tier).
    absl::StatusOr<GetResult> again =
        std::move(MultiGet(absl::MakeSpan(&key, 1), /*use_remote=*/false)[0]);
    if (!again.ok() || again->status == GetStatus::kFound) return again;
    counters_.computes.fetch_add(1, std::memory_order_relaxed);
    absl::StatusOr<std::string> bytes = compute();
    if (!bytes.ok()) return bytes.status();
    absl::StatusOr<std::shared_ptr<const ChunkValue>> v =
        VerifyForPut(key, *std::move(bytes));
    if (!v.ok()) return v.status();
    {
      std::lock_guard<std::mutex> w(write_mu_);
      if (!PutVerifiedLocked(key, *v, /*insert_into_ram=*/false).ok()) {
        counters_.put_errors.fetch_add(1, std::memory_order_relaxed);
      }
    }
    ram_.Insert(key, *v);
    GetResult r;
    r.status = GetStatus::kFound;
    r.value = *std::move(v);
    r.computed = true;
    return r;
  }();
  absl::StatusOr<GetResult> mine = result;
  computes_.Finish(key, flight, std::move(result));
  // Also overwrites a value in the cluster that failed verification.
  if (mine.ok() && mine->computed) WriteBehind(key, mine->value);
  return mine;
}

absl::Status ChunkStore::Impl::PersistAccessOrder() {
  rocksdb::WriteBatch batch;
  std::vector<std::pair<ChunkKey, uint64_t>> written;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    for (auto& [key, e] : index_) {
      if (e.access_seq == e.persisted_access_seq) continue;
      batch.Put(index_cf_, ToSlice(key.AsBytes()),
                EncodeIndexValue(e.size, e.write_time_s, e.access_seq,
                                 e.model->first));
      written.emplace_back(key, e.access_seq);
    }
  }
  if (written.empty()) return absl::OkStatus();
  rocksdb::Status s = Write(&batch);
  if (!s.ok()) return FromRocks(s, "persist access order");
  std::lock_guard<std::mutex> lock(index_mu_);
  for (const auto& [key, seq] : written) {
    auto it = index_.find(key);
    if (it != index_.end() && it->second.persisted_access_seq < seq) {
      it->second.persisted_access_seq = seq;
    }
  }
  return absl::OkStatus();
}

absl::Status ChunkStore::Impl::CheckFreeDisk(uint64_t record_bytes) {
  if (options_.min_free_disk_bytes == 0) return absl::OkStatus();
  struct statvfs st {};
  if (statvfs(options_.path.c_str(), &st) != 0) return absl::OkStatus();  // cannot tell
  const uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  // The record lands in the WAL now and again in a blob file at flush.
  if (free_bytes >= options_.min_free_disk_bytes + 2 * record_bytes) return absl::OkStatus();
  counters_.write_errors.fetch_add(1, std::memory_order_relaxed);
  return absl::ResourceExhaustedError(absl::StrCat(
      "store disk full: ", free_bytes, " bytes free under ", options_.path,
      ", the store keeps ", options_.min_free_disk_bytes,
      " free (--min-free-disk-bytes); retry after space is freed"));
}

void ChunkStore::Impl::ResumeAfterBackgroundError() {
  if (!write_failed_.load(std::memory_order_relaxed)) return;
  // A failed write (e.g. disk full) puts RocksDB into read-only mode until
  // Resume(); try at most every 200 ms so a full disk is not hammered.
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(resume_mu_);
  if (now - last_resume_ < std::chrono::milliseconds(200)) return;
  last_resume_ = now;
  if (db_->Resume().ok()) {
    write_failed_.store(false, std::memory_order_relaxed);
    counters_.write_resumes.fetch_add(1, std::memory_order_relaxed);
  }
}

rocksdb::Status ChunkStore::Impl::TrackWrite(rocksdb::Status s) {
  if (!s.ok()) {
    write_failed_.store(true, std::memory_order_relaxed);
    counters_.write_errors.fetch_add(1, std::memory_order_relaxed);
  }
  return s;
}

rocksdb::Status ChunkStore::Impl::Write(rocksdb::WriteBatch* batch) {
  ResumeAfterBackgroundError();
  return TrackWrite(db_->Write(WriteOpts(), batch));
}

absl::Status ChunkStore::Impl::Compact() {
  {
    std::lock_guard<std::mutex> w(write_mu_);
    if (options_.ttl_seconds > 0) {
      std::vector<ChunkKey> expired;
      const int64_t now = Now();
      {
        std::lock_guard<std::mutex> lock(index_mu_);
        for (const auto& [key, e] : index_) {
          if (ExpiredLocked(e, now)) expired.push_back(key);
        }
      }
      uint64_t removed = 0;
      absl::Status s =
          DeleteKeysLocked(expired, &counters_.ttl_expirations, &removed);
      if (!s.ok()) return s;
    }
    // Under write_mu_ so a concurrent Put's index entry is not overwritten
    // with a stale copy.
    if (absl::Status s = PersistAccessOrder(); !s.ok()) return s;
  }
  ResumeAfterBackgroundError();
  rocksdb::FlushOptions fo;
  rocksdb::Status s = TrackWrite(db_->Flush(fo, {data_cf_, index_cf_}));
  if (!s.ok()) return FromRocks(s, "flush");
  rocksdb::CompactRangeOptions co;
  co.blob_garbage_collection_policy =
      rocksdb::BlobGarbageCollectionPolicy::kForce;
  co.blob_garbage_collection_age_cutoff = 1.0;
  for (rocksdb::ColumnFamilyHandle* cf : {data_cf_, index_cf_}) {
    s = TrackWrite(db_->CompactRange(co, cf, nullptr, nullptr));
    if (!s.ok()) return FromRocks(s, "compact");
  }
  return absl::OkStatus();
}

StoreStats ChunkStore::Impl::Stats() const {
  StoreStats st;
  {
    std::lock_guard<std::mutex> lock(index_mu_);
    st.records = index_.size();
    st.bytes = total_bytes_;
    st.per_model = models_;
  }
  auto load = [](const std::atomic<uint64_t>& a) {
    return a.load(std::memory_order_relaxed);
  };
  st.ram_hits = load(counters_.ram_hits);
  st.disk_hits = load(counters_.disk_hits);
  st.misses = load(counters_.misses);
  st.corrupt = load(counters_.corrupt);
  st.ram_evictions = load(counters_.ram_evictions);
  st.capacity_evictions = load(counters_.capacity_evictions);
  st.ttl_expirations = load(counters_.ttl_expirations);
  st.bytes_read = load(counters_.bytes_read);
  st.bytes_written = load(counters_.bytes_written);
  st.ram_bytes = load(counters_.ram_bytes);
  st.ram_entries = load(counters_.ram_entries);
  st.remote_hits = load(counters_.remote_hits);
  st.remote_misses = load(counters_.remote_misses);
  st.remote_corrupt = load(counters_.remote_corrupt) + load(counters_.remote_wrong_model);
  st.remote_errors = load(counters_.remote_errors_timeout) +
                     load(counters_.remote_errors_connection) +
                     load(counters_.remote_errors_redirect) +
                     load(counters_.remote_errors_circuit_open) +
                     load(counters_.remote_errors_server);
  st.remote_bytes_read = load(counters_.remote_bytes_read);
  st.remote_bytes_written = load(counters_.remote_bytes_written);
  st.remote_pending_writes = load(counters_.remote_pending_writes);
  st.remote_pending_bytes = load(counters_.remote_pending_bytes);
  st.remote_writes = load(counters_.remote_writes);
  st.remote_write_failed = load(counters_.remote_write_failed);
  st.remote_write_dropped = load(counters_.remote_write_dropped);
  st.remote_fill_dropped = load(counters_.remote_fill_dropped);
  for (rocksdb::ColumnFamilyHandle* cf : {data_cf_, index_cf_}) {
    uint64_t v = 0;
    if (db_->GetIntProperty(cf, rocksdb::DB::Properties::kTotalSstFilesSize,
                            &v)) {
      st.disk_bytes += v;
    }
    if (db_->GetIntProperty(cf, rocksdb::DB::Properties::kTotalBlobFileSize,
                            &v)) {
      st.disk_bytes += v;
    }
  }
  return st;
}

// ---- ChunkStore: thin forwarding to Impl ----

ChunkStore::ChunkStore(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChunkStore::~ChunkStore() = default;

absl::StatusOr<std::unique_ptr<ChunkStore>> ChunkStore::Open(
    ChunkStoreOptions options) {
  auto impl = std::make_unique<Impl>(options);
  absl::Status s = impl->Open();
  if (s.ok()) s = impl->OpenRemote();
  if (s.ok()) return std::unique_ptr<ChunkStore>(new ChunkStore(std::move(impl)));
  if (!absl::IsDataLoss(s) || !options.quarantine_if_damaged) return s;
  impl.reset();  // closes what was opened
  const std::string aside = absl::StrCat(
      options.path, ".quarantined-",
      std::chrono::duration_cast<std::chrono::seconds>(
          std::chrono::system_clock::now().time_since_epoch())
          .count());
  std::error_code ec;
  std::filesystem::rename(options.path, aside, ec);
  if (ec) {
    return absl::Status(s.code(), absl::StrCat(s.message(), "; could not move the store aside to ",
                                               aside, ": ", ec.message()));
  }
  impl = std::make_unique<Impl>(std::move(options));
  if (absl::Status fresh = impl->Open(); !fresh.ok()) return fresh;
  if (absl::Status r = impl->OpenRemote(); !r.ok()) return r;
  impl->counters_.quarantined.store(1, std::memory_order_relaxed);
  auto store = std::unique_ptr<ChunkStore>(new ChunkStore(std::move(impl)));
  store->quarantined_path_ = aside;
  store->quarantine_reason_ = std::string(s.message());
  return store;
}

absl::StatusOr<PutResult> ChunkStore::Put(const ChunkKey& key,
                                          std::string record) {
  return impl_->Put(key, std::move(record));
}
absl::StatusOr<GetResult> ChunkStore::Get(const ChunkKey& key) {
  return impl_->Get(key);
}
std::vector<absl::StatusOr<GetResult>> ChunkStore::MultiGet(
    absl::Span<const ChunkKey> keys) {
  return impl_->MultiGet(keys);
}
absl::StatusOr<GetResult> ChunkStore::GetOrCompute(
    const ChunkKey& key,
    const std::function<absl::StatusOr<std::string>()>& compute,
    bool just_missed) {
  return impl_->GetOrCompute(key, compute, just_missed);
}
absl::StatusOr<bool> ChunkStore::Delete(const ChunkKey& key) {
  return impl_->Delete(key);
}
StoreStats ChunkStore::Stats() const { return impl_->Stats(); }
const StoreCounters& ChunkStore::counters() const { return impl_->counters_; }
absl::Status ChunkStore::Compact() { return impl_->Compact(); }
rocksdb::DB* ChunkStore::db_for_testing() const { return impl_->db_.get(); }
rocksdb::ColumnFamilyHandle* ChunkStore::data_cf_for_testing() const {
  return impl_->data_cf_;
}
void ChunkStore::ClearRamTierForTesting() { impl_->ram_.Clear(); }
void ChunkStore::PauseLocalFillsForTesting(bool paused) { impl_->PauseLocalFills(paused); }
RemoteWriteState ChunkStore::RemoteState(const ChunkKey& key) const {
  return impl_->RemoteState(key);
}
std::vector<UnwrittenRecord> ChunkStore::DrainRemoteWrites(std::chrono::milliseconds timeout) {
  return impl_->DrainRemoteWrites(timeout);
}
bool ChunkStore::WaitForLocalFills(std::chrono::milliseconds timeout) {
  return impl_->WaitForLocalFills(timeout);
}
RedisCluster* ChunkStore::remote_cluster() const { return impl_->remote_.get(); }
std::string ChunkStore::RemoteKey(const ChunkKey& key) const { return impl_->RemoteKey(key); }

}  // namespace infoflow::store
