// Continuous-batching primitives: Model::DecodeStep against solo Forward,
// the yield points, and DecodeState driving the same generation as Decode.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <random>
#include <vector>

#include "engine/decode/decode.h"
#include "engine/model/decode_attention.h"
#include "engine/model/forward.h"
#include "engine/model/yield_point.h"
#include "engine/text/tokenizer.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::Ids;
using testing::MaxAbsDiff;

// One-layer caches with random K/V [n_kv, N_b, hd] at the given positions
// (slot order), reserved beyond their size so heads are not adjacent rows.
std::vector<KvCache> RandomCaches(const std::vector<std::vector<int64_t>>& positions,
                                  int64_t n_kv, int64_t hd, at::ScalarType dtype) {
  std::vector<KvCache> caches;
  for (const auto& pos : positions) {
    const int64_t n = static_cast<int64_t>(pos.size());
    caches.emplace_back(1);
    caches.back().Reserve(n + 5, n_kv, hd, at::TensorOptions().dtype(dtype));
    caches.back().AppendPositions(at::tensor(pos));
    caches.back().WriteRange(0, 0, at::randn({n_kv, n, hd}).to(dtype),
                             at::randn({n_kv, n, hd}).to(dtype));
  }
  return caches;
}

// Model::DecodeAttention (the plain C++ loop on CPU f32) equals
// Model::Attention row by row within 1e-5: GQA groups 1/2/4, head dims 64
// and 24, scores near and far apart, caches of 1..300 keys with positions
// sorted, shuffled, with duplicates, and with keys hidden from the query
// (positions past it).
TEST(DecodeAttention, EqualsAttentionPerRow) {
  at::manual_seed(11);
  std::mt19937 rng(5);
  const int64_t n_kv = 2;
  for (int64_t group : {1, 2, 4}) {
    for (int64_t hd : {64, 24}) {
      std::vector<std::vector<int64_t>> pos;
      std::vector<int64_t> q_pos;
      for (int64_t n : {1, 3, 7, 64, 300}) {
        std::vector<int64_t> p(n);
        std::iota(p.begin(), p.end(), int64_t{10});
        pos.push_back(p), q_pos.push_back(10 + n - 1);  // sorted, all visible
        std::shuffle(p.begin(), p.end(), rng);
        pos.push_back(p), q_pos.push_back(10 + n - 1);  // shuffled, all visible
        pos.push_back(p), q_pos.push_back(10 + n / 2);  // shuffled, later keys hidden
        std::sort(p.begin(), p.end());
        pos.push_back(p), q_pos.push_back(10 + n / 3);  // sorted, later keys hidden
        for (int64_t& x : p) x = 10 + x % 5;
        pos.push_back(p), q_pos.push_back(12);          // duplicate positions
      }
      std::vector<KvCache> caches = RandomCaches(pos, n_kv, hd, at::kFloat);
      std::vector<KvCache*> ptrs;
      for (KvCache& c : caches) ptrs.push_back(&c);
      const int64_t batch = static_cast<int64_t>(ptrs.size());
      at::Tensor qp = at::tensor(q_pos);
      // q as ProjectQkv makes it: a transposed view, heads not contiguous.
      // Also 30x larger: scores ~100 apart, most weights underflow (the
      // loop's exp clamps below -87), and the scores' own rounding
      // (summation order, ~1e-7 relative) moves the result by ~1e-5: 1e-4.
      for (double q_scale : {1.0, 30.0}) {
        const double tolerance = q_scale == 1.0 ? 1e-5 : 1e-4;
        at::Tensor q = (at::randn({batch, n_kv * group, hd}) * q_scale).transpose(0, 1);
        std::vector<at::Tensor> keys, values, k_pos;
        for (KvCache* c : ptrs) {
          keys.push_back(c->keys(0)), values.push_back(c->values(0));
          k_pos.push_back(c->positions());
        }
        ASSERT_TRUE(DecodeAttentionCpuSupports(q, qp, keys, values, k_pos));  // the fused path
        at::Tensor got = Model::DecodeAttention(q, qp, ptrs, 0);
        ASSERT_EQ(got.sizes(), q.sizes());
        for (int64_t b = 0; b < batch; ++b) {
          at::Tensor ref = Model::Attention(q.narrow(1, b, 1), keys[b], values[b],
                                            qp.narrow(0, b, 1), k_pos[b], nullptr,
                                            ptrs[b]->positions_sorted());
          EXPECT_LE(MaxAbsDiff(got.narrow(1, b, 1), ref), tolerance)
              << "group " << group << " hd " << hd << " q x" << q_scale << " row " << b
              << " keys " << pos[b].size();
        }
      }
    }
  }
}

