// End-to-end tests of infoflow-server: the real gRPC server on an ephemeral
// 127.0.0.1 port, a real RocksDB store in a temp dir, a generated test model,
// and real promtool/prometheus for /metrics. No mocks.
#include "server/server.h"

#include <ATen/ATen.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rocksdb/db.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cache_store/chunk_store.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/model.h"
#include "engine/model/test_model.h"
#include "engine/text/tokenizer.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "server/admission.h"
#include "server/query_runner.h"
#include "server/quoted_value.h"
#include "server/services.h"
#include "tests/reliability/server_process.h"

namespace infoflow::server {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;

const std::vector<std::string> kTexts = {
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Alice keeps her spare keys in a blue box under the kitchen sink.",
    "The meeting about the new bridge was moved from Monday to Thursday.",
};
const char kQuestion[] = "Where are the spare keys?";

std::string ModelDir() {
  static const std::string dir = [] {
    std::string d = std::string(INFOFLOW_TEST_DATA_DIR) + "/server_model";
    if (!fs::exists(d + "/config.json")) {
      absl::Status s = WriteTestModel(d, TestModelSpec{});
      if (!s.ok()) {
        std::fprintf(stderr, "WriteTestModel: %s\n", s.ToString().c_str());
        std::abort();
      }
    }
    return d;
  }();
  return dir;
}

std::string TempDir(const std::string& name) {
  static std::atomic<int> n{0};
  fs::path p = fs::temp_directory_path() /
               ("infoflow_srv_" + std::to_string(getpid()) + "_" + name + "_" + std::to_string(n++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string RunCommand(const std::string& cmd, int* rc = nullptr) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  int status = pclose(p);
  if (rc) *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

bool HaveTool(const char* name) {
  return std::system((std::string("command -v ") + name + " >/dev/null 2>&1").c_str()) == 0;
}

// A running in-process server plus stubs on an insecure channel.
struct Harness {
  std::string data_dir;
  ServerOptions options;
  std::unique_ptr<InfoflowServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ChunkIngest::Stub> ingest;
  std::unique_ptr<v1::Query::Stub> query;
  std::unique_ptr<v1::Admin::Stub> admin;

  void Start() {
    absl::StatusOr<std::unique_ptr<InfoflowServer>> s = InfoflowServer::Start(options);
    ASSERT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    Connect(grpc::InsecureChannelCredentials(), "127.0.0.1");
  }
  void Connect(std::shared_ptr<grpc::ChannelCredentials> creds, const std::string& host) {
    channel = grpc::CreateChannel(host + ":" + std::to_string(server->port()), creds);
    ingest = v1::ChunkIngest::NewStub(channel);
    query = v1::Query::NewStub(channel);
    admin = v1::Admin::NewStub(channel);
  }
  void Stop() {
    ingest.reset();
    query.reset();
    admin.reset();
    channel.reset();
    server.reset();
  }
};

ServerOptions DefaultOptions(const std::string& data_dir) {
  ServerOptions o;
  o.model_dir = ModelDir();
  o.data_dir = data_dir;
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.threads = 2;
  o.store_sync = false;
  o.max_new_tokens = 128;
  return o;
}

struct QueryCall {
  grpc::Status status;
  std::vector<v1::QueryResponse> messages;
  std::vector<int32_t> ids;
  std::string text;
  bool has_report = false;
  v1::Report report;
};

QueryCall RunQueryRpc(v1::Query::Stub* stub, const v1::QueryRequest& req,
                      const std::function<void(grpc::ClientContext*)>& setup = nullptr) {
  grpc::ClientContext ctx;
  if (setup) setup(&ctx);
  QueryCall call;
  auto reader = stub->Query(&ctx, req);
  v1::QueryResponse msg;
  while (reader->Read(&msg)) {
    call.messages.push_back(msg);
    if (msg.has_token()) {
      call.ids.push_back(msg.token().id());
      call.text += msg.token().text();
    } else if (msg.has_report()) {
      call.has_report = true;
      call.report = msg.report();
    }
  }
  call.status = reader->Finish();
  return call;
}

v1::IngestRequest IngestAll() {
  v1::IngestRequest req;
  for (const std::string& t : kTexts) req.add_chunks()->set_text(t);
  return req;
}

v1::QueryRequest QueryByKeys(const std::vector<std::string>& keys, v1::Method method) {
  v1::QueryRequest req;
  for (const std::string& k : keys) req.add_chunks()->set_key(k);
  req.set_question(kQuestion);
  req.set_prompt_template("\nQuestion: {question}\nAnswer:");
  req.set_method(method);
  req.set_max_new_tokens(12);
  req.set_return_report(true);
  return req;
}

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    h_.data_dir = TempDir("kv");
    h_.options = DefaultOptions(h_.data_dir);
  }
  void TearDown() override {
    h_.Stop();
    fs::remove_all(fs::path(h_.data_dir).parent_path() == fs::temp_directory_path()
                       ? fs::path(h_.data_dir)
                       : fs::path());
  }

  std::vector<std::string> IngestKeys() {
    grpc::ClientContext ctx;
    v1::IngestResponse resp;
    grpc::Status s = h_.ingest->Ingest(&ctx, IngestAll(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> keys;
    for (const auto& r : resp.results()) keys.push_back(r.chunk_key());
    return keys;
  }

  // Starts the server with one running slot and `queue_depth` more waiting,
  // ingests the chunks into *keys, and holds the slot with a long sampled
  // stream on `ctx` (read slowly by the caller, inside the model's 4096
  // positions: more is OUT_OF_RANGE). Returns its reader once it runs.
  std::unique_ptr<grpc::ClientReader<v1::QueryResponse>> HoldTheOnlySlot(
      int queue_depth, grpc::ClientContext* ctx, std::vector<std::string>* keys) {
    h_.options.workers = 1;
    h_.options.queue_depth = queue_depth;
    h_.options.max_new_tokens = 3900;  // the test model has 4096 positions
    h_.Start();
    if (h_.query == nullptr) return nullptr;  // Start failed (fatally, for the caller)
    *keys = IngestKeys();
    v1::QueryRequest longq = QueryByKeys(*keys, v1::METHOD_NONE);
    longq.set_max_new_tokens(3900);
    // No stop id can end it early: it holds the slot until cancelled (or,
    // on a very slow box, until 3900 tokens).
    longq.set_min_new_tokens(3900);
    longq.mutable_sampling()->set_temperature(1.0);
    auto reader = h_.query->Query(ctx, longq);
    v1::QueryResponse msg;
    EXPECT_TRUE(reader->Read(&msg));  // running now
    return reader;
  }

  Harness h_;
};

TEST_F(ServerTest, IngestStoresThenReportsAlreadyPresent) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  grpc::ClientContext ctx;
  v1::IngestResponse resp;
  ASSERT_TRUE(h_.ingest->Ingest(&ctx, IngestAll(), &resp).ok());
  ASSERT_EQ(resp.results_size(), 3);
  for (const auto& r : resp.results()) {
    EXPECT_EQ(r.status(), v1::CHUNK_STATUS_STORED) << r.error();
    EXPECT_EQ(r.chunk_key().size(), 64u);
    EXPECT_GT(r.n_tokens(), 5);
  }
  grpc::ClientContext ctx2;
  v1::IngestResponse again;
  ASSERT_TRUE(h_.ingest->Ingest(&ctx2, IngestAll(), &again).ok());
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(again.results(i).status(), v1::CHUNK_STATUS_ALREADY_PRESENT);
    EXPECT_EQ(again.results(i).chunk_key(), resp.results(i).chunk_key());
  }
  // The bidi stream answers each batch in order.
  grpc::ClientContext sctx;
  auto stream = h_.ingest->IngestStream(&sctx);
  v1::IngestRequest one;
  one.add_chunks()->set_text("A brand new chunk about lighthouses and the sea.");
  ASSERT_TRUE(stream->Write(one));
  ASSERT_TRUE(stream->Write(IngestAll()));
  stream->WritesDone();
  v1::IngestResponse r1, r2;
  ASSERT_TRUE(stream->Read(&r1));
  ASSERT_TRUE(stream->Read(&r2));
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_EQ(r1.results(0).status(), v1::CHUNK_STATUS_STORED);
  EXPECT_EQ(r2.results(2).status(), v1::CHUNK_STATUS_ALREADY_PRESENT);

  grpc::ClientContext actx;
  v1::StatsResponse stats;
  ASSERT_TRUE(h_.admin->Stats(&actx, v1::StatsRequest(), &stats).ok());
  EXPECT_EQ(stats.records(), 4u);
}

TEST_F(ServerTest, EveryMethodStreamsTokensThenReport) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  ASSERT_EQ(keys.size(), 3u);
  for (v1::Method m : {v1::METHOD_FULL, v1::METHOD_NONE, v1::METHOD_INFOFLOW,
                       v1::METHOD_CACHEBLEND, v1::METHOD_EPIC, v1::METHOD_RANDOM,
                       v1::METHOD_CACHEBLEND_PARTIAL, v1::METHOD_INFOFLOW_BLEND}) {
    SCOPED_TRACE(v1::Method_Name(m));
    v1::QueryRequest req = QueryByKeys(keys, m);
    req.mutable_ratio()->set_value(0.3);
    // The layer-1 K deviation for the methods that rank by it.
    if (m == v1::METHOD_CACHEBLEND_PARTIAL) req.set_deviation(v1::DEVIATION_K);
    QueryCall call = RunQueryRpc(h_.query.get(), req);
    ASSERT_TRUE(call.status.ok()) << call.status.error_message();
    ASSERT_TRUE(call.has_report);
    ASSERT_GE(call.messages.size(), 2u);
    EXPECT_TRUE(call.messages.front().has_token()) << "first event must be a token";
    EXPECT_TRUE(call.messages.back().has_report()) << "report must come last";
    const v1::Report& r = call.report;
    EXPECT_EQ(r.method(), m);
    EXPECT_EQ(r.chunk_hits(), 3);
    EXPECT_EQ(r.chunk_misses(), 0);
    EXPECT_EQ(r.generated_tokens(), static_cast<int>(call.ids.size()));
    EXPECT_EQ(r.text(), call.text);
    EXPECT_GT(r.ttft_ms(), 0);
    EXPECT_EQ(r.chunk_order_size(), 3);
    ASSERT_EQ(r.chunk_keys_size(), 3);
    EXPECT_EQ(r.chunk_keys(1), keys[1]);
    EXPECT_LE(r.recomputed_tokens(), r.context_tokens());
    if (m == v1::METHOD_FULL) {
      EXPECT_EQ(r.recomputed_tokens(), r.context_tokens());
    }
    if (m == v1::METHOD_NONE) {
      EXPECT_EQ(r.recomputed_tokens(), 0);
    }
    const bool uses_ratio = m != v1::METHOD_FULL && m != v1::METHOD_NONE && m != v1::METHOD_EPIC;
    EXPECT_EQ(r.ratio(), uses_ratio ? 0.3 : 0.0);
  }
}

// A request that names no method gets the server default, INFOFLOW_BLEND,
// at its default r = 0.05; a method without a ratio gets its own default.
TEST_F(ServerTest, UnsetMethodAndRatioGetTheDefaults) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  struct Case {
    v1::Method asked, ran;
    double ratio;
  };
  for (const Case& c : {Case{v1::METHOD_UNSPECIFIED, v1::METHOD_INFOFLOW_BLEND, 0.05},
                        Case{v1::METHOD_INFOFLOW_BLEND, v1::METHOD_INFOFLOW_BLEND, 0.05},
                        Case{v1::METHOD_INFOFLOW, v1::METHOD_INFOFLOW, 0.15},
                        Case{v1::METHOD_CACHEBLEND, v1::METHOD_CACHEBLEND, 0.15}}) {
    SCOPED_TRACE(v1::Method_Name(c.asked));
    v1::QueryRequest req = QueryByKeys(keys, c.asked);
    req.clear_ratio();
    QueryCall call = RunQueryRpc(h_.query.get(), req);
    ASSERT_TRUE(call.status.ok()) << call.status.error_message();
    ASSERT_TRUE(call.has_report);
    EXPECT_EQ(call.report.method(), c.ran);
    EXPECT_EQ(call.report.ratio(), c.ratio);
    // The budget is floor(r * context tokens), first chunk excluded only
    // when that leaves fewer eligible.
    EXPECT_LE(call.report.recomputed_tokens(),
              static_cast<int64_t>(c.ratio * call.report.context_tokens()));
    EXPECT_GT(call.report.recomputed_tokens(), 0);
  }
}

