// infoflow-train's Trainer (engine/train/trainer.h): the loss goes down, the
// checkpoint is a model Model::Load reads back exactly, and resuming gives
// the same weights as an uninterrupted run.
#include "engine/train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <random>
#include <string>

#include "absl/strings/str_split.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
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

// --init-from: a fine-tune starts from another checkpoint's weights and
// tokenizer at step 0 with fresh moments, whatever its own flags say about
// the architecture; its first step then moves the weights.
TEST(TrainTest, InitFromStartsAtStepZeroWithTheCheckpointsWeights) {
  TrainOptions o = Tiny();
  const std::string dir = MakeTempDir("init-from");
  ASSERT_FALSE(dir.empty());
  {
    absl::StatusOr<std::unique_ptr<Trainer>> base = Trainer::Create(o);
    ASSERT_TRUE(base.ok()) << base.status();
    for (int s = 0; s < 3; ++s) (*base)->Step();
    ASSERT_TRUE((*base)->Save(dir).ok());
  }
  absl::StatusOr<std::unique_ptr<Model>> saved = Model::Load(dir, LoadOptions{"cpu", "f32"});
  ASSERT_TRUE(saved.ok()) << saved.status();
  TrainOptions f = Tiny();
  f.init_from = dir;
  f.layers = o.layers + 3;  // ignored: the checkpoint's architecture wins
  f.tasks = {"twohop"};
  absl::StatusOr<std::unique_ptr<Trainer>> tuned = Trainer::Create(f);
  ASSERT_TRUE(tuned.ok()) << tuned.status();
  EXPECT_EQ((*tuned)->step(), 0);
  EXPECT_EQ((*tuned)->model().n_layers(), o.layers);
  EXPECT_EQ(MaxParamDiff((*tuned)->model(), **saved), 0.0);
  EXPECT_EQ((*tuned)->TrainDocument(0, 0).task, "twohop");
  (*tuned)->Step();
  EXPECT_EQ((*tuned)->step(), 1);
  EXPECT_GT(MaxParamDiff((*tuned)->model(), **saved), 0.0);
  f.init_from = dir + "/missing";
  EXPECT_FALSE(Trainer::Create(f).ok());
  std::filesystem::remove_all(dir);
}

// Documents of a batch on several threads: gradients are summed in document
// order, so the weights are identical to a single-threaded run.
TEST(TrainTest, WorkersDoNotChangeTheResult) {
  TrainOptions o = Tiny();
  o.batch = 4;
  absl::StatusOr<std::unique_ptr<Trainer>> one = Trainer::Create(o);
  o.workers = 3;
  absl::StatusOr<std::unique_ptr<Trainer>> three = Trainer::Create(o);
  ASSERT_TRUE(one.ok() && three.ok());
  for (int s = 0; s < 3; ++s) {
    StepStats a = (*one)->Step();
    StepStats b = (*three)->Step();
    EXPECT_EQ(a.loss, b.loss);
    EXPECT_EQ(a.grad_norm, b.grad_norm);
  }
  EXPECT_EQ(MaxParamDiff((*one)->model(), (*three)->model()), 0.0);
}

// --digit-group 2: every two-digit group is one token, whatever numbers the
// tokenizer corpus held; a number is cut left to right; prose is unchanged.
TEST(TrainTest, DigitGroupsAreSingleTokens) {
  TrainOptions o = Tiny();
  o.max_digits = 2;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  const Tokenizer& tok = (*t)->tokenizer();
  for (int v = 0; v < 100; ++v) {
    const std::string group = (v < 10 ? "0" : "") + std::to_string(v);
    const std::vector<int32_t> ids = tok.Encode(group);
    ASSERT_EQ(ids.size(), 1u) << group;
    EXPECT_EQ(tok.Decode(ids), group);
  }
  std::vector<std::string> pieces;
  for (int32_t id : tok.Encode(" 48213.")) pieces.push_back(tok.Decode({id}));
  EXPECT_EQ(pieces, (std::vector<std::string>{" ", "48", "21", "3", "."}));
  o.max_digits = 4;
  EXPECT_FALSE(Trainer::Create(o).ok());
}

