// infoflow-server replicas sharing one REAL Redis Cluster (3 masters + 3
// replicas on 127.0.0.1, tests/remote/redis_cluster_fixture.h): the shared
// tier end to end through the real server binary.
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cache_store/chunk_key.h"
#include "cache_store/kv_record.h"
#include "cache_store/redis_cluster.h"
#include "gtest/gtest.h"
#include "tests/reliability/reliability_util.h"
#include "tests/remote/redis_cluster_fixture.h"

namespace infoflow {
namespace {
using infoflow::testing::SharedCluster;
using infoflow::testing::SharedClusterTeardown;

using testing::RedisClusterProcess;
using Clock = std::chrono::steady_clock;
using testing::PromValue;

struct Answer {
  std::vector<int32_t> ids;
  v1::Report report;
};

absl::StatusOr<Answer> Ask(client::Client& c, const v1::QueryRequest& req) {
  Answer a;
  absl::StatusOr<v1::Report> r = c.Query(req, [&](const v1::TokenEvent& e) { a.ids.push_back(e.id()); });
  if (!r.ok()) return r.status();
  a.report = *std::move(r);
  return a;
}

v1::QueryRequest QueryTexts(const std::vector<std::string>& texts, int new_tokens = 6) {
  v1::QueryRequest req;
  for (const std::string& t : texts) req.add_chunks()->set_text(t);
  req.set_question("Which street has the copper lamp?");
  req.set_method(v1::METHOD_INFOFLOW);
  req.set_max_new_tokens(new_tokens);
  req.set_return_report(true);
  return req;
}

std::vector<std::string> Ingest(client::Client& c, const std::vector<std::string>& texts,
                                std::vector<v1::RemoteState>* remote_states = nullptr) {
  v1::IngestRequest req;
  req.set_prefix_mode(v1::PREFIX_MODE_BOS);
  for (const std::string& t : texts) req.add_chunks()->set_text(t);
  absl::StatusOr<v1::IngestResponse> resp = c.Ingest(req);
  EXPECT_TRUE(resp.ok()) << resp.status();
  std::vector<std::string> keys;
  if (resp.ok()) {
    for (const auto& r : resp->results()) {
      keys.push_back(r.chunk_key());
      if (remote_states) remote_states->push_back(r.remote_state());
    }
  }
  return keys;
}

// Waits (bounded; never a pass/fail time) until `s`'s write-behind is idle
// with at least `ok` records written to the cluster.
bool WaitWritten(const ServerProcess& s, double ok, int seconds = 30) {
  return RedisClusterProcess::WaitFor(
      [&] {
        const std::string m = s.Metrics();
        return PromValue(m, "infoflow_remote_pending_writes") == 0 &&
               PromValue(m, "infoflow_remote_writes_total{result=\"ok\"}") >= ok;
      },
      seconds);
}

std::vector<std::string> Texts(const std::string& tag, int n, int offset = 0) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) {
    v.push_back(ChunkText(tag + std::to_string(offset + i), static_cast<uint32_t>(offset + i + 1)));
  }
  return v;
}

std::vector<std::string> RemoteArgs(const RedisClusterProcess& c, const std::string& prefix) {
  return {"--remote-redis=" + c.SeedList(), "--remote-key-prefix=" + prefix, "--workers=2",
          "--store-sync=false", "--threads=1"};
}

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SharedClusterTeardown);

std::string RemoteKey(const std::string& prefix, const std::string& key_hex) {
  absl::StatusOr<store::ChunkKey> k = store::ChunkKey::FromHex(key_hex);
  EXPECT_TRUE(k.ok());
  return prefix + std::string(k->AsBytes());
}