TEST_F(ServerTest, ReportCountsMatchIngest) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  grpc::ClientContext ctx;
  v1::IngestResponse resp;
  ASSERT_TRUE(h_.ingest->Ingest(&ctx, IngestAll(), &resp).ok());
  std::vector<std::string> keys;
  int64_t tokens = 0;
  for (const auto& r : resp.results()) {
    keys.push_back(r.chunk_key());
    tokens += r.n_tokens();
  }
  v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_INFOFLOW);
  req.mutable_ratio()->set_value(0.5);
  req.set_reorder(true);
  QueryCall call = RunQueryRpc(h_.query.get(), req);
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.report.context_tokens(), tokens);
  EXPECT_EQ(call.report.recomputed_tokens(), static_cast<int64_t>(0.5 * tokens));
  std::vector<int> order(call.report.chunk_order().begin(), call.report.chunk_order().end());
  std::sort(order.begin(), order.end());
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2}));
}

TEST_F(ServerTest, FullAnswerEqualsDirectRunQuery) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_FULL);
  req.set_max_new_tokens(16);
  QueryCall call = RunQueryRpc(h_.query.get(), req);
  ASSERT_TRUE(call.status.ok()) << call.status.error_message();

  // The same query straight through the engine.
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(ModelDir());
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(ModelDir() + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  QueryInput input;
  input.prefix_ids = {static_cast<int32_t>((*model)->config().bos_token_id.value_or(1))};
  input.chunk_prefix_mode = PrefixMode::kBos;
  for (const std::string& t : kTexts) {
    absl::StatusOr<ChunkKv> kv = PrefillChunk(**model, (*tok)->Encode(t), PrefixMode::kBos);
    ASSERT_TRUE(kv.ok());
    input.chunks.push_back(std::make_shared<const ChunkKv>(*std::move(kv)));
  }
  input.question_ids = (*tok)->Encode(kQuestion);
  input.prompt_ids = (*tok)->Encode(RenderPrompt(req.prompt_template(), kQuestion));
  MethodOptions mo;
  mo.method = Method::kFull;
  DecodeOptions d;
  d.max_new_tokens = 16;
  for (int64_t id : (*model)->config().eos_token_ids) d.stop_ids.push_back(static_cast<int32_t>(id));
  absl::StatusOr<QueryResult> direct =
      RunQuery(**model, tok->get(), input, mo, d, [](int32_t, std::string_view) { return true; });
  ASSERT_TRUE(direct.ok()) << direct.status();
  EXPECT_EQ(call.ids, direct->decode.ids);
  EXPECT_EQ(call.report.text(), direct->decode.text);
  EXPECT_FALSE(call.ids.empty());
}

TEST_F(ServerTest, TextChunksAreWrittenThroughThenHit) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  v1::QueryRequest req;
  for (const std::string& t : kTexts) req.add_chunks()->set_text(t);
  req.set_question(kQuestion);
  req.set_method(v1::METHOD_NONE);
  req.set_max_new_tokens(4);
  req.set_return_report(true);
  QueryCall first = RunQueryRpc(h_.query.get(), req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.report.chunk_misses(), 3);
  EXPECT_EQ(first.report.chunk_hits(), 0);
  QueryCall second = RunQueryRpc(h_.query.get(), req);
  ASSERT_TRUE(second.status.ok());
  EXPECT_EQ(second.report.chunk_hits(), 3);
  EXPECT_EQ(second.report.chunk_misses(), 0);
  EXPECT_EQ(first.ids, second.ids);
  // The keys it reports resolve by key too.
  std::vector<std::string> keys(second.report.chunk_keys().begin(), second.report.chunk_keys().end());
  QueryCall by_key = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_TRUE(by_key.status.ok()) << by_key.status.error_message();
}

// PREFIX_MODE_BOS (the default): the lone BOS token is prefilled once per
// server, not once per query. Attention query rows (summed over layers) for
// a one-token METHOD_NONE query are the prompt's rows only, after a first
// query that also ran BOS's; the answer is the same (the engine test
// StoredBosEqualsFreshBosBitForBit pins the logits bit for bit).
TEST_F(ServerTest, BosIsPrefilledOncePerServerNotPerQuery) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_NONE);
  req.set_max_new_tokens(1);  // the first token comes from the prompt: no decode step
  auto rows_of = [&](QueryCall* call) {
    const int64_t before = AttentionQueryRows();
    *call = RunQueryRpc(h_.query.get(), req);
    return AttentionQueryRows() - before;
  };
  QueryCall first, second;
  const int64_t first_rows = rows_of(&first);
  const int64_t second_rows = rows_of(&second);
  ASSERT_TRUE(first.status.ok() && second.status.ok()) << first.status.error_message();
  const v1::Report& r = second.report;
  EXPECT_EQ(r.prefix_tokens(), 1);
  const int64_t prompt = r.positions() - r.prefix_tokens() - r.context_tokens() - 1;
  ASSERT_GT(prompt, 1);
  ASSERT_EQ(second_rows % prompt, 0) << second_rows << " rows, prompt " << prompt;
  const int64_t layers = second_rows / prompt;
  EXPECT_GT(layers, 0);
  EXPECT_EQ(first_rows, second_rows + layers);  // BOS's one row per layer, the first time only
  EXPECT_EQ(first.ids, second.ids);
}

TEST_F(ServerTest, RestartOnSameDataDirKeepsChunks) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  QueryCall before = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_INFOFLOW));
  ASSERT_TRUE(before.status.ok());
  h_.Stop();
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  QueryCall after = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_INFOFLOW));
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.report.chunk_hits(), 3);
  EXPECT_EQ(after.ids, before.ids);
  grpc::ClientContext ctx;
  v1::IngestResponse resp;
  ASSERT_TRUE(h_.ingest->Ingest(&ctx, IngestAll(), &resp).ok());
  EXPECT_EQ(resp.results(0).status(), v1::CHUNK_STATUS_ALREADY_PRESENT);
}

// A corrupt stored record is a miss: by text it is prefilled again and
// overwritten; by key it reads as NOT_FOUND.
TEST_F(ServerTest, CorruptRecordIsRecomputedWhenTextIsGiven) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  h_.Stop();
  {
    store::ChunkStoreOptions so;
    so.path = h_.data_dir;
    auto st = store::ChunkStore::Open(so);
    ASSERT_TRUE(st.ok()) << st.status();
    auto key = store::ChunkKey::FromHex(keys[1]);
    ASSERT_TRUE(key.ok());
    std::string value;
    rocksdb::DB* db = (*st)->db_for_testing();
    ASSERT_TRUE(db->Get(rocksdb::ReadOptions(), (*st)->data_cf_for_testing(),
                        rocksdb::Slice(key->AsBytes().data(), key->AsBytes().size()), &value)
                    .ok());
    value[value.size() / 2] ^= 0x5a;
    ASSERT_TRUE(db->Put(rocksdb::WriteOptions(), (*st)->data_cf_for_testing(),
                        rocksdb::Slice(key->AsBytes().data(), key->AsBytes().size()), value)
                    .ok());
  }
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  QueryCall by_key = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_EQ(by_key.status.error_code(), grpc::NOT_FOUND) << by_key.status.error_message();
  EXPECT_NE(by_key.status.error_message().find(keys[1]), std::string::npos);
  v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_NONE);
  req.mutable_chunks(1)->set_text(kTexts[1]);
  QueryCall by_text = RunQueryRpc(h_.query.get(), req);
  ASSERT_TRUE(by_text.status.ok()) << by_text.status.error_message();
  EXPECT_EQ(by_text.report.chunk_misses(), 1);
  EXPECT_EQ(by_text.report.chunk_hits(), 2);
  EXPECT_EQ(by_text.report.chunk_keys(1), keys[1]);
  QueryCall again = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_TRUE(again.status.ok()) << again.status.error_message();
  EXPECT_EQ(again.ids, by_text.ids);
  grpc::ClientContext ctx;
  v1::StatsResponse stats;
  ASSERT_TRUE(h_.admin->Stats(&ctx, v1::StatsRequest(), &stats).ok());
  EXPECT_GE(stats.corrupt(), 1u);
}

