// ChunkStore against a real RocksDB in a temp dir: persistence, corruption
// handling, RAM tier, single-flight, capacity, TTL, stats, concurrency.
#include "cache_store/chunk_store.h"

#include <rocksdb/db.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/store/store_test_util.h"
#include "tests/store/test_records.h"

namespace infoflow::store {
namespace {

using testing::MakeRecord;
using testing::RecordShape;
using testing::TempDir;
using testing::TestRecord;

ChunkStoreOptions FastOptions(const TempDir& dir) {
  ChunkStoreOptions o;
  o.path = dir.path();
  // Tests that are not about durability skip fsync; the WAL is still on,
  // so a clean close/reopen is unaffected.
  o.sync = false;
  o.ram_tier_bytes = 64 << 20;
  return o;
}

std::unique_ptr<ChunkStore> MustOpen(const ChunkStoreOptions& o) {
  auto s = ChunkStore::Open(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? *std::move(s) : nullptr;
}

GetStatus StatusOf(ChunkStore& store, const ChunkKey& key) {
  auto r = store.Get(key);
  EXPECT_TRUE(r.ok()) << r.status();
  return r.ok() ? r->status : GetStatus::kNotFound;
}

TEST(ChunkStoreTest, PutGetAndIdempotentPut) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  const TestRecord rec = MakeRecord(1);
  auto put = store->Put(rec.key, rec.bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(*put, PutResult::kStored);
  put = store->Put(rec.key, rec.bytes);
  ASSERT_TRUE(put.ok());
  EXPECT_EQ(*put, PutResult::kAlreadyPresent);

  auto got = store->Get(rec.key);
  ASSERT_TRUE(got.ok());
  ASSERT_EQ(got->status, GetStatus::kFound);
  EXPECT_EQ(got->value->bytes(), rec.bytes);
  EXPECT_FALSE(got->from_ram);  // ram_insert_on_put is off
  auto again = store->Get(rec.key);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->from_ram);
  EXPECT_EQ(again->value.get(), got->value.get());  // shared, not copied
  EXPECT_EQ(again->value->record().token_ids.size(), 16u);

  EXPECT_EQ(StatusOf(*store, MakeRecord(2).key), GetStatus::kNotFound);
  const StoreCounters& c = store->counters();
  EXPECT_EQ(c.disk_hits.load(), 1u);
  EXPECT_EQ(c.ram_hits.load(), 1u);
  EXPECT_EQ(c.misses.load(), 1u);
  EXPECT_EQ(c.puts_stored.load(), 1u);
  EXPECT_EQ(c.puts_already_present.load(), 1u);
}

// "./data/kv" on a fresh checkout: the parent directory does not exist yet.
TEST(ChunkStoreTest, OpenCreatesMissingParentDirectories) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  o.path = dir.path() + "/a/b/kv";
  const TestRecord rec = MakeRecord(3);
  {
    auto store = MustOpen(o);
    ASSERT_NE(store, nullptr);
    ASSERT_TRUE(store->Put(rec.key, rec.bytes).ok());
  }
  auto store = MustOpen(o);
  ASSERT_NE(store, nullptr);
  EXPECT_EQ(StatusOf(*store, rec.key), GetStatus::kFound);
  o.path = dir.path() + "/x/y/kv";
  o.create_if_missing = false;
  EXPECT_FALSE(ChunkStore::Open(o).ok());
}

TEST(ChunkStoreTest, PutRejectsRecordOfAnotherKeyOrGarbage) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  const TestRecord a = MakeRecord(1), b = MakeRecord(2);
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put(a.key, b.bytes).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(store->Put(a.key, "garbage").status()));
  EXPECT_EQ(StatusOf(*store, a.key), GetStatus::kNotFound);
}

TEST(ChunkStoreTest, TenThousandRecordsSurviveReopen) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  constexpr int kN = 10000;
  {
    auto store = MustOpen(o);
    for (int i = 0; i < kN; ++i) {
      const TestRecord r = MakeRecord(i);
      ASSERT_EQ(*store->Put(r.key, r.bytes), PutResult::kStored) << i;
    }
  }
  auto store = MustOpen(o);
  EXPECT_EQ(store->Stats().records, static_cast<uint64_t>(kN));
  for (int i = 0; i < kN; ++i) {
    const TestRecord r = MakeRecord(i);
    auto got = store->Get(r.key);
    ASSERT_TRUE(got.ok());
    ASSERT_EQ(got->status, GetStatus::kFound) << i;
    ASSERT_EQ(got->value->bytes(), r.bytes) << i;
  }
}

