// Sequence parallelism across real processes (engine/dist/): N = 2 and 3
// ranks joined over 127.0.0.1 by c10d (TCPStore + ProcessGroupGloo). Every
// method gives the same selection, greedy ids and first-token logits
// (within 1e-4) as the single-process pipeline on the same chunks, ring
// FULL == FULL == INFOFLOW at r = 1; a rank killed or stopped mid-query
// makes rank 0 fail with UNAVAILABLE naming it within the group timeout.
//
// The test binary is also the rank: run with --sp-rank it joins the group
// and runs the queries (sp_launch.h starts it).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/dist/sp_group.h"
#include "engine/dist/ring_attention.h"
#include "engine/dist/sp_pipeline.h"
#include "engine/model/forward.h"
#include "engine/model/model.h"
#include "engine/model/runtime.h"
#include "engine/model/test_model.h"
#include "tests/dist/sp_launch.h"

namespace infoflow {
namespace {

// xorshift ids in [3, vocab), as tests/engine/test_util.h's Ids.
std::vector<int32_t> Ids(int n, int seed, int vocab) {
  std::vector<int32_t> ids;
  uint32_t x = 2463534242u + seed;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    ids.push_back(static_cast<int32_t>(3 + x % (vocab - 3)));
  }
  return ids;
}

struct Scenario {
  std::vector<int32_t> prefix;
  std::vector<std::vector<int32_t>> chunks;
  std::vector<int32_t> question, prompt;
};

Scenario MakeScenario(const Model& model) {
  const int vocab = static_cast<int>(model.config().vocab_size);
  Scenario s;
  s.prefix = {static_cast<int32_t>(*model.config().bos_token_id)};
  const int lengths[] = {40, 33, 27, 45, 31, 38};
  for (int i = 0; i < 6; ++i) s.chunks.push_back(Ids(lengths[i], 10 + i, vocab));
  s.question = Ids(9, 99, vocab);
  s.prompt = Ids(5, 77, vocab);
  s.prompt.insert(s.prompt.end(), s.question.begin(), s.question.end());
  return s;
}

struct Case {
  const char* name;
  MethodOptions options;
};

std::vector<Case> Cases() {
  auto opt = [](Method m, double r) {
    MethodOptions o;
    o.method = m;
    o.ratio = r;
    return o;
  };
  std::vector<Case> cases = {{"FULL", opt(Method::kFull, 0)},
                             {"NONE", opt(Method::kNone, 0)},
                             {"INFOFLOW r=0.15", opt(Method::kInfoFlow, 0.15)},
                             {"INFOFLOW r=1", opt(Method::kInfoFlow, 1.0)},
                             {"INFOFLOW r=0.3 sum", opt(Method::kInfoFlow, 0.3)},
                             {"INFOFLOW r=0.2 vnorm", opt(Method::kInfoFlow, 0.2)},
                             {"INFOFLOW_BLEND r=0.15", opt(Method::kInfoFlowBlend, 0.15)},
                             {"INFOFLOW_BLEND r=0.3 probe1 K", opt(Method::kInfoFlowBlend, 0.3)},
                             {"INFOFLOW_BLEND r=0.2 probe-all", opt(Method::kInfoFlowBlend, 0.2)}};
  cases[4].options.variant = ScoreVariant::kSum;
  cases[5].options.variant = ScoreVariant::kVNorm;
  cases[7].options.probe_factor = 1;  // the probe is the stale share: the rest lies outside it
  cases[7].options.deviation = Deviation::kK;
  cases[8].options.probe_factor = 0;
  return cases;
}

DecodeOptions Greedy() {
  DecodeOptions d;
  d.max_new_tokens = 6;
  return d;
}

std::unique_ptr<Model> LoadCpu(const std::string& dir) {
  LoadOptions lo;
  lo.device = "cpu";
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir, lo);
  if (!m.ok()) {
    std::fprintf(stderr, "load %s: %s\n", dir.c_str(), m.status().ToString().c_str());
    return nullptr;
  }
  return std::move(*m);
}