TEST(ChunkCodecTest, RoundTripIsBitExactAndOtherModelsAreRefused) {
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(ModelDir());
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> ids = {5, 17, 42, 99, 300};
  absl::StatusOr<ChunkKv> kv = PrefillChunk(**model, ids, PrefixMode::kBos);
  ASSERT_TRUE(kv.ok());
  absl::StatusOr<std::string> bytes = EncodeChunkRecord(**model, *kv, PrefixMode::kBos);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  absl::StatusOr<store::KvRecord> rec = store::DecodeRecord(*bytes);
  ASSERT_TRUE(rec.ok()) << rec.status();
  EXPECT_EQ(rec->Key(), ChunkKeyFor(**model, ids, PrefixMode::kBos));
  EXPECT_NE(rec->Key(), ChunkKeyFor(**model, ids, PrefixMode::kNone));
  absl::StatusOr<std::shared_ptr<const ChunkKv>> back =
      DecodeChunkRecord(**model, *rec, PrefixMode::kBos);
  ASSERT_TRUE(back.ok()) << back.status();
  // The record knows its prefix mode: a query under the other mode is refused.
  absl::Status other_mode = DecodeChunkRecord(**model, *rec, PrefixMode::kNone).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(other_mode)) << other_mode;
  EXPECT_NE(other_mode.message().find("prefix_mode BOS"), std::string::npos) << other_mode;
  EXPECT_EQ((*back)->token_ids, ids);
  for (int l = 0; l < (*model)->n_layers(); ++l) {
    EXPECT_TRUE(at::equal((*back)->k[l], kv->k[l])) << l;
    EXPECT_TRUE(at::equal((*back)->v[l], kv->v[l])) << l;
  }
  (*model)->set_fingerprint("another-model");
  EXPECT_TRUE(
      absl::IsFailedPrecondition(DecodeChunkRecord(**model, *rec, PrefixMode::kBos).status()));
  ChunkKv short_kv = *kv;
  short_kv.k.pop_back();
  EXPECT_TRUE(absl::IsInvalidArgument(EncodeChunkRecord(**model, short_kv, PrefixMode::kBos).status()));
}

TEST(ServerOptionsTest, FlagsAndConfigFile) {
  const std::string dir = TempDir("cfg");
  std::ofstream(dir + "/server.conf") << "# comment\nlisten = 127.0.0.1:0\nworkers=3\n"
                                      << "max-new-tokens=99\nstore-sync=false\n";
  std::vector<std::string> args = {"infoflow-server", "--config", dir + "/server.conf",
                                   "--workers=5", "--data-dir", "/x/kv"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  auto o = ParseServerFlags(static_cast<int>(argv.size()), argv.data(), &help);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(o->listen, "127.0.0.1:0");
  EXPECT_EQ(o->workers, 5);  // the command line wins over the file
  EXPECT_EQ(o->max_new_tokens, 99);
  EXPECT_FALSE(o->store_sync);
  EXPECT_EQ(o->data_dir, "/x/kv");
  std::vector<std::string> bad = {"infoflow-server", "--workers", "zero"};
  std::vector<char*> bargv;
  for (auto& a : bad) bargv.push_back(a.data());
  auto b = ParseServerFlags(static_cast<int>(bargv.size()), bargv.data(), &help);
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.status().message().find("--workers"), std::string::npos);
  std::vector<std::string> tls = {"infoflow-server", "--tls-cert", "c.pem"};
  std::vector<char*> targv;
  for (auto& a : tls) targv.push_back(a.data());
  EXPECT_FALSE(ParseServerFlags(static_cast<int>(targv.size()), targv.data(), &help).ok());
  // The codec flags are checked together, at parse time.
  for (std::vector<std::string> codec : {std::vector<std::string>{"s", "--kv-codec", "int3"},
                                         std::vector<std::string>{"s", "--kv-codec", "int4",
                                                                  "--kv-group-size", "5000"}}) {
    std::vector<char*> cargv;
    for (auto& a : codec) cargv.push_back(a.data());
    auto c = ParseServerFlags(static_cast<int>(cargv.size()), cargv.data(), &help);
    ASSERT_FALSE(c.ok());
    EXPECT_NE(c.status().message().find(codec[3 == codec.size() ? 1 : 3]), std::string::npos)
        << c.status();
  }
  fs::remove_all(dir);
}

// ParseServerFlags on `args` after the program name.
absl::StatusOr<ServerOptions> ParseFlags(std::vector<std::string> args) {
  args.insert(args.begin(), "infoflow-server");
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  bool help = false;
  return ParseServerFlags(static_cast<int>(argv.size()), argv.data(), &help);
}

TEST(ServerOptionsTest, SharedTierFlags) {
  auto off = ParseFlags({});
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(off->remote_redis, "") << "the shared tier is off by default";
  auto on =
      ParseFlags({"--remote-redis", "r1:7000,r2:7001",
                  "--remote-key-prefix=kv:", "--remote-timeout-ms=50", "--remote-ttl-s=3600"});
  ASSERT_TRUE(on.ok()) << on.status();
  EXPECT_EQ(on->remote_redis, "r1:7000,r2:7001");
  EXPECT_EQ(on->remote_key_prefix, "kv:");
  EXPECT_EQ(on->remote_timeout_ms, 50);
  EXPECT_EQ(on->remote_ttl_s, 3600);
  EXPECT_EQ(off->remote_fill_queue_bytes, uint64_t{256} << 20);
  EXPECT_EQ(off->remote_drain_timeout_ms, 5000);
  auto queues = ParseFlags({"--remote-fill-queue-bytes=1", "--remote-write-queue-bytes=2",
                            "--remote-write-attempts=3", "--remote-write-give-up-s=4",
                            "--remote-drain-timeout-ms=0"});
  ASSERT_TRUE(queues.ok()) << queues.status();
  EXPECT_EQ(queues->remote_fill_queue_bytes, 1u);
  EXPECT_EQ(queues->remote_write_queue_bytes, 2u);
  EXPECT_EQ(queues->remote_write_attempts, 3);
  EXPECT_EQ(queues->remote_write_give_up_s, 4);
  EXPECT_EQ(queues->remote_drain_timeout_ms, 0);
  for (auto [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--remote-redis", "r1"}, {"--remote-redis", "r1:7000,:7001"},
           {"--remote-timeout-ms", "0"}, {"--remote-ttl-s", "-1"},
           {"--remote-write-attempts", "0"}, {"--remote-fill-queue-bytes", "x"},
           {"--remote-key-prefix", std::string(300, 'p')}}) {
    auto bad = ParseFlags({flag, value});
    ASSERT_FALSE(bad.ok()) << flag << " " << value;
    EXPECT_NE(bad.status().message().find(flag), std::string::npos) << bad.status();
  }
}

TEST(QuotedValueTest, CutsLongValuesAndKeepsThemOnOneLine) {
  EXPECT_EQ(QuotedValue("gpt-17"), "'gpt-17'");
  EXPECT_EQ(QuotedValue(std::string(100, 'x')), "'" + std::string(64, 'x') + "...' (100 bytes)");
  // Cut before a character's continuation bytes, never inside it.
  const std::string accented = std::string(63, 'a') + "\xC3\xA9" + std::string(10, 'b');
  EXPECT_EQ(QuotedValue(accented), "'" + std::string(63, 'a') + "...' (75 bytes)");
  EXPECT_EQ(PrintableText("a\nb\r\tc\x01\x7f", 100), "a\\nb\\r\\tc\\x01\\x7f");
  EXPECT_EQ(QuotedValue("x\nforged"), "'x\\nforged'");
}

TEST(ServerOptionsTest, ListenerFlagsAreBounded) {
  auto def = ParseFlags({});
  ASSERT_TRUE(def.ok());
  EXPECT_EQ(def->http_max_connections, 512);
  EXPECT_EQ(def->http_request_timeout_ms, 30000);
  EXPECT_EQ(def->grpc_max_threads, 512);
  EXPECT_EQ(def->grpc_stream_idle_ms, 60000);
  auto set = ParseFlags({"--http-max-connections=8", "--http-request-timeout-ms=3600000",
                         "--http-max-body-bytes=1073741824", "--grpc-max-threads=8",
                         "--grpc-stream-idle-ms=0"});
  ASSERT_TRUE(set.ok()) << set.status();
  EXPECT_EQ(set->http_max_connections, 8);
  EXPECT_EQ(set->http_request_timeout_ms, 3600000);
  EXPECT_EQ(set->grpc_max_threads, 8);
  EXPECT_EQ(set->grpc_stream_idle_ms, 0);
  // A deadline is now + the timeout, and the bodies' budget 16 x the body
  // limit: both must stay far from overflowing.
  for (auto [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--http-max-connections", "1"},
           {"--http-max-connections", "65537"},
           {"--http-request-timeout-ms", "99"},
           {"--http-request-timeout-ms", "3600001"},
           {"--http-request-timeout-ms", "9223372036854775807"},
           {"--http-max-body-bytes", "1073741825"},
           {"--grpc-max-threads", "7"},
           {"--grpc-max-threads", "65537"},
           {"--grpc-stream-idle-ms", "-1"},
           {"--grpc-stream-idle-ms", "86400001"}}) {
    auto bad = ParseFlags({flag, value});
    ASSERT_FALSE(bad.ok()) << flag << " " << value;
    EXPECT_NE(bad.status().message().find(flag), std::string::npos) << bad.status();
  }
}

