// docs/DESIGN.md §3 invariants and the InfoFlow stages, pinned against FULL.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>

#include "engine/blend/pipeline.h"
#include "engine/blend/recompute.h"
#include "engine/blend/reposition.h"
#include "engine/blend/scoring.h"
#include "engine/blend/selection.h"
#include "engine/text/tokenizer.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::MaxAbsDiff;

std::vector<int32_t> Ids(int n, uint32_t seed, int vocab) {
  std::vector<int32_t> ids;
  uint32_t x = 2463534242u + seed * 7919u;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    ids.push_back(static_cast<int32_t>(3 + x % (vocab - 3)));
  }
  return ids;
}

class InfoFlowTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = testing::LoadOrDie(testing::GeneratedModelDir(GetParam()));
    ASSERT_NE(model_, nullptr);
    vocab_ = static_cast<int>(model_->config().vocab_size);
    bos_ = static_cast<int32_t>(model_->config().bos_token_id.value_or(1));
  }

  // prefix [BOS] + chunks of the given lengths + a question.
  QueryInput MakeInput(const std::vector<int>& lengths, uint32_t seed) {
    QueryInput in;
    in.prefix_ids = {bos_};
    in.chunk_prefix_mode = PrefixMode::kBos;
    for (size_t i = 0; i < lengths.size(); ++i) {
      auto kv = PrefillChunk(*model_, Ids(lengths[i], seed * 100 + i, vocab_), PrefixMode::kBos);
      EXPECT_TRUE(kv.ok()) << kv.status();
      in.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
    }
    in.question_ids = Ids(6, seed * 100 + 99, vocab_);
    in.prompt_ids = in.question_ids;
    return in;
  }

  // Logits of every prompt token after building the context by `options`.
  at::Tensor PromptLogits(const QueryInput& in, const MethodOptions& options,
                          RecomputePlan* plan = nullptr) {
    absl::StatusOr<BlendedContext> ctx = BuildContext(*model_, in, options);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    if (!ctx.ok()) return at::zeros({1});
    ForwardOptions all;
    all.logits = ForwardOptions::Logits::kAll;
    at::Tensor logits = PrefillTokens(*model_, in.prompt_ids, ctx->next_position, &ctx->cache, all).logits;
    if (plan) *plan = ctx->plan;
    return logits;
  }

  at::Tensor FullLogits(const QueryInput& in) {
    MethodOptions full;
    full.method = Method::kFull;
    return PromptLogits(in, full);
  }

  static double Kl(const at::Tensor& p_logits, const at::Tensor& q_logits) {
    at::Tensor lp = at::log_softmax(p_logits.to(at::kDouble), -1);
    at::Tensor lq = at::log_softmax(q_logits.to(at::kDouble), -1);
    return (lp.exp() * (lp - lq)).sum(-1).mean().item<double>();
  }

  std::unique_ptr<Model> model_;
  int vocab_ = 0;
  int32_t bos_ = 1;
};

TEST_P(InfoFlowTest, RatioOneEqualsFullForEveryMethod) {
  QueryInput in = MakeInput({17, 23, 9, 30}, 1);
  at::Tensor ref = FullLogits(in);
  for (Method m : {Method::kInfoFlow, Method::kCacheBlend, Method::kRandom,
                   Method::kCacheBlendPartial, Method::kInfoFlowBlend}) {
    for (Deviation d : {Deviation::kV, Deviation::kK}) {
      MethodOptions o;
      o.method = m;
      o.ratio = 1.0;
      o.deviation = d;
      EXPECT_LE(MaxAbsDiff(PromptLogits(in, o), ref), 1e-4) << MethodName(m) << " " << DeviationName(d);
    }
  }
  MethodOptions epic;
  epic.method = Method::kEpic;
  epic.lego_k = 1000;  // every token of every chunk
  EXPECT_LE(MaxAbsDiff(PromptLogits(in, epic), ref), 1e-4);
}

