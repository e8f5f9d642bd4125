// infoflow-train's Trainer (engine/train/trainer.h): the loss goes down, the
// checkpoint is a model Model::Load reads back exactly, and resuming gives
// the same weights as an uninterrupted run.
#include "engine/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "engine/kv_cache.h"
#include "engine/model.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

std::string MakeTempDir(const std::string& name) {
  std::string tmpl = ::testing::TempDir() + "/train_test_" + name + "_XXXXXX";
  char* dir = ::mkdtemp(tmpl.data());
  return dir ? std::string(dir) : std::string();
}

TrainOptions Tiny() {
  TrainOptions o;
  o.layers = 2;
  o.hidden = 32;
  o.heads = 4;
  o.kv_heads = 2;
  o.ffn = 64;
  o.vocab = 384;
  o.seq_len = 160;
  o.chunks = 3;
  o.chunk_words = 15;
  o.tokenizer_docs = 40;
  o.steps = 40;
  o.batch = 2;
  o.lr = 1e-2;
  o.warmup = 3;
  o.threads = 1;
  o.seed = 7;
  return o;
}

at::Tensor AllLogits(const Model& m, const std::vector<int64_t>& ids) {
  at::NoGradGuard no_grad;
  KvCache cache(m.n_layers());
  ForwardOptions fo;
  fo.logits = ForwardOptions::Logits::kAll;
  const int64_t n = static_cast<int64_t>(ids.size());
  return m.Forward(at::tensor(ids, at::kLong), at::arange(n, at::kLong), at::Tensor(), &cache, fo)
      .logits;
}

double MaxParamDiff(const Model& a, const Model& b) {
  const ModelWeights &x = a.weights(), &y = b.weights();
  double d = std::max({testing::MaxAbsDiff(x.embed, y.embed),
                       testing::MaxAbsDiff(x.lm_head, y.lm_head),
                       testing::MaxAbsDiff(x.final_norm, y.final_norm)});
  for (size_t l = 0; l < x.layers.size(); ++l) {
    const LayerWeights &p = x.layers[l], &q = y.layers[l];
    d = std::max({d, testing::MaxAbsDiff(p.wqkv, q.wqkv), testing::MaxAbsDiff(p.wo, q.wo),
                  testing::MaxAbsDiff(p.w_gate_up, q.w_gate_up),
                  testing::MaxAbsDiff(p.w_down, q.w_down),
                  testing::MaxAbsDiff(p.attn_norm, q.attn_norm),
                  testing::MaxAbsDiff(p.mlp_norm, q.mlp_norm)});
  }
  return d;
}

TEST(TrainTest, DocumentsMatchTheEvalPromptLayout) {
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(Tiny());
  ASSERT_TRUE(t.ok()) << t.status();
  Document d = (*t)->TrainDocument(0, 0);
  ASSERT_GT(d.tokens.size(), 8u);
  EXPECT_LE(d.tokens.size(), 160u);
  EXPECT_EQ(d.tokens.front(), *(*t)->tokenizer().TokenToId("<s>"));
  EXPECT_EQ(d.tokens.back(), *(*t)->tokenizer().TokenToId("</s>"));
  std::vector<int32_t> ids(d.tokens.begin() + 1, d.tokens.end());
  const std::string text = (*t)->tokenizer().Decode(ids);
  EXPECT_NE(text.find("\nQuestion: "), std::string::npos) << text;
  EXPECT_NE(text.find("\nAnswer: "), std::string::npos) << text;
  // Answer targets are the tail: " answer", "\n", "</s>".
  ASSERT_EQ(d.answer.size(), d.tokens.size() - 1);
  EXPECT_EQ(d.answer.back(), 1);
  EXPECT_EQ(d.answer.front(), 0);
  // Same (seed, step, index) => same document.
  EXPECT_EQ((*t)->TrainDocument(0, 0).tokens, d.tokens);
  EXPECT_NE((*t)->TrainDocument(1, 0).tokens, d.tokens);
}