// ---- rank mode ----

std::map<std::string, std::string> ParseFlags(int argc, char** argv) {
  std::map<std::string, std::string> f;
  for (int i = 1; i + 1 < argc; i += 2) f[argv[i]] = argv[i + 1];
  return f;
}

int RunRank(int argc, char** argv) {
  InitTorchRuntime(1);  // one core per rank: OpenBLAS would take every core otherwise
  auto f = ParseFlags(argc, argv);
  std::unique_ptr<Model> model = LoadCpu(f["--sp-model"]);
  if (!model) return 2;
  GroupOptions go;
  go.rank = std::stoi(f["--sp-rank"]);
  go.world_size = std::stoi(f["--sp-world"]);
  go.port = std::stoi(f["--sp-port"]);
  go.timeout = std::chrono::milliseconds(std::stoi(f["--sp-timeout-ms"]));
  const std::string port_file = f["--sp-port-file"];
  go.on_store_ready = [&](int port) {
    std::ofstream(port_file + ".tmp") << port << " ok\n";
    std::rename((port_file + ".tmp").c_str(), port_file.c_str());
  };
  absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> group = SequenceParallelGroup::Join(go);
  if (!group.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", go.rank, group.status().ToString().c_str());
    return 2;
  }
  const Scenario s = MakeScenario(*model);
  ShardedQueryInput in;
  in.prefix_ids = s.prefix;
  for (const auto& c : s.chunks) in.chunk_lengths.push_back(static_cast<int64_t>(c.size()));
  const ShardLayout layout =
      SplitChunks(in.chunk_lengths, static_cast<int64_t>(s.prefix.size()), go.world_size);
  for (int c = layout.chunk_begin[go.rank]; c < layout.chunk_end[go.rank]; ++c) {
    absl::StatusOr<ChunkKv> kv = PrefillChunk(*model, s.chunks[c], PrefixMode::kBos);
    if (!kv.ok()) return 2;
    in.local_chunks.push_back(std::make_shared<ChunkKv>(std::move(*kv)));
  }
  in.question_ids = s.question;
  in.prompt_ids = s.prompt;
  std::ofstream out;
  if (go.rank == 0) out.open(f["--sp-out"]);
  if (f["--sp-mode"] == "fault") {
    // Queries back to back until one fails: the test kills or stops a rank
    // meanwhile, so the fault lands mid-query.
    MethodOptions full;
    full.method = Method::kFull;
    for (int i = 0;; ++i) {
      absl::StatusOr<ShardedQueryResult> r =
          RunShardedQuery(*model, group->get(), in, full, Greedy(), nullptr, {});
      if (!r.ok()) {
        if (go.rank == 0) out << "ERR " << r.status().ToString() << "\n" << std::flush;
        std::fprintf(stderr, "rank %d: %s\n", go.rank, r.status().ToString().c_str());
        // The group is broken: every rank exits non-zero, after lingering one
        // timeout so the other ranks still find the faulty rank itself, not
        // a healthy neighbour that left first.
        if (go.rank != 0) std::this_thread::sleep_for(go.timeout);
        _exit(3);
      }
      if (go.rank == 0 && i == 0) out << "RUNNING\n" << std::flush;
    }
  }
  if (f["--sp-mode"] == "chain") {
    // Rank 0 waits on rank 1, which waits on rank 2, which the test stops
    // (once every rank has passed one ring step and the test's go file is
    // there): rank 0's own timeout is on rank 1, a healthy rank.
    at::Tensor t = at::ones({16});
    at::Tensor r = at::empty({16});
    absl::Status st = (*group)->Wait((*group)->StartRingExchange({t}, {r}));
    if (go.rank == 0) out << (st.ok() ? "RUNNING" : "ERR " + st.ToString()) << "\n" << std::flush;
    if (!st.ok()) _exit(3);
    const std::string go_file = f["--sp-out"] + ".go";
    while (!std::filesystem::exists(go_file)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (go.rank == 1) {
      st = (*group)->Exchange({{2, t}}, {});
      if (st.ok()) st = (*group)->Exchange({}, {{0, r}});
    } else {
      st = (*group)->Exchange({{1, t}}, {});
    }
    if (go.rank == 0) out << (st.ok() ? "OK" : "ERR " + st.ToString()) << "\n" << std::flush;
    std::fprintf(stderr, "rank %d: %s\n", go.rank, st.ToString().c_str());
    if (go.rank != 0) std::this_thread::sleep_for(go.timeout);  // as in "fault"
    _exit(st.ok() ? 0 : 3);
  }
  if (f["--sp-mode"] == "mismatch") {
    // Rank 1 is given another question: every rank must refuse at once.
    if (go.rank == 1) in.question_ids.back() ^= 1;
    absl::StatusOr<ShardedQueryResult> r =
        RunShardedQuery(*model, group->get(), in, MethodOptions{}, Greedy(), nullptr, {});
    if (go.rank == 0) out << (r.ok() ? std::string("OK") : "ERR " + r.status().ToString()) << "\n";
    return r.ok() ? 0 : 4;
  }
  const std::vector<Case> cases = Cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    absl::StatusOr<ShardedQueryResult> r =
        RunShardedQuery(*model, group->get(), in, cases[i].options, Greedy(), nullptr, {});
    if (!r.ok()) {
      std::fprintf(stderr, "rank %d case %s: %s\n", go.rank, cases[i].name,
                   r.status().ToString().c_str());
      _exit(3);
    }
    if (go.rank != 0) continue;
    out << "case " << i << "\nsel " << r->plan.selected.size();
    for (int64_t x : r->plan.selected) out << " " << x;
    out << "\nids " << r->decode.ids.size();
    for (int32_t x : r->decode.ids) out << " " << x;
    at::Tensor lg = r->first_logits.reshape({-1}).contiguous();
    out << "\nlogits " << lg.numel();
    char buf[32];
    for (int64_t j = 0; j < lg.numel(); ++j) {
      std::snprintf(buf, sizeof buf, " %.9g", lg.data_ptr<float>()[j]);
      out << buf;
    }
    out << "\nbytes " << r->bytes_sent << " kv " << r->kv_bytes << "\n";
  }
  out.close();
  return 0;
}

