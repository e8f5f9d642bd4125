// Reliability of the real infoflow-server binary (a child process on
// 127.0.0.1 port 0, RocksDB in a temp dir, a generated test model):
//
//  * CrashTest: SIGKILL during batch ingest, restart on the same data dir,
//    INFOFLOW_CRASH_ROUNDS rounds (default 10): every acknowledged chunk is
//    stored and decodes; the one batch in flight is absent or intact.
//  * CorruptionTest: a record damaged on disk is a miss, re-prefilled, and
//    counted by infoflow_store_corrupt_total on /metrics.
//  * BadInputTest: a table of malformed requests, each with its status code;
//    afterwards the server is alive, answers, and its RSS did not balloon.
//  * SoakTest: INFOFLOW_SOAK_STREAMS (default 32) concurrent Query streams
//    plus a bidi IngestStream and a unary Ingest caller, for
//    INFOFLOW_SOAK_SECONDS (default 60): no errors but RESOURCE_EXHAUSTED,
//    RSS growth after warm-up < 10%.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <rocksdb/db.h>

#include "cache_store/chunk_key.h"
#include "cache_store/chunk_store.h"
#include "client/client.h"
#include "engine/model/test_model.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "tests/reliability/reliability_util.h"
#include "tests/reliability/server_process.h"

namespace infoflow {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;
using testing::ServerProcess;


// ------------------------------------------------------------------ crash

TEST(CrashTest, SigkillDuringIngestLosesNoAcknowledgedChunk) {
  const int rounds = std::max(1, EnvInt("INFOFLOW_CRASH_ROUNDS", 10));
  const unsigned seed = static_cast<unsigned>(EnvInt("INFOFLOW_CRASH_SEED", 20240607));
  std::printf("crash rounds %d, seed %u\n", rounds, seed);
  std::mt19937 rng(seed);
  TempDir dir("crash");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=true", "--workers=2"});
  std::vector<std::string> acked;          // keys acknowledged so far (all rounds)
  std::vector<std::string> maybe_written;  // texts of the batch in flight at the kill
  int64_t total_acked_batches = 0;
  constexpr int kBatch = 4;

  auto verify = [&](int round) {
    client::Client c = MakeClient(srv);
    for (size_t i = 0; i < acked.size(); i += 16) {
      std::vector<std::string> group(acked.begin() + i,
                                     acked.begin() + std::min(acked.size(), i + 16));
      auto r = RunQuery(c, QueryKeys(group));
      ASSERT_TRUE(r.ok()) << "round " << round << ": acknowledged chunk lost or undecodable: "
                          << r.status();
      EXPECT_EQ(r->chunk_hits(), static_cast<int>(group.size()));
    }
    // The batch in flight: absent (miss, re-prefilled now) or intact (hit);
    // never an error and never a corrupt record.
    for (const std::string& t : maybe_written) {
      v1::QueryRequest req = QueryKeys({});
      req.add_chunks()->set_text(t);
      auto r = RunQuery(c, req);
      ASSERT_TRUE(r.ok()) << "round " << round << ": " << r.status();
      EXPECT_EQ(r->chunk_hits() + r->chunk_misses(), 1);
    }
    maybe_written.clear();
    auto stats = c.Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->corrupt(), 0u) << "round " << round;
    EXPECT_GE(stats->records(), acked.size());
  };