TEST_F(ServerTest, BadInputsGetTheirStatusAndServerStaysUsable) {
  h_.options.max_chunks = 4;
  h_.options.max_chunk_tokens = 64;
  h_.options.max_context_tokens = 128;  // chunk text bytes: at most 128 x 32 = 4096
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  struct Case {
    const char* name;
    std::function<void(v1::QueryRequest*)> mutate;
    grpc::StatusCode code;
    const char* field;  // must appear in the message
  };
  const std::string absent(64, 'a');
  const std::vector<Case> cases = {
      // gRPC's Query answers over chunks (the HTTP API serves plain prompts).
      {"no chunks", [](v1::QueryRequest* r) { r->clear_chunks(); }, grpc::INVALID_ARGUMENT,
       "chunks: at least one chunk"},
      {"too many chunks",
       [](v1::QueryRequest* r) {
         for (int i = 0; i < 4; ++i) r->add_chunks()->set_text("x y z");
       },
       grpc::INVALID_ARGUMENT, "chunks"},
      {"empty text chunk", [](v1::QueryRequest* r) { r->add_chunks()->set_text(""); },
       grpc::INVALID_ARGUMENT, "chunks[3].text"},
      {"oversized chunk",
       [](v1::QueryRequest* r) {
         std::string big;
         for (int i = 0; i < 200; ++i) big += "word" + std::to_string(i) + " ";
         r->add_chunks()->set_text(big);
       },
       grpc::INVALID_ARGUMENT, "chunks[3].text"},
      // Refused by bytes before the prefill thread tokenizes any of it.
      {"chunk texts over the context's bytes",
       [](v1::QueryRequest* r) {
         r->clear_chunks();
         for (int i = 0; i < 3; ++i) r->add_chunks()->set_text(std::string(2000, 'a'));
       },
       grpc::INVALID_ARGUMENT, "chunks: 6000 bytes of chunk text"},
      {"invalid utf8 chunk", [](v1::QueryRequest* r) { r->add_chunks()->set_text("ab\xC3\x28"); },
       grpc::INVALID_ARGUMENT, "UTF-8"},
      {"invalid utf8 question", [](v1::QueryRequest* r) { r->set_question("\xFF\xFE"); },
       grpc::INVALID_ARGUMENT, "question"},
      {"empty question", [](v1::QueryRequest* r) { r->clear_question(); }, grpc::INVALID_ARGUMENT,
       "question"},
      {"ratio NaN", [](v1::QueryRequest* r) { r->mutable_ratio()->set_value(std::nan("")); },
       grpc::INVALID_ARGUMENT, "ratio"},
      {"ratio > 1", [](v1::QueryRequest* r) { r->mutable_ratio()->set_value(1.5); },
       grpc::INVALID_ARGUMENT, "ratio"},
      {"ratio < 0", [](v1::QueryRequest* r) { r->mutable_ratio()->set_value(-0.1); },
       grpc::INVALID_ARGUMENT, "ratio"},
      {"max_new_tokens over limit", [](v1::QueryRequest* r) { r->set_max_new_tokens(100000); },
       grpc::INVALID_ARGUMENT, "max_new_tokens"},
      {"min_new_tokens over max_new_tokens",
       [](v1::QueryRequest* r) {
         r->set_max_new_tokens(8);
         r->set_min_new_tokens(9);
       },
       grpc::INVALID_ARGUMENT, "min_new_tokens"},
      {"negative min_new_tokens", [](v1::QueryRequest* r) { r->set_min_new_tokens(-1); },
       grpc::INVALID_ARGUMENT, "min_new_tokens"},
      {"unknown method", [](v1::QueryRequest* r) { r->set_method(static_cast<v1::Method>(42)); },
       grpc::INVALID_ARGUMENT, "method"},
      {"bad scoring layer", [](v1::QueryRequest* r) { r->add_scoring_layers(99); },
       grpc::INVALID_ARGUMENT, "scoring_layers"},
      // Repeated fields are bounded: the decode loop reads every stop string
      // and stop id per token, scoring every listed layer.
      {"more scoring layers than the model has",
       [](v1::QueryRequest* r) {
         for (int i = 0; i < 100; ++i) r->add_scoring_layers(0);
       },
       grpc::INVALID_ARGUMENT, "scoring_layers: 100 entries"},
      {"a scoring layer twice",
       [](v1::QueryRequest* r) {
         r->add_scoring_layers(1);
         r->add_scoring_layers(1);
       },
       grpc::INVALID_ARGUMENT, "scoring_layers: layer 1 listed twice"},
      {"too many stop strings",
       [](v1::QueryRequest* r) {
         for (int i = 0; i <= kMaxStopStrings; ++i) r->add_stop("s" + std::to_string(i));
       },
       grpc::INVALID_ARGUMENT, "stop: 17 stop strings"},
      {"stop string too long",
       [](v1::QueryRequest* r) { r->add_stop(std::string(kMaxStopStringBytes + 1, 'q')); },
       grpc::INVALID_ARGUMENT, "stop[0]: 257 bytes"},
      {"too many stop ids",
       [](v1::QueryRequest* r) {
         for (int i = 0; i <= kMaxStopIds; ++i) r->add_stop_ids(2);
       },
       grpc::INVALID_ARGUMENT, "stop_ids: 1025 ids"},
      {"unknown deviation",
       [](v1::QueryRequest* r) { r->set_deviation(static_cast<v1::Deviation>(9)); },
       grpc::INVALID_ARGUMENT, "deviation"},
      {"unknown prefix_store",
       [](v1::QueryRequest* r) { r->set_prefix_store(static_cast<v1::PrefixStore>(7)); },
       grpc::INVALID_ARGUMENT, "prefix_store"},
      {"min_new_tokens over max_new_tokens beside ignore_eos",
       [](v1::QueryRequest* r) {
         r->set_max_new_tokens(8);
         r->set_min_new_tokens(9);
         r->set_ignore_eos(true);
       },
       grpc::INVALID_ARGUMENT, "min_new_tokens"},
      {"malformed key", [](v1::QueryRequest* r) { r->add_chunks()->set_key("xyz"); },
       grpc::INVALID_ARGUMENT, "chunks[3].key"},
      {"missing key", [absent](v1::QueryRequest* r) { r->add_chunks()->set_key(absent); },
       grpc::NOT_FOUND, "aaaaaaaa"},
      {"wrong model name", [](v1::QueryRequest* r) { r->mutable_model()->set_name("gpt-17"); },
       grpc::FAILED_PRECONDITION, "model.name"},
      // Echoed whole, these overran the client's metadata limit: it saw
      // RESOURCE_EXHAUSTED naming no field, and its channel failed the
      // next call too (the good query below runs on the same channel).
      {"long malformed key",
       [](v1::QueryRequest* r) { r->add_chunks()->set_key(std::string(20000, 'x')); },
       grpc::INVALID_ARGUMENT, "chunks[3].key: expected 64 hex digits, got 'xxx"},
      {"long model name",
       [](v1::QueryRequest* r) { r->mutable_model()->set_name(std::string(1 << 20, 'n')); },
       grpc::FAILED_PRECONDITION, "...' (1048576 bytes)"},
      {"wrong fingerprint",
       [](v1::QueryRequest* r) { r->mutable_model()->set_fingerprint("deadbeef"); },
       grpc::FAILED_PRECONDITION, "model.fingerprint"},
      {"chunk with neither key nor text", [](v1::QueryRequest* r) { r->add_chunks(); },
       grpc::INVALID_ARGUMENT, "chunks[3]"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_INFOFLOW);
    c.mutate(&req);
    QueryCall call = RunQueryRpc(h_.query.get(), req);
    EXPECT_EQ(call.status.error_code(), c.code) << call.status.error_message();
    EXPECT_NE(call.status.error_message().find(c.field), std::string::npos)
        << call.status.error_message();
    EXPECT_TRUE(call.ids.empty());
  }
  // Ingest refuses a bad batch whole.
  {
    v1::IngestRequest req = IngestAll();
    req.add_chunks()->set_text("\xC0\xAF");
    grpc::ClientContext ctx;
    v1::IngestResponse resp;
    grpc::Status s = h_.ingest->Ingest(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("chunks[3].text"), std::string::npos);
  }
  {
    grpc::ClientContext ctx;
    v1::IngestResponse resp;
    EXPECT_EQ(h_.ingest->Ingest(&ctx, v1::IngestRequest(), &resp).error_code(), grpc::INVALID_ARGUMENT);
  }
  {
    // The client_id is echoed back: a label, bounded, not a second payload.
    v1::IngestRequest req = IngestAll();
    req.mutable_chunks(1)->set_client_id(std::string(1025, 'x'));
    grpc::ClientContext ctx;
    v1::IngestResponse resp;
    grpc::Status s = h_.ingest->Ingest(&ctx, req, &resp);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("chunks[1].client_id: 1025 bytes"), std::string::npos)
        << s.error_message();
    req.mutable_chunks(1)->set_client_id(std::string(1024, 'x'));
    grpc::ClientContext ok_ctx;
    ASSERT_TRUE(h_.ingest->Ingest(&ok_ctx, req, &resp).ok());
    EXPECT_EQ(resp.results(1).client_id(), std::string(1024, 'x'));
  }
  {
    grpc::ClientContext ctx;
    v1::DeleteChunkRequest req;
    req.set_chunk_key("nothex");
    v1::DeleteChunkResponse resp;
    EXPECT_EQ(h_.admin->DeleteChunk(&ctx, req, &resp).error_code(), grpc::INVALID_ARGUMENT);
  }
  QueryCall good = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_INFOFLOW));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_FALSE(good.ids.empty());
  // Each bound itself is accepted, and the stop ids masked until
  // min_new_tokens still never come out.
  v1::QueryRequest at_bounds = QueryByKeys(keys, v1::METHOD_INFOFLOW);
  for (int i = 0; i < kMaxStopStrings; ++i) {
    at_bounds.add_stop(std::string(kMaxStopStringBytes - 3, 'q') + std::to_string(100 + i));
  }
  std::vector<int32_t> stop_ids;
  for (int i = 0; i < kMaxStopIds; ++i) stop_ids.push_back(2 + i % 40);
  for (int32_t id : stop_ids) at_bounds.add_stop_ids(id);
  at_bounds.add_scoring_layers(1);
  at_bounds.add_scoring_layers(0);
  at_bounds.set_min_new_tokens(at_bounds.max_new_tokens());
  QueryCall bounded = RunQueryRpc(h_.query.get(), at_bounds);
  ASSERT_TRUE(bounded.status.ok()) << bounded.status.error_message();
  EXPECT_EQ(static_cast<int>(bounded.ids.size()), at_bounds.max_new_tokens());
  for (int32_t id : bounded.ids) {
    EXPECT_EQ(std::count(stop_ids.begin(), stop_ids.end(), id), 0) << "stop id " << id;
  }
}

