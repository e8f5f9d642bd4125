// Exactness of the transformer itself: caching, chunk prefill, RoPE.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "engine/blend/reposition.h"
#include "engine/chunk/chunk_prefill.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::Ids;
using testing::MaxAbsDiff;


ForwardOptions AllLogits() {
  ForwardOptions o;
  o.logits = ForwardOptions::Logits::kAll;
  return o;
}

class ModelExactness : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const std::string kind = GetParam();
    dir_ = kind == "stories260K" ? testing::Stories260KDir() : testing::GeneratedModelDir(kind);
    model_ = testing::LoadOrDie(dir_);
    ASSERT_NE(model_, nullptr);
  }
  std::string dir_;
  std::unique_ptr<Model> model_;
};

// Decoding one token at a time with the cache equals recomputing the whole
// sequence at every step.
TEST_P(ModelExactness, IncrementalDecodeEqualsFullRecompute) {
  const auto ids = Ids(40, 1, static_cast<int>(model_->config().vocab_size));
  KvCache full(model_->n_layers());
  at::Tensor ref = PrefillTokens(*model_, ids, 0, &full, AllLogits()).logits;

  KvCache inc(model_->n_layers());
  std::vector<int32_t> first(ids.begin(), ids.begin() + 10);
  at::Tensor l0 = PrefillTokens(*model_, first, 0, &inc, AllLogits()).logits;
  EXPECT_LE(MaxAbsDiff(l0, ref.narrow(0, 0, 10)), 1e-4);
  for (size_t i = 10; i < ids.size(); ++i) {
    at::Tensor step = PrefillTokens(*model_, {ids[i]}, static_cast<int64_t>(i), &inc).logits;
    ASSERT_LE(MaxAbsDiff(step[0], ref[i]), 1e-4) << "step " << i;
  }
  EXPECT_EQ(inc.size(), static_cast<int64_t>(ids.size()));
}

// A single chunk prefilled alone at local positions, placed at offset 0,
// then a question on top equals full prefill of chunk + question.
TEST_P(ModelExactness, SingleChunkRepositionedEqualsFullPrefill) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const auto chunk = Ids(33, 2, vocab), question = Ids(7, 3, vocab);
  std::vector<int32_t> all = chunk;
  all.insert(all.end(), question.begin(), question.end());
  KvCache full(model_->n_layers());
  at::Tensor ref = PrefillTokens(*model_, all, 0, &full, AllLogits()).logits;

  absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, chunk, PrefixMode::kNone);
  ASSERT_TRUE(kv.ok()) << kv.status();
  KvCache cache(model_->n_layers());
  AppendChunkAt(*model_, *kv, 0, &cache);
  at::Tensor got = PrefillTokens(*model_, question, 33, &cache, AllLogits()).logits;
  EXPECT_LE(MaxAbsDiff(got, ref.narrow(0, 33, 7)), 1e-4);
  for (int l = 0; l < model_->n_layers(); ++l) {
    EXPECT_LE(MaxAbsDiff(cache.keys(l), full.keys(l)), 1e-4) << "layer " << l;
    EXPECT_LE(MaxAbsDiff(cache.values(l), full.values(l)), 1e-4) << "layer " << l;
  }
}

// Reposition(prefill at 0..n-1, offset d) gives the layer-0 keys a prefill at
// d..d+n-1 computes; layer-0 K/V depend only on token and position.
TEST_P(ModelExactness, RepositionMatchesPrefillAtOffset) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const auto chunk = Ids(20, 4, vocab);
  absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, chunk, PrefixMode::kNone);
  ASSERT_TRUE(kv.ok()) << kv.status();
  for (int64_t d : {1, 17, 300}) {
    KvCache at_d(model_->n_layers());
    ForwardOptions o;
    o.logits = ForwardOptions::Logits::kNone;
    PrefillTokens(*model_, chunk, d, &at_d, o);
    at::Tensor moved = RepositionKeys(*model_, kv->k[0], PositionRange(*model_, d, 20));
    EXPECT_LE(MaxAbsDiff(moved, at_d.keys(0)), 1e-5) << "offset " << d;
    EXPECT_LE(MaxAbsDiff(kv->v[0], at_d.values(0)), 1e-6) << "offset " << d;
  }
}

TEST_P(ModelExactness, RotateThenUnrotateIsIdentity) {
  at::Tensor k = at::randn({static_cast<int64_t>(model_->config().num_key_value_heads), 50,
                            model_->config().head_dim});
  at::Tensor pos = PositionRange(*model_, 0, 50) * 37 + 5;
  at::Tensor back = model_->Rotate(model_->Rotate(k, pos), -pos);
  EXPECT_LE(MaxAbsDiff(back, k), 1e-5);
}

// Reposition writes rotated keys straight into the cache (RotateInto): bit
// for bit what Rotate returns, also into a strided slot range.
TEST_P(ModelExactness, RotateIntoIsBitIdenticalToRotate) {
  const int64_t n_kv = model_->config().num_key_value_heads, hd = model_->config().head_dim;
  at::Tensor k = at::randn({n_kv, 50, hd}).to(model_->dtype());
  const auto rope = model_->RopeTables(PositionRange(*model_, 1000, 50));
  at::Tensor want = model_->Rotate(k, rope);
  at::Tensor cache = at::full({n_kv, 80, hd}, 7.0, k.options());
  at::Tensor scratch;
  model_->RotateInto(k, rope, cache.narrow(1, 20, 50), &scratch);
  EXPECT_TRUE(at::equal(cache.narrow(1, 20, 50), want));
  EXPECT_TRUE(at::equal(cache.narrow(1, 0, 20), at::full({n_kv, 20, hd}, 7.0, k.options())));
  EXPECT_TRUE(at::equal(cache.narrow(1, 70, 10), at::full({n_kv, 10, hd}, 7.0, k.options())));
  // The scratch is reused for a second call of the same shape.
  at::Tensor again = at::empty_like(want);
  model_->RotateInto(k, rope, again, &scratch);
  EXPECT_TRUE(at::equal(again, want));
}