// With threads the (request, kv head) pairs are split over them (enough keys
// here to pass the threshold for it): bit-identical to one thread, and
// still Attention's result within 1e-5.
TEST(DecodeAttention, ThreadsSplitWorkBitIdentically) {
  at::manual_seed(14);
  std::mt19937 rng(6);
  std::vector<std::vector<int64_t>> pos;
  std::vector<int64_t> q_pos;
  for (int64_t n : {2500, 40, 3000, 7, 1200, 2000}) {
    std::vector<int64_t> p(n);
    std::iota(p.begin(), p.end(), int64_t{0});
    if (n % 2 == 0) std::shuffle(p.begin(), p.end(), rng);
    pos.push_back(p), q_pos.push_back(n % 3 == 0 ? n / 2 : n - 1);
  }
  std::vector<KvCache> caches = RandomCaches(pos, 2, 64, at::kFloat);
  std::vector<at::Tensor> keys, values, k_pos;
  for (KvCache& c : caches) {
    keys.push_back(c.keys(0)), values.push_back(c.values(0)), k_pos.push_back(c.positions());
  }
  at::Tensor q = at::randn({6, 4, 64}).transpose(0, 1);
  at::Tensor qp = at::tensor(q_pos);
  at::Tensor one = DecodeAttentionCpu(q, qp, keys, values, k_pos, 1);
  for (int threads : {2, 3, 16}) {
    EXPECT_TRUE(at::equal(DecodeAttentionCpu(q, qp, keys, values, k_pos, threads), one))
        << threads;
  }
  for (int64_t b = 0; b < 6; ++b) {
    at::Tensor ref = Model::Attention(q.narrow(1, b, 1), keys[b], values[b], qp.narrow(0, b, 1),
                                      k_pos[b], nullptr, caches[b].positions_sorted());
    EXPECT_LE(MaxAbsDiff(one.narrow(1, b, 1), ref), 1e-5) << b;
  }
}

// Inputs the loop does not take (bf16 here) go through Attention per row:
// the same result exactly.
TEST(DecodeAttention, OtherDtypesFallBackToAttention) {
  at::manual_seed(12);
  std::vector<KvCache> caches = RandomCaches({{0, 1, 2, 3, 4}, {3, 0, 2}}, 2, 64, at::kBFloat16);
  std::vector<KvCache*> ptrs = {&caches[0], &caches[1]};
  at::Tensor q = at::randn({4, 2, 64}).to(at::kBFloat16);
  at::Tensor qp = at::tensor(std::vector<int64_t>{4, 2});
  EXPECT_FALSE(DecodeAttentionCpuSupports(q, qp, {caches[0].keys(0), caches[1].keys(0)},
                                          {caches[0].values(0), caches[1].values(0)},
                                          {caches[0].positions(), caches[1].positions()}));
  at::Tensor got = Model::DecodeAttention(q, qp, ptrs, 0);
  for (int64_t b = 0; b < 2; ++b) {
    at::Tensor ref = Model::Attention(q.narrow(1, b, 1), ptrs[b]->keys(0), ptrs[b]->values(0),
                                      qp.narrow(0, b, 1), ptrs[b]->positions(), nullptr);
    EXPECT_TRUE(at::equal(got.narrow(1, b, 1), ref)) << b;
  }
}