TEST(ChunkStoreTest, LargeRecordsGoThroughBlobFilesAndSurviveReopen) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  RecordShape big;
  big.n_layers = 4;
  big.n_kv_heads = 4;
  big.head_dim = 64;
  big.n_tokens = 128;  // 512 KiB payload
  std::vector<TestRecord> recs;
  for (int i = 0; i < 8; ++i) recs.push_back(MakeRecord(100 + i, big));
  {
    auto store = MustOpen(o);
    for (const auto& r : recs) ASSERT_TRUE(store->Put(r.key, r.bytes).ok());
    ASSERT_TRUE(store->Compact().ok());
    EXPECT_GT(store->Stats().disk_bytes, 8u * 512 * 1024);
  }
  auto store = MustOpen(o);
  std::vector<ChunkKey> keys;
  for (const auto& r : recs) keys.push_back(r.key);
  auto got = store->MultiGet(keys);
  for (size_t i = 0; i < recs.size(); ++i) {
    ASSERT_TRUE(got[i].ok());
    ASSERT_EQ(got[i]->status, GetStatus::kFound);
    EXPECT_EQ(got[i]->value->bytes(), recs[i].bytes);
  }
}

TEST(ChunkStoreTest, MultiGetKeepsOrderAndHandlesDuplicates) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  const TestRecord a = MakeRecord(1), b = MakeRecord(2), c = MakeRecord(3);
  ASSERT_TRUE(store->Put(a.key, a.bytes).ok());
  ASSERT_TRUE(store->Put(c.key, c.bytes).ok());
  ASSERT_TRUE(store->Get(a.key).ok());  // a now in RAM, c only on disk
  std::vector<ChunkKey> keys = {c.key, b.key, a.key, c.key};
  auto got = store->MultiGet(keys);
  ASSERT_EQ(got.size(), 4u);
  EXPECT_EQ(got[0]->status, GetStatus::kFound);
  EXPECT_EQ(got[0]->value->bytes(), c.bytes);
  EXPECT_EQ(got[1]->status, GetStatus::kNotFound);
  EXPECT_EQ(got[2]->status, GetStatus::kFound);
  EXPECT_TRUE(got[2]->from_ram);
  EXPECT_EQ(got[2]->value->bytes(), a.bytes);
  EXPECT_EQ(got[3]->status, GetStatus::kFound);
  EXPECT_EQ(got[3]->value->bytes(), c.bytes);
}

TEST(ChunkStoreTest, DeleteRemovesFromDiskAndRam) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  const TestRecord a = MakeRecord(1);
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store->Put(a.key, a.bytes).ok());
    ASSERT_EQ(StatusOf(*store, a.key), GetStatus::kFound);  // into RAM
    EXPECT_TRUE(*store->Delete(a.key));
    EXPECT_FALSE(*store->Delete(a.key));
    EXPECT_EQ(StatusOf(*store, a.key), GetStatus::kNotFound);
    EXPECT_EQ(store->Stats().records, 0u);
  }
  auto store = MustOpen(o);
  EXPECT_EQ(StatusOf(*store, a.key), GetStatus::kNotFound);
}

// Overwrites the stored value of `key` through RocksDB directly.
void RawWrite(ChunkStore& store, const ChunkKey& key, const std::string& v) {
  rocksdb::Status s = store.db_for_testing()->Put(
      rocksdb::WriteOptions(), store.data_cf_for_testing(),
      rocksdb::Slice(key.AsBytes().data(), key.AsBytes().size()), v);
  ASSERT_TRUE(s.ok()) << s.ToString();
  store.ClearRamTierForTesting();
}

void FlipEveryByte(const RecordShape& shape) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  const TestRecord rec = MakeRecord(42, shape);
  ASSERT_EQ(*store->Put(rec.key, rec.bytes), PutResult::kStored);
  uint64_t expected_corrupt = 0;
  for (size_t i = 0; i < rec.bytes.size(); ++i) {
    std::string bad = rec.bytes;
    bad[i] = static_cast<char>(bad[i] ^ (1 + (i % 255)));
    RawWrite(*store, rec.key, bad);
    ASSERT_EQ(StatusOf(*store, rec.key), GetStatus::kCorrupt) << "byte " << i;
    ++expected_corrupt;
    // Until overwritten it keeps reading as corrupt, and an idempotent Put
    // does not mistake it for present.
    auto put = store->Put(rec.key, rec.bytes);
    ASSERT_TRUE(put.ok()) << put.status();
    ASSERT_EQ(*put, PutResult::kStored) << "byte " << i;
    store->ClearRamTierForTesting();
    auto got = store->Get(rec.key);
    ASSERT_EQ(got->status, GetStatus::kFound) << "byte " << i;
    ASSERT_EQ(got->value->bytes(), rec.bytes);
  }
  EXPECT_EQ(store->counters().corrupt.load(), expected_corrupt);
  EXPECT_EQ(store->Stats().records, 1u);
}