// Chunk prefill after BOS drops the BOS KV and keeps positions 1..n.
TEST_P(ModelExactness, BosPrefixChunkEqualsFullPrefillAfterBos) {
  if (!model_->config().bos_token_id.has_value()) GTEST_SKIP() << "config has no bos_token_id";
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const auto chunk = Ids(25, 5, vocab);
  std::vector<int32_t> all = {static_cast<int32_t>(model_->config().bos_token_id.value_or(1))};
  all.insert(all.end(), chunk.begin(), chunk.end());
  KvCache full(model_->n_layers());
  PrefillTokens(*model_, all, 0, &full, AllLogits());
  absl::StatusOr<ChunkKv> kv = PrefillChunk(*model_, chunk, PrefixMode::kBos);
  ASSERT_TRUE(kv.ok()) << kv.status();
  KvCache cache(model_->n_layers());
  AppendChunkAt(*model_, *kv, 1, &cache);
  for (int l = 0; l < model_->n_layers(); ++l) {
    EXPECT_LE(MaxAbsDiff(cache.keys(l), full.keys(l).narrow(1, 1, 25)), 1e-4) << "layer " << l;
    EXPECT_LE(MaxAbsDiff(cache.values(l), full.values(l).narrow(1, 1, 25)), 1e-4);
  }
}

TEST_P(ModelExactness, PrefillChunkRejectsBadInput) {
  EXPECT_EQ(PrefillChunk(*model_, {}, PrefixMode::kNone).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(PrefillChunk(*model_, {1, static_cast<int32_t>(model_->config().vocab_size)},
                         PrefixMode::kNone)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Models, ModelExactness,
                         ::testing::Values("stories260K", "llama", "qwen2", "qwen3",
                                           "llama3-scaled", "bf16", "glm", "glm4", "glm4-bos"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = isalnum(c) ? c : '_';
                           return n;
                         });

// GLM's RoPE on a unit vector: pair (2i, 2i+1) of the first rotary_dim =
// int(head_dim * partial_rotary_factor) dims turns by position * f_i with
// f_i = theta^(-2i / rotary_dim); the dims after rotary_dim pass unchanged.
TEST(GlmRope, PartialInterleavedRotation) {
  auto model = testing::LoadOrDie(testing::GeneratedModelDir("glm4"));
  ASSERT_NE(model, nullptr);
  const ModelConfig& c = model->config();
  const int64_t hd = c.head_dim, rd = RotaryDim(c);
  ASSERT_EQ(rd, hd / 2);
  const int64_t pos = 7;
  for (int64_t i = 0; i < rd / 2; ++i) {
    const double angle = pos * std::pow(c.rope_theta, -2.0 * i / rd);
    at::Tensor k = at::zeros({1, 1, hd});
    k[0][0][2 * i] = 1.0;  // the pair's first dim
    at::Tensor r = model->Rotate(k, at::full({1}, pos, at::kLong))[0][0];
    at::Tensor want = at::zeros({hd});
    want[2 * i] = std::cos(angle);
    want[2 * i + 1] = std::sin(angle);
    EXPECT_LE(MaxAbsDiff(r, want), 1e-6) << "pair " << i;
    k = at::zeros({1, 1, hd});
    k[0][0][2 * i + 1] = 1.0;  // its second dim
    r = model->Rotate(k, at::full({1}, pos, at::kLong))[0][0];
    want = at::zeros({hd});
    want[2 * i] = -std::sin(angle);
    want[2 * i + 1] = std::cos(angle);
    EXPECT_LE(MaxAbsDiff(r, want), 1e-6) << "pair " << i;
  }
  at::Tensor k = at::randn({2, 3, hd});
  at::Tensor r = model->Rotate(k, at::tensor({5, 100, 4000}, at::kLong));
  EXPECT_TRUE(at::equal(r.narrow(-1, rd, hd - rd), k.narrow(-1, rd, hd - rd)));
}

// The same weights written as one file and as 3 shards load to the same model.
TEST(GlmCheckpoint, ShardedEqualsSingleFile) {
  auto single = testing::LoadOrDie(testing::GeneratedModelDir("glm4"));
  auto sharded = testing::LoadOrDie(testing::GeneratedModelDir("glm4-sharded"));
  ASSERT_NE(single, nullptr);
  ASSERT_NE(sharded, nullptr);
  const auto ids = Ids(20, 9, static_cast<int>(single->config().vocab_size));
  KvCache a(single->n_layers()), b(sharded->n_layers());
  EXPECT_TRUE(at::equal(PrefillTokens(*single, ids, 0, &a, AllLogits()).logits,
                        PrefillTokens(*sharded, ids, 0, &b, AllLogits()).logits));
}

}  // namespace
}  // namespace infoflow