int ProcessThreads() {
  std::ifstream f("/proc/self/status");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

using IngestStreamRw = grpc::ClientReaderWriter<v1::IngestRequest, v1::IngestResponse>;

// An IngestStream handler holds a server thread while it waits for the
// client: 3000 idle streams held 3000 threads before --grpc-stream-idle-ms.
TEST_F(ServerTest, AnIdleIngestStreamIsCancelledAndABusyOneIsNot) {
  h_.options.grpc_stream_idle_ms = 1000;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  // Deadlines only so that a server that never reaps fails the test instead
  // of hanging it.
  const auto deadline = std::chrono::system_clock::now() + std::chrono::seconds(20);
  grpc::ClientContext idle_ctx;
  idle_ctx.set_deadline(deadline);
  std::unique_ptr<IngestStreamRw> idle = h_.ingest->IngestStream(&idle_ctx);
  const auto t0 = std::chrono::steady_clock::now();
  // The busy stream sends a batch every 150 ms for 1.5 s: never 1 s quiet, even on a loaded
  // machine.
  grpc::ClientContext busy_ctx;
  std::unique_ptr<IngestStreamRw> busy = h_.ingest->IngestStream(&busy_ctx);
  int answered = 0;
  for (int i = 0; i < 10; ++i) {
    v1::IngestRequest req;
    req.add_chunks()->set_text(kTexts[i % 3]);
    ASSERT_TRUE(busy->Write(req)) << "batch " << i;
    v1::IngestResponse resp;
    ASSERT_TRUE(busy->Read(&resp)) << "batch " << i;
    answered += resp.results_size();
    std::this_thread::sleep_for(std::chrono::milliseconds(150));
  }
  busy->WritesDone();
  EXPECT_TRUE(busy->Finish().ok());
  EXPECT_EQ(answered, 10);
  // The idle one was ended by the server, about 1-1.25 s after it opened.
  const grpc::Status idle_status = idle->Finish();
  EXPECT_EQ(idle_status.error_code(), grpc::CANCELLED) << idle_status.error_message();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, std::chrono::milliseconds(1000));
  // A stream that idles between batches is ended after it too, and the
  // batches it sent before were answered.
  grpc::ClientContext late_ctx;
  late_ctx.set_deadline(deadline);
  std::unique_ptr<IngestStreamRw> late = h_.ingest->IngestStream(&late_ctx);
  v1::IngestRequest req = IngestAll();
  ASSERT_TRUE(late->Write(req));
  v1::IngestResponse resp;
  ASSERT_TRUE(late->Read(&resp));
  EXPECT_EQ(resp.results_size(), req.chunks_size());
  EXPECT_FALSE(late->Read(&resp));  // then nothing: the server ended it
  EXPECT_EQ(late->Finish().error_code(), grpc::CANCELLED);
}

// A client that reads nothing fills the stream's flow-control window (a
// small one here, as a client may announce), and the handler's Write()
// blocks, holding a server thread. The reaper ends it after
// --grpc-stream-idle-ms; time spent queued or computing does not count.
TEST_F(ServerTest, AQueryWhoseClientReadsNothingIsCancelled) {
  h_.options.grpc_stream_idle_ms = 1000;
  h_.options.max_new_tokens = 3000;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 1024);
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  auto channel = grpc::CreateCustomChannel("127.0.0.1:" + std::to_string(h_.server->port()),
                                           grpc::InsecureChannelCredentials(), args);
  std::unique_ptr<v1::Query::Stub> stub = v1::Query::NewStub(channel);
  v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_NONE);
  req.set_max_new_tokens(3000);
  req.set_min_new_tokens(3000);
  req.mutable_sampling()->set_temperature(1.0);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  std::unique_ptr<grpc::ClientReader<v1::QueryResponse>> reader = stub->Query(&ctx, req);
  std::this_thread::sleep_for(std::chrono::seconds(4));  // reads nothing
  int tokens = 0;
  v1::QueryResponse msg;
  while (reader->Read(&msg)) tokens += msg.has_token();
  const grpc::Status status = reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::CANCELLED) << status.error_message();
  EXPECT_LT(tokens, 3000);
  // A reader that keeps up is not cut, however long the answer takes.
  QueryCall full = RunQueryRpc(stub.get(), req);
  EXPECT_TRUE(full.status.ok()) << full.status.error_message();
  EXPECT_EQ(static_cast<int>(full.ids.size()), 3000);
}

// An ingest batch runs a chunk per scheduler turn: a query sent while a long
// batch is being prefilled waits for one chunk, not for the batch (64 chunks
// of ~1600 tokens held one for 34 s before). Pinned by order, not time: the
// query is sent once the batch has stored its first chunk and must finish
// before the batch does.
TEST_F(ServerTest, AQueryIsNotHeldBehindAWholeIngestBatch) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  v1::IngestRequest batch;
  for (int c = 0; c < 60; ++c) {
    std::string text;
    for (int w = 0; w < 300; ++w) text += "w" + std::to_string(c * 1000 + w) + " ";
    batch.add_chunks()->set_text(text);
  }
  const int port = h_.server->metrics_port();
  const double tokens_before =
      testing::PromValue(testing::HttpGet(port, "/metrics"), "infoflow_ingest_tokens_total");
  std::atomic<bool> ingest_done{false};
  grpc::Status ingest_status;
  std::thread ingest([&] {
    grpc::ClientContext ctx;
    v1::IngestResponse resp;
    ingest_status = h_.ingest->Ingest(&ctx, batch, &resp);
    ingest_done = true;
  });
  // The batch has started: its first chunks are stored.
  while (!ingest_done && testing::PromValue(testing::HttpGet(port, "/metrics"),
                                            "infoflow_ingest_tokens_total") <= tokens_before) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_FALSE(ingest_done.load()) << "the batch ended before the test could look";
  QueryCall q = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  const bool query_first = !ingest_done.load();
  ingest.join();
  EXPECT_TRUE(q.status.ok()) << q.status.error_message();
  EXPECT_TRUE(ingest_status.ok()) << ingest_status.error_message();
  EXPECT_TRUE(query_first) << "the query waited for the whole ingest batch";
}

// --grpc-max-threads caps the handler threads: a flood of held streams gets
// RESOURCE_EXHAUSTED past it instead of a thread each, and once they go the
// server answers again.
TEST_F(ServerTest, GrpcHandlerThreadsAreCapped) {
  h_.options.grpc_max_threads = 16;
  h_.options.grpc_stream_idle_ms = 0;  // held until the client lets go
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  const int before = ProcessThreads();
  constexpr int kStreams = 200;
  std::vector<std::unique_ptr<grpc::ClientContext>> ctxs;
  std::vector<std::unique_ptr<IngestStreamRw>> streams;
  for (int i = 0; i < kStreams; ++i) {
    ctxs.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(h_.ingest->IngestStream(ctxs.back().get()));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  const int during = ProcessThreads();
  EXPECT_LE(during - before, 24) << "threads " << before << " -> " << during;
  // A call past the cap is refused at once, naming the cause; retryable.
  QueryCall refused = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_EQ(refused.status.error_code(), grpc::RESOURCE_EXHAUSTED)
      << refused.status.error_message();
  // Half-closing lets each held handler end (OK); the streams refused at the
  // cap say so.
  int exhausted = 0, ok = 0;
  for (auto& st : streams) st->WritesDone();
  for (auto& st : streams) {
    const grpc::Status fs = st->Finish();
    exhausted += fs.error_code() == grpc::RESOURCE_EXHAUSTED;
    ok += fs.ok();
  }
  EXPECT_GE(exhausted, kStreams - 24);
  EXPECT_EQ(exhausted + ok, kStreams);
  streams.clear();
  QueryCall good = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_TRUE(good.status.ok()) << good.status.error_message();
}

TEST_F(ServerTest, DeadlineAndCancelStopTheStream) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  v1::QueryRequest req = QueryByKeys(keys, v1::METHOD_FULL);
  req.set_max_new_tokens(128);
  QueryCall late = RunQueryRpc(h_.query.get(), req, [](grpc::ClientContext* c) {
    c->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(1));
  });
  EXPECT_EQ(late.status.error_code(), grpc::DEADLINE_EXCEEDED);

  grpc::ClientContext ctx;
  auto reader = h_.query->Query(&ctx, req);
  v1::QueryResponse msg;
  int n = 0;
  while (reader->Read(&msg)) {
    if (++n == 1) ctx.TryCancel();
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::CANCELLED);
  QueryCall good = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_TRUE(good.status.ok());
}

TEST_F(ServerTest, AdminModelInfoDeleteAndCompact) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  grpc::ClientContext c1;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(h_.admin->ModelInfo(&c1, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.name(), "server_model");
  EXPECT_EQ(info.n_layers(), 4);
  EXPECT_FALSE(info.fingerprint().empty());
  grpc::ClientContext c2;
  v1::DeleteChunkRequest del;
  del.set_chunk_key(keys[0]);
  v1::DeleteChunkResponse dresp;
  ASSERT_TRUE(h_.admin->DeleteChunk(&c2, del, &dresp).ok());
  EXPECT_TRUE(dresp.deleted());
  QueryCall q = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_EQ(q.status.error_code(), grpc::NOT_FOUND);
  EXPECT_NE(q.status.error_message().find(keys[0]), std::string::npos);
  grpc::ClientContext c3;
  v1::CompactResponse cresp;
  EXPECT_TRUE(h_.admin->Compact(&c3, v1::CompactRequest(), &cresp).ok());
  // Model selector with the right identity passes.
  v1::QueryRequest req = QueryByKeys({keys[1], keys[2]}, v1::METHOD_NONE);
  req.mutable_model()->set_name(info.name());
  req.mutable_model()->set_fingerprint(info.fingerprint());
  EXPECT_TRUE(RunQueryRpc(h_.query.get(), req).status.ok());
}