TEST_P(InfoFlowTest, RatioZeroEqualsNoneAndNoneDiffersFromFull) {
  QueryInput in = MakeInput({15, 20, 12}, 2);
  MethodOptions none;
  none.method = Method::kNone;
  at::Tensor base = PromptLogits(in, none);
  // CACHEBLEND (the original) is not here: it keeps fresh layer 0-1 K/V for
  // every token, see CacheBlendAtRatioZeroIsNoneWithFullLayersZeroAndOne.
  // What this test pinned for it before the split is now CACHEBLEND_PARTIAL.
  for (Method m : {Method::kInfoFlow, Method::kCacheBlendPartial, Method::kRandom,
                   Method::kInfoFlowBlend}) {
    MethodOptions o;
    o.method = m;
    o.ratio = 0.0;
    RecomputePlan plan;
    EXPECT_LE(MaxAbsDiff(PromptLogits(in, o, &plan), base), 1e-5) << MethodName(m);
    EXPECT_TRUE(plan.selected.empty()) << MethodName(m);
  }
  // Several chunks that never saw each other: NONE must not be exact, or the
  // invariants above could not fail.
  EXPECT_GT(MaxAbsDiff(base, FullLogits(in)), 1e-3);
}

TEST_P(InfoFlowTest, SingleChunkNoneEqualsFull) {
  QueryInput in = MakeInput({40}, 3);
  MethodOptions none;
  none.method = Method::kNone;
  EXPECT_LE(MaxAbsDiff(PromptLogits(in, none), FullLogits(in)), 1e-4);
  // And with no prefix at all (chunk prefilled at 0..n-1).
  QueryInput bare = in;
  bare.prefix_ids.clear();
  bare.chunk_prefix_mode = PrefixMode::kNone;
  auto kv = PrefillChunk(*model_, in.chunks[0]->token_ids, PrefixMode::kNone);
  ASSERT_TRUE(kv.ok());
  bare.chunks = {std::make_shared<ChunkKv>(*std::move(kv))};
  EXPECT_LE(MaxAbsDiff(PromptLogits(bare, none), FullLogits(bare)), 1e-4);
}

// The original CacheBlend at r = 0 recomputes nothing from layer 2 on but
// keeps the fresh layer 0-1 K/V of every token, which are FULL's (layer 0
// depends only on token and position, so layer 1's input is exact): it is
// NONE with FULL's layer 0 and 1 K/V, and not NONE.
TEST_P(InfoFlowTest, CacheBlendAtRatioZeroIsNoneWithFullLayersZeroAndOne) {
  if (model_->n_layers() < 3) GTEST_SKIP() << "needs layers past 1";
  QueryInput in = MakeInput({15, 20, 12}, 2);
  MethodOptions full, none;
  full.method = Method::kFull;
  none.method = Method::kNone;
  absl::StatusOr<BlendedContext> f = BuildContext(*model_, in, full);
  absl::StatusOr<BlendedContext> n = BuildContext(*model_, in, none);
  ASSERT_TRUE(f.ok() && n.ok());
  for (int l = 0; l < 2; ++l) n->cache.WriteRange(l, 0, f->cache.keys(l), f->cache.values(l));
  ForwardOptions all;
  all.logits = ForwardOptions::Logits::kAll;
  at::Tensor expected = PrefillTokens(*model_, in.prompt_ids, n->next_position, &n->cache, all).logits;
  for (Deviation d : {Deviation::kV, Deviation::kK}) {
    MethodOptions cb;
    cb.method = Method::kCacheBlend;
    cb.ratio = 0.0;
    cb.deviation = d;
    RecomputePlan plan;
    at::Tensor got = PromptLogits(in, cb, &plan);
    EXPECT_TRUE(plan.selected.empty());
    EXPECT_LE(MaxAbsDiff(got, expected), 1e-4) << DeviationName(d);
    EXPECT_GT(MaxAbsDiff(got, PromptLogits(in, none)), 1e-3) << "r = 0 CACHEBLEND must not be NONE";
  }
  // The partial variant at r = 0 is NONE (RatioZeroEqualsNone...); at the
  // same r > 0 both select the same tokens (same deviation) but differ in
  // the unselected tokens' layer-1 K/V.
  MethodOptions a, b;
  a.method = Method::kCacheBlend;
  b.method = Method::kCacheBlendPartial;
  a.ratio = b.ratio = 0.2;
  RecomputePlan pa, pb;
  at::Tensor la = PromptLogits(in, a, &pa), lb = PromptLogits(in, b, &pb);
  EXPECT_EQ(pa.selected, pb.selected);
  EXPECT_FALSE(pa.selected.empty());
  EXPECT_GT(MaxAbsDiff(la, lb), 1e-5);
}

