// infoflow-server as a sequence-parallel group (--world-size N): real server
// processes on 127.0.0.1, rank 0 serving gRPC, the others joined through
// rank 0's control store and Gloo. Checked against one ordinary server on
// the same model and chunks: the same greedy answers for every method the
// group runs; refusals; Health following the group; a killed, a stopped and
// a restarted rank; a restarted rank 0.
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "tests/reliability/reliability_util.h"

namespace infoflow {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutMs = 3000;  // --dist-timeout-ms of the groups here

struct Answer {
  std::vector<int32_t> ids;
  v1::Report report;
};

absl::StatusOr<Answer> Ask(const ServerProcess& s, const v1::QueryRequest& req) {
  client::Client c = MakeClient(s, 60000);
  Answer a;
  absl::StatusOr<v1::Report> r =
      c.Query(req, [&](const v1::TokenEvent& t) { a.ids.push_back(t.id()); });
  if (!r.ok()) return r.status();
  a.report = *r;
  return a;
}

std::vector<std::string> Chunks(int n, uint32_t seed) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i)
    out.push_back(ChunkText("sp" + std::to_string(seed) + "c" + std::to_string(i), seed * 31 + i));
  return out;
}

v1::QueryRequest Request(const std::vector<std::string>& texts, v1::Method method, double ratio) {
  v1::QueryRequest req;
  for (const std::string& t : texts) req.add_chunks()->set_text(t);
  req.set_question("Which street has the copper lamp and the silver candle?");
  req.set_method(method);
  if (ratio > 0) req.mutable_ratio()->set_value(ratio);
  req.set_max_new_tokens(8);
  req.mutable_sampling()->set_temperature(0);
  req.set_return_report(true);
  return req;
}

// A plain prompt (no blend separator, so no chunks) through the OpenAI HTTP
// API of `s`: the greedy text and the report's context_tokens.
struct PlainAnswer {
  std::string text;
  int64_t context_tokens = -1;
};
absl::StatusOr<PlainAnswer> AskPlain(const ServerProcess& s) {
  std::smatch m;
  const std::string log = s.log();
  if (!std::regex_search(log, m, std::regex("http on http://127\\.0\\.0\\.1:(\\d+)"))) {
    return absl::UnavailableError("no HTTP port in the log");
  }
  httplib::Client c("127.0.0.1", std::stoi(m[1]));
  c.set_read_timeout(60);
  const nlohmann::json body = {{"model", std::filesystem::path(ModelDir()).filename().string()},
                               {"prompt", "Question: Who keeps the lighthouse?\nAnswer:"},
                               {"max_tokens", 8},
                               {"temperature", 0},
                               {"infoflow", {{"method", "INFOFLOW"}, {"report", true}}}};
  httplib::Result r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return absl::UnavailableError("no HTTP answer");
  if (r->status != 200) return absl::InternalError(r->body);
  const nlohmann::json a = nlohmann::json::parse(r->body);
  return PlainAnswer{a["choices"][0]["text"], a["infoflow"]["context_tokens"]};
}

bool WaitFor(const std::function<bool()>& cond, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return cond();
}

// A group of `world` server processes (rank 0 picks its control port).
class Group {
 public:
  Group(const std::string& name, int world) : dir_(name), world_(world) {
    for (int r = 0; r < world; ++r) ranks_.push_back(MakeRank(r, r == 0 ? 0 : -1));
  }
  // Starts rank r (rank 0 first: the others need its port).
  void StartRank(int r) {
    if (r > 0) ranks_[r] = MakeRank(r, port_);
    std::string err;
    ASSERT_TRUE(ranks_[r]->Start(&err)) << err;
    if (r == 0) {
      std::smatch m;
      const std::string log = ranks_[0]->log();
      ASSERT_TRUE(std::regex_search(
          log, m, std::regex("event=group_start rank=0 .*dist_init=127\\.0\\.0\\.1:(\\d+)")))
          << log;
      port_ = std::stoi(m[1]);
    }
  }
  void StartAll() {
    for (int r = 0; r < world_; ++r) StartRank(r);
  }
  bool WaitServing(std::chrono::milliseconds limit = std::chrono::milliseconds(30000)) {
    return WaitFor([&] { return ranks_[0]->Healthy(); }, limit);
  }
  ServerProcess& rank(int r) { return *ranks_[r]; }
  int port() const { return port_; }
  // Rank 0 again on the same control port, with the same store.
  void RestartRank0() {
    ranks_[0] = MakeRank(0, port_);
    std::string err;
    ASSERT_TRUE(ranks_[0]->Start(&err)) << err;
  }