// KvCache::WriteRows writes what WriteAt writes, bit for bit, from strided
// K/V (views of a fused projection) and converting dtypes on the slow path.
TEST(DecodeAttention, WriteRowsEqualsWriteAt) {
  at::manual_seed(13);
  for (at::ScalarType src : {at::kFloat, at::kDouble}) {
    std::vector<KvCache> a = RandomCaches({{0, 1, 2}, {5, 4}, {7}}, 2, 16, at::kFloat);
    std::vector<KvCache> b;
    for (const KvCache& c : a) b.push_back(c.Clone());
    std::vector<KvCache*> ptrs;
    std::vector<int64_t> slots;
    for (KvCache& c : a) {
      slots.push_back(c.AppendPositions(at::tensor(std::vector<int64_t>{9})));
      ptrs.push_back(&c);
    }
    for (KvCache& c : b) c.AppendPositions(at::tensor(std::vector<int64_t>{9}));
    at::Tensor fused = at::randn({3, 2 * 2 * 16}).to(src);  // [B, (k, v) x n_kv x hd]
    at::Tensor k = fused.narrow(1, 0, 32).view({3, 2, 16}).transpose(0, 1);
    at::Tensor v = fused.narrow(1, 32, 32).view({3, 2, 16}).transpose(0, 1);
    KvCache::WriteRows(0, ptrs, slots, k, v);
    for (int64_t i = 0; i < 3; ++i) {
      b[i].WriteAt(0, at::tensor(std::vector<int64_t>{slots[i]}), k.narrow(1, i, 1),
                   v.narrow(1, i, 1));
      EXPECT_TRUE(at::equal(a[i].keys(0), b[i].keys(0))) << i;
      EXPECT_TRUE(at::equal(a[i].values(0), b[i].values(0))) << i;
    }
  }
}

class BatchDecode : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    model_ = testing::LoadOrDie(testing::GeneratedModelDir(GetParam()));
    ASSERT_NE(model_, nullptr);
  }
  std::unique_ptr<Model> model_;
};

// Every row of a batched step equals that request's solo Forward within
// 1e-4 at every step, with requests of different lengths (so different
// positions and cache sizes) joining and leaving the batch between steps.
TEST_P(BatchDecode, EachRowEqualsItsSoloForwardAtEveryStep) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const std::vector<int> prompt_lengths = {5, 37, 120, 1, 64, 9};
  const int n = static_cast<int>(prompt_lengths.size());
  std::vector<KvCache> solo, batched;
  std::vector<int32_t> next(n);
  std::vector<int64_t> pos(n);
  for (int r = 0; r < n; ++r) {
    solo.emplace_back(model_->n_layers());
    const auto ids = Ids(prompt_lengths[r], r, vocab);
    at::Tensor logits = PrefillTokens(*model_, ids, 0, &solo.back()).logits;
    batched.push_back(solo.back().Clone());
    next[r] = static_cast<int32_t>(logits.argmax(-1).item<int64_t>());
    pos[r] = prompt_lengths[r];
  }
  double worst = 0;
  for (int step = 0; step < 12; ++step) {
    // Request r runs in steps [r % 3, 12 - r % 2): joins late, leaves early.
    std::vector<int> rows;
    for (int r = 0; r < n; ++r) {
      if (step >= r % 3 && step < 12 - r % 2) rows.push_back(r);
    }
    std::vector<int64_t> tok, p;
    std::vector<KvCache*> caches;
    for (int r : rows) {
      tok.push_back(next[r]);
      p.push_back(pos[r]);
      caches.push_back(&batched[r]);
    }
    at::Tensor logits = model_->DecodeStep(at::tensor(tok), at::tensor(p), caches);
    ASSERT_EQ(logits.size(0), static_cast<int64_t>(rows.size()));
    for (size_t i = 0; i < rows.size(); ++i) {
      const int r = rows[i];
      at::Tensor ref = PrefillTokens(*model_, {next[r]}, pos[r], &solo[r]).logits;
      const double d = MaxAbsDiff(logits[i], ref[0]);
      worst = std::max(worst, d);
      ASSERT_LE(d, 1e-4) << "request " << r << " step " << step;
      ASSERT_EQ(logits[i].argmax().item<int64_t>(), ref[0].argmax().item<int64_t>());
      next[r] = static_cast<int32_t>(ref[0].argmax().item<int64_t>());
      ++pos[r];
    }
  }
  for (int r = 0; r < n; ++r) {
    ASSERT_EQ(batched[r].size(), solo[r].size());
    EXPECT_LE(MaxAbsDiff(batched[r].keys(model_->n_layers() - 1),
                         solo[r].keys(model_->n_layers() - 1)),
              1e-4);
  }
  std::printf("max |batched - solo| logit difference: %.3g\n", worst);
}