TEST_F(ServerTest, HealthServiceAnswers) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  auto health = grpc::health::v1::Health::NewStub(h_.channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST_F(ServerTest, AuthTokenRequired) {
  const std::string token_file = h_.data_dir + "/../token";
  std::ofstream(token_file) << "s3cret-token\n";
  h_.options.auth_token_file = token_file;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  auto ingest_with = [&](const std::string& header) {
    grpc::ClientContext ctx;
    if (!header.empty()) ctx.AddMetadata("authorization", header);
    v1::IngestResponse resp;
    return h_.ingest->Ingest(&ctx, IngestAll(), &resp).error_code();
  };
  EXPECT_EQ(ingest_with(""), grpc::UNAUTHENTICATED);
  EXPECT_EQ(ingest_with("Bearer wrong"), grpc::UNAUTHENTICATED);
  EXPECT_EQ(ingest_with("Bearer s3cret-token-longer"), grpc::UNAUTHENTICATED);
  EXPECT_EQ(ingest_with("s3cret-token"), grpc::UNAUTHENTICATED);
  EXPECT_EQ(ingest_with("Bearer s3cret-token"), grpc::OK);
  QueryCall q = RunQueryRpc(h_.query.get(), QueryByKeys({std::string(64, 'b')}, v1::METHOD_NONE));
  EXPECT_EQ(q.status.error_code(), grpc::UNAUTHENTICATED);
  // Health stays open.
  auto health = grpc::health::v1::Health::NewStub(h_.channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
}

TEST_F(ServerTest, TlsWithSelfSignedCert) {
  if (!HaveTool("openssl")) GTEST_SKIP() << "openssl not installed";
  const std::string dir = TempDir("tls");
  const std::string cmd = "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
                          "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
                          dir + "/key.pem -out " + dir + "/cert.pem 2>/dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0);
  h_.options.tls_cert = dir + "/cert.pem";
  h_.options.tls_key = dir + "/key.pem";
  absl::StatusOr<std::unique_ptr<InfoflowServer>> s = InfoflowServer::Start(h_.options);
  ASSERT_TRUE(s.ok()) << s.status();
  h_.server = *std::move(s);
  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = Slurp(dir + "/cert.pem");
  h_.Connect(grpc::SslCredentials(ssl), "localhost");
  grpc::ClientContext ctx;
  v1::IngestResponse resp;
  grpc::Status st = h_.ingest->Ingest(&ctx, IngestAll(), &resp);
  EXPECT_TRUE(st.ok()) << st.error_message();
  // A plaintext client cannot talk to it.
  auto plain = grpc::CreateChannel("127.0.0.1:" + std::to_string(h_.server->port()),
                                   grpc::InsecureChannelCredentials());
  auto stub = v1::Admin::NewStub(plain);
  grpc::ClientContext pctx;
  pctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  v1::StatsResponse stats;
  EXPECT_FALSE(stub->Stats(&pctx, v1::StatsRequest(), &stats).ok());
  fs::remove_all(dir);
}

TEST(AdmissionTest, RefusesWhenQueueIsFull) {
  Admission a(1, 1);
  ASSERT_TRUE(a.Acquire([] { return false; }).ok());
  std::atomic<bool> second_done{false};
  std::thread waiter([&] {
    EXPECT_TRUE(a.Acquire([] { return false; }).ok());
    second_done = true;
    a.Release();
  });
  while (a.waiting() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  absl::Status third = a.Acquire([] { return false; });
  EXPECT_TRUE(absl::IsResourceExhausted(third)) << third;
  EXPECT_TRUE(absl::IsCancelled(Admission(1, 0).Acquire([] { return true; })) ||
              true);  // a free slot is taken at once, cancelled or not
  a.Release();
  waiter.join();
  EXPECT_TRUE(second_done);
}

TEST_F(ServerTest, QuantizedCodecStoresSmallerRecordsAndRatioOneStillEqualsFull) {
  // A raw server first, for the record size and the FULL answer.
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  const std::vector<std::string> raw_keys = IngestKeys();
  v1::StatsResponse raw_stats;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(h_.admin->Stats(&ctx, v1::StatsRequest(), &raw_stats).ok());
  }
  const QueryCall full = RunQueryRpc(h_.query.get(), QueryByKeys(raw_keys, v1::METHOD_FULL));
  ASSERT_TRUE(full.status.ok()) << full.status.error_message();
  h_.Stop();

  Harness int8;
  int8.data_dir = TempDir("kv_int8");
  int8.options = DefaultOptions(int8.data_dir);
  int8.options.kv_codec = "int8";
  int8.options.kv_group_size = 32;
  ASSERT_NO_FATAL_FAILURE(int8.Start());
  grpc::ClientContext ictx;
  v1::IngestResponse resp;
  ASSERT_TRUE(int8.ingest->Ingest(&ictx, IngestAll(), &resp).ok());
  std::vector<std::string> keys;
  for (const auto& r : resp.results()) {
    EXPECT_EQ(r.status(), v1::CHUNK_STATUS_STORED);
    keys.push_back(r.chunk_key());
  }
  EXPECT_NE(keys, raw_keys);  // another codec, other records
  v1::ModelInfoResponse info;
  v1::StatsResponse stats;
  {
    grpc::ClientContext c1, c2;
    ASSERT_TRUE(int8.admin->ModelInfo(&c1, v1::ModelInfoRequest(), &info).ok());
    ASSERT_TRUE(int8.admin->Stats(&c2, v1::StatsRequest(), &stats).ok());
  }
  EXPECT_EQ(info.kv_codec(), "int8");
  EXPECT_LT(info.kv_bytes_per_token(), info.raw_kv_bytes_per_token() / 3);
  EXPECT_EQ(stats.kv_bytes_per_token(), info.kv_bytes_per_token());
  EXPECT_LT(stats.bytes(), raw_stats.bytes() / 2);
  // r = 1 recomputes every context token: the same answer as FULL.
  v1::QueryRequest all = QueryByKeys(keys, v1::METHOD_INFOFLOW);
  all.mutable_ratio()->set_value(1.0);
  const QueryCall got = RunQueryRpc(int8.query.get(), all);
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.ids, full.ids);
  EXPECT_EQ(got.report.recomputed_tokens(), got.report.context_tokens());
  int8.Stop();
  fs::remove_all(int8.data_dir);
}

TEST_F(ServerTest, BusyServerAnswersResourceExhausted) {
  grpc::ClientContext ctx;
  std::vector<std::string> keys;
  auto reader = HoldTheOnlySlot(/*queue_depth=*/0, &ctx, &keys);
  ASSERT_TRUE(reader != nullptr && !HasFailure());
  v1::QueryResponse msg;
  QueryCall refused = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  reader->Finish();
  // Only a box that generates 3900 tokens before the second call frees the slot.
  if (refused.status.ok()) GTEST_SKIP() << "long query ran all 3900 tokens before the second call";
  EXPECT_EQ(refused.status.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.status.error_message().find("queue"), std::string::npos);
  // Refusals are counted, by method and code (the TTFT histograms see only successes).
  const std::string metrics = testing::HttpGet(h_.server->metrics_port(), "/metrics");
  EXPECT_EQ(
      testing::PromValue(
          metrics, "infoflow_grpc_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"Query\"}"),
      1)
      << metrics;
  EXPECT_EQ(
      testing::PromValue(metrics, "infoflow_grpc_requests_total{code=\"OK\",method=\"Ingest\"}"), 1)
      << metrics;
  // The cancelled query frees its worker once its token callback sees the
  // cancel; then the server takes queries again.
  bool ok = false;
  for (int i = 0; i < 100 && !ok; ++i) {
    ok = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE)).status.ok();
    if (!ok) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(ok);
}

// --store-capacity-bytes bounds the store: the write that would pass it
// first evicts the least recently used record, which then reads as
// NOT_FOUND by key until ingested again. A capacity that cannot hold one
// record of the longest chunk is refused at start.
TEST_F(ServerTest, StoreCapacityEvictsTheLeastRecentlyUsedRecord) {
  const std::vector<std::string> texts = {"The heron nests by the mill.",
                                          "Maria Lopez owns a red boat.",
                                          "Arthur keeps a brass compass."};
  auto ingest_one = [&](const std::string& text, v1::IngestResult* out) {
    v1::IngestRequest req;
    req.add_chunks()->set_text(text);
    v1::IngestResponse resp;
    grpc::ClientContext ctx;
    const grpc::Status s = h_.ingest->Ingest(&ctx, req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    *out = resp.results(0);
  };
  auto stored_bytes = [&] {
    grpc::ClientContext ctx;
    v1::StatsResponse stats;
    EXPECT_TRUE(h_.admin->Stats(&ctx, v1::StatsRequest(), &stats).ok());
    return stats;
  };
  // Each record's size, from an unbounded store.
  h_.options.max_chunk_tokens = 24;
  h_.options.max_prefix_tokens = 24;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  uint64_t total = 0;
  std::vector<std::string> keys;
  for (const std::string& t : texts) {
    v1::IngestResult r;
    ASSERT_NO_FATAL_FAILURE(ingest_one(t, &r));
    keys.push_back(r.chunk_key());
  }
  total = stored_bytes().bytes();
  h_.Stop();
  fs::remove_all(h_.data_dir);

  // One byte short of all three: the third write evicts the first.
  h_.options.store_capacity_bytes = total - 1;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  for (size_t i = 0; i < texts.size(); ++i) {
    v1::IngestResult r;
    ASSERT_NO_FATAL_FAILURE(ingest_one(texts[i], &r));
    EXPECT_EQ(r.status(), v1::CHUNK_STATUS_STORED);
    EXPECT_EQ(r.chunk_key(), keys[i]);
  }
  const v1::StatsResponse stats = stored_bytes();
  EXPECT_EQ(stats.records(), 2u);
  EXPECT_LE(stats.bytes(), total - 1);
  EXPECT_EQ(stats.evictions(), 1u);
  const QueryCall evicted = RunQueryRpc(h_.query.get(), QueryByKeys({keys[0]}, v1::METHOD_NONE));
  EXPECT_EQ(evicted.status.error_code(), grpc::NOT_FOUND) << evicted.status.error_message();
  EXPECT_NE(evicted.status.error_message().find(keys[0]), std::string::npos);
  EXPECT_TRUE(
      RunQueryRpc(h_.query.get(), QueryByKeys({keys[1], keys[2]}, v1::METHOD_NONE)).status.ok());
  h_.Stop();

  // Too small for one record of 24 tokens.
  h_.options.store_capacity_bytes = 1000;
  absl::StatusOr<std::unique_ptr<InfoflowServer>> small = InfoflowServer::Start(h_.options);
  ASSERT_FALSE(small.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(small.status())) << small.status();
  EXPECT_NE(small.status().message().find("--store-capacity-bytes"), std::string::npos);
}

// --store-ttl-s: a record older than the TTL reads as missing; ingesting it
// again stores it afresh.
TEST_F(ServerTest, StoreTtlExpiresRecords) {
  // The store compares whole seconds: a record is certainly alive for the
  // first TTL - 1 s and certainly expired after TTL + 1 s.
  h_.options.store_ttl_s = 2;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  const std::vector<std::string> keys = IngestKeys();
  EXPECT_TRUE(RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE)).status.ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(3100));
  const QueryCall expired = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
  EXPECT_EQ(expired.status.error_code(), grpc::NOT_FOUND) << expired.status.error_message();
  grpc::ClientContext ctx;
  v1::IngestResponse again;
  ASSERT_TRUE(h_.ingest->Ingest(&ctx, IngestAll(), &again).ok());
  for (const auto& r : again.results()) EXPECT_EQ(r.status(), v1::CHUNK_STATUS_STORED);
}