// INFOFLOW_BLEND's staleness signal is CACHEBLEND's layer-1 deviation at
// one layer's cost: with stale_share 1 it selects exactly what
// CACHEBLEND_PARTIAL does (the first chunk is exact: deviation 0, never
// picked by either here); with 0 it is relevance only. Its knobs are checked.
TEST_P(InfoFlowTest, InfoFlowBlendRanksByCacheBlendsDeviationAtLayerZeroCost) {
  if (model_->n_layers() < 2) GTEST_SKIP() << "needs layer 1";
  QueryInput in = MakeInput({20, 24, 18, 22}, 7);
  for (Deviation d : {Deviation::kV, Deviation::kK}) {
    MethodOptions blend, cb;
    blend.method = Method::kInfoFlowBlend;
    blend.stale_share = 1.0;
    blend.probe_factor = 0;  // every eligible token
    cb.method = Method::kCacheBlendPartial;
    blend.ratio = cb.ratio = 0.15;
    blend.deviation = cb.deviation = d;
    RecomputePlan pb, pc;
    PromptLogits(in, blend, &pb);
    PromptLogits(in, cb, &pc);
    EXPECT_EQ(pb.selected, pc.selected) << DeviationName(d);
    EXPECT_EQ(pb.selected.size(), 12u);
  }
  // Half the budget by deviation, half by relevance: it differs from both.
  MethodOptions half;
  half.method = Method::kInfoFlowBlend;
  half.ratio = 0.25;
  half.probe_factor = 0;
  RecomputePlan ph;
  PromptLogits(in, half, &ph);
  EXPECT_EQ(ph.selected.size(), 21u);
  for (int64_t t : ph.selected) EXPECT_GE(t, 20) << "first chunk is exact, not eligible";
  // A probe that covers every eligible token is the full probe, bit for
  // bit; a small one ranks deviation among the most relevant tokens only,
  // and tokens outside it still start at layer 1 exactly (r = 1 with a
  // small probe is FULL).
  MethodOptions all_probed = half;
  all_probed.probe_factor = 1000;
  RecomputePlan pa;
  at::Tensor la = PromptLogits(in, all_probed, &pa);
  EXPECT_EQ(pa.selected, ph.selected);
  EXPECT_EQ(MaxAbsDiff(la, PromptLogits(in, half)), 0.0);
  MethodOptions small = half;
  small.probe_factor = 1;
  small.stale_share = 1.0;
  RecomputePlan pk;
  PromptLogits(in, small, &pk);
  // The probe is the top k by relevance, and all of it is picked.
  MethodOptions relevance = half;
  relevance.method = Method::kInfoFlow;
  RecomputePlan pr;
  PromptLogits(in, relevance, &pr);
  EXPECT_EQ(pk.selected, pr.selected);
  small.ratio = 1.0;
  small.stale_share = 0.5;
  EXPECT_LE(MaxAbsDiff(PromptLogits(in, small), FullLogits(in)), 1e-4);
  small.probe_factor = -1;
  EXPECT_FALSE(BuildContext(*model_, in, small).ok());
  // Layer 0's output is exact, so starting the recompute at layer 1 loses
  // nothing: r = 1 is FULL (RatioOneEqualsFull...), and bad knobs fail.
  half.stale_share = 1.5;
  EXPECT_FALSE(BuildContext(*model_, in, half).ok());
  half.stale_share = -0.1;
  EXPECT_FALSE(BuildContext(*model_, in, half).ok());
}