  for (int round = 0; round < rounds; ++round) {
    std::string err;
    ASSERT_TRUE(srv.Start(&err)) << err;
    if (round > 0) {
      ASSERT_NO_FATAL_FAILURE(verify(round));
    }

    // Batches for this round, all distinct from earlier rounds.
    std::vector<v1::IngestRequest> batches(400);
    for (size_t b = 0; b < batches.size(); ++b) {
      for (int c = 0; c < kBatch; ++c) {
        const std::string tag = "r" + std::to_string(round) + "b" + std::to_string(b) + "c" +
                                std::to_string(c);
        batches[b].add_chunks()->set_text(
            ChunkText(tag, static_cast<uint32_t>(round * 100000 + b * 10 + c)));
      }
    }
    std::mutex mu;
    std::vector<std::string> round_acked;
    std::atomic<int> acked_batches{0};
    absl::Status ingest_status;
    const bool use_stream = round % 2 == 0;
    std::thread ingester([&] {
      client::Client c = MakeClient(srv, 0);
      auto record = [&](const v1::IngestResponse& resp) {
        std::lock_guard<std::mutex> l(mu);
        for (const auto& r : resp.results()) {
          if (r.status() == v1::CHUNK_STATUS_STORED ||
              r.status() == v1::CHUNK_STATUS_ALREADY_PRESENT) {
            round_acked.push_back(r.chunk_key());
          } else {
            ADD_FAILURE() << "chunk error: " << r.error();
          }
        }
        acked_batches.fetch_add(1);
      };
      if (use_stream) {
        ingest_status = c.IngestStream(batches, record);
      } else {
        for (const auto& b : batches) {
          auto resp = c.Ingest(b);
          if (!resp.ok()) {
            ingest_status = resp.status();
            return;
          }
          record(*resp);
        }
      }
    });
    // Kill at a random moment after the first acknowledgement.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (acked_batches.load() == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 250)(rng)));
    srv.Kill();
    ingester.join();
    ASSERT_GT(acked_batches.load(), 0) << srv.log();
    ASSERT_LT(acked_batches.load(), static_cast<int>(batches.size()))
        << "ingest finished before the kill; make the round longer";
    EXPECT_FALSE(ingest_status.ok()) << "ingest must have been cut by the kill";
    total_acked_batches += acked_batches.load();
    acked.insert(acked.end(), round_acked.begin(), round_acked.end());
    // At most one batch was in flight (one write at a time, each answered
    // before the next is sent).
    for (const auto& c : batches[acked_batches.load()].chunks()) maybe_written.push_back(c.text());
  }
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  ASSERT_NO_FATAL_FAILURE(verify(rounds));
  std::printf("%d rounds: %lld acknowledged batches, %zu acknowledged chunks verified\n", rounds,
              static_cast<long long>(total_acked_batches), acked.size());
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// ------------------------------------------------------------- corruption

TEST(CorruptionTest, DamagedRecordIsMissRecomputedAndCounted) {
  TempDir dir("corrupt");
  const std::string kv = dir.path + "/kv";
  ServerProcess srv(ServerBin(), ModelDir(), kv, dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  std::vector<std::string> texts = {ChunkText("a", 1), ChunkText("b", 2), ChunkText("c", 3)};
  std::vector<std::string> keys;
  {
    client::Client c = MakeClient(srv);
    v1::IngestRequest req;
    for (const auto& t : texts) req.add_chunks()->set_text(t);
    auto resp = c.Ingest(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    for (const auto& r : resp->results()) keys.push_back(r.chunk_key());
  }
  ASSERT_EQ(srv.Stop(), 0) << srv.log();
  {  // Flip one payload byte of chunk 1 straight in RocksDB.
    store::ChunkStoreOptions so;
    so.path = kv;
    auto st = store::ChunkStore::Open(so);
    ASSERT_TRUE(st.ok()) << st.status();
    auto key = store::ChunkKey::FromHex(keys[1]);
    ASSERT_TRUE(key.ok());
    const rocksdb::Slice k(key->AsBytes().data(), key->AsBytes().size());
    std::string value;
    rocksdb::DB* db = (*st)->db_for_testing();
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), (*st)->data_cf_for_testing(), k, &value).ok());
    value[value.size() - 7] ^= 0x20;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), (*st)->data_cf_for_testing(), k, value).ok());
  }
  ASSERT_TRUE(srv.Start(&err)) << err;
  const double corrupt_before = testing::PromValue(srv.Metrics(), "infoflow_store_corrupt_total");
  EXPECT_EQ(corrupt_before, 0.0);
  client::Client c = MakeClient(srv);
  // By key it cannot be served.
  auto by_key = RunQuery(c, QueryKeys(keys));
  EXPECT_TRUE(absl::IsNotFound(by_key.status())) << by_key.status();
  // By text: a miss, prefilled again, and the answer comes.
  v1::QueryRequest req = QueryKeys({});
  for (const auto& t : texts) req.add_chunks()->set_text(t);
  req.set_max_new_tokens(4);
  auto r = RunQuery(c, req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->chunk_misses(), 1);
  EXPECT_EQ(r->chunk_hits(), 2);
  EXPECT_EQ(r->chunk_keys(1), keys[1]);
  EXPECT_GT(r->generated_tokens(), 0);
  const std::string metrics = srv.Metrics();
  const double corrupt_after = testing::PromValue(metrics, "infoflow_store_corrupt_total");
  EXPECT_GE(corrupt_after, corrupt_before + 1) << metrics;
  // The rewritten record now serves by key.
  auto again = RunQuery(c, QueryKeys(keys));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->chunk_hits(), 3);
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->corrupt(), 1u);
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// -------------------------------------------------------------- bad input