TEST(ChunkStoreCorruptionTest, FlipAnyByteOfInlineValue) {
  FlipEveryByte(RecordShape{});  // ~2.1 KiB, below min_blob_size
}

TEST(ChunkStoreCorruptionTest, FlipAnyByteOfBlobValue) {
  RecordShape shape;
  shape.n_kv_heads = 2;
  shape.head_dim = 32;
  shape.n_tokens = 10;  // ~5.2 KiB, above min_blob_size
  FlipEveryByte(shape);
}

TEST(ChunkStoreCorruptionTest, CorruptionFoundAfterReopenAndRepaired) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  const TestRecord rec = MakeRecord(5);
  const TestRecord other = MakeRecord(6);
  {
    auto store = MustOpen(o);
    ASSERT_TRUE(store->Put(rec.key, rec.bytes).ok());
    // A valid record, but of another key: also corrupt for this key.
    RawWrite(*store, rec.key, other.bytes);
  }
  {
    auto store = MustOpen(o);
    EXPECT_EQ(StatusOf(*store, rec.key), GetStatus::kCorrupt);
    EXPECT_EQ(*store->Put(rec.key, rec.bytes), PutResult::kStored);
  }
  auto store = MustOpen(o);
  auto got = store->Get(rec.key);
  ASSERT_EQ(got->status, GetStatus::kFound);
  EXPECT_EQ(got->value->bytes(), rec.bytes);
  // Truncated and empty values too.
  RawWrite(*store, rec.key, rec.bytes.substr(0, 17));
  EXPECT_EQ(StatusOf(*store, rec.key), GetStatus::kCorrupt);
  ASSERT_TRUE(store->Put(rec.key, rec.bytes).ok());
  RawWrite(*store, rec.key, "");
  store->ClearRamTierForTesting();
  EXPECT_EQ(StatusOf(*store, rec.key), GetStatus::kCorrupt);
}

TEST(ChunkStoreTest, GetOrComputeRunsComputeOnceForConcurrentMisses) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  const TestRecord rec = MakeRecord(9);
  std::atomic<int> calls{0};
  auto compute = [&]() -> absl::StatusOr<std::string> {
    calls.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return rec.bytes;
  };
  constexpr int kThreads = 8;
  std::vector<std::shared_ptr<const ChunkValue>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto r = store->GetOrCompute(rec.key, compute);
      ASSERT_TRUE(r.ok()) << r.status();
      ASSERT_EQ(r->status, GetStatus::kFound);
      seen[t] = r->value;
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(calls.load(), 1);
  for (const auto& v : seen) {
    ASSERT_NE(v, nullptr);
    EXPECT_EQ(v->bytes(), rec.bytes);
  }
  // Stored (write-through) and now a plain hit.
  auto r = store->GetOrCompute(rec.key, compute);
  EXPECT_FALSE(r->computed);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(store->counters().computes.load(), 1u);

  // Errors from compute propagate and nothing is stored.
  const TestRecord other = MakeRecord(10);
  auto failed = store->GetOrCompute(other.key, [] {
    return absl::StatusOr<std::string>(absl::InternalError("prefill failed"));
  });
  EXPECT_TRUE(absl::IsInternal(failed.status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      store->GetOrCompute(other.key, [&] {
             return absl::StatusOr<std::string>(rec.bytes);
           }).status()));
  EXPECT_EQ(StatusOf(*store, other.key), GetStatus::kNotFound);
}

TEST(ChunkStoreTest, ConcurrentMissesOnOneKeyReadDiskOnce) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  RecordShape big;
  big.n_layers = 8;
  big.n_kv_heads = 8;
  big.head_dim = 64;
  big.n_tokens = 128;  // 2 MiB: a read long enough to overlap
  const TestRecord rec = MakeRecord(77, big);
  ASSERT_TRUE(store->Put(rec.key, rec.bytes).ok());
  for (int round = 0; round < 10; ++round) {
    store->ClearRamTierForTesting();
    const uint64_t before = store->counters().disk_hits.load();
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&] {
        auto r = store->Get(rec.key);
        ASSERT_TRUE(r.ok());
        ASSERT_EQ(r->status, GetStatus::kFound);
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(store->counters().disk_hits.load() - before, 1u);
  }
}