// Caches whose slots are not in position order (prompts run in a shuffled
// order) decode batched as each request does alone, within 1e-4.
TEST_P(BatchDecode, UnsortedCachesEqualSoloForward) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  std::mt19937 rng(3);
  std::vector<KvCache> solo, batched;
  std::vector<KvCache*> ptrs;
  std::vector<int64_t> tok, pos;
  for (int r = 0; r < 4; ++r) {
    const int n = 20 + 30 * r;
    std::vector<int64_t> p(n);
    std::iota(p.begin(), p.end(), int64_t{0});
    std::shuffle(p.begin(), p.end(), rng);
    const auto ids = Ids(n, 40 + r, vocab);
    std::vector<int64_t> ids_by_slot;
    for (int64_t x : p) ids_by_slot.push_back(ids[x]);
    solo.emplace_back(model_->n_layers());
    model_->Forward(at::tensor(ids_by_slot), at::tensor(p), at::Tensor(), &solo.back());
    ASSERT_FALSE(solo.back().positions_sorted());
    batched.push_back(solo.back().Clone());
    tok.push_back(ids[r]);
    pos.push_back(n);
  }
  for (KvCache& c : batched) ptrs.push_back(&c);
  at::Tensor logits = model_->DecodeStep(at::tensor(tok), at::tensor(pos), ptrs);
  for (int r = 0; r < 4; ++r) {
    const int32_t id = static_cast<int32_t>(tok[r]);
    at::Tensor ref = PrefillTokens(*model_, {id}, pos[r], &solo[r]).logits;
    EXPECT_LE(MaxAbsDiff(logits[r], ref[0]), 1e-4) << r;
  }
}

// A yield policy splits the work and calls the hook; the result changes only
// by BLAS summation order (a matmul over fewer rows may block its sums
// differently): within 1e-4 like every other exactness bound.
TEST_P(BatchDecode, YieldPointsSplitWorkWithoutChangingIt) {
  const auto ids = Ids(300, 7, static_cast<int>(model_->config().vocab_size));
  ForwardOptions all;
  all.logits = ForwardOptions::Logits::kAll;
  KvCache plain(model_->n_layers());
  at::Tensor ref = PrefillTokens(*model_, ids, 0, &plain, all).logits;
  int calls = 0;
  KvCache yielded(model_->n_layers());
  at::Tensor got;
  {
    ScopedYieldPolicy policy({[&] { ++calls; }, /*max_rows=*/64});
    EXPECT_EQ(YieldMaxRows(), 64);
    got = PrefillTokens(*model_, ids, 0, &yielded, all).logits;
  }
  EXPECT_EQ(YieldMaxRows(), 0);
  // Per layer: 4 QKV blocks + 4 MLP blocks of <= 64 rows -> >= 6 yields, +2 per layer.
  EXPECT_GE(calls, 8 * model_->n_layers());
  const double d = MaxAbsDiff(got, ref);
  std::printf("max |row blocks of 64 - one block| logit difference: %.3g\n", d);
  EXPECT_LE(d, 1e-4);
}

// A request's logits do not depend on which requests share its step: row
// r of a step over all six requests is bit-identical to the same step for
// r alone and to r in a batch of two (the decode matmuls read each row on
// its own, engine/model/small_batch_linear.h). Server replies therefore do
// not change with load.
TEST_P(BatchDecode, RowsAreBitIdenticalWhicheverRequestsShareTheStep) {
  const int vocab = static_cast<int>(model_->config().vocab_size);
  const std::vector<int> prompt_lengths = {5, 37, 120, 1, 64, 9};
  const int n = static_cast<int>(prompt_lengths.size());
  std::vector<KvCache> base;
  std::vector<int64_t> tok, pos;
  for (int r = 0; r < n; ++r) {
    base.emplace_back(model_->n_layers());
    at::Tensor logits =
        PrefillTokens(*model_, Ids(prompt_lengths[r], r, vocab), 0, &base.back()).logits;
    tok.push_back(logits.argmax(-1).item<int64_t>());
    pos.push_back(prompt_lengths[r]);
  }
  auto step = [&](const std::vector<int>& rows) {
    std::vector<KvCache> caches;
    std::vector<int64_t> t, p;
    for (int r : rows) {
      caches.push_back(base[r].Clone());
      t.push_back(tok[r]);
      p.push_back(pos[r]);
    }
    std::vector<KvCache*> ptrs;
    for (KvCache& c : caches) ptrs.push_back(&c);
    return model_->DecodeStep(at::tensor(t), at::tensor(p), ptrs);
  };
  at::Tensor all = step({0, 1, 2, 3, 4, 5});
  for (int r = 0; r < n; ++r) {
    EXPECT_TRUE(at::equal(all[r], step({r})[0])) << "request " << r << " alone";
    EXPECT_TRUE(at::equal(all[r], step({(r + 3) % n, r})[1]))
        << "request " << r << " second of two";
  }
}