TEST(BadInputTest, MalformedRequestsGetTheirCodeAndServerStaysHealthy) {
  TempDir dir("bad");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false", "--max-chunks=32",
                     "--max-chunk-tokens=128", "--max-context-tokens=1024",
                     "--max-new-tokens=64", "--idle-trim-ms=500"},
                    {"MALLOC_ARENA_MAX=2"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  client::Client c = MakeClient(srv);
  auto info = c.ModelInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  std::vector<std::string> keys;
  {
    v1::IngestRequest req;
    for (int i = 0; i < 3; ++i) req.add_chunks()->set_text(ChunkText("k" + std::to_string(i), i));
    auto resp = c.Ingest(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    for (const auto& r : resp->results()) keys.push_back(r.chunk_key());
  }
  auto good_query = [&] {
    v1::QueryRequest q = QueryKeys(keys, v1::METHOD_INFOFLOW);
    q.set_max_new_tokens(4);
    return RunQuery(c, q);
  };
  ASSERT_TRUE(good_query().ok());
  const int64_t rss_before = srv.RssKiB();

  const std::string huge(65 << 20, 'a');  // over the 64 MiB receive limit
  std::string long_text;
  for (int i = 0; i < 300; ++i) long_text += "word" + std::to_string(i) + " ";
  const double inf = std::numeric_limits<double>::infinity();
  using Code = absl::StatusCode;
  struct QCase {
    const char* name;
    std::function<void(v1::QueryRequest*)> mutate;
    Code code;
  };
  const std::vector<QCase> qcases = {
      {"unknown method 99", [](v1::QueryRequest* r) { r->set_method(static_cast<v1::Method>(99)); },
       Code::kInvalidArgument},
      {"negative method", [](v1::QueryRequest* r) { r->set_method(static_cast<v1::Method>(-3)); },
       Code::kInvalidArgument},
      {"unknown prefix_mode", [](v1::QueryRequest* r) { r->set_prefix_mode(static_cast<v1::PrefixMode>(42)); },
       Code::kInvalidArgument},
      {"ratio NaN", [](v1::QueryRequest* r) { r->mutable_ratio()->set_value(std::nan("")); },
       Code::kInvalidArgument},
      {"ratio negative", [](v1::QueryRequest* r) { r->mutable_ratio()->set_value(-0.25); },
       Code::kInvalidArgument},
      {"ratio +inf", [inf](v1::QueryRequest* r) { r->mutable_ratio()->set_value(inf); },
       Code::kInvalidArgument},
      {"empty question", [](v1::QueryRequest* r) { r->clear_question(); }, Code::kInvalidArgument},
      {"question invalid UTF-8", [](v1::QueryRequest* r) { r->set_question("ok \xC0\xAF"); },
       Code::kInvalidArgument},
      {"template invalid UTF-8", [](v1::QueryRequest* r) { r->set_prompt_template("\xED\xA0\x80"); },
       Code::kInvalidArgument},
      {"chunk text invalid UTF-8", [](v1::QueryRequest* r) { r->add_chunks()->set_text("x\xF5\x80\x80\x80"); },
       Code::kInvalidArgument},
      {"chunk neither key nor text", [](v1::QueryRequest* r) { r->add_chunks(); },
       Code::kInvalidArgument},
      {"unknown key", [](v1::QueryRequest* r) { r->add_chunks()->set_key(std::string(64, 'e')); },
       Code::kNotFound},
      {"key not hex", [](v1::QueryRequest* r) { r->add_chunks()->set_key(std::string(64, 'z')); },
       Code::kInvalidArgument},
      {"key too short", [](v1::QueryRequest* r) { r->add_chunks()->set_key("abc123"); },
       Code::kInvalidArgument},
      {"10k chunks",
       [](v1::QueryRequest* r) { for (int i = 0; i < 10000; ++i) r->add_chunks()->set_text("c"); },
       Code::kInvalidArgument},
      {"no chunks", [](v1::QueryRequest* r) { r->clear_chunks(); }, Code::kInvalidArgument},
      {"chunk over max tokens", [&](v1::QueryRequest* r) { r->add_chunks()->set_text(long_text); },
       Code::kInvalidArgument},
      {"context over max tokens",
       [&](v1::QueryRequest* r) {
         std::string t;
         for (int i = 0; i < 40; ++i) t += "w" + std::to_string(i) + " ";
         for (int i = 0; i < 25; ++i) r->add_chunks()->set_text(t + std::to_string(i));
       },
       Code::kInvalidArgument},
      {"huge max_new_tokens", [](v1::QueryRequest* r) { r->set_max_new_tokens(1 << 30); },
       Code::kInvalidArgument},
      {"negative max_new_tokens", [](v1::QueryRequest* r) { r->set_max_new_tokens(-1); },
       Code::kInvalidArgument},
      {"scoring layer 1000", [](v1::QueryRequest* r) { r->add_scoring_layers(1000); },
       Code::kInvalidArgument},
      {"scoring layer -1", [](v1::QueryRequest* r) { r->add_scoring_layers(-1); },
       Code::kInvalidArgument},
      {"negative lego_k", [](v1::QueryRequest* r) { r->set_lego_k(-4); }, Code::kInvalidArgument},
      {"temperature NaN", [](v1::QueryRequest* r) { r->mutable_sampling()->set_temperature(std::nanf("")); },
       Code::kInvalidArgument},
      {"temperature negative", [](v1::QueryRequest* r) { r->mutable_sampling()->set_temperature(-1); },
       Code::kInvalidArgument},
      {"top_p > 1", [](v1::QueryRequest* r) { r->mutable_sampling()->set_top_p(2); },
       Code::kInvalidArgument},
      {"empty stop string", [](v1::QueryRequest* r) { r->add_stop(""); }, Code::kInvalidArgument},
      {"wrong model name", [](v1::QueryRequest* r) { r->mutable_model()->set_name("gpt-17"); },
       Code::kFailedPrecondition},
      {"wrong fingerprint", [](v1::QueryRequest* r) { r->mutable_model()->set_fingerprint("00ff"); },
       Code::kFailedPrecondition},
      {"message over 64 MiB", [&](v1::QueryRequest* r) { r->set_question(huge); },
       Code::kResourceExhausted},
  };
  // Three passes over the whole table (two 65 MiB messages in each). While
  // idle the server hands freed heap back to the OS (--idle-trim-ms), so
  // RSS measured after a pause is what the server really keeps: the last
  // pass must not grow it by more than max(5%, 16 MiB). Without the trim
  // glibc kept up to ~115 MiB of freed message buffers resident (flat after
  // pass 4 of 8: retention, not a leak); a real leak of one message per pass
  // breaks this bound.
  int n_cases = 0;
  int64_t rss_warm = 0;
  const int passes = std::max(2, EnvInt("INFOFLOW_BADINPUT_PASSES", 3));
  auto settled_rss = [&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));  // several --idle-trim-ms periods
    return srv.RssKiB();
  };
  auto heap_in_use_kib = [&] {
    return static_cast<int64_t>(
        testing::PromValue(srv.Metrics(), "infoflow_process_heap_bytes{state=\"in_use\"}") / 1024);
  };
  // The smallest heap-in-use reading over up to 5 s: a buffer gRPC is still
  // releasing (a 65 MiB message under a loaded CI machine) is not retained,
  // while a leak stays whatever the wait.
  auto settled_heap_in_use_kib = [&] {
    int64_t least = heap_in_use_kib();
    for (int i = 0; i < 20; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      least = std::min(least, heap_in_use_kib());
    }
    return least;
  };
  int64_t heap_warm = 0;
  for (int pass = 0; pass < passes; ++pass) {
  if (pass == passes - 1) {
    rss_warm = settled_rss();
    heap_warm = heap_in_use_kib();
  }
  std::printf("pass %d: RSS %lld KiB\n", pass, static_cast<long long>(srv.RssKiB()));
  n_cases = 0;
  for (const QCase& qc : qcases) {
    SCOPED_TRACE(qc.name);
    v1::QueryRequest req = QueryKeys(keys, v1::METHOD_INFOFLOW);
    qc.mutate(&req);
    auto r = RunQuery(c, req);
    EXPECT_EQ(r.status().code(), qc.code) << qc.name << ": " << r.status();
    ++n_cases;
  }
  struct ICase {
    const char* name;
    std::function<void(v1::IngestRequest*)> mutate;
    Code code;
  };
  const std::vector<ICase> icases = {
      {"ingest no chunks", [](v1::IngestRequest*) {}, Code::kInvalidArgument},
      {"ingest 10k chunks",
       [](v1::IngestRequest* r) { for (int i = 0; i < 10000; ++i) r->add_chunks()->set_text("c"); },
       Code::kInvalidArgument},
      {"ingest empty text", [](v1::IngestRequest* r) { r->add_chunks()->set_text(""); },
       Code::kInvalidArgument},
      {"ingest invalid UTF-8",
       [](v1::IngestRequest* r) {
         r->add_chunks()->set_text("fine text");
         r->add_chunks()->set_text("bad \xFF tail");
       },
       Code::kInvalidArgument},
      {"ingest oversized chunk", [&](v1::IngestRequest* r) { r->add_chunks()->set_text(long_text); },
       Code::kInvalidArgument},
      {"ingest unknown prefix_mode",
       [](v1::IngestRequest* r) {
         r->set_prefix_mode(static_cast<v1::PrefixMode>(9));
         r->add_chunks()->set_text("hello");
       },
       Code::kInvalidArgument},
      {"ingest wrong model",
       [](v1::IngestRequest* r) {
         r->mutable_model()->set_name("other");
         r->add_chunks()->set_text("hello");
       },
       Code::kFailedPrecondition},
      {"ingest over 64 MiB", [&](v1::IngestRequest* r) { r->add_chunks()->set_text(huge); },
       Code::kResourceExhausted},
  };
  for (const ICase& ic : icases) {
    SCOPED_TRACE(ic.name);
    v1::IngestRequest req;
    ic.mutate(&req);
    auto r = c.Ingest(req);
    EXPECT_EQ(r.status().code(), ic.code) << ic.name << ": " << r.status();
    ++n_cases;
  }
  {  // Admin with a malformed key.
    auto admin = v1::Admin::NewStub(srv.channel());
    grpc::ClientContext ctx;
    v1::DeleteChunkRequest del;
    del.set_chunk_key("not-a-key");
    v1::DeleteChunkResponse resp;
    EXPECT_EQ(admin->DeleteChunk(&ctx, del, &resp).error_code(), grpc::INVALID_ARGUMENT);
    grpc::ClientContext ctx2;
    del.set_chunk_key(std::string(64, 'd'));
    ASSERT_TRUE(admin->DeleteChunk(&ctx2, del, &resp).ok());
    EXPECT_FALSE(resp.deleted());
    n_cases += 2;
  }
  }  // pass
  {  // The context limit is what refuses this one (not the chunk count or size).
    v1::QueryRequest req = QueryKeys(keys, v1::METHOD_INFOFLOW);
    for (const QCase& qc : qcases) {
      if (std::string(qc.name) == "context over max tokens") qc.mutate(&req);
    }
    auto r = RunQuery(c, req);
    EXPECT_NE(r.status().message().find("context of"), std::string::npos) << r.status();
  }
  // Nothing was stored: the three records only. The over-context query's
  // valid text chunks are refused before any prefill.
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->records(), 3u);
  std::printf("records after the table: %llu\n", static_cast<unsigned long long>(stats->records()));
  // Alive, healthy, answers, RSS bounded (the 65 MiB messages must not stay).
  EXPECT_TRUE(srv.Alive());
  EXPECT_TRUE(srv.Healthy());
  auto good = good_query();
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->chunk_hits(), 3);
  const int64_t rss_after = settled_rss();
  const int64_t heap_after = settled_heap_in_use_kib();
  std::printf("%d bad-input cases x %d passes; server RSS %lld KiB at start, %lld before the last "
              "pass, %lld after it\n",
              n_cases, passes, static_cast<long long>(rss_before), static_cast<long long>(rss_warm),
              static_cast<long long>(rss_after));
  EXPECT_GE(n_cases, 20);
  std::printf("heap in use %lld KiB before the last pass, %lld after it\n",
              static_cast<long long>(heap_warm), static_cast<long long>(heap_after));
  // A leak grows the heap in use: keeping even one of a pass's two 65 MiB
  // messages would add 65 MiB. Healthy runs move it by -15..+15 MiB (gRPC's
  // read buffers follow the traffic; 10 runs, 48-66 MiB in use), and under
  // ctest -j2 a reading now and then holds a further ~47-50 MiB for seconds
  // (seen before the last pass: 95 MiB; and once after it, through the whole
  // 5 s settle: +49.4 MiB); hence 60 MiB, under one message. RSS also counts
  // freed pages the allocator could not hand back (partly used pages), which
  // varied by up to 60 MiB between healthy runs, so it gets the coarse bound.
  ASSERT_GT(heap_warm, 0) << "no infoflow_process_heap_bytes on /metrics";
  EXPECT_LT(heap_after - heap_warm, 60 * 1024)
      << "heap in use grew from " << heap_warm << " to " << heap_after << " KiB over the last pass";
  EXPECT_LT(rss_after - rss_warm, 128 * 1024)
      << "RSS grew from " << rss_warm << " to " << rss_after << " KiB over the last pass";
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// ------------------------------------------------------------------- soak