 private:
  std::unique_ptr<ServerProcess> MakeRank(int r, int port) {
    const std::string data = dir_.path + "/rank" + std::to_string(r);
    std::vector<std::string> args = {
        "--world-size=" + std::to_string(world_), "--rank=" + std::to_string(r),
        "--dist-timeout-ms=" + std::to_string(kTimeoutMs), "--threads=1", "--store-sync=false"};
    if (port >= 0) args.push_back("--dist-init=127.0.0.1:" + std::to_string(port));
    if (r == 0) args.push_back("--http-listen=127.0.0.1:0");
    return std::make_unique<ServerProcess>(ServerBin(), ModelDir(), data,
                                           dir_.path + "/rank" + std::to_string(r) + ".log", args);
  }
  TempDir dir_;
  int world_;
  int port_ = 0;
  std::vector<std::unique_ptr<ServerProcess>> ranks_;
};

class SpServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    reference_dir_ = new TempDir("sp_ref");
    reference_ = new ServerProcess(
        ServerBin(), ModelDir(), reference_dir_->path + "/data", reference_dir_->path + "/ref.log",
        {"--threads=1", "--store-sync=false", "--http-listen=127.0.0.1:0"});
    std::string err;
    ASSERT_TRUE(reference_->Start(&err)) << err;
  }
  static void TearDownTestSuite() {
    delete reference_;
    delete reference_dir_;
  }
  static TempDir* reference_dir_;
  static ServerProcess* reference_;
};
TempDir* SpServerTest::reference_dir_ = nullptr;
ServerProcess* SpServerTest::reference_ = nullptr;

// Every method the group runs gives the single server's greedy answer and
// recomputes as many tokens; the other ranks get the chunks they lack from
// rank 0 once, then find them in their own store.
void ExpectSameAnswers(ServerProcess& reference, Group& group, int world, uint32_t seed) {
  const std::vector<std::string> texts = Chunks(6, seed);
  struct Case {
    v1::Method method;
    double ratio;
  };
  const std::vector<Case> cases = {{v1::METHOD_FULL, 0},
                                   {v1::METHOD_NONE, 0},
                                   {v1::METHOD_INFOFLOW, 0.15},
                                   {v1::METHOD_INFOFLOW, 1.0},
                                   {v1::METHOD_INFOFLOW_BLEND, 0.15},
                                   {v1::METHOD_UNSPECIFIED, 0}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << "world " << world << " method "
                                      << v1::Method_Name(c.method) << " ratio " << c.ratio);
    const v1::QueryRequest req = Request(texts, c.method, c.ratio);
    absl::StatusOr<Answer> want = Ask(reference, req);
    ASSERT_TRUE(want.ok()) << want.status();
    absl::StatusOr<Answer> got = Ask(group.rank(0), req);
    ASSERT_TRUE(got.ok()) << got.status() << "\n" << group.rank(0).log();
    EXPECT_EQ(got->ids, want->ids);
    EXPECT_EQ(got->report.text(), want->report.text());
    EXPECT_EQ(got->report.recomputed_tokens(), want->report.recomputed_tokens());
    EXPECT_EQ(got->report.context_tokens(), want->report.context_tokens());
    EXPECT_EQ(got->report.method(), want->report.method());
    ASSERT_EQ(got->report.chunk_keys_size(), 6);
    for (int i = 0; i < 6; ++i) EXPECT_EQ(got->report.chunk_keys(i), want->report.chunk_keys(i));
  }
  // By key now: stored on rank 0 by the text queries above.
  absl::StatusOr<Answer> by_text = Ask(group.rank(0), Request(texts, v1::METHOD_INFOFLOW, 0.15));
  ASSERT_TRUE(by_text.ok());
  v1::QueryRequest by_key = Request({}, v1::METHOD_INFOFLOW, 0.15);
  for (const std::string& k : by_text->report.chunk_keys()) by_key.add_chunks()->set_key(k);
  absl::StatusOr<Answer> got = Ask(group.rank(0), by_key);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->ids, by_text->ids);
  EXPECT_EQ(got->report.chunk_hits(), 6);
  // A plain prompt over HTTP (no chunks) has nothing to split: rank 0
  // answers it alone, as one server does (the other ranks' query counts
  // below exclude it).
  absl::StatusOr<PlainAnswer> plain_want = AskPlain(reference);
  ASSERT_TRUE(plain_want.ok()) << plain_want.status();
  absl::StatusOr<PlainAnswer> plain_got = AskPlain(group.rank(0));
  ASSERT_TRUE(plain_got.ok()) << plain_got.status() << "\n" << group.rank(0).log();
  EXPECT_EQ(plain_got->text, plain_want->text);
  EXPECT_EQ(plain_got->context_tokens, 0);
  // Each other rank received its chunks from rank 0 exactly once (first
  // query) and served them from its own store afterwards.
  for (int r = 1; r < world; ++r) {
    const std::string log = group.rank(r).log();
    std::smatch m;
    std::string rest = log;
    int received = 0, from_store = 0, queries = 0;
    const std::regex line("event=group_query rank=\\d+ .* from_store=(\\d+) from_rank0=(\\d+)");
    while (std::regex_search(rest, m, line)) {
      from_store += std::stoi(m[1]);
      received += std::stoi(m[2]);
      ++queries;
      rest = m.suffix();
    }
    EXPECT_EQ(queries, static_cast<int>(cases.size()) + 2) << log;
    EXPECT_GT(received, 0) << log;
    EXPECT_GT(from_store, 0) << log;
    const double served =
        testing::PromValue(group.rank(r).Metrics(), "infoflow_group_queries_total");
    EXPECT_EQ(served, queries);
  }
  EXPECT_EQ(testing::PromValue(group.rank(0).Metrics(), "infoflow_group_serving"), 1);
}