TEST(SharedTierServerTest, ReplicaBServesWhatReplicaAIngested) {
  RedisClusterProcess* cluster = SharedCluster();
  TempDir da("two_a"), db("two_b");
  ServerProcess a(ServerBin(), ModelDir(), da.path + "/kv", da.path + "/log",
                  RemoteArgs(*cluster, "two:"));
  ServerProcess b(ServerBin(), ModelDir(), db.path + "/kv", db.path + "/log",
                  RemoteArgs(*cluster, "two:"));
  std::string error;
  ASSERT_TRUE(a.Start(&error)) << error;
  ASSERT_TRUE(b.Start(&error)) << error;
  EXPECT_NE(b.log().find("shared tier: redis cluster"), std::string::npos) << b.log();
  client::Client ca = MakeClient(a), cb = MakeClient(b);
  const std::vector<std::string> texts = Texts("two", 6);
  std::vector<v1::RemoteState> states;
  const std::vector<std::string> keys = Ingest(ca, texts, &states);
  ASSERT_EQ(keys.size(), 6u);
  // The ingest answered after the local write; the cluster is written
  // behind it (usually still pending when the reply is sent).
  for (v1::RemoteState st : states) {
    EXPECT_TRUE(st == v1::REMOTE_STATE_PENDING || st == v1::REMOTE_STATE_WRITTEN) << st;
  }
  ASSERT_TRUE(WaitWritten(a, 6)) << a.Metrics();
  EXPECT_EQ(PromValue(a.Metrics(), "infoflow_remote_pending_bytes"), 0);
  // Present now, and known written.
  std::vector<v1::RemoteState> again;
  Ingest(ca, {texts[0]}, &again);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(again[0], v1::REMOTE_STATE_WRITTEN);

  v1::QueryRequest by_key = QueryKeys(keys, v1::METHOD_INFOFLOW);
  by_key.set_max_new_tokens(8);
  absl::StatusOr<Answer> on_a = Ask(ca, by_key);
  ASSERT_TRUE(on_a.ok()) << on_a.status();
  absl::StatusOr<Answer> on_b = Ask(cb, by_key);
  ASSERT_TRUE(on_b.ok()) << on_b.status() << "\n" << b.log();
  EXPECT_EQ(on_b->report.chunk_hits(), 6);
  EXPECT_EQ(on_b->report.chunk_remote_hits(), 6) << "every chunk from the shared tier";
  EXPECT_EQ(on_b->report.chunk_misses(), 0);
  EXPECT_EQ(on_a->report.chunk_remote_hits(), 0);
  EXPECT_EQ(on_b->ids, on_a->ids) << "B streams exactly A's greedy tokens";
  EXPECT_FALSE(on_b->ids.empty());
  // Nothing was prefilled on B.
  EXPECT_EQ(PromValue(b.Metrics(), "infoflow_ingest_tokens_total"), 0) << b.Metrics();
  EXPECT_EQ(PromValue(b.Metrics(), "infoflow_remote_hits_total"), 6);
  absl::StatusOr<v1::StatsResponse> st = cb.Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->remote_hits(), 6u);
  EXPECT_GT(st->remote_bytes_read(), 0u);
  absl::StatusOr<v1::StatsResponse> sa = ca.Stats();
  EXPECT_EQ(sa->remote_bytes_written(), st->remote_bytes_read());

  // The same chunks as text through a third replica: still no prefill, and
  // the texts' keys are the ingested ones.
  TempDir dc("two_c");
  ServerProcess c(ServerBin(), ModelDir(), dc.path + "/kv", dc.path + "/log",
                  RemoteArgs(*cluster, "two:"));
  ASSERT_TRUE(c.Start(&error)) << error;
  client::Client cc = MakeClient(c);
  v1::QueryRequest by_text = QueryTexts({texts[0], texts[3], texts[5]});
  absl::StatusOr<Answer> on_c = Ask(cc, by_text);
  ASSERT_TRUE(on_c.ok()) << on_c.status();
  EXPECT_EQ(on_c->report.chunk_remote_hits(), 3);
  EXPECT_EQ(on_c->report.chunk_misses(), 0);
  EXPECT_EQ(on_c->report.chunk_keys(1), keys[3]);
  absl::StatusOr<Answer> text_on_a = Ask(ca, by_text);
  ASSERT_TRUE(text_on_a.ok());
  EXPECT_EQ(on_c->ids, text_on_a->ids);
  EXPECT_EQ(PromValue(c.Metrics(), "infoflow_ingest_tokens_total"), 0);
}

