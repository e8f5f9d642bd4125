// remote_bench: the shared chunk-KV tier (Redis Cluster) on loopback. Starts
// a real cluster (--masters redis-server processes, no replicas, in a temp
// dir) and real infoflow-server processes, and measures
//
//  1. fetch throughput from the cluster with RedisCluster::MultiGet (one
//     pipeline per master: every master at once, one after another, and
//     with the server's default options) vs one GET at a time, for
//     8 x 1 MiB values and for 8 real chunk records (--chunk-tokens tokens of
//     the generated 6-layer 512-wide model, BOS prefix, bf16), the latter
//     also with record verification (xxh64 + header + key);
//  2. INFOFLOW TTFT at --context tokens with the chunks served from RAM,
//     RocksDB (--ram-bytes=0), the cluster (local copies deleted before each
//     rep) and recomputed (no shared tier, local copies deleted), same run,
//     median of --reps; and on the RocksDB server, the same query with its
//     chunks only in the cluster vs a local RocksDB hit once the background
//     fill has landed: the ratio (issue #27's target: <= 1.10x), with both
//     queries warm and with both after --idle-wait-ms without a request
//     (past the server's idle trim), and each one's stages;
//  3. two replicas behind round-robin, --queries queries of 4 chunks drawn
//     from a --corpus-chunk corpus: chunk tokens prefilled in total with and
//     without the shared tier, vs the tokens of the distinct chunks drawn.
//
//   remote_bench [--masters 3] [--chunk-tokens 512] [--context 4096] [--reps 5]
//                [--queries 200] [--corpus 64] [--rr-chunk-tokens 128]
//                [--threads 1] [--server BIN] [--idle-wait-ms 2500]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "cache_store/chunk_store.h"
#include "cache_store/malloc_tuning.h"
#include "cache_store/redis_cluster.h"
#include "client/client.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/model.h"
#include "engine/model/runtime.h"
#include "engine/model/test_model.h"
#include "engine/text/tokenizer.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "tests/bench/bench_util.h"
#include "tests/reliability/server_process.h"
#include "tests/remote/redis_cluster_fixture.h"

namespace infoflow {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;
using Clock = std::chrono::steady_clock;

using bench::Median;
using bench::Ms;


// Text of about `tokens` tokens under `tok`, distinct per seed.
std::string TextOfTokens(const Tokenizer& tok, int64_t tokens, uint32_t seed) {
  std::string t = "Record " + std::to_string(seed) + ":";
  uint32_t x = seed * 2654435761u + 17u;
  while (static_cast<int64_t>(tok.Encode(t).size()) < tokens) {
    for (int i = 0; i < 16; ++i) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      t += " ";
      t += bench::kWords[x % bench::kNumWords];
    }
  }
  return t;
}

struct Throughput {
  double all_nodes_gbs = 0;  // MultiGet, every node's pipeline at once
  double one_node_gbs = 0;   // MultiGet, one node's pipeline after another
  double auto_gbs = 0;       // MultiGet with the server's (default) options
  double serial_gbs = 0;     // one GET at a time
  double verify_gbs = 0;     // auto MultiGet + record verification
};

// Median GB/s of fetching `keys` (`bytes` in all) with each client, `reps`
// rounds interleaved so that drift on a shared box hits every way alike.
Throughput MeasureFetch(store::RedisCluster& all, store::RedisCluster& one,
                        store::RedisCluster& automatic, const std::vector<std::string>& keys,
                        uint64_t bytes, int reps, bool verify) {
  Throughput t;
  for (store::RedisCluster* c : {&all, &one, &automatic}) (void)c->MultiGet(keys);  // connect
  std::vector<double> t_all, t_one, t_auto, t_ser, t_ver;
  auto time_ms = [](auto f) {
    const auto t0 = Clock::now();
    f();
    return Ms(Clock::now() - t0);
  };
  auto check = [](const auto& got) {
    for (auto& g : got) {
      if (!g.ok() || !g->has_value()) std::fprintf(stderr, "fetch failed\n");
    }
  };
  for (int r = 0; r < reps; ++r) {
    t_all.push_back(time_ms([&] { check(all.MultiGet(keys)); }));
    t_one.push_back(time_ms([&] { check(one.MultiGet(keys)); }));
    t_auto.push_back(time_ms([&] { check(automatic.MultiGet(keys)); }));
    t_ser.push_back(time_ms([&] {
      for (const std::string& k : keys) (void)automatic.Get(k);
    }));
    if (verify) {
      t_ver.push_back(time_ms([&] {
        for (auto& g : automatic.MultiGet(keys)) {
          auto v = store::ChunkValue::Create(**std::move(g));
          if (!v.ok()) std::fprintf(stderr, "verify failed\n");
        }
      }));
    }
  }
  auto gbs = [&](const std::vector<double>& ms) { return bytes / (Median(ms) / 1e3) / 1e9; };
  t.all_nodes_gbs = gbs(t_all);
  t.one_node_gbs = gbs(t_one);
  t.auto_gbs = gbs(t_auto);
  t.serial_gbs = gbs(t_ser);
  if (verify) t.verify_gbs = gbs(t_ver);
  return t;
}