// A full queue refuses an ingest batch before its texts are tokenized (a
// flood of large batches would otherwise cost that CPU each time), after the
// checks that need no tokenizer, which still name the field.
TEST_F(ServerTest, ABusyServerRefusesAnIngestBeforeTokenizingIt) {
  h_.options.max_chunk_tokens = 64;
  grpc::ClientContext ctx;
  std::vector<std::string> keys;
  auto reader = HoldTheOnlySlot(/*queue_depth=*/0, &ctx, &keys);
  ASSERT_TRUE(reader != nullptr && !HasFailure());
  // Over the token limit within the byte limit: only tokenizing finds that.
  std::string many;
  for (int i = 0; i < 200; ++i) many += "word" + std::to_string(i) + " ";
  v1::IngestRequest over;
  over.add_chunks()->set_text("A fine chunk about lighthouses.");
  over.add_chunks()->set_text(many);
  v1::IngestResponse resp;
  grpc::ClientContext busy_ctx;
  const grpc::Status busy = h_.ingest->Ingest(&busy_ctx, over, &resp);
  v1::IngestRequest empty;
  empty.add_chunks()->set_text("");
  grpc::ClientContext bad_ctx;
  const grpc::Status bad = h_.ingest->Ingest(&bad_ctx, empty, &resp);
  ctx.TryCancel();
  v1::QueryResponse msg;
  while (reader->Read(&msg)) {
  }
  if (reader->Finish().ok()) GTEST_SKIP() << "long query ran all 3900 tokens before the ingest";
  EXPECT_EQ(busy.error_code(), grpc::RESOURCE_EXHAUSTED) << busy.error_message();
  EXPECT_EQ(bad.error_code(), grpc::INVALID_ARGUMENT) << bad.error_message();
  EXPECT_NE(bad.error_message().find("chunks[0].text"), std::string::npos) << bad.error_message();
  // With room again, the same batch gets what tokenizing finds.
  grpc::Status again = grpc::Status(grpc::RESOURCE_EXHAUSTED, "");
  for (int i = 0; i < 100 && again.error_code() == grpc::RESOURCE_EXHAUSTED; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    grpc::ClientContext c;
    again = h_.ingest->Ingest(&c, over, &resp);
  }
  EXPECT_EQ(again.error_code(), grpc::INVALID_ARGUMENT) << again.error_message();
  EXPECT_NE(again.error_message().find("chunks[1].text: chunk has"), std::string::npos)
      << again.error_message();
}

// Continuous batching computes what each request computes alone: 16
// concurrent queries with different contexts, methods, lengths and stop
// conditions get the same greedy ids, text and stop reason as their solo
// runs (docs/DESIGN.md, "Serving": batched matmuls may sum in another order,
// logits within 1e-4 -- pinned in tests/engine/batch_decode_test.cc).
TEST_F(ServerTest, SixteenConcurrentQueriesEqualTheirSoloRuns) {
  h_.options.workers = 16;
  h_.options.queue_depth = 16;
  h_.options.max_new_tokens = 1000;
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  {
    grpc::ClientContext ctx;
    v1::IngestRequest more;
    for (const char* t : {"Bob parks his red bicycle behind the old library every morning.",
                          "The bakery on Elm Street sells bread until seven in the evening.",
                          "A storm closed the northern pass for three days last winter."}) {
      more.add_chunks()->set_text(t);
    }
    v1::IngestResponse resp;
    ASSERT_TRUE(h_.ingest->Ingest(&ctx, more, &resp).ok());
    for (const auto& r : resp.results()) keys.push_back(r.chunk_key());
  }
  const v1::Method methods[] = {v1::METHOD_FULL,       v1::METHOD_NONE, v1::METHOD_INFOFLOW,
                                v1::METHOD_INFOFLOW,   v1::METHOD_CACHEBLEND, v1::METHOD_EPIC,
                                v1::METHOD_RANDOM};
  constexpr int kQueries = 16;
  std::vector<v1::QueryRequest> reqs;
  for (int i = 0; i < kQueries; ++i) {
    // Contexts: 2..6 chunks starting at a different key each time.
    std::vector<std::string> k;
    for (int j = 0; j < 2 + i % 5; ++j) k.push_back(keys[(i + j) % keys.size()]);
    v1::QueryRequest q = QueryByKeys(k, methods[i % 7]);
    q.set_reorder(i % 7 == 3);
    q.set_max_new_tokens(4 + (i * 7) % 37);
    q.set_question(i % 2 ? kQuestion : "Which day was the meeting moved to?");
    reqs.push_back(q);
  }
  // Stop strings that cut some generations short: a piece of their solo text.
  for (int i = 1; i < kQueries; i += 4) {
    QueryCall probe = RunQueryRpc(h_.query.get(), reqs[i]);
    ASSERT_TRUE(probe.status.ok()) << probe.status.error_message();
    if (probe.text.size() > 6) reqs[i].add_stop(probe.text.substr(probe.text.size() / 2, 2));
  }
  std::vector<QueryCall> solo;
  for (const auto& q : reqs) {
    solo.push_back(RunQueryRpc(h_.query.get(), q));
    ASSERT_TRUE(solo.back().status.ok()) << solo.back().status.error_message();
  }
  std::vector<QueryCall> together(kQueries);
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kQueries; ++i) {
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kQueries) std::this_thread::yield();
      together[i] = RunQueryRpc(h_.query.get(), reqs[i]);
    });
  }
  for (auto& t : threads) t.join();
  int stopped_by_string = 0;
  for (int i = 0; i < kQueries; ++i) {
    ASSERT_TRUE(together[i].status.ok()) << i << ": " << together[i].status.error_message();
    EXPECT_EQ(together[i].ids, solo[i].ids) << "query " << i;
    EXPECT_EQ(together[i].text, solo[i].text) << "query " << i;
    EXPECT_EQ(together[i].report.stop_reason(), solo[i].report.stop_reason()) << "query " << i;
    EXPECT_EQ(together[i].report.recomputed_tokens(), solo[i].report.recomputed_tokens());
    stopped_by_string += solo[i].report.stop_reason() == "stop_string";
  }
  EXPECT_GE(stopped_by_string, 1);
  // Whether the 16 overlapped in their decode phase depends on timing (each
  // may finish decoding within the next one's prefill), so batching itself
  // is shown on a pair that must overlap: B runs start to end while A, a
  // 400-token sampled generation (a seed whose solo run does not meet the
  // end-of-sequence token), is decoding.
  v1::QueryRequest a = QueryByKeys({keys[0]}, v1::METHOD_NONE);
  a.set_max_new_tokens(400);
  a.mutable_sampling()->set_temperature(1.0);
  bool long_enough = false;
  for (uint64_t seed = 1; seed <= 30 && !long_enough; ++seed) {
    a.mutable_sampling()->set_seed(seed);
    const QueryCall a_solo = RunQueryRpc(h_.query.get(), a);
    ASSERT_TRUE(a_solo.status.ok()) << a_solo.status.error_message();
    long_enough = a_solo.report.stop_reason() == "max_tokens";
  }
  ASSERT_TRUE(long_enough) << "no seed in 1..30 gives 400 tokens without EOS";
  {
    grpc::ClientContext ctx;
    auto reader = h_.query->Query(&ctx, a);
    v1::QueryResponse msg;
    ASSERT_TRUE(reader->Read(&msg));  // A is decoding
    const QueryCall b = RunQueryRpc(h_.query.get(), reqs[0]);
    EXPECT_TRUE(b.status.ok()) << b.status.error_message();
    EXPECT_EQ(b.ids, solo[0].ids);
    while (reader->Read(&msg)) {
    }
    EXPECT_TRUE(reader->Finish().ok());
  }
  if (!HaveTool("curl")) GTEST_SKIP() << "curl not installed (batch size not checked)";
  const std::string body = RunCommand("curl -sf http://127.0.0.1:" +
                                      std::to_string(h_.server->metrics_port()) + "/metrics");
  // Some decode step ran more than one request: sum of batch sizes > steps.
  auto value = [&](const std::string& name) {
    const size_t at = body.find("\n" + name + " ");
    return at == std::string::npos ? -1.0 : std::stod(body.substr(at + name.size() + 2));
  };
  EXPECT_GT(value("infoflow_batch_size_sum"), value("infoflow_batch_size_count")) << body;
  EXPECT_EQ(value("infoflow_running_requests"), 0);
  EXPECT_EQ(value("infoflow_waiting_requests"), 0);
  EXPECT_GT(value("infoflow_inter_token_seconds_count"), 0);
  EXPECT_GT(value("infoflow_queue_wait_seconds_count"), 0);
}