TEST(SharedTierServerTest, CorruptValueIsCountedReprefilledAndOverwritten) {
  RedisClusterProcess* cluster = SharedCluster();
  TempDir da("cor_a"), db("cor_b");
  ServerProcess a(ServerBin(), ModelDir(), da.path + "/kv", da.path + "/log",
                  RemoteArgs(*cluster, "cor:"));
  ServerProcess b(ServerBin(), ModelDir(), db.path + "/kv", db.path + "/log",
                  RemoteArgs(*cluster, "cor:"));
  std::string error;
  ASSERT_TRUE(a.Start(&error)) << error;
  ASSERT_TRUE(b.Start(&error)) << error;
  client::Client ca = MakeClient(a), cb = MakeClient(b);
  const std::vector<std::string> texts = Texts("cor", 2);
  const std::vector<std::string> keys = Ingest(ca, texts);
  ASSERT_EQ(keys.size(), 2u);
  ASSERT_TRUE(WaitWritten(a, 2));

  store::RedisClusterOptions o;
  o.seeds = cluster->Seeds();
  auto rc = store::RedisCluster::Create(o);
  ASSERT_TRUE(rc.ok());
  const std::string rk = RemoteKey("cor:", keys[0]);
  auto good = (*rc)->Get(rk);
  ASSERT_TRUE(good.ok() && good->has_value());
  const std::string original = **good;
  std::string bad = original;
  bad[bad.size() / 2] ^= 0x01;  // one flipped bit in the payload
  ASSERT_TRUE((*rc)->Set(rk, bad).ok());

  v1::QueryRequest req = QueryTexts(texts);
  absl::StatusOr<Answer> on_b = Ask(cb, req);
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ(on_b->report.chunk_misses(), 1) << "the corrupt chunk is prefilled again";
  EXPECT_EQ(on_b->report.chunk_remote_hits(), 1);
  const std::string m = b.Metrics();
  EXPECT_EQ(PromValue(m, "infoflow_remote_errors_total{kind=\"corrupt\"}"), 1) << m;
  ASSERT_TRUE(WaitWritten(b, 1)) << "B writes its prefill behind the query";
  // The cluster holds the good record again (B's prefill is bit-identical
  // to A's: same model, same ids, deterministic CPU kernels).
  auto now = (*rc)->Get(rk);
  ASSERT_TRUE(now.ok() && now->has_value());
  EXPECT_TRUE(store::DecodeRecord(**now).ok());
  EXPECT_EQ(**now, original);
  absl::StatusOr<Answer> on_a = Ask(ca, req);
  ASSERT_TRUE(on_a.ok());
  EXPECT_EQ(on_b->ids, on_a->ids);
}