// "mixed": several facts per document, every question followed by its answer;
// the answer targets are exactly those answers (and the final </s>).
TEST(TrainTest, MixedDocumentsAnswerEveryQuestion) {
  TrainOptions o = Tiny();
  o.tasks = {"mixed"};
  o.seq_len = 1200;
  o.chunks = 6;
  o.chunk_words = 40;
  o.max_digits = 1;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  const Tokenizer& tok = (*t)->tokenizer();
  // Digits are single tokens.
  for (int32_t id : tok.Encode(" 48213")) EXPECT_LE(tok.Decode({id}).size(), 1u);
  int multi = 0;
  for (int i = 0; i < 6; ++i) {
    Document d = (*t)->TrainDocument(0, i);
    std::vector<int32_t> ids(d.tokens.begin() + 1, d.tokens.end());
    const std::string text = tok.Decode(ids);
    size_t questions = 0;
    for (size_t p = text.find("\nQuestion: "); p != std::string::npos;
         p = text.find("\nQuestion: ", p + 1)) {
      ++questions;
    }
    ASSERT_GE(questions, 1u) << text;
    multi += questions > 1;
    // Runs of answer targets: one per question, the last one also covers </s>.
    size_t runs = 0;
    std::string answers;
    for (size_t k = 0; k < d.answer.size(); ++k) {
      if (d.answer[k] && (k == 0 || !d.answer[k - 1])) ++runs;
      if (d.answer[k]) answers += tok.Decode({static_cast<int32_t>(d.tokens[k + 1])});
    }
    EXPECT_EQ(runs, questions) << text;
    // Each answer line appears right after an "Answer:".
    for (absl::string_view piece : absl::StrSplit(answers, '\n', absl::SkipEmpty())) {
      const std::string line(piece);
      if (line == "</s>") continue;
      EXPECT_NE(text.find("\nAnswer:" + line + "\n"), std::string::npos) << line << "\n" << text;
    }
  }
  EXPECT_GT(multi, 0) << "no document had more than one question";
  // Held-out documents stay eval-style: one question.
  Document e = (*t)->EvalDocument(0);
  std::vector<int32_t> ids(e.tokens.begin() + 1, e.tokens.end());
  const std::string text = tok.Decode(ids);
  EXPECT_EQ(text.find("\nQuestion: "), text.rfind("\nQuestion: ")) << text;
}

// --tasks needles / xref / split: needles and xref documents ask several
// questions (every fact), split asks the one secret code among decoys.
TEST(TrainTest, NeedlesXrefAndSplitDocuments) {
  for (const std::string task : {"needles", "xref", "split"}) {
    SCOPED_TRACE(task);
    TrainOptions o = Tiny();
    o.tasks = {task};
    o.seq_len = 1200;
    o.chunks = 6;
    o.min_chunks = 4;
    o.chunk_words = 20;
    absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
    ASSERT_TRUE(t.ok()) << t.status();
    const Tokenizer& tok = (*t)->tokenizer();
    int multi = 0;
    for (int i = 0; i < 6; ++i) {
      Document d = (*t)->TrainDocument(0, i);
      EXPECT_EQ(d.task, task);
      const std::string text =
          tok.Decode(std::vector<int32_t>(d.tokens.begin() + 1, d.tokens.end()));
      size_t questions = 0;
      for (size_t p = text.find("\nQuestion: "); p != std::string::npos;
           p = text.find("\nQuestion: ", p + 1)) {
        ++questions;
      }
      multi += questions > 1;
      if (task == "xref") {
        EXPECT_GE(questions, 2u) << text;
      }
      if (task == "split") {
        EXPECT_EQ(questions, 1u) << text;
        EXPECT_NE(text.find("The secret code of "), std::string::npos) << text;
      }
      ASSERT_GE(questions, 1u) << text;
    }
    if (task != "split") {
      EXPECT_GT(multi, 0) << "no document asked more than one question";
    }
  }
}

// Positional skips: ascending positions within --position-span, gaps only at
// chunk starts, the question right after the last chunk; held-out documents
// keep 0..T-1.
TEST(TrainTest, PositionGapsStayInSpanAndOnlyBeforeChunks) {
  TrainOptions o = Tiny();
  o.seq_len = 400;  // no truncated documents (they get no gaps)
  o.position_span = 3000;
  o.gap_fraction = 1.0;
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  int gapped = 0;
  for (int i = 0; i < 8; ++i) {
    Document d = (*t)->TrainDocument(0, i);
    ASSERT_EQ(d.positions.size(), d.tokens.size());
    EXPECT_EQ(d.positions.front(), 0);
    EXPECT_LT(d.positions.back(), 3000);
    int jumps = 0;
    for (size_t k = 1; k < d.positions.size(); ++k) {
      ASSERT_GT(d.positions[k], d.positions[k - 1]);
      jumps += d.positions[k] - d.positions[k - 1] > 1;
    }
    EXPECT_LE(jumps, d.chunks);
    gapped += d.positions.back() > static_cast<int64_t>(d.tokens.size()) - 1;
    // The question block ("\nQuestion: ..." to the end) is contiguous.
    size_t q = d.answer.size();
    while (q > 0 && (d.answer[q - 1] || d.positions[q] - d.positions[q - 1] == 1)) --q;
    std::vector<int32_t> tail(d.tokens.begin() + q, d.tokens.end());
    EXPECT_NE((*t)->tokenizer().Decode(tail).find("Question:"), std::string::npos);
  }
  EXPECT_GE(gapped, 7);
  Document e = (*t)->EvalDocument(1);
  for (size_t k = 0; k < e.positions.size(); ++k) ASSERT_EQ(e.positions[k], static_cast<int64_t>(k));
}

