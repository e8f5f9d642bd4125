// store_bench: read/write throughput of ChunkStore vs memcpy, per
// compression setting. Not run by ctest.
//
//   build-store/tests/store/store_bench [--benchmark_filter=...]
//
// A "query" is MultiGet of 8 chunks x 1 MiB (bf16 N(0,1) values, the shape
// of a real KV chunk). Paths measured:
//   Memcpy              copy the same 8 MiB (the yardstick)
//   MultiGetRam         RAM-tier hits (zero-copy shared_ptr hand-out)
//   MultiGetRamCopyOut  ... plus copying each payload out, as an engine that
//                       needs its own tensor memory would
//   MultiGetDiskWarm    RAM tier off; RocksDB + OS page cache warm
//   MultiGetDiskCold    RAM tier off; store reopened before every query, so
//                       RocksDB's block cache is empty (OS page cache is not
//                       dropped: that needs root)
//   Put/sync:{0,1}      1 MiB records, fresh keys; reports disk bytes / bytes
// Rates are per wall-clock second (UseRealTime). main() applies
// TuneMallocForLargeValues() unless STORE_BENCH_NO_MALLOC_TUNING=1.
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "cache_store/chunk_store.h"
#include "cache_store/malloc_tuning.h"
#include "tests/store/test_records.h"