TEST(ChunkStoreTest, CapacityEvictsLeastRecentlyAccessed) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  const size_t rec_size = MakeRecord(0).bytes.size();
  o.capacity_bytes = 20 * rec_size + rec_size / 2;
  {
    auto store = MustOpen(o);
    const TestRecord hot = MakeRecord(0);
    ASSERT_TRUE(store->Put(hot.key, hot.bytes).ok());
    for (int i = 1; i < 200; ++i) {
      const TestRecord r = MakeRecord(i);
      ASSERT_EQ(*store->Put(r.key, r.bytes), PutResult::kStored);
      ASSERT_EQ(StatusOf(*store, hot.key), GetStatus::kFound) << i;
      const StoreStats st = store->Stats();
      ASSERT_LE(st.bytes, o.capacity_bytes + rec_size);
      ASSERT_LE(st.bytes, o.capacity_bytes);  // in fact never over at all
    }
    const StoreStats st = store->Stats();
    EXPECT_EQ(st.records, 20u);
    EXPECT_EQ(store->counters().capacity_evictions.load(), 180u);
    // Most recent 19 + the hot one survive; the oldest are gone.
    EXPECT_EQ(StatusOf(*store, MakeRecord(1).key), GetStatus::kNotFound);
    EXPECT_EQ(StatusOf(*store, MakeRecord(199).key), GetStatus::kFound);
    EXPECT_EQ(StatusOf(*store, MakeRecord(181).key), GetStatus::kFound);
    EXPECT_EQ(StatusOf(*store, MakeRecord(180).key), GetStatus::kNotFound);
    ASSERT_TRUE(store->Compact().ok());
  }
  // Access order persists across reopen: touch 181 last, then evict one.
  auto store = MustOpen(o);
  EXPECT_EQ(store->Stats().records, 20u);
  EXPECT_LE(store->Stats().bytes, o.capacity_bytes);
  const TestRecord r = MakeRecord(1000);
  ASSERT_EQ(*store->Put(r.key, r.bytes), PutResult::kStored);
  // 181 was read after 0 and 199 in the block above... the oldest access
  // among survivors is record 182's Put (0, 199, 181 were read later).
  EXPECT_EQ(StatusOf(*store, MakeRecord(182).key), GetStatus::kNotFound);
  EXPECT_EQ(StatusOf(*store, MakeRecord(0).key), GetStatus::kFound);
  EXPECT_EQ(StatusOf(*store, MakeRecord(181).key), GetStatus::kFound);

  RecordShape huge;
  huge.n_tokens = 4096;
  const TestRecord too_big = MakeRecord(5, huge);
  EXPECT_TRUE(absl::IsResourceExhausted(
      store->Put(too_big.key, too_big.bytes).status()));
}

TEST(ChunkStoreTest, TtlExpiresRecords) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  auto now = std::make_shared<std::atomic<int64_t>>(1000);
  o.clock_seconds = [now] { return now->load(); };
  o.ttl_seconds = 60;
  auto store = MustOpen(o);
  const TestRecord a = MakeRecord(1), b = MakeRecord(2);
  ASSERT_TRUE(store->Put(a.key, a.bytes).ok());
  now->store(1030);
  ASSERT_TRUE(store->Put(b.key, b.bytes).ok());
  EXPECT_EQ(StatusOf(*store, a.key), GetStatus::kFound);
  now->store(1060);
  EXPECT_EQ(StatusOf(*store, a.key), GetStatus::kNotFound);
  EXPECT_EQ(StatusOf(*store, b.key), GetStatus::kFound);
  EXPECT_EQ(store->Stats().records, 1u);
  // An expired record is replaced by a fresh Put.
  EXPECT_EQ(*store->Put(a.key, a.bytes), PutResult::kStored);
  now->store(1100);
  ASSERT_TRUE(store->Compact().ok());  // sweeps b
  EXPECT_EQ(store->Stats().records, 1u);
  EXPECT_EQ(store->counters().ttl_expirations.load(), 2u);
  EXPECT_EQ(StatusOf(*store, a.key), GetStatus::kFound);
}