TEST(SharedTierServerTest, FailoverUnderLoadKeepsAnswersRight) {
  RedisClusterProcess cluster("server_failover");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 1, &error, 1000)) << error;
  TempDir da("fo_a"), db("fo_b");
  ServerProcess a(ServerBin(), ModelDir(), da.path + "/kv", da.path + "/log",
                  RemoteArgs(cluster, "fo:"));
  ServerProcess b(ServerBin(), ModelDir(), db.path + "/kv", db.path + "/log",
                  RemoteArgs(cluster, "fo:"));
  ASSERT_TRUE(a.Start(&error)) << error;
  ASSERT_TRUE(b.Start(&error)) << error;
  client::Client ca = MakeClient(a);
  // Chunks B has never seen, so every query of the load reaches the cluster.
  const std::vector<std::string> texts = Texts("fo", 96);
  ASSERT_EQ(Ingest(ca, texts).size(), texts.size());
  ASSERT_TRUE(WaitWritten(a, static_cast<double>(texts.size())));
  // Let the replicas catch up so the promoted one has the data.
  // (Best effort: a replica that lags only turns some hits into recomputes.)
  for (size_t i = 0; i < cluster.nodes().size(); ++i) {
    const std::string repl = cluster.Admin(i, {"INFO", "replication"});
    const size_t at = repl.find("master_port:");
    if (repl.find("role:slave") == std::string::npos || at == std::string::npos) continue;
    const int master = cluster.IndexOfPort(std::atoi(repl.c_str() + at + 12));
    if (master < 0) continue;
    RedisClusterProcess::WaitFor(
        [&] { return cluster.Admin(i, {"DBSIZE"}) == cluster.Admin(master, {"DBSIZE"}); }, 5);
  }

  std::atomic<int> next{0}, failed{0}, done{0};
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<std::pair<v1::QueryRequest, std::vector<int32_t>>> answered;
  std::vector<std::string> failures;
  auto worker = [&] {
    client::Client cb = MakeClient(b);
    while (!stop.load()) {
      const int q = next.fetch_add(1);
      if (q * 2 + 1 >= static_cast<int>(texts.size())) break;
      v1::QueryRequest req = QueryTexts({texts[2 * q], texts[2 * q + 1]}, 4);
      absl::StatusOr<Answer> r = Ask(cb, req);
      std::lock_guard<std::mutex> lock(mu);
      if (!r.ok()) {
        failed++;
        failures.push_back(r.status().ToString());
        continue;
      }
      done++;
      answered.emplace_back(req, r->ids);
    }
  };
  std::vector<std::thread> load;
  for (int t = 0; t < 2; ++t) load.emplace_back(worker);
  // Kill a master once the load is running.
  while (done.load() < 4 && next.load() < 40) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const int victim_port = cluster.MasterPortForSlot(0);
  cluster.Kill(cluster.IndexOfPort(victim_port));
  const auto killed = Clock::now();
  ASSERT_TRUE(cluster.WaitHealthy(20)) << "no failover";
  const double failover_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - killed).count();
  for (auto& t : load) t.join();
  EXPECT_EQ(failed.load(), 0) << (failures.empty() ? "" : failures[0]);
  EXPECT_TRUE(b.Alive()) << b.log();
  EXPECT_TRUE(b.Healthy());
  // Every answer equals A's for the same query (A holds every chunk locally).
  int wrong = 0;
  for (const auto& [req, ids] : answered) {
    absl::StatusOr<Answer> ref = Ask(ca, req);
    ASSERT_TRUE(ref.ok());
    if (ref->ids != ids) ++wrong;
  }
  EXPECT_EQ(wrong, 0);
  const std::string m = b.Metrics();
  std::printf("failover under load: %zu queries on B, %d failed, %d wrong, failover %.0f ms, "
              "remote hits %.0f, errors timeout=%.0f connection=%.0f circuit_open=%.0f\n",
              answered.size(), failed.load(), wrong, failover_ms,
              PromValue(m, "infoflow_remote_hits_total"),
              PromValue(m, "infoflow_remote_errors_total{kind=\"timeout\"}"),
              PromValue(m, "infoflow_remote_errors_total{kind=\"connection\"}"),
              PromValue(m, "infoflow_remote_errors_total{kind=\"circuit_open\"}"));

  // Both running clients follow the new slot map: chunks ingested through A
  // now (some land on the promoted replica's slots) are shared-tier hits on B.
  std::this_thread::sleep_for(std::chrono::milliseconds(2100));  // any open circuit closes
  const std::vector<std::string> after = Texts("after", 9);
  const std::vector<std::string> keys = Ingest(ca, after);
  ASSERT_EQ(keys.size(), after.size());
  ASSERT_TRUE(WaitWritten(a, static_cast<double>(texts.size() + after.size()))) << a.Metrics();
  bool on_promoted = false;
  for (const std::string& k : keys) {
    on_promoted |= cluster.MasterPortForSlot(store::RedisCluster::KeySlot(RemoteKey("fo:", k))) !=
                   victim_port &&
                   store::RedisCluster::KeySlot(RemoteKey("fo:", k)) <= 5460;
  }
  EXPECT_TRUE(on_promoted) << "some chunk should live on the promoted replica's slots";
  client::Client cb = MakeClient(b);
  absl::StatusOr<Answer> r = Ask(cb, QueryKeys(keys, v1::METHOD_INFOFLOW));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->report.chunk_remote_hits(), static_cast<int>(keys.size()));
  EXPECT_GT(PromValue(b.Metrics(), "infoflow_remote_slot_map_refreshes_total"), 1);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