// ---- test mode ----

struct Outcome {
  std::vector<int64_t> selected;
  std::vector<int32_t> ids;
  at::Tensor logits;  // [vocab] f32
};

class SequenceParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("infoflow_sp_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
    TestModelSpec spec = DefaultTestModelSpec("llama");
    spec.seed = 7;
    ASSERT_TRUE(WriteTestModel(dir_ / "model", spec).ok());
    model_ = LoadCpu(dir_ / "model");
    ASSERT_NE(model_, nullptr);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::vector<std::string> Base(const std::string& mode, int timeout_ms) {
    return {"sp_test",
            "--sp-model",
            (dir_ / "model").string(),
            "--sp-out",
            (dir_ / "out.txt").string(),
            "--sp-mode",
            mode,
            "--sp-timeout-ms",
            std::to_string(timeout_ms)};
  }

  std::vector<Outcome> Reference() {
    const Scenario s = MakeScenario(*model_);
    QueryInput in;
    in.prefix_ids = s.prefix;
    for (const auto& c : s.chunks) {
      absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, c, PrefixMode::kBos);
      EXPECT_TRUE(kv.ok());
      in.chunks.push_back(std::make_shared<ChunkKv>(std::move(*kv)));
    }
    in.question_ids = s.question;
    in.prompt_ids = s.prompt;
    in.decode_reserve = Greedy().max_new_tokens;
    std::vector<Outcome> out;
    for (const Case& c : Cases()) {
      absl::StatusOr<BlendedContext> ctx = BuildContext(*model_, in, c.options);
      EXPECT_TRUE(ctx.ok()) << c.name;
      Outcome o;
      o.selected = ctx->plan.selected;
      at::Tensor logits = PrefillTokens(*model_, s.prompt, ctx->next_position, &ctx->cache).logits;
      o.logits = logits.reshape({-1}).to(at::kFloat).clone();
      o.ids =
          Decode(*model_, &ctx->cache, ctx->next_position + static_cast<int64_t>(s.prompt.size()),
                 logits, Greedy(), nullptr, {})
              .ids;
      out.push_back(std::move(o));
    }
    return out;
  }

  std::vector<Outcome> ReadOutcomes(int64_t* bytes_sent) {
    std::ifstream in(dir_ / "out.txt");
    std::vector<Outcome> out;
    std::string tag;
    while (in >> tag) {
      if (tag == "case") {
        int i;
        in >> i;
        out.emplace_back();
      } else if (tag == "sel" || tag == "ids" || tag == "logits") {
        size_t n;
        in >> n;
        std::vector<float> lg;
        for (size_t j = 0; j < n; ++j) {
          if (tag == "sel") {
            int64_t x;
            in >> x;
            out.back().selected.push_back(x);
          } else if (tag == "ids") {
            int32_t x;
            in >> x;
            out.back().ids.push_back(x);
          } else {
            float x;
            in >> x;
            lg.push_back(x);
          }
        }
        if (tag == "logits") out.back().logits = at::tensor(lg);
      } else if (tag == "bytes") {
        std::string kv;
        int64_t b, k;
        in >> b >> kv >> k;
        *bytes_sent = std::max(*bytes_sent, b);
      }
    }
    return out;
  }

  void ExpectSameAsOneProcess(int world) {
    const std::vector<Outcome> ref = Reference();
    std::vector<pid_t> pids =
        sp_launch::LaunchGroup(Base("exact", 60000), world, (dir_ / "port").string());
    ASSERT_EQ(pids.size(), static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) EXPECT_EQ(sp_launch::WaitExit(pids[r]), 0) << "rank " << r;
    int64_t bytes = 0;
    const std::vector<Outcome> got = ReadOutcomes(&bytes);
    const std::vector<Case> cases = Cases();
    ASSERT_EQ(got.size(), cases.size());
    EXPECT_GT(bytes, 0);  // the ranks really exchanged K/V
    for (size_t i = 0; i < cases.size(); ++i) {
      SCOPED_TRACE(cases[i].name);
      EXPECT_EQ(got[i].selected, ref[i].selected);
      EXPECT_EQ(got[i].ids, ref[i].ids);
      ASSERT_TRUE(got[i].logits.defined());
      ASSERT_EQ(got[i].logits.numel(), ref[i].logits.numel());
      EXPECT_LT((got[i].logits - ref[i].logits).abs().max().item<double>(), 1e-4);
    }
    // r = 1 recomputes everything: INFOFLOW == FULL == ring FULL.
    EXPECT_LT((got[3].logits - ref[0].logits).abs().max().item<double>(), 1e-4);
    EXPECT_LT((got[0].logits - ref[0].logits).abs().max().item<double>(), 1e-4);
    EXPECT_EQ(got[3].ids, ref[0].ids);
  }

  // Starts a group running queries back to back, applies `fault` (a signal)
  // to rank `victim` once rank 0 has finished one, and expects rank 0 to
  // fail with UNAVAILABLE naming the victim within the timeout.
  void ExpectFaultNamesRank(int world, int victim, int sig) {
    const int timeout_ms = 3000;
    std::vector<pid_t> pids =
        sp_launch::LaunchGroup(Base("fault", timeout_ms), world, (dir_ / "port").string());
    ASSERT_EQ(pids.size(), static_cast<size_t>(world));
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    std::string text;
    while (std::chrono::steady_clock::now() < until) {
      std::ifstream in(dir_ / "out.txt");
      std::stringstream ss;
      ss << in.rdbuf();
      text = ss.str();
      if (text.find("RUNNING") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_NE(text.find("RUNNING"), std::string::npos);
    const auto t0 = std::chrono::steady_clock::now();
    kill(pids[victim], sig);
    const int rc0 = sp_launch::WaitExit(pids[0]);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int r = 1; r < world; ++r) {
      kill(pids[r], SIGKILL);  // SIGKILL also ends a stopped process
      sp_launch::WaitExit(pids[r]);
    }
    EXPECT_EQ(rc0, 3);
    std::ifstream in(dir_ / "out.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    EXPECT_NE(text.find("ERR UNAVAILABLE"), std::string::npos) << text;
    EXPECT_NE(text.find("rank " + std::to_string(victim) + ":"), std::string::npos) << text;
    // Within the group timeout (plus start-up slack), never a hang.
    EXPECT_LT(waited, timeout_ms / 1000.0 + 5.0);
  }

  std::filesystem::path dir_;
  std::unique_ptr<Model> model_;
};

TEST_F(SequenceParallelTest, TwoRanksMatchOneProcess) { ExpectSameAsOneProcess(2); }
TEST_F(SequenceParallelTest, ThreeRanksMatchOneProcess) { ExpectSameAsOneProcess(3); }
TEST_F(SequenceParallelTest, KilledRankFailsQueryNamingIt) { ExpectFaultNamesRank(2, 1, SIGKILL); }
TEST_F(SequenceParallelTest, StalledRankFailsQueryWithinTimeout) {
  ExpectFaultNamesRank(3, 2, SIGSTOP);
}

// Rank 0 times out on rank 1, which is healthy but itself waits on the
// stopped rank 2: rank 0's error follows rank 1's record (the blame chain in
// the group's store) and names rank 2.
TEST_F(SequenceParallelTest, TimeoutOnAWaitingRankNamesTheStalledOne) {
  const int timeout_ms = 2000;
  std::vector<pid_t> pids =
      sp_launch::LaunchGroup(Base("chain", timeout_ms), 3, (dir_ / "port").string());
  ASSERT_EQ(pids.size(), 3u);
  auto read_out = [&] {
    std::ifstream in(dir_ / "out.txt");
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (read_out().find("RUNNING") == std::string::npos &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_NE(read_out().find("RUNNING"), std::string::npos) << read_out();
  kill(pids[2], SIGSTOP);
  std::ofstream((dir_ / "out.txt").string() + ".go") << "go\n";
  const auto t0 = std::chrono::steady_clock::now();
  const int rc0 = sp_launch::WaitExit(pids[0]);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (int r = 1; r < 3; ++r) {
    kill(pids[r], SIGKILL);
    sp_launch::WaitExit(pids[r]);
  }
  EXPECT_EQ(rc0, 3);
  const std::string text = read_out();
  EXPECT_NE(text.find("ERR UNAVAILABLE: rank 2: stalled or gone"), std::string::npos) << text;
  EXPECT_NE(text.find("rank 1 timed out on rank 2"), std::string::npos) << text;
  // The timeout plus the wait for records (half the timeout), never a hang.
  EXPECT_LT(waited, timeout_ms / 1000.0 * 1.5 + 3.0);
}

// Ranks given different queries (a bug in whoever feeds them) fail at once,
// all of them, instead of computing garbage or timing out in the ring.
TEST_F(SequenceParallelTest, RanksGivenDifferentQueriesRefuseAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<pid_t> pids =
      sp_launch::LaunchGroup(Base("mismatch", 60000), 2, (dir_ / "port").string());
  ASSERT_EQ(pids.size(), 2u);
  EXPECT_EQ(sp_launch::WaitExit(pids[0]), 4);
  EXPECT_EQ(sp_launch::WaitExit(pids[1]), 4);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  std::ifstream in(dir_ / "out.txt");
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_NE(
      ss.str().find("ERR FAILED_PRECONDITION: rank 1 was given a different query than rank 0"),
      std::string::npos)
      << ss.str();
}

// One rank: the group machinery with no peer equals the single process, and
// requests this mode cannot run are refused before any exchange.
TEST_F(SequenceParallelTest, OneRankMatchesOneProcessAndRefusesWhatItCannotRun) {
  GroupOptions go;
  go.timeout = std::chrono::milliseconds(5000);
  absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> group = SequenceParallelGroup::Join(go);
  ASSERT_TRUE(group.ok()) << group.status();
  EXPECT_GT((*group)->port(), 0);
  const Scenario s = MakeScenario(*model_);
  ShardedQueryInput in;
  in.prefix_ids = s.prefix;
  for (const auto& c : s.chunks) {
    in.chunk_lengths.push_back(static_cast<int64_t>(c.size()));
    absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, c, PrefixMode::kBos);
    ASSERT_TRUE(kv.ok());
    in.local_chunks.push_back(std::make_shared<ChunkKv>(std::move(*kv)));
  }
  in.question_ids = s.question;
  in.prompt_ids = s.prompt;
  const std::vector<Outcome> ref = Reference();
  const std::vector<Case> cases = Cases();
  for (size_t i = 0; i < cases.size(); ++i) {
    SCOPED_TRACE(cases[i].name);
    absl::StatusOr<ShardedQueryResult> r =
        RunShardedQuery(*model_, group->get(), in, cases[i].options, Greedy(), nullptr, {});
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->plan.selected, ref[i].selected);
    EXPECT_EQ(r->decode.ids, ref[i].ids);
    EXPECT_LT((r->first_logits.reshape({-1}) - ref[i].logits).abs().max().item<double>(), 1e-4);
    EXPECT_EQ(r->bytes_sent, 0);
  }
  auto status_of = [&](const MethodOptions& o, const ShardedQueryInput& input) {
    return RunShardedQuery(*model_, group->get(), input, o, Greedy(), nullptr, {}).status();
  };
  MethodOptions reorder;
  reorder.reorder = true;
  EXPECT_EQ(status_of(reorder, in).code(), absl::StatusCode::kInvalidArgument);
  MethodOptions cacheblend;
  cacheblend.method = Method::kCacheBlend;
  EXPECT_EQ(status_of(cacheblend, in).code(), absl::StatusCode::kUnimplemented);
  MethodOptions bad_ratio;
  bad_ratio.ratio = 1.5;
  EXPECT_EQ(status_of(bad_ratio, in).code(), absl::StatusCode::kInvalidArgument);
  ShardedQueryInput missing = in;
  missing.local_chunks.pop_back();
  EXPECT_EQ(status_of(MethodOptions{}, missing).code(), absl::StatusCode::kInvalidArgument);
  ShardedQueryInput no_prompt = in;
  no_prompt.prompt_ids.clear();
  EXPECT_EQ(status_of(MethodOptions{}, no_prompt).code(), absl::StatusCode::kInvalidArgument);
}

// A group whose other ranks never come is UNAVAILABLE after the timeout.
TEST(SequenceParallelGroupTest, IncompleteGroupFailsJoinWithinTimeout) {
  GroupOptions go;
  go.world_size = 2;
  go.timeout = std::chrono::milliseconds(1500);
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<SequenceParallelGroup>> group = SequenceParallelGroup::Join(go);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(group.ok());
  EXPECT_EQ(group.status().code(), absl::StatusCode::kUnavailable) << group.status();
  EXPECT_LT(waited, 10.0);
  GroupOptions bad;
  bad.rank = 2;
  bad.world_size = 2;
  EXPECT_EQ(SequenceParallelGroup::Join(bad).status().code(), absl::StatusCode::kInvalidArgument);
  bad.rank = 1;
  bad.port = 0;  // only rank 0 may ask for an ephemeral port
  EXPECT_EQ(SequenceParallelGroup::Join(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ShardLayoutTest, SplitsContiguouslyByTokens) {
  ShardLayout l = SplitChunks({40, 33, 27, 45, 31, 38}, 1, 3);
  EXPECT_EQ(l.n_ctx, 214);
  EXPECT_EQ(l.chunk_begin, (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(l.chunk_end, (std::vector<int>{2, 4, 6}));
  EXPECT_EQ(l.ctx_begin, (std::vector<int64_t>{0, 73, 145}));
  EXPECT_EQ(l.ctx_end, (std::vector<int64_t>{73, 145, 214}));
  // Fewer chunks than ranks: some ranks hold nothing, the rest stay contiguous.
  ShardLayout two = SplitChunks({10, 10}, 1, 4);
  EXPECT_EQ(two.ctx_end.back(), 20);
  for (int r = 1; r < 4; ++r) EXPECT_EQ(two.ctx_begin[r], two.ctx_end[r - 1]);
}

// Ring attention's pieces run the blocked kernel (with each row's lse) from
// Model::Attention's size on; the materialised path is the reference. Keys
// at repositioned, unsorted positions; some rows see no key of the piece.
TEST(AttendPieceTest, BlockedPieceMatchesMaterialised) {
  at::manual_seed(3);
  const int64_t H = 8, Hkv = 2, nq = 40, nk = 300, hd = 32;
  at::Tensor q = at::randn({H, nq, hd}), k = at::randn({Hkv, nk, hd}), v = at::randn({Hkv, nk, hd});
  at::Tensor k_pos = at::randperm(nk, at::kLong) + 100;  // keys at 100..399, shuffled
  at::Tensor q_pos = at::arange(60, 460, 10, at::kLong);  // rows at 60..450: the first 4 see none
  Model::SetBlockedAttentionMinPairs(int64_t{1} << 40);
  const PartialAttention want = AttendPiece(q, k, v, q_pos, k_pos);
  Model::SetBlockedAttentionMinPairs(64 * 64);
  ASSERT_TRUE(Model::BlockedAttentionPays(nq, nk));
  const PartialAttention got = AttendPiece(q, k, v, q_pos, k_pos);
  ASSERT_EQ(got.out.sizes(), want.out.sizes());
  ASSERT_EQ(got.lse.sizes(), want.lse.sizes());
  for (int64_t i = 0; i < 4; ++i) {
    EXPECT_TRUE(std::isinf(got.lse[0][i].item<float>())) << i;
    EXPECT_EQ(got.out.select(1, i).abs().max().item<float>(), 0.0f) << i;
  }
  at::Tensor seen = got.lse.narrow(1, 4, nq - 4), seen_want = want.lse.narrow(1, 4, nq - 4);
  EXPECT_LT((seen - seen_want).abs().max().item<float>(), 1e-5);
  EXPECT_LT((got.out - want.out).abs().max().item<float>(), 1e-5);
  // Merging two halves of the keys equals attending all of them.
  PartialAttention merged;
  MergePartial(&merged, AttendPiece(q, k.narrow(1, 0, 150), v.narrow(1, 0, 150), q_pos,
                                    k_pos.narrow(0, 0, 150)));
  MergePartial(&merged, AttendPiece(q, k.narrow(1, 150, 150), v.narrow(1, 150, 150), q_pos,
                                    k_pos.narrow(0, 150, 150)));
  EXPECT_LT((merged.out - want.out).abs().max().item<float>(), 1e-5);
}

}  // namespace
}  // namespace infoflow

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--sp-rank") return infoflow::RunRank(argc, argv);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