// Model::LayerKv is the projection Layer() writes to the cache.
TEST_P(InfoFlowTest, LayerKvMatchesWhatLayerWrites) {
  QueryInput in = MakeInput({12}, 8);
  KvCache cache(model_->n_layers());
  ForwardResult r = PrefillTokens(*model_, in.chunks[0]->token_ids, 0, &cache);
  (void)r;
  at::Tensor positions = cache.positions();
  auto rope = model_->RopeTables(positions);
  at::Tensor ids = at::tensor(std::vector<int64_t>(in.chunks[0]->token_ids.begin(),
                                                   in.chunks[0]->token_ids.end()),
                              at::TensorOptions().dtype(at::kLong));
  at::Tensor h = model_->Embed(ids.to(model_->device()));
  auto [k, v] = model_->LayerKv(0, h, rope);
  EXPECT_LE(MaxAbsDiff(k, cache.keys(0)), 1e-5);
  EXPECT_LE(MaxAbsDiff(v, cache.values(0)), 1e-5);
}

// Deviation from FULL shrinks as r grows: the ends strictly, the middle on
// average over seeds (selection is a heuristic; single cases may be noisy).
TEST_P(InfoFlowTest, DeviationShrinksWithRatio) {
  const std::vector<double> ratios = {0.0, 0.15, 0.5, 1.0};
  std::vector<double> mean_kl(ratios.size(), 0.0), mean_abs(ratios.size(), 0.0);
  const int seeds = 4;
  for (int seed = 0; seed < seeds; ++seed) {
    QueryInput in = MakeInput({24, 18, 30, 20}, 10 + seed);
    at::Tensor ref = FullLogits(in);
    for (size_t i = 0; i < ratios.size(); ++i) {
      MethodOptions o;
      o.ratio = ratios[i];
      at::Tensor got = PromptLogits(in, o);
      mean_kl[i] += Kl(ref, got) / seeds;
      mean_abs[i] += MaxAbsDiff(got, ref) / seeds;
    }
  }
  EXPECT_GT(mean_kl[0], 1e-6);
  EXPECT_LE(mean_abs[3], 1e-4);
  EXPECT_LT(mean_kl[2], mean_kl[0]);
  EXPECT_LE(mean_kl[1], mean_kl[0] * 1.05);
  EXPECT_LE(mean_kl[3], mean_kl[2]);
}

// The paper's RoPE-alignment claim: scores under global positions differ from
// scores with every chunk at its local positions, and BuildContext uses the
// global ones.
TEST_P(InfoFlowTest, ScoringUsesGlobalPositions) {
  QueryInput in = MakeInput({30, 30, 30}, 4);
  const auto layers = DefaultScoringLayers(*model_);
  // Global layout.
  KvCache global(model_->n_layers());
  PrefillTokens(*model_, in.prefix_ids, 0, &global);
  RepositionChunks(*model_, in.chunks, {0, 1, 2}, 1, &global);
  at::Tensor g = ScoreByAttentionNorm(*model_, &global, in.question_ids, 91, 1, 91, layers,
                                      ScoreVariant::kL2);
  EXPECT_EQ(global.size(), 91);  // the question's KV was dropped again
  // Local layout: every chunk at positions 1..30, question right after.
  KvCache local(model_->n_layers());
  PrefillTokens(*model_, in.prefix_ids, 0, &local);
  for (const auto& c : in.chunks) AppendChunkAt(*model_, *c, 1, &local);
  at::Tensor l = ScoreByAttentionNorm(*model_, &local, in.question_ids, 31, 1, 91, layers,
                                      ScoreVariant::kL2);
  EXPECT_GT(MaxAbsDiff(g, l), 1e-3);

  MethodOptions o;
  RecomputePlan plan;
  PromptLogits(in, o, &plan);
  ASSERT_EQ(plan.scores.size(), 90u);
  at::Tensor planned = at::tensor(plan.scores, at::kDouble);
  EXPECT_LE(MaxAbsDiff(planned, g), 1e-9);
  // Selection = top-k of the global scores outside the first chunk.
  EXPECT_EQ(plan.selected, SelectTopK(g, BudgetFor(0.15, 90), ExcludeFirstChunk(90, 30)));
  for (int64_t i : plan.selected) EXPECT_GE(i, 30);
}

