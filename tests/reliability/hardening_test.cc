// Hardening of the real infoflow-server binary against what an attacker or a
// careless client sends, and against the machine it runs on:
//
//  * LimitsTest: a small request whose template repeats "{question}", a
//    100k-token question and a context beyond the model's positions are
//    refused by their limit before any work; with
//    --allow-beyond-model-positions the last one runs and its report says so.
//  * PrefixModeTest: a key stored under one prefix mode and queried under the
//    other is FAILED_PRECONDITION, never a silently wrong answer.
//  * DiskFullTest: on a full filesystem ingest fails with a retryable code
//    (not OK with a per-chunk error), Delete/Compact never INTERNAL, and the
//    store writes again once space is back, without a restart.
//  * CorruptStoreTest: damaged store files refuse to start by default;
//    --on-corrupt-store=quarantine moves them aside and starts empty.
//  * AccountingTest: queries that wait on one in-flight prefill count it
//    once; the queue-depth gauge is 0 again after load.
//  * MetricsTest: clients that trickle bytes at /metrics do not block scrapes.
//  * MemoryCapTest: the largest requests the limits allow, concurrently,
//    against a server under RLIMIT_AS: it stays up, answers each with OK or
//    its limit status, and its RSS stays under the cap.
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <sys/mount.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/reliability/reliability_util.h"