TEST(ChunkStoreTest, StatsPerModelFingerprint) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  {
    auto store = MustOpen(o);
    for (int i = 0; i < 3; ++i) {
      const TestRecord r = MakeRecord(i, {}, "model-a");
      ASSERT_TRUE(store->Put(r.key, r.bytes).ok());
    }
    const TestRecord r = MakeRecord(9, {}, "model-b");
    ASSERT_TRUE(store->Put(r.key, r.bytes).ok());
  }
  auto store = MustOpen(o);
  const StoreStats st = store->Stats();
  ASSERT_EQ(st.per_model.size(), 2u);
  EXPECT_EQ(st.per_model.at("model-a").records, 3u);
  EXPECT_EQ(st.per_model.at("model-b").records, 1u);
  EXPECT_EQ(st.per_model.at("model-b").bytes, MakeRecord(9, {}, "model-b").bytes.size());
  EXPECT_EQ(st.records, 4u);
  EXPECT_EQ(store->counters().records.load(), 4u);
  ASSERT_TRUE(*store->Delete(MakeRecord(9, {}, "model-b").key));
  EXPECT_EQ(store->Stats().per_model.count("model-b"), 0u);
}

TEST(ChunkStoreTest, SecondOpenOfSameDirFails) {
  TempDir dir;
  auto store = MustOpen(FastOptions(dir));
  EXPECT_FALSE(ChunkStore::Open(FastOptions(dir)).ok());
}

// 8 threads of mixed Get/MultiGet/Put/Delete/GetOrCompute for ~2 s over a
// small key set with a capacity limit and a small RAM tier, so eviction,
// single-flight and replacement paths all race. Run under TSan
// (-DINFOFLOW_TSAN=ON) to check for data races.
TEST(StoreConcurrencyTest, MixedOpsEightThreads) {
  TempDir dir;
  ChunkStoreOptions o = FastOptions(dir);
  constexpr int kKeys = 48;
  std::vector<TestRecord> recs;
  for (int i = 0; i < kKeys; ++i) recs.push_back(MakeRecord(i));
  o.capacity_bytes = 32 * recs[0].bytes.size();
  o.ram_tier_bytes = 16 * recs[0].bytes.size();
  auto store = MustOpen(o);
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> ops{0}, errors{0}, wrong{0};
  auto check = [&](const absl::StatusOr<GetResult>& r, int i) {
    if (!r.ok()) {
      errors.fetch_add(1);
      return;
    }
    if (r->status == GetStatus::kCorrupt) wrong.fetch_add(1);
    if (r->status == GetStatus::kFound && r->value->bytes() != recs[i].bytes) {
      wrong.fetch_add(1);
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      while (!stop.load(std::memory_order_relaxed)) {
        const int i = static_cast<int>(rng() % kKeys);
        switch (rng() % 10) {
          case 0:
          case 1:
          case 2:
            check(store->Get(recs[i].key), i);
            break;
          case 3: {
            const int j = static_cast<int>(rng() % kKeys);
            std::vector<ChunkKey> keys = {recs[i].key, recs[j].key};
            auto r = store->MultiGet(keys);
            check(r[0], i);
            check(r[1], j);
            break;
          }
          case 4:
          case 5:
          case 6: {
            auto r = store->Put(recs[i].key, recs[i].bytes);
            if (!r.ok()) errors.fetch_add(1);
            break;
          }
          case 7:
            if (!store->Delete(recs[i].key).ok()) errors.fetch_add(1);
            break;
          case 8:
            check(store->GetOrCompute(
                      recs[i].key,
                      [&]() -> absl::StatusOr<std::string> {
                        return recs[i].bytes;
                      }),
                  i);
            break;
          case 9:
            (void)store->Stats();
            break;
        }
        ops.fetch_add(1, std::memory_order_relaxed);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(2));
  stop.store(true);
  for (auto& th : threads) th.join();
  EXPECT_EQ(errors.load(), 0u);
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_GT(ops.load(), 1000u);
  const StoreStats st = store->Stats();
  EXPECT_LE(st.bytes, o.capacity_bytes);
  // The in-memory accounting matches the index rebuilt from disk.
  store.reset();
  auto reopened = MustOpen(o);
  EXPECT_EQ(reopened->Stats().records, st.records);
  EXPECT_EQ(reopened->Stats().bytes, st.bytes);
  std::printf("[ mixed ops ] %llu ops in 2 s\n",
              static_cast<unsigned long long>(ops.load()));
}

}  // namespace
}  // namespace infoflow::store
