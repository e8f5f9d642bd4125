// The blocked (flash-style) CPU attention kernel against a plain f64
// softmax(QK^T)V and against the existing Model::Attention path, on random
// inputs: GQA groups, head dims, sorted / shuffled / duplicate positions,
// keys hidden by position, lengths that are no multiple of any tile.
#include "engine/model/blocked_attention.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "engine/model/forward.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/model/yield_point.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::Ids;
using testing::MaxAbsDiff;

// softmax(q k^T / sqrt(hd), masked by position) v in f64, one head at a time.
at::Tensor NaiveAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& q_pos, const at::Tensor& k_pos) {
  const int64_t n_heads = q.size(0), group = n_heads / k.size(0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  at::Tensor hidden = k_pos.unsqueeze(0) > q_pos.unsqueeze(1);  // [nq, N]
  std::vector<at::Tensor> heads;
  for (int64_t h = 0; h < n_heads; ++h) {
    at::Tensor s = at::matmul(q[h].to(at::kDouble), k[h / group].to(at::kDouble).t()) * scale;
    s.masked_fill_(hidden, -std::numeric_limits<double>::infinity());
    heads.push_back(at::matmul(at::softmax(s, 1), v[h / group].to(at::kDouble)));
  }
  return at::stack(heads, 0).to(at::kFloat);
}

// Model::Attention as it was before the blocked kernel: asking for column
// statistics keeps it on its own (materialising) path.
at::Tensor ExistingAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& q_pos, const at::Tensor& k_pos) {
  AttentionColumnStats stats;
  return Model::Attention(
      q, k, v, q_pos, k_pos, &stats,
      std::is_sorted(k_pos.data_ptr<int64_t>(), k_pos.data_ptr<int64_t>() + k_pos.size(0)));
}

enum class Positions { kPrefill, kSorted, kShuffled, kDuplicates, kSomeHidden };

struct Case {
  int64_t n_kv, group, hd, n_q, n_keys;
  Positions positions;
};

std::string Name(const Case& c) {
  return "kv" + std::to_string(c.n_kv) + " g" + std::to_string(c.group) + " hd" +
         std::to_string(c.hd) + " q" + std::to_string(c.n_q) + " N" + std::to_string(c.n_keys) +
         " pos" + std::to_string(static_cast<int>(c.positions));
}

// Key and query positions for a case (keys in slot order).
void MakePositions(const Case& c, std::mt19937* rng, at::Tensor* q_pos, at::Tensor* k_pos) {
  std::vector<int64_t> kp(c.n_keys), qp(c.n_q);
  std::iota(kp.begin(), kp.end(), 0);
  switch (c.positions) {
    case Positions::kPrefill:  // queries are the last n_q keys
      for (int64_t i = 0; i < c.n_q; ++i) qp[i] = c.n_keys - c.n_q + i;
      break;
    case Positions::kSorted:  // recompute of scattered rows of a sorted cache
      for (int64_t& p : qp) p = (*rng)() % c.n_keys;
      break;
    case Positions::kShuffled:  // repositioned cache: slots in any order
      std::shuffle(kp.begin(), kp.end(), *rng);
      for (int64_t& p : qp) p = (*rng)() % c.n_keys;
      break;
    case Positions::kDuplicates:  // several keys and queries share positions
      for (int64_t& p : kp) p = (*rng)() % (c.n_keys / 3 + 1);
      for (int64_t& p : qp) p = (*rng)() % (c.n_keys / 3 + 1);
      kp[0] = 0;  // every query sees some key
      break;
    case Positions::kSomeHidden:  // a third of the keys lie after every query
      for (int64_t& p : qp) p = (*rng)() % (2 * c.n_keys / 3);
      std::shuffle(kp.begin(), kp.end(), *rng);
      break;
  }
  *q_pos = at::tensor(qp);
  *k_pos = at::tensor(kp);
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (Positions p : {Positions::kPrefill, Positions::kSorted, Positions::kShuffled,
                      Positions::kDuplicates, Positions::kSomeHidden}) {
    cases.push_back({4, 2, 64, 37, 300, p});   // bench model's GQA, short
    cases.push_back({2, 4, 64, 131, 531, p});  // group 4, not tile multiples
    cases.push_back({3, 1, 128, 61, 290, p});  // MHA, hd 128
    cases.push_back({2, 2, 80, 29, 97, p});    // hd 80: a partial vector chunk
    cases.push_back({1, 2, 16, 50, 260, p});   // hd 16
  }
  cases.push_back({4, 2, 64, 700, 700, Positions::kPrefill});  // several key blocks
  cases.push_back({2, 2, 32, 333, 1111, Positions::kShuffled});
  return cases;
}