// With weight decay off, a parameter only moves if its gradient is non-zero:
// every parameter (K/V rows of wqkv included, whose path runs through the
// KvCache index_copy_ and the masked softmax) must receive gradient.
TEST(TrainTest, GradientReachesEveryParameter) {
  TrainOptions o = Tiny();
  o.weight_decay = 0;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  const Model& m = (*t)->model();
  const int64_t hd = m.config().head_dim, nh = m.config().num_attention_heads,
                nkv = m.config().num_key_value_heads;
  std::vector<at::Tensor> before;
  auto snapshot = [&](std::vector<at::Tensor>* out) {
    const ModelWeights& w = m.weights();
    out->clear();
    out->push_back(w.embed.detach().clone());
    out->push_back(w.lm_head.detach().clone());
    out->push_back(w.final_norm.detach().clone());
    for (const LayerWeights& l : w.layers) {
      out->push_back(l.wqkv.detach().narrow(0, 0, nh * hd).clone());              // q
      out->push_back(l.wqkv.detach().narrow(0, nh * hd, nkv * hd).clone());       // k
      out->push_back(l.wqkv.detach().narrow(0, (nh + nkv) * hd, nkv * hd).clone());  // v
      out->push_back(l.wo.detach().clone());
      out->push_back(l.w_gate_up.detach().clone());
      out->push_back(l.w_down.detach().clone());
      out->push_back(l.attn_norm.detach().clone());
      out->push_back(l.mlp_norm.detach().clone());
    }
  };
  snapshot(&before);
  StepStats st = (*t)->Step();
  EXPECT_GT(st.grad_norm, 0);
  std::vector<at::Tensor> after;
  snapshot(&after);
  ASSERT_EQ(before.size(), after.size());
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_GT(testing::MaxAbsDiff(before[i], after[i]), 0) << "parameter slice " << i;
  }
}

TEST(TrainTest, LossFallsAndCheckpointLoadsExactly) {
  const std::string dir = MakeTempDir("ckpt");
  ASSERT_FALSE(dir.empty());
  TrainOptions o = Tiny();
  o.out = dir;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  const EvalStats e0 = (*t)->Evaluate(8);
  double first = 0, last = 0;
  for (int s = 0; s < o.steps; ++s) {
    StepStats st = (*t)->Step();
    if (s < 3) first += st.loss / 3;
    if (s >= o.steps - 3) last += st.loss / 3;
  }
  const EvalStats e1 = (*t)->Evaluate(8);
  EXPECT_LT(last, 0.8 * first) << "train loss " << first << " -> " << last;
  EXPECT_LT(e1.loss, 0.8 * e0.loss) << "held-out loss " << e0.loss << " -> " << e1.loss;

  ASSERT_TRUE((*t)->Save(dir).ok());
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json",
                        "optimizer.safetensors", "trainer_state.json"}) {
    EXPECT_TRUE(std::filesystem::exists(dir + "/" + f)) << f;
  }
  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "f32";
  absl::StatusOr<std::unique_ptr<Model>> loaded = Model::Load(dir, lo);
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  EXPECT_EQ((*loaded)->config().num_hidden_layers, 2);
  EXPECT_EQ((*loaded)->config().bos_token_id, (*t)->tokenizer().TokenToId("<s>"));
  Document doc = (*t)->EvalDocument(3);
  at::Tensor a = AllLogits((*t)->model(), doc.tokens);
  at::Tensor b = AllLogits(**loaded, doc.tokens);
  ASSERT_EQ(a.sizes(), b.sizes());
  EXPECT_LE(testing::MaxAbsDiff(a, b), 1e-5);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(dir + "/tokenizer.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  std::vector<int32_t> ids(doc.tokens.begin() + 1, doc.tokens.end());
  EXPECT_EQ((*tok)->Decode(ids), (*t)->tokenizer().Decode(ids));
  std::filesystem::remove_all(dir);
}

TEST(TrainTest, ResumeContinuesFromTheSameStep) {
  TrainOptions o = Tiny();
  o.steps = 10;
  absl::StatusOr<std::unique_ptr<Trainer>> straight = Trainer::Create(o);
  ASSERT_TRUE(straight.ok()) << straight.status();
  for (int s = 0; s < 10; ++s) (*straight)->Step();

  const std::string dir = MakeTempDir("resume");
  ASSERT_FALSE(dir.empty());
  o.out = dir;
  {
    absl::StatusOr<std::unique_ptr<Trainer>> first = Trainer::Create(o);
    ASSERT_TRUE(first.ok()) << first.status();
    for (int s = 0; s < 6; ++s) (*first)->Step();
    ASSERT_TRUE((*first)->Save(dir).ok());
  }
  o.resume = true;
  o.seed = 7;
  absl::StatusOr<std::unique_ptr<Trainer>> resumed = Trainer::Create(o);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ((*resumed)->step(), 6);
  EXPECT_EQ((*resumed)->TrainDocument(6, 1).tokens, (*straight)->TrainDocument(6, 1).tokens);
  for (int s = 6; s < 10; ++s) (*resumed)->Step();
  EXPECT_EQ((*resumed)->step(), 10);
  EXPECT_LE(MaxParamDiff((*resumed)->model(), (*straight)->model()), 1e-6);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace infoflow