TEST_F(SpServerTest, TwoRanksAnswerAsOneServer) {
  Group g("sp2", 2);
  g.StartAll();
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  ExpectSameAnswers(*reference_, g, 2, 1);
}

TEST_F(SpServerTest, ThreeRanksAnswerAsOneServer) {
  Group g("sp3", 3);
  g.StartAll();
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  ExpectSameAnswers(*reference_, g, 3, 2);
}

TEST_F(SpServerTest, RefusesWhatTheGroupCannotRun) {
  Group g("sp_refuse", 2);
  g.StartAll();
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  const std::vector<std::string> texts = Chunks(3, 3);
  absl::StatusOr<Answer> a = Ask(g.rank(0), Request(texts, v1::METHOD_CACHEBLEND, 0.15));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("method"), std::string::npos) << a.status();
  v1::QueryRequest reorder = Request(texts, v1::METHOD_INFOFLOW, 0.15);
  reorder.set_reorder(true);
  a = Ask(g.rank(0), reorder);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("reorder"), std::string::npos) << a.status();
  // Rank 1 serves the group, not clients.
  a = Ask(g.rank(1), Request(texts, v1::METHOD_FULL, 0));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(a.status().message().find("rank 0"), std::string::npos) << a.status();
  client::Client c1 = MakeClient(g.rank(1));
  v1::IngestRequest ingest;
  ingest.add_chunks()->set_text(texts[0]);
  absl::StatusOr<v1::IngestResponse> ir = c1.Ingest(ingest);
  ASSERT_FALSE(ir.ok());
  EXPECT_EQ(ir.status().code(), absl::StatusCode::kFailedPrecondition);
  // A limit is still checked before any work, and the group stays usable.
  v1::QueryRequest too_many = Request(texts, v1::METHOD_FULL, 0);
  too_many.set_max_new_tokens(100000);
  a = Ask(g.rank(0), too_many);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  absl::StatusOr<Answer> ok = Ask(g.rank(0), Request(texts, v1::METHOD_FULL, 0));
  EXPECT_TRUE(ok.ok()) << ok.status();
}