// DecodeState driven by batched steps generates what Decode generates alone.
TEST_P(BatchDecode, DecodeStateBatchedEqualsDecodeAlone) {
  auto tok = Tokenizer::FromFile(testing::GeneratedModelDir(GetParam()) + "/tokenizer.json");
  ASSERT_TRUE(tok.ok());
  const int vocab = static_cast<int>(model_->config().vocab_size);
  struct Req {
    std::vector<int32_t> prompt;
    DecodeOptions options;
  };
  std::vector<Req> reqs(4);
  for (int r = 0; r < 4; ++r) {
    reqs[r].prompt = Ids(10 + 17 * r, 20 + r, vocab);
    reqs[r].options.max_new_tokens = 6 + 5 * r;
  }
  reqs[1].options.stop_strings = {"e"};  // likely early stop
  reqs[2].options.sampling = {0.8f, 0.9f, 42};
  std::vector<DecodeResult> alone;
  for (const Req& q : reqs) {
    KvCache cache(model_->n_layers());
    at::Tensor logits = PrefillTokens(*model_, q.prompt, 0, &cache).logits;
    alone.push_back(Decode(*model_, &cache, static_cast<int64_t>(q.prompt.size()), logits,
                           q.options, tok->get(), nullptr));
  }
  std::vector<KvCache> caches;
  std::vector<std::unique_ptr<DecodeState>> states;
  std::vector<std::optional<NextToken>> next;
  for (const Req& q : reqs) {
    caches.emplace_back(model_->n_layers());
    at::Tensor logits = PrefillTokens(*model_, q.prompt, 0, &caches.back()).logits;
    states.push_back(std::make_unique<DecodeState>(q.options, tok->get(),
                                                   static_cast<int64_t>(q.prompt.size()),
                                                   model_->config().max_position_embeddings,
                                                   nullptr));
    next.push_back(states.back()->Advance(logits));
  }
  while (true) {
    std::vector<int64_t> ids, pos;
    std::vector<KvCache*> batch;
    std::vector<int> rows;
    for (int r = 0; r < 4; ++r) {
      if (!next[r]) continue;
      ids.push_back(next[r]->id);
      pos.push_back(next[r]->position);
      batch.push_back(&caches[r]);
      rows.push_back(r);
    }
    if (rows.empty()) break;
    at::Tensor logits = model_->DecodeStep(at::tensor(ids), at::tensor(pos), batch);
    for (size_t i = 0; i < rows.size(); ++i) next[rows[i]] = states[rows[i]]->Advance(logits[i]);
  }
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(states[r]->result().ids, alone[r].ids) << r;
    EXPECT_EQ(states[r]->result().text, alone[r].text) << r;
    EXPECT_EQ(states[r]->result().stop_reason, alone[r].stop_reason) << r;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, BatchDecode, ::testing::Values("llama", "qwen3", "glm4"));

// min_new_tokens masks the stop ids until that many tokens: the next best
// token is sampled instead (greedy here), and afterwards the stop id ends
// generation as usual. Stop ids outside the vocabulary are ignored.
TEST(DecodeStateMinTokens, StopIdsAreMaskedUntilMinNewTokens) {
  at::Tensor logits = at::zeros({8});
  logits[5] = 3.0;  // the stop id: the argmax
  logits[3] = 2.0;  // next best
  DecodeOptions options;
  options.max_new_tokens = 10;
  options.stop_ids = {5, 99};
  DecodeState plain(options, nullptr, 0, 0, nullptr);
  EXPECT_FALSE(plain.Advance(logits).has_value());
  EXPECT_EQ(plain.result().stop_reason, StopReason::kStopId);
  EXPECT_TRUE(plain.result().ids.empty());

  options.min_new_tokens = 2;
  DecodeState held(options, nullptr, 0, 0, nullptr);
  for (int i = 0; i < 2; ++i) {
    std::optional<NextToken> next = held.Advance(logits);
    ASSERT_TRUE(next.has_value()) << i;
    EXPECT_EQ(next->id, 3);
  }
  EXPECT_FALSE(held.Advance(logits).has_value());
  EXPECT_EQ(held.result().stop_reason, StopReason::kStopId);
  EXPECT_EQ(held.result().ids, (std::vector<int32_t>{3, 3}));
  EXPECT_EQ(logits[5].item<float>(), 3.0f);  // the caller's logits are not modified
}

}  // namespace
}  // namespace infoflow