TEST_P(InfoFlowTest, ReorderAtRatioOneEqualsFullOnReorderedChunks) {
  QueryInput in = MakeInput({12, 25, 18, 9}, 5);
  MethodOptions o;
  o.ratio = 1.0;
  o.reorder = true;
  RecomputePlan plan;
  at::Tensor got = PromptLogits(in, o, &plan);
  QueryInput reordered = in;
  reordered.chunks.clear();
  for (int c : plan.chunk_order) reordered.chunks.push_back(in.chunks[c]);
  EXPECT_LE(MaxAbsDiff(got, FullLogits(reordered)), 1e-4);

  // At r = 0.3 the chunk with the highest first-pass selected ratio goes last.
  o.ratio = 0.3;
  PromptLogits(in, o, &plan);
  std::vector<int> sorted = plan.chunk_order;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(sorted, (std::vector<int>{0, 1, 2, 3}));
}

// Recompute of k tokens processes exactly k attention rows per layer.
TEST_P(InfoFlowTest, RecomputeWorkIsProportionalToK) {
  QueryInput in = MakeInput({40, 40, 40}, 6);
  KvCache cache(model_->n_layers());
  PrefillTokens(*model_, in.prefix_ids, 0, &cache);
  std::vector<int32_t> ids = in.prefix_ids;
  auto ctx = RepositionChunks(*model_, in.chunks, {0, 1, 2}, 1, &cache);
  ids.insert(ids.end(), ctx.begin(), ctx.end());
  for (int64_t k : {1, 7, 18}) {
    std::vector<int64_t> slots;
    for (int64_t i = 0; i < k; ++i) slots.push_back(41 + i * 4);
    const int64_t before = AttentionQueryRows();
    RecomputeTokens(*model_, &cache, ids, slots);
    EXPECT_EQ(AttentionQueryRows() - before, k * model_->n_layers());
  }
}