void PrintFetch(const char* what, const Throughput& t, bool verify) {
  std::printf("fetch %s: all nodes at once %.2f GB/s | one node at a time %.2f GB/s | "
              "default options %.2f GB/s | one GET at a time %.2f GB/s",
              what, t.all_nodes_gbs, t.one_node_gbs, t.auto_gbs, t.serial_gbs);
  if (verify) std::printf(" | default + verification %.2f GB/s", t.verify_gbs);
  std::printf("\n");
}

int Main(int argc, char** argv) {
  int masters = 3, reps = 5, queries = 200, corpus = 64, threads = 1, idle_wait_ms = 2500;
  int64_t chunk_tokens = 512, context = 4096, rr_chunk_tokens = 128;
  std::string server_bin = INFOFLOW_SERVER_BIN;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h" || i + 1 >= argc) {
      std::printf(
          "usage: remote_bench [--masters 3] [--chunk-tokens 512] [--context 4096] [--reps 5]\n"
          "  [--queries 200] [--corpus 64] [--rr-chunk-tokens 128] [--threads 1] [--server BIN]\n"
          "  [--idle-wait-ms 2500 (0 = no after-idle pair)]\n"
          "Starts a Redis Cluster (redis-server, no replicas) and infoflow-server processes on\n"
          "127.0.0.1 and measures the shared tier: fetch GB/s, TTFT by tier, and tokens\n"
          "prefilled by two round-robin replicas with and without it.\n");
      return f == "--help" || f == "-h" ? 0 : 2;
    }
    const std::string v = argv[++i];
    if (f == "--masters") masters = std::max(1, std::atoi(v.c_str()));
    else if (f == "--chunk-tokens") chunk_tokens = std::atoll(v.c_str());
    else if (f == "--context") context = std::atoll(v.c_str());
    else if (f == "--reps") reps = std::max(1, std::atoi(v.c_str()));
    else if (f == "--queries") queries = std::atoi(v.c_str());
    else if (f == "--corpus") corpus = std::atoi(v.c_str());
    else if (f == "--rr-chunk-tokens") rr_chunk_tokens = std::atoll(v.c_str());
    else if (f == "--threads") threads = std::atoi(v.c_str());
    else if (f == "--server") server_bin = v;
    else if (f == "--idle-wait-ms") idle_wait_ms = std::max(0, std::atoi(v.c_str()));
    else {
      std::fprintf(stderr, "remote_bench: unknown flag %s (see --help)\n", f.c_str());
      return 2;
    }
  }
  InitTorchRuntime(threads);
  // As store_bench: without it glibc re-faults every freed MB-sized buffer.
  if (!store::TuneMallocForLargeValues()) return 1;
  const std::string model_dir = (fs::temp_directory_path() / "infoflow-serve-bench-model").string();
  if (absl::Status s = bench::EnsureBenchModel(model_dir); !s.ok()) {  // serve_bench's model
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  static testing::RedisClusterProcess cluster("bench");
  // The error paths below std::exit(1): stop the cluster's processes then too.
  std::atexit([] { cluster.Stop(); });
  std::string err;
  if (!cluster.Start(masters, 0, &err)) {
    std::fprintf(stderr, "cluster: %s\n", err.c_str());
    return 1;
  }
  std::printf("cluster: %d masters on 127.0.0.1 (redis-server %s)\n", masters,
              cluster.Admin(0, {"INFO", "server"}).find("redis_version:7") != std::string::npos
                  ? "7.x"
                  : "?");
  store::RedisClusterOptions co;
  co.seeds = cluster.Seeds();
  co.timeout = std::chrono::milliseconds(2000);
  auto rc = store::RedisCluster::Create(co);  // the server's defaults
  co.max_parallel_nodes = masters;
  auto rc_all = store::RedisCluster::Create(co);
  co.max_parallel_nodes = 1;
  auto rc_one = store::RedisCluster::Create(co);
  if (!rc.ok() || !rc_all.ok() || !rc_one.ok()) return 1;
  std::printf("\n");

  // ---- 1. fetch throughput.
  {
    std::mt19937_64 rng(1);
    std::vector<std::string> keys;
    uint64_t bytes = 0;
    for (int i = 0; i < 8; ++i) {
      std::string v(1 << 20, '\0');
      for (auto& ch : v) ch = static_cast<char>(rng());
      keys.push_back("bench:mib:" + std::to_string(i));
      bytes += v.size();
      if (!(*rc)->Set(keys.back(), v).ok()) return 1;
    }
    Throughput t = MeasureFetch(**rc_all, **rc_one, **rc, keys, bytes, 2 * reps + 1, false);
    PrintFetch("8 x 1 MiB", t, false);
  }
  LoadOptions lo;
  lo.device = "cpu";
  auto model = Model::Load(model_dir, lo);
  auto tok = Tokenizer::FromFile(model_dir + "/tokenizer.json");
  if (!model.ok() || !tok.ok()) return 1;
  {
    std::vector<std::string> keys;
    uint64_t bytes = 0;
    for (uint32_t i = 0; i < 8; ++i) {
      std::vector<int32_t> ids = (*tok)->Encode(TextOfTokens(**tok, chunk_tokens, 500 + i));
      ids.resize(std::min<size_t>(ids.size(), chunk_tokens));
      auto kv = PrefillChunk(**model, ids, PrefixMode::kBos);
      auto rec = EncodeChunkRecord(**model, *kv, PrefixMode::kBos);
      if (!rec.ok()) return 1;
      keys.push_back("bench:rec:" + ChunkKeyFor(**model, ids, PrefixMode::kBos).Hex());
      bytes += rec->size();
      if (!(*rc)->Set(keys.back(), *rec).ok()) return 1;
    }
    Throughput t = MeasureFetch(**rc_all, **rc_one, **rc, keys, bytes, 2 * reps + 1, true);
    const std::string what = absl::StrFormat("8 chunk records (%lld tokens, %.2f MiB each)",
                                             static_cast<long long>(chunk_tokens),
                                             bytes / 8.0 / (1 << 20));
    PrintFetch(what.c_str(), t, true);
  }

  // ---- 2. TTFT by tier at `context` tokens.
  const std::string root =
      (fs::temp_directory_path() / ("infoflow-remote-bench-" + std::to_string(getpid()))).string();
  fs::remove_all(root);
  auto server = [&](const std::string& name, std::vector<std::string> extra) {
    extra.push_back("--threads=" + std::to_string(threads));
    extra.push_back("--store-sync=false");
    extra.push_back("--max-context-tokens=" + std::to_string(context + 2048));
    extra.push_back("--max-chunk-tokens=" + std::to_string(std::max<int64_t>(2048, chunk_tokens)));
    fs::create_directories(root + "/" + name);
    return std::make_unique<testing::ServerProcess>(server_bin, model_dir, root + "/" + name + "/kv",
                                                    root + "/" + name + "/log", extra);
  };
  // A generous timeout: this is a throughput run on a shared 2-core box, not
  // a fault drill (the default 250 ms is for latency-bound serving).
  const std::string remote = "--remote-redis=" + cluster.SeedList();
  const std::string remote_timeout = "--remote-timeout-ms=2000";
  auto s_ram = server("ram", {remote, remote_timeout, "--remote-key-prefix=ttft:"});
  auto s_disk = server("disk", {remote, remote_timeout, "--remote-key-prefix=ttft:", "--ram-bytes=0"});
  auto s_none = server("none", {});
  for (auto* s : {s_ram.get(), s_disk.get(), s_none.get()}) {
    if (!s->Start(&err, std::chrono::seconds(300))) {
      std::fprintf(stderr, "server: %s\n", err.c_str());
      return 1;
    }
  }
  auto client_of = [](const testing::ServerProcess& s) {
    client::ClientOptions o;
    o.address = s.address();
    o.timeout_ms = 600000;
    return client::Client(o);
  };
  client::Client c_ram = client_of(*s_ram), c_disk = client_of(*s_disk), c_none = client_of(*s_none);
  std::vector<std::string> texts;
  for (int64_t n = 0, i = 0; n < context; ++i) {
    texts.push_back(TextOfTokens(**tok, chunk_tokens, 100 + static_cast<uint32_t>(i)));
    n += static_cast<int64_t>((*tok)->Encode(texts.back()).size());
  }
  std::vector<std::string> keys;
  {
    v1::IngestRequest req;
    for (const auto& t : texts) req.add_chunks()->set_text(t);
    auto r = c_ram.Ingest(req);  // the cluster is written behind it
    if (!r.ok()) {
      std::fprintf(stderr, "ingest: %s\n", r.status().ToString().c_str());
      return 1;
    }
    for (const auto& res : r->results()) keys.push_back(res.chunk_key());
    if (!c_none.Ingest(req).ok()) return 1;
    // The cluster is written behind the ingest: wait for it (bounded).
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (testing::PromValue(s_ram->Metrics(), "infoflow_remote_pending_writes") != 0) {
      if (Clock::now() > until) {
        std::fprintf(stderr, "write-behind did not drain in 120 s\n");
        return 1;
      }
      usleep(20000);
    }
  }
  auto query = [&](client::Client& c, bool by_text) {
    v1::QueryRequest req;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (by_text) req.add_chunks()->set_text(texts[i]);
      else req.add_chunks()->set_key(keys[i]);
    }
    req.set_question("Which village is north of the copper bridge?");
    req.set_method(v1::METHOD_INFOFLOW);
    req.set_max_new_tokens(1);
    req.set_return_report(true);
    auto r = c.Query(req, [](const v1::TokenEvent&) {});
    if (!r.ok()) {
      std::fprintf(stderr, "query: %s\n", r.status().ToString().c_str());
      std::exit(1);
    }
    return *r;
  };
  auto delete_local = [&](const testing::ServerProcess& s) {
    auto admin = v1::Admin::NewStub(s.channel());
    for (const auto& k : keys) {
      grpc::ClientContext ctx;
      v1::DeleteChunkRequest req;
      req.set_chunk_key(k);
      v1::DeleteChunkResponse resp;
      (void)admin->DeleteChunk(&ctx, req, &resp);
    }
  };
  // Waits (bounded) until `s`'s background local fills have written `n`
  // records in all, so its next query reads RocksDB.
  auto wait_fills = [&](const testing::ServerProcess& s, double n) {
    const auto until = Clock::now() + std::chrono::seconds(120);
    while (true) {
      const std::string m = s.Metrics();
      if (testing::PromValue(m, "infoflow_remote_fills_total") >= n &&
          testing::PromValue(m, "infoflow_remote_fill_queue_bytes") == 0) {
        return;
      }
      if (Clock::now() > until) {
        std::fprintf(stderr, "local fills did not land in 120 s\n");
        std::exit(1);
      }
      usleep(20000);
    }
  };
  (void)query(c_disk, false);  // fills s_disk's RocksDB from the cluster (in the background)
  double disk_fills = static_cast<double>(keys.size());
  wait_fills(*s_disk, disk_fills);
  (void)query(c_ram, false);
  // The RocksDB server's pairs: the query with its chunks only in the
  // cluster and the same query on a local RocksDB hit, both warm (right
  // after a query) and both after an idle spell past the trim period.
  struct Pair {
    std::vector<double> cluster, disk;
    std::vector<v1::StageTimings> cluster_stages, disk_stages;
    std::vector<double> cluster_faults, disk_faults;  // the server's, per query
  };
  Pair warm, idle;
  auto measure_pair = [&](Pair* p, int idle_ms) {
    if (idle_ms == 0) (void)query(c_disk, false);  // warm: a query right before
    usleep(idle_ms * 1000);
    int64_t faults = bench::MinorFaults(s_disk->pid());
    v1::Report rep = query(c_disk, false);
    p->disk_faults.push_back(static_cast<double>(bench::MinorFaults(s_disk->pid()) - faults));
    p->disk.push_back(rep.ttft_ms());
    p->disk_stages.push_back(rep.stages());
    delete_local(*s_disk);  // a few ms: warm still means within the trim period
    usleep(idle_ms * 1000);
    faults = bench::MinorFaults(s_disk->pid());
    rep = query(c_disk, false);
    p->cluster_faults.push_back(static_cast<double>(bench::MinorFaults(s_disk->pid()) - faults));
    p->cluster.push_back(rep.ttft_ms());
    p->cluster_stages.push_back(rep.stages());
    if (rep.chunk_remote_hits() != static_cast<int>(keys.size())) {
      std::fprintf(stderr, "expected %zu chunks from the cluster, got %d\n", keys.size(),
                   rep.chunk_remote_hits());
      std::exit(1);
    }
    disk_fills += static_cast<double>(keys.size());
    wait_fills(*s_disk, disk_fills);
  };
  std::vector<double> t_ram, t_cluster, t_recompute;
  int64_t ctx_tokens = 0;
  int cluster_hits = 0;
  for (int r = 0; r < reps; ++r) {
    delete_local(*s_ram);
    v1::Report rep = query(c_ram, false);
    t_cluster.push_back(rep.ttft_ms());
    cluster_hits = rep.chunk_remote_hits();
    t_ram.push_back(query(c_ram, false).ttft_ms());
    // s_ram's fills of the records it just fetched must not share the cores
    // with the next server's query.
    wait_fills(*s_ram, static_cast<double>(keys.size() * (r + 1)));
    measure_pair(&warm, 0);
    if (idle_wait_ms > 0) measure_pair(&idle, idle_wait_ms);  // 0: no after-idle pair
    delete_local(*s_none);
    rep = query(c_none, true);
    ctx_tokens = rep.context_tokens();
    t_recompute.push_back(rep.ttft_ms());
  }
  std::printf("\nINFOFLOW TTFT, %lld context tokens in %zu chunks (median of %d, server-side):\n"
              "  RAM %.1f ms | RocksDB %.1f ms | cluster %.1f ms (%d/%zu chunks from the cluster) | "
              "recompute %.1f ms\n",
              static_cast<long long>(ctx_tokens), keys.size(), reps, Median(t_ram),
              Median(warm.disk), Median(t_cluster), cluster_hits, keys.size(), Median(t_recompute));
  auto stage_line = [](const char* name, const std::vector<v1::StageTimings>& st,
                       const std::vector<double>& faults) {
    auto med = [&](double (v1::StageTimings::*f)() const) {
      std::vector<double> v;
      for (const auto& s : st) v.push_back((s.*f)());
      return Median(v);
    };
    std::printf("      %-13s fetch %.1f | reposition %.1f | score %.1f | recompute %.1f | "
                "prompt %.1f ms | %.0f page faults (%.1f MiB)\n",
                name, med(&v1::StageTimings::fetch_ms), med(&v1::StageTimings::reposition_ms),
                med(&v1::StageTimings::score_ms), med(&v1::StageTimings::recompute_ms),
                med(&v1::StageTimings::prompt_ms), Median(faults),
                Median(faults) * 4096 / (1 << 20));
  };
  std::printf("  chunks only in the cluster vs a local RocksDB hit, same server (--ram-bytes=0), "
              "all %zu chunks from the cluster (issue #27's target: <= 1.10x):\n",
              keys.size());
  for (const auto& [name, p] : {std::pair<const char*, const Pair*>{"warm", &warm},
                                {"after idle", &idle}}) {
    if (p == &idle && idle_wait_ms == 0) continue;
    std::printf("    %-10s %.1f ms / %.1f ms = %.3fx\n", name, Median(p->cluster), Median(p->disk),
                Median(p->cluster) / Median(p->disk));
    stage_line("cluster only", p->cluster_stages, p->cluster_faults);
    stage_line("RocksDB hit", p->disk_stages, p->disk_faults);
  }
  if (idle_wait_ms > 0) {
    std::printf("    (after idle: %d ms without a request before each query; the server trims "
                "after --idle-trim-ms, default 1000)\n", idle_wait_ms);
  }
  s_ram.reset();
  s_disk.reset();
  s_none.reset();

  // ---- 3. two replicas behind round-robin.
  std::vector<std::string> corpus_texts;
  std::vector<int64_t> corpus_tokens;
  for (int i = 0; i < corpus; ++i) {
    corpus_texts.push_back(TextOfTokens(**tok, rr_chunk_tokens, 9000 + static_cast<uint32_t>(i)));
    corpus_tokens.push_back(static_cast<int64_t>((*tok)->Encode(corpus_texts.back()).size()));
  }
  std::mt19937 rng(42);
  std::vector<std::vector<int>> draws(queries);
  std::set<int> distinct;
  for (auto& d : draws) {
    while (d.size() < 4) {
      const int c = static_cast<int>(rng() % corpus);
      if (std::find(d.begin(), d.end(), c) == d.end()) d.push_back(c);
    }
    for (int c : d) distinct.insert(c);
  }
  int64_t distinct_tokens = 0;
  for (int c : distinct) distinct_tokens += corpus_tokens[c];
  auto run_pair = [&](bool shared, const std::string& tag) -> int64_t {
    std::vector<std::string> extra;
    if (shared) extra = {remote, remote_timeout, "--remote-key-prefix=rr" + tag + ":"};
    auto r1 = server("rr1" + tag, extra), r2 = server("rr2" + tag, extra);
    if (!r1->Start(&err, std::chrono::seconds(300)) || !r2->Start(&err, std::chrono::seconds(300))) {
      std::fprintf(stderr, "server: %s\n", err.c_str());
      std::exit(1);
    }
    client::Client c1 = client_of(*r1), c2 = client_of(*r2);
    for (int q = 0; q < queries; ++q) {
      v1::QueryRequest req;
      for (int c : draws[q]) req.add_chunks()->set_text(corpus_texts[c]);
      req.set_question("Which village is north of the copper bridge?");
      req.set_max_new_tokens(1);
      auto r = (q % 2 ? c2 : c1).Query(req, [](const v1::TokenEvent&) {});
      if (!r.ok()) {
        std::fprintf(stderr, "rr query: %s\n", r.status().ToString().c_str());
        std::exit(1);
      }
    }
    return static_cast<int64_t>(testing::PromValue(r1->Metrics(), "infoflow_ingest_tokens_total") +
                                testing::PromValue(r2->Metrics(), "infoflow_ingest_tokens_total"));
  };
  const auto rr0 = Clock::now();
  const int64_t without = run_pair(false, "local");
  const double without_s = Ms(Clock::now() - rr0) / 1e3;
  const auto rr1 = Clock::now();
  const int64_t with = run_pair(true, "shared");
  const double with_s = Ms(Clock::now() - rr1) / 1e3;
  std::printf("\nround-robin over 2 replicas, %d queries x 4 chunks from a %d-chunk corpus "
              "(~%lld tokens/chunk; %zu distinct chunks drawn, %lld tokens):\n"
              "  tokens prefilled without the shared tier: %lld (%.2fx the distinct tokens, %.1f s)\n"
              "  tokens prefilled with the shared tier:    %lld (%.2fx, %.1f s)\n",
              queries, corpus, static_cast<long long>(rr_chunk_tokens), distinct.size(),
              static_cast<long long>(distinct_tokens), static_cast<long long>(without),
              static_cast<double>(without) / distinct_tokens, without_s,
              static_cast<long long>(with), static_cast<double>(with) / distinct_tokens, with_s);
  fs::remove_all(root);
  return 0;
}

}  // namespace
}  // namespace infoflow

int main(int argc, char** argv) { return infoflow::Main(argc, argv); }