// The gradients the trainer optimizes are the true gradients of the loss:
// for every parameter tensor (Q/K/V rows of each layer's wqkv separately),
// the analytic directional derivative along the gradient and along a random
// direction matches central finite differences. (The forward keeps norms,
// scores and logits in float32, so steps are sized to move the loss by ~1e-3,
// far above float32 noise.) A detached or mis-masked attention path gives
// non-zero but wrong gradients, which this catches.
TEST(TrainTest, GradientsMatchFiniteDifferences) {
  TrainOptions o = Tiny();
  absl::StatusOr<std::unique_ptr<Trainer>> t = Trainer::Create(o);
  ASSERT_TRUE(t.ok()) << t.status();
  const Model& m = (*t)->model();
  ModelWeights w = m.weights();
  std::vector<at::Tensor*> leaves = {&w.embed, &w.final_norm, &w.lm_head};
  for (LayerWeights& l : w.layers) {
    for (at::Tensor* x : {&l.attn_norm, &l.wqkv, &l.wo, &l.mlp_norm, &l.w_gate_up, &l.w_down}) {
      leaves.push_back(x);
    }
  }
  for (at::Tensor* x : leaves) *x = x->detach().to(at::kDouble).clone().requires_grad_(true);
  Model m64(m.config(), w, c10::Device(c10::kCPU), at::kDouble);
  Document doc = (*t)->TrainDocument(0, 0);
  const int64_t T = static_cast<int64_t>(doc.tokens.size());
  at::Tensor tokens = at::tensor(doc.tokens, at::kLong);
  at::Tensor positions = at::tensor(doc.positions, at::kLong);
  auto loss_of = [&]() {
    KvCache cache(m64.n_layers());
    ForwardOptions fo;
    fo.logits = ForwardOptions::Logits::kAll;
    at::Tensor logits = m64.Forward(tokens, positions, at::Tensor(), &cache, fo).logits;
    at::Tensor logp = at::log_softmax(logits.to(at::kDouble).narrow(0, 0, T - 1), -1);
    return -logp.gather(1, tokens.narrow(0, 1, T - 1).unsqueeze(1)).mean();
  };
  std::vector<at::Tensor> params;
  for (at::Tensor* x : leaves) params.push_back(*x);
  std::vector<at::Tensor> grads = torch::autograd::grad({loss_of()}, params);
  const int64_t hd = m.config().head_dim, nh = m.config().num_attention_heads,
                nkv = m.config().num_key_value_heads;
  at::NoGradGuard no_grad;
  at::manual_seed(5);
  int checked = 0;
  auto check = [&](const at::Tensor& p, const at::Tensor& g, const std::string& what) {
    for (int dir = 0; dir < 2; ++dir) {
      at::Tensor d = dir == 0 ? g.clone() : at::randn_like(g);
      d /= d.norm();
      const double slope = (g * d).sum().item<double>();  // analytic dL/dh along d
      const double h = 1e-3 / std::max(g.norm().item<double>(), 1e-3);
      p.add_(d, h);
      const double up = loss_of().item<double>();
      p.add_(d, -2 * h);
      const double down = loss_of().item<double>();
      p.add_(d, h);
      const double numeric = (up - down) / (2 * h);
      EXPECT_NEAR(slope, numeric, 0.03 * std::abs(numeric) + 1e-3 * g.norm().item<double>())
          << what << (dir == 0 ? " along the gradient" : " along a random direction");
      ++checked;
    }
  };
  for (size_t i = 0; i < params.size(); ++i) {
    const std::string what = "parameter " + std::to_string(i);
    if (params[i].dim() == 2 && params[i].size(0) == (nh + 2 * nkv) * hd) {
      const int64_t rows[3][2] = {{0, nh * hd}, {nh * hd, nkv * hd}, {(nh + nkv) * hd, nkv * hd}};
      const char* names[3] = {" (Q rows)", " (K rows)", " (V rows)"};
      for (int r = 0; r < 3; ++r) {
        check(params[i].narrow(0, rows[r][0], rows[r][1]), grads[i].narrow(0, rows[r][0], rows[r][1]),
              what + names[r]);
      }
    } else {
      check(params[i], grads[i], what);
    }
  }
  EXPECT_GE(checked, 2 * (3 + 8 * static_cast<int>(w.layers.size())));
}

}  // namespace
}  // namespace infoflow