TEST(SoakTest, MixedLoadHasNoUnexpectedErrorsAndBoundedRss) {
  const int seconds = std::max(4, EnvInt("INFOFLOW_SOAK_SECONDS", 60));
  const int kQueryStreams = std::max(1, EnvInt("INFOFLOW_SOAK_STREAMS", 32));
  // Two more callers: unary Ingest and a bidi IngestStream.
  const int kStreams = kQueryStreams + 2;
  TempDir dir("soak");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=2", "--store-sync=false", "--workers=2", "--queue-depth=16",
                     "--ram-bytes=16777216"},
                    {"MALLOC_ARENA_MAX=" + std::string(std::getenv("INFOFLOW_SOAK_ARENAS") ? std::getenv("INFOFLOW_SOAK_ARENAS") : "2")});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  // A pool of stored chunks to query by key.
  std::vector<std::string> pool_texts, pool_keys;
  {
    client::Client c = MakeClient(srv);
    v1::IngestRequest req;
    for (int i = 0; i < 32; ++i) {
      pool_texts.push_back(ChunkText("pool" + std::to_string(i), 1000 + i));
      req.add_chunks()->set_text(pool_texts.back());
    }
    auto resp = c.Ingest(req);
    ASSERT_TRUE(resp.ok()) << resp.status();
    for (const auto& r : resp->results()) pool_keys.push_back(r.chunk_key());
  }
  const auto start = std::chrono::steady_clock::now();
  const auto stop_at = start + std::chrono::seconds(seconds);
  // Warm-up: the first 40% (RocksDB memtables, the RAM tier, gRPC threads
  // and their malloc arenas reach their working size).
  const auto warm_at = start + std::chrono::milliseconds(std::max(3000, seconds * 400));
  std::atomic<bool> stop{false};
  std::atomic<int64_t> ok_calls{0}, exhausted{0};
  std::mutex mu;
  std::map<std::string, int> unexpected;
  auto count = [&](const absl::Status& s) {
    if (s.ok()) ++ok_calls;
    else if (absl::IsResourceExhausted(s)) {
      ++exhausted;
      // A real client backs off; without it the rejected streams spin.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    } else {
      std::lock_guard<std::mutex> l(mu);
      ++unexpected[s.ToString().substr(0, 160)];
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kStreams; ++t) {
    threads.emplace_back([&, t] {
      client::Client c = MakeClient(srv, 20000);
      std::mt19937 rng(t);
      int n = 0;
      while (!stop.load() && std::chrono::steady_clock::now() < stop_at) {
        ++n;
        if (t >= kQueryStreams) {
          // Ingest: mostly known chunks (already present); new ones during
          // warm-up only, so the store's own growth does not read as a leak.
          auto batch = [&](int b) {
            v1::IngestRequest req;
            const bool warming = std::chrono::steady_clock::now() < warm_at;
            for (int i = 0; i < 4; ++i) {
              if (warming && rng() % 4 == 0) {
                req.add_chunks()->set_text(ChunkText("s" + std::to_string(t) + "n" +
                                                         std::to_string(n) + "b" + std::to_string(b) +
                                                         "i" + std::to_string(i),
                                                     rng()));
              } else {
                req.add_chunks()->set_text(pool_texts[rng() % pool_texts.size()]);
              }
            }
            return req;
          };
          auto check = [&](const v1::IngestResponse& resp) {
            for (const auto& res : resp.results()) {
              if (res.status() == v1::CHUNK_STATUS_ERROR) count(absl::InternalError(res.error()));
            }
          };
          if (t == kQueryStreams) {
            auto r = c.Ingest(batch(0));
            count(r.status());
            if (r.ok()) check(*r);
          } else {
            std::vector<v1::IngestRequest> batches;
            for (int b = 0; b < 4; ++b) batches.push_back(batch(b));
            int responses = 0;
            absl::Status st = c.IngestStream(batches, [&](const v1::IngestResponse& resp) {
              ++responses;
              check(resp);
            });
            count(st);
            if (st.ok() && responses != 4) {
              count(absl::InternalError("IngestStream: " + std::to_string(responses) +
                                        " responses for 4 batches"));
            }
          }
          continue;
        }
        static const v1::Method kMethods[] = {v1::METHOD_INFOFLOW, v1::METHOD_FULL,
                                              v1::METHOD_NONE, v1::METHOD_CACHEBLEND,
                                              v1::METHOD_EPIC, v1::METHOD_RANDOM};
        std::vector<std::string> keys;
        const int k = 2 + static_cast<int>(rng() % 5);
        for (int i = 0; i < k; ++i) keys.push_back(pool_keys[rng() % pool_keys.size()]);
        v1::QueryRequest req = QueryKeys(keys, kMethods[rng() % 6]);
        req.set_reorder(rng() % 2 == 0);
        req.set_max_new_tokens(1 + static_cast<int>(rng() % 8));
        if (rng() % 4 == 0) req.add_chunks()->set_text(pool_texts[rng() % pool_texts.size()]);
        if (rng() % 5 == 0) req.mutable_sampling()->set_temperature(0.8f);
        count(RunQuery(c, req).status());
      }
    });
  }
  // Sample RSS; the baseline is taken at the end of warm-up.
  int64_t rss_warm = -1, rss_max_after = 0, rss_end = 0;
  int samples = 0;
  std::string timeline;  // MiB, once a second
  while (std::chrono::steady_clock::now() < stop_at + std::chrono::seconds(30)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const int64_t rss = srv.RssKiB();
    if (rss < 0) break;  // the server died
    if (++samples % 5 == 0) timeline += " " + std::to_string(rss / 1024);
    if (std::chrono::steady_clock::now() >= warm_at) {
      if (rss_warm < 0) rss_warm = rss;
      rss_max_after = std::max(rss_max_after, rss);
      rss_end = rss;
    }
    if (std::chrono::steady_clock::now() >= stop_at) break;
  }
  stop = true;  // hard stop: calls carry a 20 s deadline
  for (auto& th : threads) th.join();
  ASSERT_TRUE(srv.Alive()) << srv.log().substr(0, 4000);
  EXPECT_TRUE(srv.Healthy());
  std::string errors;
  for (const auto& [what, n] : unexpected) errors += std::to_string(n) + "x " + what + "\n";
  EXPECT_TRUE(unexpected.empty()) << errors;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("soak %.1f s, %d query streams + Ingest + IngestStream: %lld ok calls (%.1f/s), "
              "%lld RESOURCE_EXHAUSTED; RSS warm %lld KiB, end %lld KiB, max %lld KiB\n",
              secs, kQueryStreams, static_cast<long long>(ok_calls.load()), ok_calls.load() / secs,
              static_cast<long long>(exhausted.load()), static_cast<long long>(rss_warm),
              static_cast<long long>(rss_end), static_cast<long long>(rss_max_after));
  std::printf("RSS MiB each second:%s\n", timeline.c_str());
  EXPECT_GT(ok_calls.load(), kStreams);
  ASSERT_GT(rss_warm, 0);
  EXPECT_LT(rss_end - rss_warm, rss_warm / 10)
      << "RSS grew from " << rss_warm << " to " << rss_end << " KiB (more than 10%)";
  EXPECT_EQ(srv.Stop(), 0) << srv.log().substr(0, 4000);
}

}  // namespace
}  // namespace infoflow