TEST(BlockedAttention, EqualsNaiveAndExistingAttentionOnEveryPath) {
  std::mt19937 rng(7);
  at::manual_seed(7);
  const std::vector<BlockedAttentionIsa> isas = {
      BlockedAttentionIsa::kAvx512, BlockedAttentionIsa::kAvx2, BlockedAttentionIsa::kBaseline};
  for (const Case& c : Cases()) {
    SCOPED_TRACE(Name(c));
    const int64_t n_heads = c.n_kv * c.group;
    at::Tensor q = at::randn({n_heads, c.n_q, c.hd});
    at::Tensor k = at::randn({c.n_kv, c.n_keys, c.hd});
    at::Tensor v = at::randn({c.n_kv, c.n_keys, c.hd});
    at::Tensor q_pos, k_pos;
    MakePositions(c, &rng, &q_pos, &k_pos);
    ASSERT_TRUE(BlockedAttentionCpuSupports(q, k, v, q_pos, k_pos));
    const at::Tensor naive = NaiveAttention(q, k, v, q_pos, k_pos);
    const at::Tensor existing = ExistingAttention(q, k, v, q_pos, k_pos);
    EXPECT_LT(MaxAbsDiff(existing, naive), 1e-5);
    for (BlockedAttentionIsa isa : isas) {
      SCOPED_TRACE(static_cast<int>(isa));
      const at::Tensor blocked = BlockedAttentionCpu(q, k, v, q_pos, k_pos, 2, isa);
      ASSERT_EQ(blocked.sizes(), naive.sizes());
      EXPECT_LT(MaxAbsDiff(blocked, naive), 1e-5);
      EXPECT_LT(MaxAbsDiff(blocked, existing), 1e-5);
    }
  }
}

// A query that sees no key is NaN, as in Model::Attention; the others are not
// disturbed by it.
TEST(BlockedAttention, QueryThatSeesNoKeyIsNan) {
  at::manual_seed(3);
  at::Tensor q = at::randn({2, 3, 64}), k = at::randn({1, 40, 64}), v = at::randn({1, 40, 64});
  at::Tensor k_pos = at::arange(10, 50, at::kLong), q_pos = at::tensor({5L, 20L, 49L});
  const at::Tensor blocked = BlockedAttentionCpu(q, k, v, q_pos, k_pos, 1);
  const at::Tensor existing = ExistingAttention(q, k, v, q_pos, k_pos);
  EXPECT_TRUE(at::isnan(blocked.narrow(1, 0, 1)).all().item<bool>());
  EXPECT_TRUE(at::isnan(existing.narrow(1, 0, 1)).all().item<bool>());
  EXPECT_LT(MaxAbsDiff(blocked.narrow(1, 1, 2), existing.narrow(1, 1, 2)), 1e-5);
}

// Inputs laid out as the model hands them over: q in [q, H, hd] memory
// (a transposed view), K/V as strided KvCache views.
TEST(BlockedAttention, StridedInputsAsFromTheModel) {
  at::manual_seed(5);
  const int64_t n = 333, n_kv = 4, group = 2, hd = 64;
  at::Tensor q = at::randn({n, n_kv * group, hd}).transpose(0, 1);
  KvCache cache(1);
  cache.Reserve(n + 17, n_kv, hd, at::TensorOptions().dtype(at::kFloat));
  cache.AppendPositions(at::arange(n, at::kLong));
  cache.WriteRange(0, 0, at::randn({n_kv, n, hd}), at::randn({n_kv, n, hd}));
  const at::Tensor pos = at::arange(n, at::kLong);
  ASSERT_TRUE(
      BlockedAttentionCpuSupports(q, cache.keys(0), cache.values(0), pos, cache.positions()));
  const at::Tensor blocked =
      BlockedAttentionCpu(q, cache.keys(0), cache.values(0), pos, cache.positions(), 2);
  EXPECT_LT(
      MaxAbsDiff(blocked, NaiveAttention(q, cache.keys(0).contiguous(),
                                         cache.values(0).contiguous(), pos, cache.positions())),
      1e-5);
}

// The thread count and yield rounds change which thread runs a tile and
// when, never its arithmetic: bit-identical results.
TEST(BlockedAttention, ThreadsAndYieldRoundsAreBitIdentical) {
  at::manual_seed(11);
  std::mt19937 rng(11);
  Case c{4, 2, 64, 500, 900, Positions::kShuffled};
  at::Tensor q = at::randn({8, c.n_q, c.hd}), k = at::randn({4, c.n_keys, c.hd}),
             v = at::randn({4, c.n_keys, c.hd});
  at::Tensor q_pos, k_pos;
  MakePositions(c, &rng, &q_pos, &k_pos);
  const at::Tensor one = BlockedAttentionCpu(q, k, v, q_pos, k_pos, 1);
  EXPECT_TRUE(at::equal(one, BlockedAttentionCpu(q, k, v, q_pos, k_pos, 2)));
  EXPECT_TRUE(at::equal(one, BlockedAttentionCpu(q, k, v, q_pos, k_pos, 3)));
  int yields = 0;
  YieldPolicy policy;
  policy.hook = [&yields] { ++yields; };
  policy.max_rows = 32;
  at::Tensor with_yields;
  {
    ScopedYieldPolicy scope(policy);
    with_yields = BlockedAttentionCpu(q, k, v, q_pos, k_pos, 2);
  }
  EXPECT_GT(yields, 3);
  EXPECT_TRUE(at::equal(one, with_yields));
}