// Health is NOT_SERVING until every rank has joined and again once one is
// lost; a killed rank fails queries with UNAVAILABLE naming it, and the
// group serves again when it restarts.
TEST_F(SpServerTest, HealthFollowsTheGroupAndARestartedRankRejoins) {
  Group g("sp_health", 2);
  g.StartRank(0);
  EXPECT_FALSE(g.rank(0).Healthy());
  const std::vector<std::string> texts = Chunks(4, 4);
  absl::StatusOr<Answer> a = Ask(g.rank(0), Request(texts, v1::METHOD_INFOFLOW, 0.15));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(a.status().message().find("waiting for rank 1"), std::string::npos) << a.status();
  g.StartRank(1);
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  EXPECT_TRUE(g.rank(1).Healthy());
  absl::StatusOr<Answer> want = Ask(*reference_, Request(texts, v1::METHOD_INFOFLOW, 0.15));
  ASSERT_TRUE(want.ok());
  a = Ask(g.rank(0), Request(texts, v1::METHOD_INFOFLOW, 0.15));
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->ids, want->ids);

  // Killed while idle: its heartbeat stops; rank 0 notices within the timeout.
  g.rank(1).Kill();
  const auto t0 = Clock::now();
  EXPECT_TRUE(
      WaitFor([&] { return !g.rank(0).Healthy(); }, std::chrono::milliseconds(4 * kTimeoutMs)));
  EXPECT_LT(Clock::now() - t0, std::chrono::milliseconds(3 * kTimeoutMs));
  a = Ask(g.rank(0), Request(texts, v1::METHOD_INFOFLOW, 0.15));
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(a.status().message().find("rank 1"), std::string::npos) << a.status();
  EXPECT_NE(g.rank(0).log().find("event=group_broken"), std::string::npos);

  g.StartRank(1);
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  a = Ask(g.rank(0), Request(texts, v1::METHOD_INFOFLOW, 0.15));
  ASSERT_TRUE(a.ok()) << a.status() << "\n" << g.rank(0).log();
  EXPECT_EQ(a->ids, want->ids);
  EXPECT_GE(testing::PromValue(g.rank(0).Metrics(), "infoflow_group_generation"), 2);
}

// A rank that stops mid-query fails that query with UNAVAILABLE naming it
// within the timeout (never a hang); once it continues it rejoins by itself.
TEST_F(SpServerTest, StoppedRankFailsTheQueryInFlightAndRejoins) {
  Group g("sp_stall", 3);
  g.StartAll();
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  const std::vector<std::string> texts = Chunks(6, 5);
  absl::StatusOr<Answer> want = Ask(*reference_, Request(texts, v1::METHOD_FULL, 0));
  ASSERT_TRUE(want.ok());
  ASSERT_TRUE(Ask(g.rank(0), Request(texts, v1::METHOD_FULL, 0)).ok());
  kill(g.rank(2).pid(), SIGSTOP);
  const auto t0 = Clock::now();
  absl::StatusOr<Answer> a = Ask(g.rank(0), Request(texts, v1::METHOD_FULL, 0));
  const auto took = Clock::now() - t0;
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(a.status().message().find("rank 2"), std::string::npos) << a.status();
  EXPECT_LT(took, std::chrono::milliseconds(3 * kTimeoutMs));
  EXPECT_FALSE(g.rank(0).Healthy());
  kill(g.rank(2).pid(), SIGCONT);
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log() << "\n" << g.rank(2).log();
  a = Ask(g.rank(0), Request(texts, v1::METHOD_FULL, 0));
  ASSERT_TRUE(a.ok()) << a.status() << "\n" << g.rank(0).log();
  EXPECT_EQ(a->ids, want->ids);
}

// Rank 0 restarts (same control port, same store): the other ranks
// reconnect and the group serves again, without restarting them.
TEST_F(SpServerTest, RestartedRankZeroGetsItsGroupBack) {
  Group g("sp_leader", 2);
  g.StartAll();
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log();
  const std::vector<std::string> texts = Chunks(4, 6);
  absl::StatusOr<Answer> first = Ask(g.rank(0), Request(texts, v1::METHOD_INFOFLOW_BLEND, 0.15));
  ASSERT_TRUE(first.ok()) << first.status();
  const pid_t rank1 = g.rank(1).pid();
  g.RestartRank0();
  ASSERT_TRUE(g.WaitServing()) << g.rank(0).log() << "\n" << g.rank(1).log();
  EXPECT_EQ(g.rank(1).pid(), rank1);
  absl::StatusOr<Answer> again = Ask(g.rank(0), Request(texts, v1::METHOD_INFOFLOW_BLEND, 0.15));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ids, first->ids);
  EXPECT_NE(g.rank(1).log().find("event=group_lost_rank0"), std::string::npos);
}

}  // namespace
}  // namespace infoflow