namespace infoflow {
namespace {

using Code = absl::StatusCode;
using testing::PromValue;

// Text of about `n` tokens under the generated model's byte-level BPE
// (distinct per `tag`, so every call is a new chunk).
std::string LongText(const std::string& tag, int n_words) {
  std::string t = "Record " + tag + ".";
  for (int i = 0; i < n_words; ++i) t += " " + std::string(kWords[(i * 7 + tag.size()) % 20]);
  return t;
}

int CountTokens(client::Client& c, const std::string& text) {
  // The report's context_tokens for a one-chunk NONE query is the chunk's
  // token count; cheaper to ask the server than to load the tokenizer here.
  v1::QueryRequest q;
  q.add_chunks()->set_text(text);
  q.set_question("count");
  q.set_method(v1::METHOD_NONE);
  q.set_max_new_tokens(1);
  q.set_return_report(true);
  auto r = RunQuery(c, q);
  return r.ok() ? static_cast<int>(r->context_tokens()) : -1;
}

// Words LongText needs for about `tokens` tokens (measured on the server).
int WordsForTokens(client::Client& c, int tokens) {
  static const double per_word = CountTokens(c, LongText("calibrate", 200)) / 200.0;
  return std::max(1, static_cast<int>(tokens / per_word));
}

std::vector<std::string> IngestTexts(client::Client& c, const std::vector<std::string>& texts,
                                     v1::PrefixMode mode = v1::PREFIX_MODE_BOS) {
  v1::IngestRequest req;
  req.set_prefix_mode(mode);
  for (const std::string& t : texts) req.add_chunks()->set_text(t);
  auto resp = c.Ingest(req);
  std::vector<std::string> keys;
  if (!resp.ok()) return keys;
  for (const auto& r : resp->results()) keys.push_back(r.chunk_key());
  return keys;
}

// ------------------------------------------------------------------ limits

TEST(LimitsTest, OversizedPromptQuestionAndPositionsAreRefusedBeforeWork) {
  TempDir dir("limits");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false", "--max-prompt-tokens=512",
                     "--max-context-tokens=8192", "--max-chunk-tokens=2048", "--max-chunks=64"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  client::Client c = MakeClient(srv);
  const std::vector<std::string> keys = IngestTexts(c, {ChunkText("a", 1), ChunkText("b", 2)});
  ASSERT_EQ(keys.size(), 2u);
  const int words_1500 = WordsForTokens(c, 1500);  // queries (stores) one calibration chunk
  auto stats0 = c.Stats();
  ASSERT_TRUE(stats0.ok());

  struct Case {
    const char* name;
    std::function<void(v1::QueryRequest*)> mutate;
    Code code;
    const char* field;  // the message must name it
  };
  std::string repeated_template;
  for (int i = 0; i < 20000; ++i) repeated_template += "{question}";  // 200 KB
  std::string huge_question;
  for (int i = 0; i < 100000; ++i) huge_question += " w" + std::to_string(i % 97);
  std::string ok_question;
  for (int i = 0; i < 60; ++i) ok_question += " lamp";
  // ~4500 context tokens: under --max-context-tokens, over the 4096 positions.
  std::vector<std::string> beyond;
  for (int i = 0; i < 3; ++i) {
    beyond.push_back(LongText("beyond" + std::to_string(i), words_1500));
  }
  const std::vector<Case> cases = {
      {"template repeating {question}",
       [&](v1::QueryRequest* r) {
         r->set_prompt_template(repeated_template);
         r->set_question("What is the secret code?");
       },
       Code::kInvalidArgument, "prompt_template"},
      {"100k-token question", [&](v1::QueryRequest* r) { r->set_question(huge_question); },
       Code::kInvalidArgument, "question"},
      {"context beyond the model's positions",
       [&](v1::QueryRequest* r) {
         r->clear_chunks();
         for (const std::string& t : beyond) r->add_chunks()->set_text(t);
       },
       Code::kOutOfRange, "max_position_embeddings"},
      {"question within the limit", [&](v1::QueryRequest* r) { r->set_question(ok_question); },
       Code::kOk, ""},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.name);
    v1::QueryRequest req = QueryKeys(keys, v1::METHOD_INFOFLOW);
    k.mutate(&req);
    const auto t0 = std::chrono::steady_clock::now();
    auto r = RunQuery(c, req);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("%-40s -> %s in %.3f s\n", k.name, r.status().ToString().substr(0, 160).c_str(), s);
    EXPECT_EQ(r.status().code(), k.code) << r.status();
    EXPECT_NE(r.status().message().find(k.field), std::string::npos) << r.status();
    ASSERT_TRUE(srv.Alive()) << srv.log();
  }
  // The refused context was not prefilled or stored.
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->records(), stats0->records());
  EXPECT_TRUE(srv.Healthy());
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

TEST(LimitsTest, BeyondModelPositionsRunsWhenAllowedAndTheReportSaysSo) {
  TempDir dir("beyond");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false", "--max-context-tokens=8192",
                     "--allow-beyond-model-positions=true"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  client::Client c = MakeClient(srv);
  v1::QueryRequest req = QueryKeys({}, v1::METHOD_NONE);
  for (int i = 0; i < 3; ++i) {
    req.add_chunks()->set_text(LongText("allowed" + std::to_string(i), WordsForTokens(c, 1500)));
  }
  auto r = RunQuery(c, req);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GT(r->positions(), 4096);
  EXPECT_TRUE(r->beyond_model_positions());
  // A query inside the range is not flagged.
  v1::QueryRequest small = QueryKeys({}, v1::METHOD_NONE);
  small.add_chunks()->set_text(ChunkText("small", 3));
  auto r2 = RunQuery(c, small);
  ASSERT_TRUE(r2.ok()) << r2.status();
  EXPECT_FALSE(r2->beyond_model_positions());
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// ------------------------------------------------------------- prefix mode

TEST(PrefixModeTest, KeyStoredUnderOtherModeIsFailedPrecondition) {
  TempDir dir("prefix");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  client::Client c = MakeClient(srv);
  const std::vector<std::string> none_keys =
      IngestTexts(c, {ChunkText("n", 4)}, v1::PREFIX_MODE_NONE);
  const std::vector<std::string> bos_keys = IngestTexts(c, {ChunkText("b", 5)}, v1::PREFIX_MODE_BOS);
  ASSERT_EQ(none_keys.size(), 1u);
  ASSERT_EQ(bos_keys.size(), 1u);
  for (auto [keys, mode, stored_as] :
       {std::tuple{none_keys, v1::PREFIX_MODE_BOS, "NONE"},
        std::tuple{bos_keys, v1::PREFIX_MODE_NONE, "BOS"}}) {
    v1::QueryRequest q = QueryKeys(keys, v1::METHOD_INFOFLOW);
    q.set_prefix_mode(mode);
    auto r = RunQuery(c, q);
    EXPECT_EQ(r.status().code(), Code::kFailedPrecondition) << r.status();
    EXPECT_NE(r.status().message().find(std::string("prefix_mode ") + stored_as),
              std::string::npos)
        << r.status();
  }
  // The matching modes answer.
  v1::QueryRequest ok = QueryKeys(none_keys, v1::METHOD_INFOFLOW);
  ok.set_prefix_mode(v1::PREFIX_MODE_NONE);
  EXPECT_TRUE(RunQuery(c, ok).ok());
  EXPECT_TRUE(RunQuery(c, QueryKeys(bos_keys, v1::METHOD_INFOFLOW)).ok());
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// --------------------------------------------------------------- disk full

// A tmpfs of `mib` MiB at `path`, unmounted at scope exit. ok() is false
// where mounting is not permitted (not root, no CAP_SYS_ADMIN).
class SmallFilesystem {
 public:
  SmallFilesystem(const std::string& path, int mib) : path_(path) {
    fs::create_directories(path);
    const std::string opts = "size=" + std::to_string(mib) + "m";
    ok_ = mount("tmpfs", path.c_str(), "tmpfs", 0, opts.c_str()) == 0;
    if (!ok_) error_ = std::strerror(errno);
  }
  ~SmallFilesystem() {
    if (ok_) umount2(path_.c_str(), MNT_DETACH);
  }
  bool Resize(int mib) {
    const std::string opts = "size=" + std::to_string(mib) + "m";
    return mount("tmpfs", path_.c_str(), "tmpfs", MS_REMOUNT, opts.c_str()) == 0;
  }
  bool ok() const { return ok_; }
  const std::string& error() const { return error_; }

 private:
  std::string path_;
  bool ok_ = false;
  std::string error_;
};

bool Retryable(Code c) { return c == Code::kResourceExhausted || c == Code::kUnavailable; }

TEST(DiskFullTest, IngestIsRetryableWhileFullAndTheStoreRecoversWhenSpaceReturns) {
  TempDir dir("diskfull");
  SmallFilesystem small(dir.path + "/fs", 40);
  if (!small.ok()) GTEST_SKIP() << "cannot mount a tmpfs here (" << small.error() << ")";
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/fs/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=true", "--max-chunks=32",
                     "--min-free-disk-bytes=8388608"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  client::Client c = MakeClient(srv);

  // Fill the disk: batches of new chunks until one fails.
  std::vector<std::string> acked;  // keys whose batch was answered OK
  absl::Status failure;
  v1::IngestRequest failed_batch;
  for (int b = 0; b < 400 && failure.ok(); ++b) {
    v1::IngestRequest req;
    for (int i = 0; i < 16; ++i) req.add_chunks()->set_text(LongText("f" + std::to_string(b * 16 + i), 60));
    auto resp = c.Ingest(req);
    if (!resp.ok()) {
      failure = resp.status();
      failed_batch = req;
      break;
    }
    for (const auto& r : resp->results()) {
      ASSERT_NE(r.status(), v1::CHUNK_STATUS_ERROR) << r.error();
      acked.push_back(r.chunk_key());
    }
  }
  std::printf("%zu chunks acknowledged before the disk filled; then: %s\n", acked.size(),
              failure.ToString().c_str());
  ASSERT_FALSE(failure.ok()) << "the small filesystem never filled";
  ASSERT_FALSE(acked.empty()) << "the first batch already failed: " << failure << "\n"
                              << srv.log();
  EXPECT_TRUE(Retryable(failure.code())) << failure;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(srv.Alive()) << srv.log();

  // While full: Delete and Compact answer with OK or a retryable code.
  auto admin = v1::Admin::NewStub(srv.channel());
  {
    grpc::ClientContext ctx;
    v1::DeleteChunkRequest del;
    del.set_chunk_key(acked.front());
    v1::DeleteChunkResponse resp;
    grpc::Status s = admin->DeleteChunk(&ctx, del, &resp);
    std::printf("DeleteChunk while full: %d %s\n", s.error_code(), s.error_message().c_str());
    EXPECT_TRUE(s.ok() || Retryable(static_cast<Code>(s.error_code()))) << s.error_message();
    if (s.ok() && resp.deleted()) acked.erase(acked.begin());
  }
  {
    grpc::ClientContext ctx;
    v1::CompactResponse resp;
    grpc::Status s = admin->Compact(&ctx, v1::CompactRequest(), &resp);
    std::printf("Compact while full: %d %s\n", s.error_code(), s.error_message().c_str());
    EXPECT_TRUE(s.ok() || Retryable(static_cast<Code>(s.error_code()))) << s.error_message();
  }

  // Space comes back: the same batch goes through without a restart.
  ASSERT_TRUE(small.Resize(512));
  absl::Status retry = absl::UnknownError("not tried");
  for (int attempt = 0; attempt < 50 && !retry.ok(); ++attempt) {
    auto resp = c.Ingest(failed_batch);
    retry = resp.status();
    if (!retry.ok()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(retry.ok()) << retry;
  // Every acknowledged chunk is still there.
  for (size_t i = 0; i < acked.size(); i += 8) {
    std::vector<std::string> group(acked.begin() + i,
                                   acked.begin() + std::min(acked.size(), i + 8));
    auto r = RunQuery(c, QueryKeys(group, v1::METHOD_NONE));
    ASSERT_TRUE(r.ok()) << "acknowledged chunks " << i << "..: " << r.status();
  }
  EXPECT_GE(PromValue(srv.Metrics(), "infoflow_store_write_errors_total"), 1);
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// ----------------------------------------------------------- corrupt store

void DamageEverySstFile(const std::string& kv_dir) {
  for (const auto& e : fs::directory_iterator(kv_dir)) {
    if (e.path().extension() != ".sst") continue;
    std::fstream f(e.path(), std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<size_t>(fs::file_size(e.path()));
    const std::string junk(size / 2, '\x5a');
    f.seekp(0);
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
}

TEST(CorruptStoreTest, DamagedStoreRefusesByDefaultAndQuarantineStartsEmpty) {
  TempDir dir("corruptstore");
  const std::string kv = dir.path + "/kv";
  {
    ServerProcess srv(ServerBin(), ModelDir(), kv, dir.path + "/first.log",
                      {"--threads=1", "--store-sync=true"});
    std::string err;
    ASSERT_TRUE(srv.Start(&err)) << err;
    client::Client c = MakeClient(srv);
    ASSERT_EQ(IngestTexts(c, {ChunkText("q1", 7), ChunkText("q2", 8)}).size(), 2u);
    auto admin = v1::Admin::NewStub(srv.channel());
    grpc::ClientContext ctx;
    v1::CompactResponse resp;
    ASSERT_TRUE(admin->Compact(&ctx, v1::CompactRequest(), &resp).ok());  // flush to SST files
    ASSERT_EQ(srv.Stop(), 0) << srv.log();
  }
  DamageEverySstFile(kv);

  ServerProcess refuse(ServerBin(), ModelDir(), kv, dir.path + "/refuse.log", {"--threads=1"});
  std::string err;
  EXPECT_FALSE(refuse.Start(&err, std::chrono::seconds(60)));
  EXPECT_NE(err.find("--on-corrupt-store=quarantine"), std::string::npos) << err;

  ServerProcess q(ServerBin(), ModelDir(), kv, dir.path + "/quarantine.log",
                  {"--threads=1", "--on-corrupt-store=quarantine"});
  ASSERT_TRUE(q.Start(&err)) << err;
  EXPECT_NE(q.log().find("event=store_quarantined"), std::string::npos) << q.log();
  client::Client c = MakeClient(q);
  auto stats = c.Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->records(), 0u);
  EXPECT_EQ(PromValue(q.Metrics(), "infoflow_store_quarantined"), 1);
  int moved = 0;
  for (const auto& e : fs::directory_iterator(dir.path)) {
    moved += e.path().filename().string().rfind("kv.quarantined-", 0) == 0;
  }
  EXPECT_EQ(moved, 1);
  EXPECT_EQ(IngestTexts(c, {ChunkText("q3", 9)}).size(), 1u);  // the new store works
  EXPECT_EQ(q.Stop(), 0) << q.log();
}

// -------------------------------------------------------------- accounting

TEST(AccountingTest, QueriesWaitingOnOnePrefillCountItOnceAndQueueDepthReturnsToZero) {
  TempDir dir("accounting");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false", "--workers=4", "--queue-depth=16"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  client::Client probe = MakeClient(srv);
  const std::string text = LongText("shared", WordsForTokens(probe, 1800));  // slow enough to overlap
  const double ingest_before = PromValue(srv.Metrics(), "infoflow_ingest_tokens_total");
  constexpr int kQueries = 4;
  std::atomic<int> ready{0}, misses{0}, hits{0}, failed{0};
  std::atomic<int64_t> prefilled_tokens{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kQueries; ++t) {
    threads.emplace_back([&] {
      client::Client c = MakeClient(srv);
      v1::QueryRequest q = QueryKeys({}, v1::METHOD_NONE);
      q.add_chunks()->set_text(text);
      ++ready;
      while (ready.load() < kQueries) std::this_thread::yield();
      auto r = RunQuery(c, q);
      if (!r.ok()) {
        ++failed;
        return;
      }
      misses += r->chunk_misses();
      hits += r->chunk_hits();
      prefilled_tokens += r->context_tokens();
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(failed.load(), 0);
  EXPECT_EQ(misses.load(), 1) << "one prefill, reported by one query";
  EXPECT_EQ(hits.load(), kQueries - 1);
  const std::string m = srv.Metrics();
  EXPECT_EQ(PromValue(m, "infoflow_ingest_tokens_total") - ingest_before,
            prefilled_tokens.load() / kQueries);

  // Queue depth: one worker, many queries at once, then idle.
  ServerProcess one(ServerBin(), ModelDir(), dir.path + "/kv1", dir.path + "/one.log",
                    {"--threads=1", "--store-sync=false", "--workers=1", "--queue-depth=32"});
  ASSERT_TRUE(one.Start(&err)) << err;
  threads.clear();
  for (int t = 0; t < 12; ++t) {
    threads.emplace_back([&, t] {
      client::Client c = MakeClient(one);
      v1::QueryRequest q = QueryKeys({}, v1::METHOD_INFOFLOW);
      q.add_chunks()->set_text(LongText("depth" + std::to_string(t % 3), 100));
      q.set_max_new_tokens(4);
      (void)RunQuery(c, q);
    });
  }
  for (auto& t : threads) t.join();
  const std::string idle = one.Metrics();
  EXPECT_EQ(PromValue(idle, "infoflow_queue_depth"), 0) << idle;
  EXPECT_EQ(PromValue(idle, "infoflow_inflight_streams"), 0) << idle;
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
  EXPECT_EQ(one.Stop(), 0) << one.log();
}

// ----------------------------------------------------------------- metrics

TEST(MetricsTest, ClientsTricklingBytesDoNotBlockScrapes) {
  TempDir dir("slowmetrics");
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log",
                    {"--threads=1", "--store-sync=false"});
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  std::atomic<bool> stop{false};
  std::vector<std::thread> tricklers;
  for (int t = 0; t < 2; ++t) {
    tricklers.emplace_back([&] {
      int fd = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(srv.metrics_port()));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) return;
      const std::string req = "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
      for (size_t i = 0; !stop.load() && i < 200; ++i) {  // one byte every 250 ms, <= 50 s
        const char ch = i < req.size() ? req[i] : 'z';
        if (send(fd, &ch, 1, MSG_NOSIGNAL) != 1) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
      }
      close(fd);
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // both are connected
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::string body = srv.Metrics();  // 5 s receive timeout
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_NE(body.find("infoflow_build_info"), std::string::npos) << "scrape " << i;
    std::printf("scrape %d during 2 trickling clients: %.3f s, %zu bytes\n", i, s, body.size());
  }
  stop = true;
  for (auto& t : tricklers) t.join();
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

// -------------------------------------------------------------- memory cap

int64_t VmKiB(pid_t pid, const std::string& field) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) == 0) return std::stoll(line.substr(field.size() + 1));
  }
  return -1;
}

TEST(MemoryCapTest, LargestAllowedRequestsConcurrentlyStayUpAndUnderTheCap) {
  TempDir dir("memcap");
  // Limits the load below uses to the full.
  const int kChunks = 8, kChunkTokens = 512, kContextTokens = 3600, kPromptTokens = 256,
            kNewTokens = 16;
  const std::vector<std::string> limits = {
      "--threads=1", "--store-sync=false", "--workers=2", "--queue-depth=4",
      "--max-chunks=" + std::to_string(kChunks),
      "--max-chunk-tokens=" + std::to_string(kChunkTokens),
      "--max-context-tokens=" + std::to_string(kContextTokens),
      "--max-prompt-tokens=" + std::to_string(kPromptTokens),
      "--max-new-tokens=" + std::to_string(kNewTokens)};
  // Measure the idle server's address space first, then cap it there + 2 GiB.
  int64_t idle_vm_kib = 0;
  {
    ServerProcess probe(ServerBin(), ModelDir(), dir.path + "/probe", dir.path + "/probe.log",
                        limits);
    std::string err;
    ASSERT_TRUE(probe.Start(&err)) << err;
    idle_vm_kib = VmKiB(probe.pid(), "VmSize");
    probe.Stop();
  }
  const uint64_t cap = static_cast<uint64_t>(idle_vm_kib) * 1024 + (uint64_t{2} << 30);
  ServerProcess srv(ServerBin(), ModelDir(), dir.path + "/kv", dir.path + "/server.log", limits);
  srv.set_address_space_limit(cap);
  std::string err;
  ASSERT_TRUE(srv.Start(&err)) << err;
  std::printf("idle VmSize %lld KiB; RLIMIT_AS %llu MiB\n", static_cast<long long>(idle_vm_kib),
              static_cast<unsigned long long>(cap >> 20));

  // Texts just under each limit (measured through the server), and over it.
  client::Client probe_client = MakeClient(srv);
  // Chunks as large as both --max-chunk-tokens and --max-context-tokens / chunks allow.
  const int target = std::min(kChunkTokens, kContextTokens / kChunks) - 8;
  int words = WordsForTokens(probe_client, target) * 9 / 10;
  while (CountTokens(probe_client, LongText("size", words + 4)) <= target) words += 4;
  std::string question;
  while (true) {
    std::string longer = question + " lamp lamp lamp lamp";
    v1::QueryRequest q = QueryKeys({}, v1::METHOD_NONE);
    q.add_chunks()->set_text("x");
    q.set_question(longer);
    if (!RunQuery(probe_client, q).ok()) break;
    question = longer;
    if (question.size() > 4000) break;
  }
  std::string repeated_template;
  for (int i = 0; i < 20000; ++i) repeated_template += "{question}";

  std::mutex mu;
  std::map<std::string, int> codes;
  std::atomic<int64_t> peak_rss{0};
  std::atomic<bool> done{false};
  std::thread sampler([&] {
    while (!done.load()) {
      const int64_t rss = srv.RssKiB();
      if (rss > peak_rss.load()) peak_rss = rss;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  const int kClients = 6, kRequestsEach = 6;
  std::vector<std::thread> clients;
  for (int t = 0; t < kClients; ++t) {
    clients.emplace_back([&, t] {
      client::Client c = MakeClient(srv, 120000);
      for (int i = 0; i < kRequestsEach; ++i) {
        v1::QueryRequest q = QueryKeys({}, (i % 2) ? v1::METHOD_INFOFLOW : v1::METHOD_FULL);
        const int n_chunks = (t + i) % 3 == 2 ? kChunks + 1 : kChunks;  // some over --max-chunks
        for (int k = 0; k < n_chunks; ++k) {
          q.add_chunks()->set_text(LongText("m" + std::to_string(t) + "_" + std::to_string(i) +
                                                "_" + std::to_string(k),
                                            words));
        }
        q.set_question(question);
        q.set_max_new_tokens(kNewTokens);
        if (i == 3) q.set_prompt_template(repeated_template);  // expands past the limit
        auto r = RunQuery(c, q);
        std::lock_guard<std::mutex> lock(mu);
        codes[absl::StatusCodeToString(r.status().code())]++;
      }
    });
  }
  for (auto& t : clients) t.join();
  done = true;
  sampler.join();
  std::string summary;
  for (const auto& [code, n] : codes) summary += code + "=" + std::to_string(n) + " ";
  std::printf("%d requests: %s; peak RSS %lld MiB (cap %llu MiB)\n", kClients * kRequestsEach,
              summary.c_str(), static_cast<long long>(peak_rss.load() >> 10),
              static_cast<unsigned long long>(cap >> 20));
  for (const auto& [code, n] : codes) {
    EXPECT_TRUE(code == "OK" || code == "INVALID_ARGUMENT" || code == "OUT_OF_RANGE" ||
                code == "RESOURCE_EXHAUSTED")
        << code << " x" << n;
  }
  EXPECT_GT(codes["OK"], 0);
  EXPECT_GT(codes["INVALID_ARGUMENT"], 0);
  ASSERT_TRUE(srv.Alive()) << srv.log();
  EXPECT_TRUE(srv.Healthy());
  EXPECT_LT(static_cast<uint64_t>(peak_rss.load()) * 1024, cap);
  EXPECT_EQ(srv.Stop(), 0) << srv.log();
}

}  // namespace
}  // namespace infoflow