// FIFO: with one running slot, queued requests start in arrival order, and a
// cancelled running request frees its slot for the next.
TEST_F(ServerTest, QueuedQueriesRunInArrivalOrderAfterACancel) {
  grpc::ClientContext ctx;
  std::vector<std::string> keys;
  auto reader = HoldTheOnlySlot(/*queue_depth=*/8, &ctx, &keys);
  ASSERT_TRUE(reader != nullptr && !HasFailure());
  v1::QueryResponse msg;
  std::mutex mu;
  std::vector<int> finished;
  std::vector<std::thread> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.emplace_back([&, i] {
      QueryCall c = RunQueryRpc(h_.query.get(), QueryByKeys(keys, v1::METHOD_NONE));
      EXPECT_TRUE(c.status.ok()) << c.status.error_message();
      std::lock_guard<std::mutex> l(mu);
      finished.push_back(i);
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // arrive in order
  }
  bool ran_while_held = false;
  {
    std::lock_guard<std::mutex> l(mu);
    ran_while_held = !finished.empty();
  }
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  const grpc::Status st = reader->Finish();
  for (auto& t : waiting) t.join();
  // min_new_tokens keeps EOS out; only all 3900 tokens end it first.
  if (st.ok()) GTEST_SKIP() << "long query ran all 3900 tokens before the cancel";
  EXPECT_FALSE(ran_while_held) << "a queued query ran while the slot was held";
  EXPECT_EQ(st.error_code(), grpc::CANCELLED);
  EXPECT_EQ(finished, (std::vector<int>{0, 1, 2, 3}));
}

// A query whose KV cache could never fit --max-kv-bytes is refused up front,
// naming the limit; smaller ones still run.
TEST_F(ServerTest, QueryLargerThanKvBudgetIsRefused) {
  h_.options.max_kv_bytes = 64 << 10;  // the test model: 1 KiB per position
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  std::vector<std::string> keys = IngestKeys();
  v1::QueryRequest big = QueryByKeys(keys, v1::METHOD_NONE);
  big.set_max_new_tokens(100);
  QueryCall refused = RunQueryRpc(h_.query.get(), big);
  EXPECT_EQ(refused.status.error_code(), grpc::OUT_OF_RANGE);
  EXPECT_NE(refused.status.error_message().find("--max-kv-bytes"), std::string::npos)
      << refused.status.error_message();
  v1::QueryRequest small = QueryByKeys({keys[0]}, v1::METHOD_NONE);
  small.set_max_new_tokens(2);
  EXPECT_TRUE(RunQueryRpc(h_.query.get(), small).status.ok());
}

TEST_F(ServerTest, MetricsPassPromtoolAndPrometheusScrapes) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  ASSERT_GT(h_.server->metrics_port(), 0);
  std::vector<std::string> keys = IngestKeys();
  for (v1::Method m : {v1::METHOD_INFOFLOW, v1::METHOD_FULL}) {
    ASSERT_TRUE(RunQueryRpc(h_.query.get(), QueryByKeys(keys, m)).status.ok());
  }
  if (!HaveTool("curl")) GTEST_SKIP() << "curl not installed";
  const std::string url = "http://127.0.0.1:" + std::to_string(h_.server->metrics_port()) + "/metrics";
  const std::string body = RunCommand("curl -sf " + url);
  for (const char* name :
       {"infoflow_query_ttft_seconds_bucket{method=\"INFOFLOW\"", "infoflow_stage_duration_seconds",
        "infoflow_recompute_ratio", "infoflow_generated_tokens_total", "infoflow_store_hits_total",
        "infoflow_store_misses_total", "infoflow_store_corrupt_total",
        "infoflow_store_evictions_total", "infoflow_store_bytes_read_total",
        "infoflow_store_bytes_written_total", "infoflow_ingest_tokens_total",
        "infoflow_inflight_streams", "infoflow_queue_depth", "infoflow_build_info"}) {
    EXPECT_NE(body.find(name), std::string::npos) << name;
  }
  if (HaveTool("promtool")) {
    const std::string file = h_.data_dir + "/../metrics.txt";
    std::ofstream(file) << body;
    int rc = -1;
    std::string out = RunCommand("promtool check metrics < " + file + " 2>&1", &rc);
    EXPECT_EQ(rc, 0) << out;
  }
  if (!HaveTool("prometheus")) GTEST_SKIP() << "prometheus not installed";
  const std::string pdir = TempDir("prom");
  const int pport = FreePort();
  std::ofstream(pdir + "/prometheus.yml")
      << "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: infoflow\n"
      << "    scrape_interval: 1s\n    static_configs:\n      - targets: ['127.0.0.1:"
      << h_.server->metrics_port() << "']\n";
  pid_t pid = fork();
  if (pid == 0) {
    const std::string log = pdir + "/prometheus.log";
    freopen(log.c_str(), "w", stderr);
    freopen(log.c_str(), "a", stdout);
    const std::string cfg = "--config.file=" + pdir + "/prometheus.yml";
    const std::string tsdb = "--storage.tsdb.path=" + pdir + "/data";
    const std::string web = "--web.listen-address=127.0.0.1:" + std::to_string(pport);
    execlp("prometheus", "prometheus", cfg.c_str(), tsdb.c_str(), web.c_str(), nullptr);
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  std::string result;
  bool found = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(45);
  while (std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    result = RunCommand("curl -sf 'http://127.0.0.1:" + std::to_string(pport) +
                        "/api/v1/query?query=infoflow_query_ttft_seconds_count'");
    if (result.find("\"__name__\":\"infoflow_query_ttft_seconds_count\"") != std::string::npos) {
      found = true;
      break;
    }
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(found) << result << "\n" << Slurp(pdir + "/prometheus.log").substr(0, 3000);
  EXPECT_NE(result.find("\"method\":\"INFOFLOW\""), std::string::npos) << result;
  fs::remove_all(pdir);
}

// The infoflow CLI and the Python example against a live server.
// `infoflow ingest` resends what a busy server refused. With the only slot
// held and no queue, every batch is RESOURCE_EXHAUSTED: --retries 0 fails at
// once; by default the command waits, retries, and stores every chunk once
// the slot frees.
TEST_F(ServerTest, IngestCliRetriesWhileTheServerIsBusy) {
  grpc::ClientContext ctx;
  std::vector<std::string> keys;
  auto reader = HoldTheOnlySlot(/*queue_depth=*/0, &ctx, &keys);
  ASSERT_TRUE(reader != nullptr && !HasFailure());
  const std::string dir = TempDir("cli_retry");
  std::ofstream(dir + "/doc.txt") << "The lighthouse keeper counts ships.\n\n"
                                  << "A fox sleeps under the old bridge.\n";
  const std::string cmd =
      std::string(INFOFLOW_CLI_BIN) +
      " ingest --quiet --batch 1 --server 127.0.0.1:" + std::to_string(h_.server->port()) + " " +
      dir + "/doc.txt";
  // Both runs start at once, while the long query holds the only slot (it
  // frees it after 3900 tokens, a few seconds on a fast box).
  std::string once, out;
  int once_rc = -1, retried_rc = -1;
  std::thread no_retries([&] { once = RunCommand(cmd + " --retries 0 2>&1", &once_rc); });
  std::thread retrying([&] { out = RunCommand(cmd + " 2>&1", &retried_rc); });
  // The slot is freed once both have been refused (the server counts its
  // refusals by method and code).
  auto refused_streams = [&] {
    return testing::PromValue(
        testing::HttpGet(h_.server->metrics_port(), "/metrics"),
        "infoflow_grpc_requests_total{code=\"RESOURCE_EXHAUSTED\",method=\"IngestStream\"}");
  };
  for (int i = 0; i < 200 && refused_streams() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const bool both_refused = refused_streams() >= 2;
  no_retries.join();
  ctx.TryCancel();
  v1::QueryResponse msg;
  while (reader->Read(&msg)) {
  }
  reader->Finish();
  retrying.join();
  if (!both_refused) {
    GTEST_SKIP() << "the long query freed the slot before both runs were refused:\n" << once;
  }
  EXPECT_EQ(once_rc, 1) << once;
  EXPECT_NE(once.find("RESOURCE_EXHAUSTED"), std::string::npos) << once;
  EXPECT_EQ(once.find("retry"), std::string::npos) << once;
  EXPECT_EQ(retried_rc, 0) << out;
  EXPECT_NE(out.find("retry 1/8"), std::string::npos) << out;
  EXPECT_NE(out.find("2 chunks: 2 stored, 0 skipped"), std::string::npos) << out;
  fs::remove_all(dir);
}

TEST_F(ServerTest, CliAndPythonClientsWork) {
  ASSERT_NO_FATAL_FAILURE(h_.Start());
  const std::string dir = TempDir("cli");
  std::ofstream(dir + "/doc.txt") << kTexts[0] << "\n\n" << kTexts[1] << "\n\n" << kTexts[2] << "\n";
  const std::string server = " --server 127.0.0.1:" + std::to_string(h_.server->port());
  int rc = -1;
  std::string out = RunCommand(std::string(INFOFLOW_CLI_BIN) + " ingest --quiet" + server + " " +
                               dir + "/doc.txt 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("3 chunks: 3 stored, 0 skipped"), std::string::npos) << out;
  out = RunCommand(std::string(INFOFLOW_CLI_BIN) + " ingest --quiet" + server + " " + dir +
                       "/doc.txt 2>&1 >/dev/null",
                   &rc);
  EXPECT_NE(out.find("3 chunks: 0 stored, 3 skipped"), std::string::npos) << out;
  out = RunCommand(std::string(INFOFLOW_CLI_BIN) + " ingest --quiet" + server + " " + dir +
                       "/doc.txt 2>/dev/null",
                   &rc);
  ASSERT_GE(out.size(), 64u);
  const std::string key = out.substr(0, 64);
  EXPECT_NE(out.find("\tskipped"), std::string::npos) << out;
  out = RunCommand(std::string(INFOFLOW_CLI_BIN) + " query" + server + " --key " + key +
                       " --chunk-text 'More text.' --question 'Where?' --report "
                       "--max-new-tokens 5 --method cacheblend 2>&1",
                   &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("method CACHEBLEND"), std::string::npos) << out;
  EXPECT_NE(out.find("chunks hit 1 miss 1"), std::string::npos) << out;
  out = RunCommand(std::string(INFOFLOW_CLI_BIN) + " stats" + server + " 2>&1", &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("records      4"), std::string::npos) << out;
  if (std::system("/usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-grpcio / python3-grpc-tools not installed";
  }
  out = RunCommand("/usr/bin/python3 " INFOFLOW_SOURCE_DIR "/client/python/example_client.py" +
                       server + " --max-new-tokens 4 2>&1",
                   &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("c2: CHUNK_STATUS_STORED"), std::string::npos) << out;
  EXPECT_NE(out.find("hits 3, misses 0"), std::string::npos) << out;
  fs::remove_all(dir);
}

// The real binary: default model generated on first start, ephemeral ports
// logged, health answers, SIGTERM exits cleanly.
TEST(ServerBinaryTest, StartsOnEphemeralPortAndStopsOnSigterm) {
  const std::string dir = TempDir("bin");
  const std::string log = dir + "/server.log";
  pid_t pid = fork();
  if (pid == 0) {
    freopen(log.c_str(), "w", stderr);
    const std::string data = "--data-dir=" + dir + "/kv";
    execl(INFOFLOW_SERVER_BIN, INFOFLOW_SERVER_BIN, data.c_str(), "--listen=127.0.0.1:0",
          "--metrics-listen=127.0.0.1:0", "--threads=1", "--store-sync=false", nullptr);
    _exit(127);
  }
  ASSERT_GT(pid, 0);
  std::smatch m;
  std::string text;
  const std::regex re("listening on 127\\.0\\.0\\.1:(\\d+)");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    text = Slurp(log);
    if (std::regex_search(text, m, re)) break;
    int st = 0;
    if (waitpid(pid, &st, WNOHANG) == pid) break;  // died
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(std::regex_search(text, m, re)) << text;
  const int port = std::stoi(m[1]);
  EXPECT_TRUE(fs::exists(dir + "/models/default/config.json"));
  EXPECT_NE(text.find("metrics on http://127.0.0.1:"), std::string::npos) << text;
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse resp;
  EXPECT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
  auto ingest = v1::ChunkIngest::NewStub(channel);
  grpc::ClientContext ictx;
  v1::IngestResponse iresp;
  EXPECT_TRUE(ingest->Ingest(&ictx, IngestAll(), &iresp).ok());
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << Slurp(log);
  text = Slurp(log);
  EXPECT_NE(text.find("rpc=Ingest n_chunks=3 stored=3"), std::string::npos) << text;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace infoflow::server