TEST(SharedTierServerTest, UnreachableClusterAddsBoundedTtft) {
  // At start: the only seed accepts connections but never answers (worse
  // than a refused connection: every attempt runs into the timeout).
  const testing::LoopbackSocket silent_node = testing::BindLoopback(/*backlog=*/128);
  ASSERT_GE(silent_node.fd, 0);
  const std::string silent = silent_node.address();

  TempDir dl("dead_local"), dr("dead_remote");
  ServerProcess local(ServerBin(), ModelDir(), dl.path + "/kv", dl.path + "/log",
                      {"--store-sync=false", "--threads=1"});
  ServerProcess dead(ServerBin(), ModelDir(), dr.path + "/kv", dr.path + "/log",
                     {"--remote-redis=" + silent, "--remote-timeout-ms=100", "--store-sync=false",
                      "--threads=1"});
  std::string error;
  ASSERT_TRUE(local.Start(&error)) << error;
  ASSERT_TRUE(dead.Start(&error)) << error;
  EXPECT_NE(dead.log().find("unreachable now"), std::string::npos) << dead.log();
  client::Client cl = MakeClient(local), cd = MakeClient(dead);
  std::vector<double> base, with_dead;
  for (int i = 0; i < 12; ++i) {
    const auto texts = Texts("dead" + std::to_string(i) + "_", 2);
    absl::StatusOr<Answer> r1 = Ask(cl, QueryTexts(texts, 1));
    absl::StatusOr<Answer> r2 = Ask(cd, QueryTexts(texts, 1));
    ASSERT_TRUE(r1.ok()) << r1.status();
    ASSERT_TRUE(r2.ok()) << r2.status();
    EXPECT_EQ(r1->ids, r2->ids);
    base.push_back(r1->report.ttft_ms());
    with_dead.push_back(r2->report.ttft_ms());
  }
  const double worst = *std::max_element(with_dead.begin(), with_dead.end());
  std::printf("TTFT with a silent cluster (timeout 100 ms): median %.1f ms vs %.1f ms without a "
              "shared tier; worst %.1f ms\n",
              Median(with_dead), Median(base), worst);
  // Once the breaker is open the tier costs nothing; a probe (2 attempts x
  // 100 ms + a map refresh) at most every 2 s.
  EXPECT_LT(Median(with_dead), Median(base) + 30);
  EXPECT_LT(worst, Median(base) + 600);
  EXPECT_EQ(PromValue(dead.Metrics(), "infoflow_remote_circuit_state"), 1);
  close(silent_node.fd);

  // Mid-run: a live cluster dies (every node SIGKILLed) under a running
  // server; it keeps answering from local tiers and by recomputing.
  RedisClusterProcess cluster("server_dies");
  ASSERT_TRUE(cluster.Start(3, 0, &error)) << error;
  TempDir dm("dies");
  ServerProcess s(ServerBin(), ModelDir(), dm.path + "/kv", dm.path + "/log",
                  {"--remote-redis=" + cluster.SeedList(), "--remote-timeout-ms=100",
                   "--store-sync=false", "--threads=1"});
  ASSERT_TRUE(s.Start(&error)) << error;
  client::Client cs = MakeClient(s);
  const auto stored = Texts("dies", 3);
  ASSERT_EQ(Ingest(cs, stored).size(), 3u);
  ASSERT_TRUE(WaitWritten(s, 3));
  EXPECT_EQ(PromValue(s.Metrics(), "infoflow_remote_writes_total{result=\"ok\"}"), 3);
  cluster.Stop();
  std::vector<double> after;
  for (int i = 0; i < 8; ++i) {
    auto texts = Texts("dies_new" + std::to_string(i) + "_", 1);
    texts.push_back(stored[i % 3]);  // local hit
    absl::StatusOr<Answer> r = Ask(cs, QueryTexts(texts, 1));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->report.chunk_misses(), 1);
    EXPECT_EQ(r->report.chunk_hits(), 1);
    after.push_back(r->report.ttft_ms());
  }
  std::printf("TTFT after the cluster died mid-run: median %.1f ms, worst %.1f ms\n", Median(after),
              *std::max_element(after.begin(), after.end()));
  EXPECT_LT(*std::max_element(after.begin(), after.end()), Median(base) + 600);
  // The new chunks' write-behind keeps failing (and retrying) meanwhile.
  EXPECT_TRUE(RedisClusterProcess::WaitFor(
      [&] { return PromValue(s.Metrics(), "infoflow_remote_write_errors_total") > 0; }, 30));
  EXPECT_GT(PromValue(s.Metrics(), "infoflow_remote_pending_writes"), 0);
  EXPECT_TRUE(s.Healthy());
}

// ---- The shared tier off the query and ingest paths ----