namespace infoflow::store {
namespace {

using testing::MakeRecord;
using testing::RecordShape;
using testing::TestRecord;

constexpr int kChunks = 8;

RecordShape OneMiB() {
  RecordShape s;
  s.n_layers = 8;
  s.n_kv_heads = 4;
  s.head_dim = 64;
  s.n_tokens = 128;  // 8 x 2 x 4 x 128 x 64 x 2 B = 1 MiB payload
  s.dtype = KvDtype::kBf16;
  return s;
}

const char* Name(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kLz4:
      return "lz4";
    case Compression::kZstd:
      return "zstd";
  }
  return "?";
}

std::string BenchDir(const std::string& tag) {
  auto p = std::filesystem::temp_directory_path() /
           ("store_bench_" + tag + "_" + std::to_string(getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

const std::vector<TestRecord>& Records() {
  static const auto* recs = [] {
    auto* v = new std::vector<TestRecord>;
    for (int i = 0; i < kChunks; ++i) v->push_back(MakeRecord(i, OneMiB()));
    return v;
  }();
  return *recs;
}

std::vector<ChunkKey> Keys() {
  std::vector<ChunkKey> keys;
  for (const auto& r : Records()) keys.push_back(r.key);
  return keys;
}

uint64_t QueryBytes() {
  uint64_t n = 0;
  for (const auto& r : Records()) n += r.bytes.size();
  return n;
}

std::unique_ptr<ChunkStore> OpenFilled(const std::string& dir, Compression c,
                                       uint64_t ram_bytes) {
  ChunkStoreOptions o;
  o.path = dir;
  o.compression = c;
  o.sync = false;
  o.ram_tier_bytes = ram_bytes;
  auto store = ChunkStore::Open(o);
  if (!store.ok()) return nullptr;
  for (const auto& r : Records()) (void)(*store)->Put(r.key, r.bytes);
  // Flush so reads come from blob files, not the memtable.
  (void)(*store)->Compact();
  return *std::move(store);
}

void CheckAllFound(benchmark::State& state,
                   const std::vector<absl::StatusOr<GetResult>>& got) {
  for (const auto& r : got) {
    if (!r.ok() || r->status != GetStatus::kFound) {
      state.SkipWithError("MultiGet did not find a chunk");
      return;
    }
  }
}

void BM_Memcpy(benchmark::State& state) {
  std::vector<std::string> dst;
  for (const auto& r : Records()) dst.emplace_back(r.bytes.size(), '\0');
  for (auto _ : state) {
    for (int i = 0; i < kChunks; ++i) {
      std::memcpy(dst[i].data(), Records()[i].bytes.data(), dst[i].size());
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * QueryBytes());
}

void BM_MultiGetRam(benchmark::State& state, Compression c, bool copy_out) {
  const std::string dir = BenchDir("ram");
  auto store = OpenFilled(dir, c, uint64_t{1} << 30);
  const auto keys = Keys();
  CheckAllFound(state, store->MultiGet(keys));  // loads into RAM
  std::vector<std::string> dst;
  for (const auto& r : Records()) dst.emplace_back(r.bytes.size(), '\0');
  for (auto _ : state) {
    auto got = store->MultiGet(keys);
    if (copy_out) {
      for (int i = 0; i < kChunks; ++i) {
        const std::string_view p = got[i]->value->record().payload;
        std::memcpy(dst[i].data(), p.data(), p.size());
      }
    }
    benchmark::DoNotOptimize(got);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * QueryBytes());
  state.counters["ram_hits"] = store->counters().ram_hits.load();
  store.reset();
  std::filesystem::remove_all(dir);
}

void BM_MultiGetDisk(benchmark::State& state, Compression c, bool cold) {
  const std::string dir = BenchDir("disk");
  auto store = OpenFilled(dir, c, 0);
  const auto keys = Keys();
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      store.reset();
      ChunkStoreOptions o;
      o.path = dir;
      o.compression = c;
      o.ram_tier_bytes = 0;
      store = *ChunkStore::Open(o);
      state.ResumeTiming();
    }
    auto got = store->MultiGet(keys);
    CheckAllFound(state, got);
    benchmark::DoNotOptimize(got);
  }
  state.SetBytesProcessed(state.iterations() * QueryBytes());
  store.reset();
  std::filesystem::remove_all(dir);
}

void BM_Put(benchmark::State& state, Compression c, bool sync) {
  const std::string dir = BenchDir("put");
  ChunkStoreOptions o;
  o.path = dir;
  o.compression = c;
  o.sync = sync;
  o.ram_tier_bytes = 0;
  auto store = *ChunkStore::Open(o);
  // Pre-generate distinct records so generation is not timed.
  std::vector<TestRecord> recs;
  for (int i = 0; i < 64; ++i) recs.push_back(MakeRecord(1000 + i, OneMiB()));
  uint64_t bytes = 0;
  size_t next = 0;
  for (auto _ : state) {
    if (next == recs.size()) {
      state.PauseTiming();
      for (const auto& r : recs) (void)store->Delete(r.key);
      next = 0;
      state.ResumeTiming();
    }
    auto put = store->Put(recs[next].key, recs[next].bytes);
    if (!put.ok() || *put != PutResult::kStored) {
      state.SkipWithError("put failed");
      break;
    }
    bytes += recs[next].bytes.size();
    ++next;
  }
  state.SetBytesProcessed(bytes);
  // Compression ratio of what is stored now (after flush + blob GC).
  uint64_t logical = store->Stats().bytes;
  (void)store->Compact();
  const StoreStats st = store->Stats();
  if (logical > 0) {
    state.counters["disk_over_logical"] =
        static_cast<double>(st.disk_bytes) / static_cast<double>(logical);
  }
  store.reset();
  std::filesystem::remove_all(dir);
}

void RegisterAll() {
  benchmark::RegisterBenchmark("Memcpy/8x1MiB", BM_Memcpy)
      ->Unit(benchmark::kMicrosecond)->UseRealTime();
  for (Compression c :
       {Compression::kNone, Compression::kLz4, Compression::kZstd}) {
    const std::string n = Name(c);
    benchmark::RegisterBenchmark(("MultiGetRam/" + n).c_str(), BM_MultiGetRam,
                                 c, false)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("MultiGetRamCopyOut/" + n).c_str(),
                                 BM_MultiGetRam, c, true)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("MultiGetDiskWarm/" + n).c_str(),
                                 BM_MultiGetDisk, c, false)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("MultiGetDiskCold/" + n).c_str(),
                                 BM_MultiGetDisk, c, true)
        ->Unit(benchmark::kMicrosecond)->UseRealTime()
        ->Iterations(20);
    benchmark::RegisterBenchmark(("Put/sync:0/" + n).c_str(), BM_Put, c, false)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
    benchmark::RegisterBenchmark(("Put/sync:1/" + n).c_str(), BM_Put, c, true)
        ->Unit(benchmark::kMicrosecond)->UseRealTime();
  }
}

}  // namespace
}  // namespace infoflow::store

int main(int argc, char** argv) {
  // As the server should (see malloc_tuning.h); STORE_BENCH_NO_MALLOC_TUNING=1
  // measures the glibc defaults instead.
  const char* no_tuning = std::getenv("STORE_BENCH_NO_MALLOC_TUNING");
  if (no_tuning == nullptr || std::string(no_tuning) != "1") {
    if (!infoflow::store::TuneMallocForLargeValues()) return 1;
  }
  infoflow::store::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
