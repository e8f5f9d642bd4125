// Continuous-batching primitives: Model::DecodeStep against solo Forward,
// the yield points, and DecodeState driving the same generation as Decode.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

#include "engine/decode/decode.h"
#include "engine/model/forward.h"
#include "engine/model/yield_point.h"
#include "engine/text/tokenizer.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

using testing::Ids;
using testing::MaxAbsDiff;


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

}  // namespace
}  // namespace infoflow