TEST(SharedTierServerTest, FullFillQueueDropsTheLocalCopyButAnswers) {
  RedisClusterProcess* cluster = SharedCluster();
  TempDir da("fill_a"), db("fill_b"), dc("fill_c");
  ServerProcess a(ServerBin(), ModelDir(), da.path + "/kv", da.path + "/log",
                  RemoteArgs(*cluster, "fill:"));
  std::vector<std::string> tiny = RemoteArgs(*cluster, "fill:");
  tiny.push_back("--remote-fill-queue-bytes=1");  // no record fits: every fill is dropped
  ServerProcess b(ServerBin(), ModelDir(), db.path + "/kv", db.path + "/log", tiny);
  ServerProcess c(ServerBin(), ModelDir(), dc.path + "/kv", dc.path + "/log",
                  RemoteArgs(*cluster, "fill:"));
  std::string error;
  ASSERT_TRUE(a.Start(&error)) << error;
  ASSERT_TRUE(b.Start(&error)) << error;
  ASSERT_TRUE(c.Start(&error)) << error;
  client::Client ca = MakeClient(a);
  const std::vector<std::string> keys = Ingest(ca, Texts("fill", 4));
  ASSERT_EQ(keys.size(), 4u);
  ASSERT_TRUE(WaitWritten(a, 4));

  client::Client cb = MakeClient(b);
  absl::StatusOr<Answer> on_b = Ask(cb, QueryKeys(keys, v1::METHOD_NONE));
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ(on_b->report.chunk_remote_hits(), 4);
  std::string m = b.Metrics();
  EXPECT_EQ(PromValue(m, "infoflow_remote_fill_dropped_total"), 4) << m;
  EXPECT_EQ(PromValue(m, "infoflow_remote_fills_total"), 0);
  EXPECT_EQ(PromValue(m, "infoflow_remote_fill_queue_bytes"), 0);
  EXPECT_EQ(cb.Stats()->remote_fill_dropped(), 4u);
  // Still served (from RAM) while the cluster copy is there.
  absl::StatusOr<Answer> again = Ask(cb, QueryKeys(keys, v1::METHOD_NONE));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->report.chunk_remote_hits(), 0);
  EXPECT_EQ(again->ids, on_b->ids);

  // With room in the queue the fill lands on disk behind the query: a
  // restart without the shared tier serves the chunks locally.
  client::Client cc = MakeClient(c);
  absl::StatusOr<Answer> on_c = Ask(cc, QueryKeys(keys, v1::METHOD_NONE));
  ASSERT_TRUE(on_c.ok()) << on_c.status();
  EXPECT_EQ(on_c->report.chunk_remote_hits(), 4);
  ASSERT_TRUE(RedisClusterProcess::WaitFor(
      [&] { return PromValue(c.Metrics(), "infoflow_remote_fills_total") == 4; }, 30))
      << c.Metrics();
  EXPECT_EQ(PromValue(c.Metrics(), "infoflow_remote_fill_dropped_total"), 0);
  EXPECT_EQ(c.Stop(), 0);
  ServerProcess local(ServerBin(), ModelDir(), dc.path + "/kv", dc.path + "/log2",
                      {"--store-sync=false", "--threads=1"});
  ASSERT_TRUE(local.Start(&error)) << error;
  client::Client cl = MakeClient(local);
  absl::StatusOr<Answer> on_disk = Ask(cl, QueryKeys(keys, v1::METHOD_NONE));
  ASSERT_TRUE(on_disk.ok()) << on_disk.status();
  EXPECT_EQ(on_disk->report.chunk_hits(), 4);
  EXPECT_EQ(on_disk->ids, on_b->ids);
}