// A text prefix (system prompt + chat header) before the chunks, its KV from
// a stored record (PrefixMode::kNone, positions 0..n-1) as the server uses
// it: the same invariants hold, the record equals a fresh prefill of the
// prefix, and every chunk is a candidate (the first is no longer exact).
TEST_P(InfoFlowTest, TextPrefixKeepsTheInvariants) {
  QueryInput in = MakeInput({17, 23, 9, 30}, 7);
  in.prefix_ids = Ids(11, 777, vocab_);
  in.prefix_ids.insert(in.prefix_ids.begin(), bos_);
  auto prefix_kv = PrefillChunk(*model_, in.prefix_ids, PrefixMode::kNone);
  ASSERT_TRUE(prefix_kv.ok()) << prefix_kv.status();
  QueryInput fresh = in;  // the prefix prefilled in the pipeline instead
  in.prefix_kv = std::make_shared<ChunkKv>(*std::move(prefix_kv));
  const at::Tensor ref = FullLogits(in);
  EXPECT_LE(MaxAbsDiff(ref, FullLogits(fresh)), 1e-6);
  // The original CACHEBLEND refreshes layers 0-1 for every token, so only
  // its r = 1 case is NONE-independent; the rest also pin r = 0 == NONE.
  MethodOptions cacheblend;
  cacheblend.method = Method::kCacheBlend;
  cacheblend.ratio = 1.0;
  EXPECT_LE(MaxAbsDiff(PromptLogits(in, cacheblend), ref), 1e-4) << "CACHEBLEND";
  for (Method m : {Method::kInfoFlow, Method::kCacheBlendPartial, Method::kRandom,
                   Method::kInfoFlowBlend}) {
    MethodOptions o;
    o.method = m;
    o.ratio = 1.0;
    EXPECT_LE(MaxAbsDiff(PromptLogits(in, o), ref), 1e-4) << MethodName(m);
    o.ratio = 0.0;
    MethodOptions none;
    none.method = Method::kNone;
    RecomputePlan plan;
    const at::Tensor base = PromptLogits(in, none);
    EXPECT_LE(MaxAbsDiff(PromptLogits(in, o, &plan), base), 1e-5) << MethodName(m);
    EXPECT_TRUE(plan.selected.empty());
    EXPECT_LE(MaxAbsDiff(base, PromptLogits(fresh, none)), 1e-4) << "stored prefix != fresh";
    EXPECT_GT(MaxAbsDiff(base, ref), 1e-3);  // NONE is not exact, so the checks can fail
  }
  // EPIC takes the first token of every chunk: with [BOS] alone the first
  // chunk is exact and skipped; after a text prefix it is a candidate.
  MethodOptions epic;
  epic.method = Method::kEpic;
  epic.lego_k = 1;
  RecomputePlan with_prefix, bos_only;
  PromptLogits(in, epic, &with_prefix);
  PromptLogits(MakeInput({17, 23, 9, 30}, 7), epic, &bos_only);
  EXPECT_EQ(with_prefix.selected, (std::vector<int64_t>{0, 17, 40, 49}));
  EXPECT_EQ(bos_only.selected, (std::vector<int64_t>{17, 40, 49}));
  // A record of other tokens is refused, not used.
  QueryInput wrong = in;
  wrong.prefix_ids.back() = wrong.prefix_ids.back() == 5 ? 6 : 5;
  MethodOptions none;
  none.method = Method::kNone;
  EXPECT_EQ(BuildContext(*model_, wrong, none).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The server keeps the lone BOS token's K/V and places it as a stored
// prefix (server/query_runner.h, BosKv) instead of a one-token forward per
// query: the prompt logits are bit-identical to prefilling BOS fresh.
TEST_P(InfoFlowTest, StoredBosEqualsFreshBosBitForBit) {
  QueryInput fresh = MakeInput({17, 23, 9}, 5);
  QueryInput stored = fresh;
  auto bos_kv = PrefillChunk(*model_, {bos_}, PrefixMode::kNone);
  ASSERT_TRUE(bos_kv.ok()) << bos_kv.status();
  stored.prefix_kv = std::make_shared<ChunkKv>(*std::move(bos_kv));
  for (Method m : {Method::kNone, Method::kInfoFlow, Method::kInfoFlowBlend, Method::kCacheBlend,
                   Method::kEpic}) {
    MethodOptions o;
    o.method = m;
    o.ratio = 0.3;
    EXPECT_TRUE(at::equal(PromptLogits(stored, o), PromptLogits(fresh, o))) << MethodName(m);
  }
}

// A query with no chunks is a plain prompt (the HTTP API's prompt without a
// separator): every method gives the logits of one forward pass over prefix +
// prompt on an empty cache, whether the prefix is [BOS] prefilled fresh, a
// stored [BOS], a text prefix, or nothing at all.
TEST_P(InfoFlowTest, NoChunksIsThePromptPrefilledWhole) {
  QueryInput bos = MakeInput({}, 8);
  QueryInput stored = bos;
  auto bos_kv = PrefillChunk(*model_, {bos_}, PrefixMode::kNone);
  ASSERT_TRUE(bos_kv.ok()) << bos_kv.status();
  stored.prefix_kv = std::make_shared<ChunkKv>(*std::move(bos_kv));
  QueryInput text = bos;
  text.prefix_ids = Ids(9, 888, vocab_);
  text.prefix_ids.insert(text.prefix_ids.begin(), bos_);
  QueryInput bare = bos;
  bare.prefix_ids.clear();
  bare.chunk_prefix_mode = PrefixMode::kNone;
  for (const QueryInput* in : {&bos, &stored, &text, &bare}) {
    std::vector<int32_t> ids = in->prefix_ids;
    ids.insert(ids.end(), in->prompt_ids.begin(), in->prompt_ids.end());
    KvCache cache(model_->n_layers());
    ForwardOptions all;
    all.logits = ForwardOptions::Logits::kAll;
    const int64_t n_prompt = static_cast<int64_t>(in->prompt_ids.size());
    const at::Tensor ref = PrefillTokens(*model_, ids, 0, &cache, all)
                               .logits.narrow(0, ids.size() - n_prompt, n_prompt);
    for (Method m :
         {Method::kFull, Method::kNone, Method::kInfoFlow, Method::kInfoFlowBlend,
          Method::kCacheBlend, Method::kCacheBlendPartial, Method::kEpic, Method::kRandom}) {
      MethodOptions o;
      o.method = m;
      o.ratio = 0.5;
      RecomputePlan plan;
      const at::Tensor got = PromptLogits(*in, o, &plan);
      EXPECT_LE(MaxAbsDiff(got, ref), 1e-4)
          << MethodName(m) << " with a prefix of " << in->prefix_ids.size() << " tokens";
      EXPECT_EQ(plan.context_tokens, 0);
      EXPECT_TRUE(plan.selected.empty() && plan.chunk_order.empty()) << MethodName(m);
    }
  }
  // With no prefix the prompt starts at position 0 on an empty cache.
  absl::StatusOr<BlendedContext> ctx = BuildContext(*model_, bare, MethodOptions{});
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  EXPECT_EQ(ctx->next_position, 0);
}

// glm4-bos: GLM-4's architecture (partial interleaved RoPE, QKV bias, sandwich
// norms) with <sop> as a BOS token, so every BOS-prefixed invariant above runs
// on it too.
INSTANTIATE_TEST_SUITE_P(Models, InfoFlowTest, ::testing::Values("llama", "qwen3", "glm4-bos"));

// GLM as its chat format uses it: no BOS; the query prefix is [gMASK]<sop>
// plus the system turn, chunks are prefilled alone after nothing (kNone).
// r = 1 equals FULL for INFOFLOW and INFOFLOW_BLEND (and the other
// recomputing methods), r = 0 equals NONE, and NONE is not FULL.
class GlmInfoFlowTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GlmInfoFlowTest, RatioOneEqualsFullWithGlmPrefixAndNoBos) {
  const std::string dir = testing::GeneratedModelDir(GetParam());
  std::unique_ptr<Model> model = testing::LoadOrDie(dir);
  ASSERT_NE(model, nullptr);
  ASSERT_FALSE(model->config().bos_token_id.has_value());
  const int vocab = static_cast<int>(model->config().vocab_size);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  auto id = [&](const char* special) {
    std::optional<int32_t> i = (*tok)->TokenToId(special);
    EXPECT_TRUE(i.has_value()) << special;
    return i.value_or(0);
  };
  QueryInput in;
  in.prefix_ids = {id("[gMASK]"), id("<sop>"), id("<|system|>")};
  for (int32_t t : Ids(9, 501, vocab)) in.prefix_ids.push_back(t);
  in.prefix_ids.push_back(id("<|user|>"));
  in.chunk_prefix_mode = PrefixMode::kNone;
  for (int i = 0; i < 4; ++i) {
    auto kv = PrefillChunk(*model, Ids(12 + 5 * i, 510 + i, vocab), PrefixMode::kNone);
    ASSERT_TRUE(kv.ok()) << kv.status();
    in.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
  }
  in.question_ids = Ids(6, 599, vocab);
  in.prompt_ids = in.question_ids;
  auto prompt_logits = [&](const MethodOptions& o) {
    absl::StatusOr<BlendedContext> ctx = BuildContext(*model, in, o);
    EXPECT_TRUE(ctx.ok()) << ctx.status();
    if (!ctx.ok()) return at::zeros({1});
    ForwardOptions all;
    all.logits = ForwardOptions::Logits::kAll;
    return PrefillTokens(*model, in.prompt_ids, ctx->next_position, &ctx->cache, all).logits;
  };
  MethodOptions full;
  full.method = Method::kFull;
  const at::Tensor ref = prompt_logits(full);
  MethodOptions none;
  none.method = Method::kNone;
  const at::Tensor base = prompt_logits(none);
  EXPECT_GT(MaxAbsDiff(base, ref), 1e-3);  // NONE is not exact, so the checks can fail
  for (Method m : {Method::kInfoFlow, Method::kInfoFlowBlend, Method::kCacheBlendPartial,
                   Method::kRandom}) {
    MethodOptions o;
    o.method = m;
    o.ratio = 1.0;
    EXPECT_LE(MaxAbsDiff(prompt_logits(o), ref), 1e-4) << MethodName(m);
    o.ratio = 0.0;
    EXPECT_LE(MaxAbsDiff(prompt_logits(o), base), 1e-5) << MethodName(m);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, GlmInfoFlowTest, ::testing::Values("glm", "glm4"));

TEST(Selection, TopKIsSortedStableAndRespectsEligibility) {
  at::Tensor s = at::tensor({0.5, 0.9, 0.9, 0.1, 0.7}, at::kDouble);
  EXPECT_EQ(SelectTopK(s, 2), (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(SelectTopK(s, 3, {false, false, true, true, true}), (std::vector<int64_t>{2, 3, 4}));
  EXPECT_EQ(SelectTopK(s, 10).size(), 5u);
  EXPECT_EQ(BudgetFor(0.15, 100), 15);
  EXPECT_EQ(BudgetFor(1.0, 7), 7);
  EXPECT_EQ(BudgetFor(0.0, 7), 0);
}

TEST(Selection, ReorderMovesHighestRatioLastAndKeepsTies) {
  // Chunks 0..3 of lengths 10, 10, 20, 10 in order 0,1,2,3.
  // Selected: chunk1 gets 5/10, chunk2 gets 2/20, chunk3 gets 0, chunk0 0.
  std::vector<int64_t> sel = {10, 11, 12, 13, 14, 20, 21};
  EXPECT_EQ(ReorderChunks(sel, {10, 10, 20, 10}, {0, 1, 2, 3}), (std::vector<int>{0, 3, 2, 1}));
  // Ties keep the current relative order.
  EXPECT_EQ(ReorderChunks({}, {5, 5, 5}, {2, 0, 1}), (std::vector<int>{2, 0, 1}));
}

TEST(Selection, EpicAndRandom) {
  EXPECT_EQ(EpicSelect({3, 6, 2}, 2), (std::vector<int64_t>{0, 1, 3, 4, 9, 10}));
  EXPECT_EQ(EpicSelect({3, 6}, 2, ExcludeFirstChunk(9, 3)), (std::vector<int64_t>{3, 4}));
  auto a = RandomSelect(100, 15, 42), b = RandomSelect(100, 15, 42), c = RandomSelect(100, 15, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a.size(), 15u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  for (int64_t i : RandomSelect(100, 50, 1, ExcludeFirstChunk(100, 60))) EXPECT_GE(i, 60);
}

}  // namespace
}  // namespace infoflow