TEST(BlockedAttention, SupportsOnlyCpuF32WithWholeVectorHeads) {
  at::Tensor q = at::randn({4, 5, 64}), k = at::randn({2, 9, 64}), v = at::randn({2, 9, 64});
  at::Tensor qp = at::arange(5, at::kLong), kp = at::arange(9, at::kLong);
  EXPECT_TRUE(BlockedAttentionCpuSupports(q, k, v, qp, kp));
  EXPECT_FALSE(BlockedAttentionCpuSupports(q.to(at::kBFloat16), k, v, qp, kp));
  EXPECT_FALSE(BlockedAttentionCpuSupports(q, k.to(at::kDouble), v, qp, kp));
  EXPECT_FALSE(BlockedAttentionCpuSupports(at::randn({4, 5, 24}), at::randn({2, 9, 24}),
                                           at::randn({2, 9, 24}), qp, kp));        // hd % 16
  EXPECT_FALSE(BlockedAttentionCpuSupports(at::randn({3, 5, 64}), k, v, qp, kp));  // H % Hkv
  EXPECT_FALSE(BlockedAttentionCpuSupports(q, k, v, qp.to(at::kInt), kp));
  EXPECT_FALSE(BlockedAttentionCpuSupports(q, k, v, qp, at::arange(8, at::kLong)));
}

// Model::Attention routes long f32 CPU calls to the blocked kernel; it must
// agree with the kernel called directly, bit for bit.
TEST(BlockedAttention, ModelAttentionUsesItForLongCalls) {
  at::manual_seed(13);
  const int64_t n = 600;
  at::Tensor q = at::randn({8, n, 64}), k = at::randn({4, n, 64}), v = at::randn({4, n, 64});
  at::Tensor pos = at::arange(n, at::kLong);
  const at::Tensor direct = BlockedAttentionCpu(q, k, v, pos, pos, 1);
  const at::Tensor model = Model::Attention(q, k, v, pos, pos, nullptr, true);
  EXPECT_TRUE(at::equal(direct, model));
}

// Whole models: a prefill's logits at every row, and a recompute of
// scattered rows of a cache whose slots are in shuffled position order, are
// the same with the blocked kernel as with the materialising path (within
// the 1e-4 every approximation is pinned to).
class BlockedAttentionModel : public ::testing::TestWithParam<const char*> {};

TEST_P(BlockedAttentionModel, PrefillAndRecomputeEqualMaterialisedPath) {
  std::unique_ptr<Model> model;
  ASSERT_NO_FATAL_FAILURE(model = testing::LoadOrDie(testing::GeneratedModelDir(GetParam())));
  const int64_t n = 300;
  const std::vector<int32_t> ids = Ids(n, 3, static_cast<int>(model->config().vocab_size));
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937(5));
  std::vector<int64_t> rows(order.begin(), order.begin() + 90);  // scattered, unsorted
  std::vector<int64_t> row_pos;                                  // their positions
  for (int64_t r : rows) row_pos.push_back(order[r]);
  ForwardOptions all;
  all.logits = ForwardOptions::Logits::kAll;
  auto run = [&](int64_t min_pairs, at::Tensor* prefill_logits, at::Tensor* recompute_logits) {
    Model::SetBlockedAttentionMinPairs(min_pairs);
    KvCache cache(model->n_layers());
    *prefill_logits = PrefillTokens(*model, ids, 0, &cache, all).logits;
    // Slots in shuffled position order: slot i holds token order[i].
    KvCache shuffled(model->n_layers());
    std::vector<int32_t> shuffled_ids;
    for (int64_t i : order) shuffled_ids.push_back(ids[i]);
    model->Forward(TokenTensor(*model, shuffled_ids), at::tensor(order), at::Tensor(), &shuffled,
                   all);
    std::vector<int32_t> row_ids;
    for (int64_t r : rows) row_ids.push_back(shuffled_ids[r]);
    *recompute_logits = model
                            ->Forward(TokenTensor(*model, row_ids), at::tensor(row_pos),
                                      at::tensor(rows), &shuffled, all)
                            .logits;
  };
  at::Tensor blocked_prefill, blocked_recompute, old_prefill, old_recompute;
  run(0, &blocked_prefill, &blocked_recompute);
  run(std::numeric_limits<int64_t>::max(), &old_prefill, &old_recompute);
  Model::SetBlockedAttentionMinPairs(int64_t{64} * 64);  // the default again
  EXPECT_LT(MaxAbsDiff(blocked_prefill, old_prefill), 1e-4);
  EXPECT_LT(MaxAbsDiff(blocked_recompute, old_recompute), 1e-4);
  // Each recomputed row equals its row of the in-order prefill.
  EXPECT_LT(MaxAbsDiff(blocked_recompute, blocked_prefill.index_select(0, at::tensor(row_pos))),
            1e-4);
}

INSTANTIATE_TEST_SUITE_P(Models, BlockedAttentionModel,
                         ::testing::Values("llama", "qwen3", "glm4"));

}  // namespace
}  // namespace infoflow