TEST(SharedTierServerTest, SigstoppedClusterDuringWriteBehindThenDrains) {
  RedisClusterProcess cluster("server_sigstop");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 0, &error)) << error;
  TempDir da("stop_a"), db("stop_b");
  std::vector<std::string> args = RemoteArgs(cluster, "stop:");
  args.push_back("--remote-timeout-ms=100");
  ServerProcess a(ServerBin(), ModelDir(), da.path + "/kv", da.path + "/log", args);
  ServerProcess b(ServerBin(), ModelDir(), db.path + "/kv", db.path + "/log", args);
  ASSERT_TRUE(a.Start(&error)) << error;
  ASSERT_TRUE(b.Start(&error)) << error;
  client::Client ca = MakeClient(a);

  cluster.PauseAll();
  std::vector<v1::RemoteState> states;
  const std::vector<std::string> keys = Ingest(ca, Texts("stop", 3), &states);
  ASSERT_EQ(keys.size(), 3u) << "ingest answers OK with the cluster stopped";
  for (v1::RemoteState st : states) EXPECT_EQ(st, v1::REMOTE_STATE_PENDING);
  absl::StatusOr<Answer> local = Ask(ca, QueryKeys(keys, v1::METHOD_NONE));
  ASSERT_TRUE(local.ok()) << local.status();
  EXPECT_EQ(local->report.chunk_hits(), 3);
  EXPECT_EQ(local->report.chunk_remote_hits(), 0);
  std::string m = a.Metrics();
  EXPECT_EQ(PromValue(m, "infoflow_remote_pending_writes"), 3) << m;
  EXPECT_GT(PromValue(m, "infoflow_remote_pending_bytes"), 0);
  EXPECT_EQ(PromValue(m, "infoflow_remote_writes_total{result=\"ok\"}"), 0);
  absl::StatusOr<v1::StatsResponse> st = ca.Stats();
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->remote_pending_writes(), 3u);
  EXPECT_GT(st->remote_pending_bytes(), 0u);

  cluster.ResumeAll();
  ASSERT_TRUE(WaitWritten(a, 3)) << a.Metrics();
  m = a.Metrics();
  EXPECT_EQ(PromValue(m, "infoflow_remote_pending_bytes"), 0);
  EXPECT_EQ(PromValue(m, "infoflow_remote_writes_total{result=\"failed\"}"), 0);
  client::Client cb = MakeClient(b);
  absl::StatusOr<Answer> on_b = Ask(cb, QueryKeys(keys, v1::METHOD_NONE));
  ASSERT_TRUE(on_b.ok()) << on_b.status();
  EXPECT_EQ(on_b->report.chunk_remote_hits(), 3);
  EXPECT_EQ(on_b->ids, local->ids);
}

TEST(SharedTierServerTest, ShutdownDrainsWithinItsDeadlineAndLogsWhatItCouldNotWrite) {
  RedisClusterProcess cluster("server_drain");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 0, &error)) << error;
  std::vector<std::string> args = RemoteArgs(cluster, "drain:");
  args.push_back("--remote-timeout-ms=100");
  args.push_back("--remote-drain-timeout-ms=300");

  // Cluster up: shutdown right after an ingest writes everything first.
  TempDir du("drain_up");
  ServerProcess up(ServerBin(), ModelDir(), du.path + "/kv", du.path + "/log", args);
  ASSERT_TRUE(up.Start(&error)) << error;
  client::Client cu = MakeClient(up);
  const std::vector<std::string> written = Ingest(cu, Texts("drain_up", 2));
  ASSERT_EQ(written.size(), 2u);
  EXPECT_EQ(up.Stop(), 0);
  EXPECT_NE(up.log().find("event=remote_write_drain "), std::string::npos) << up.log();
  EXPECT_NE(up.log().find(" unwritten=0 "), std::string::npos) << up.log();
  store::RedisClusterOptions o;
  o.seeds = cluster.Seeds();
  auto rc = store::RedisCluster::Create(o);
  ASSERT_TRUE(rc.ok());
  for (const std::string& k : written) {
    auto g = (*rc)->Get(RemoteKey("drain:", k));
    ASSERT_TRUE(g.ok() && g->has_value()) << k;
  }

  // Cluster stopped: the drain gives up at its deadline and names each
  // record it could not write; the local copies survive the restart.
  TempDir dd("drain_down");
  ServerProcess down(ServerBin(), ModelDir(), dd.path + "/kv", dd.path + "/log", args);
  ASSERT_TRUE(down.Start(&error)) << error;
  client::Client cd = MakeClient(down);
  cluster.PauseAll();
  const std::vector<std::string> stuck = Ingest(cd, Texts("drain_down", 2));
  ASSERT_EQ(stuck.size(), 2u);
  EXPECT_EQ(down.Stop(), 0);
  cluster.ResumeAll();
  const std::string log = down.log();
  for (const std::string& k : stuck) {
    EXPECT_NE(log.find("event=remote_write_unwritten key=" + k), std::string::npos) << log;
  }
  EXPECT_NE(log.find(" unwritten=2 "), std::string::npos) << log;
  EXPECT_NE(log.find("timeout_ms=300"), std::string::npos) << log;
  ServerProcess again(ServerBin(), ModelDir(), dd.path + "/kv", dd.path + "/log2",
                      {"--store-sync=false", "--threads=1"});
  ASSERT_TRUE(again.Start(&error)) << error;
  client::Client ca = MakeClient(again);
  absl::StatusOr<Answer> r = Ask(ca, QueryKeys(stuck, v1::METHOD_NONE));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->report.chunk_hits(), 2);
}

}  // namespace
}  // namespace infoflow
