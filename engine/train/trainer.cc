#include "engine/train/trainer.h"
#include "engine/model/test_model.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "engine/text/bpe_trainer.h"
#include "engine/tools/flag_table.h"
#include "engine/eval/eval_set.h"
#include "engine/model/kv_cache.h"
#include "engine/checkpoint/model_config.h"
#include "engine/model/runtime.h"
#include "engine/checkpoint/safetensors.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

constexpr uint64_t kEvalStream = 0xE7A15E7ull;
constexpr uint64_t kTokenizerStream = 0x70CE41ull;

uint64_t SplitMix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t Key(uint64_t seed, uint64_t stream, uint64_t a, uint64_t b) {
  return SplitMix(SplitMix(SplitMix(seed ^ stream) + a) + b);
}

std::string ReadFile(const std::string& path, bool* ok) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  *ok = static_cast<bool>(in);
  return s.str();
}

absl::Status WriteFile(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary);
    out << text;
    if (!out) return absl::InternalError("cannot write " + tmp);
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError("cannot rename " + tmp + ": " + ec.message());
  return absl::OkStatus();
}

std::string Duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  int64_t t = static_cast<int64_t>(s + 0.5);
  if (t >= 3600) return absl::StrFormat("%dh%02dm", t / 3600, (t / 60) % 60);
  return absl::StrFormat("%dm%02ds", t / 60, t % 60);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Trainer>> Trainer::Create(const TrainOptions& options) {
  const TrainOptions& o = options;
  if (o.hidden <= 0 || o.heads <= 0 || o.kv_heads <= 0 || o.layers <= 0 || o.ffn <= 0) {
    return absl::InvalidArgumentError("model sizes must be positive");
  }
  if (o.hidden % o.heads != 0 || (o.hidden / o.heads) % 2 != 0) {
    return absl::InvalidArgumentError("--hidden / --heads must be an even integer");
  }
  if (o.heads % o.kv_heads != 0) return absl::InvalidArgumentError("--heads % --kv-heads != 0");
  if (o.vocab < 258) return absl::InvalidArgumentError("--vocab must be >= 258");
  if (o.max_digits < 0 || o.max_digits > 3) {
    return absl::InvalidArgumentError("--digit-group must be 0..3");
  }
  if (o.steps < 0 || o.batch <= 0 || o.seq_len < 16) {
    return absl::InvalidArgumentError("need --steps >= 0, --batch > 0, --seq-len >= 16");
  }
  if (o.chunks < 2 || o.min_chunks < 1 || o.chunk_words <= 0) {
    return absl::InvalidArgumentError("need --chunks >= 2, --min-chunks >= 1, --chunk-words > 0");
  }
  EvalSetOptions check;
  for (const std::string& t : o.tasks) {
    if (t != "mixed" && t != "needles") check.tasks.push_back(t);
  }
  if (absl::Status s = ValidateEvalSetOptions(check); !s.ok()) return s;

  std::unique_ptr<Trainer> t(new Trainer());
  t->options_ = options;
  // --threads cores in all, shared by --workers concurrent documents.
  InitTorchRuntime(std::max(1, std::max(1, o.threads) / std::max(1, o.workers)));

  if (o.resume && !o.out.empty() && std::filesystem::exists(o.out + "/model.safetensors")) {
    if (absl::Status s = t->LoadCheckpoint(o.out); !s.ok()) return s;
    return t;
  }
  if (!o.init_from.empty()) {
    if (absl::Status s = t->LoadWeights(o.init_from); !s.ok()) return s;
    return t;
  }

  // Tokenizer: byte-level BPE on generated documents (own seed stream).
  std::vector<std::string> corpus;
  for (int i = 0; i < o.tokenizer_docs; ++i) {
    EvalSetOptions g;
    g.n_examples = 1;
    g.n_chunks = o.chunks;
    g.chunk_words = o.chunk_words;
    g.seed = Key(o.seed, kTokenizerStream, i, 0);
    // These three tasks, whatever --tasks trains on: the tokenizer must cover
    // the eval's vocabulary (and a later --resume phase's tasks). xref and
    // split reuse their words (split's decoy keys fall back to smaller
    // tokens); leaving them out keeps the corpus, and so the shipped
    // models/infoflow-tiny tokenizer, what it was before they existed.
    static const std::vector<std::string> kTokenizerTasks = {"multihop", "needle", "coref"};
    g.tasks = {kTokenizerTasks[i % kTokenizerTasks.size()]};
    for (const EvalExample& ex : GenerateEvalSet(g)) {
      for (const std::string& c : ex.chunks) corpus.push_back(c);
      corpus.push_back(absl::StrCat("\nQuestion: ", ex.question, "\nAnswer: ", ex.answers[0], "\n"));
    }
  }
  absl::StatusOr<std::string> json =
      TrainByteLevelBpeTokenizerJson(corpus, o.vocab, {"<s>", "</s>"}, o.max_digits);
  if (!json.ok()) return json.status();
  t->tokenizer_json_ = *json;
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJsonString(*json);
  if (!tok.ok()) return tok.status();
  t->tokenizer_ = *std::move(tok);
  t->bos_ = *t->tokenizer_->TokenToId("<s>");
  t->eos_ = *t->tokenizer_->TokenToId("</s>");

  // The same config builder the generated test models use; the trainer
  // keeps its own eps (the shipped checkpoint was trained with 1e-5).
  TestModelSpec spec;
  spec.vocab_size = o.vocab;
  spec.hidden_size = o.hidden;
  spec.num_layers = o.layers;
  spec.num_heads = o.heads;
  spec.num_kv_heads = o.kv_heads;
  spec.intermediate_size = o.ffn;
  spec.max_position_embeddings = std::max({4096, o.seq_len, o.position_span});
  spec.rope_theta = o.rope_theta;
  spec.tie_word_embeddings = o.tie_embeddings;
  ModelConfig& c = t->config_;
  c = TestModelConfig(spec);
  c.rms_norm_eps = 1e-5;
  c.bos_token_id = t->bos_;
  c.eos_token_ids = {t->eos_};
  t->InitWeights();
  return t;
}

void Trainer::InitWeights() {
  at::manual_seed(options_.seed);
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, ff = c.intermediate_size;
  const double std0 = 0.02, out_std = 0.02 / std::sqrt(2.0 * c.num_hidden_layers);
  auto normal = [](std::vector<int64_t> shape, double stddev) {
    return at::randn(shape, at::kFloat).mul_(stddev);
  };
  auto ones = [](int64_t n) { return at::ones({n}, at::kFloat); };
  weights_ = ModelWeights();
  weights_.embed = normal({c.vocab_size, d}, std0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    LayerWeights w;
    w.attn_norm = ones(d);
    w.wqkv = normal({(nh + 2 * nkv) * hd, d}, std0);
    w.wo = normal({d, nh * hd}, out_std);
    w.mlp_norm = ones(d);
    w.w_gate_up = normal({2 * ff, d}, std0);
    w.w_down = normal({d, ff}, out_std);
    weights_.layers.push_back(w);
  }
  weights_.final_norm = ones(d);
  weights_.lm_head = c.tie_word_embeddings ? weights_.embed : normal({c.vocab_size, d}, std0);
  CollectParameters();
}

void Trainer::CollectParameters() {
  names_.clear();
  params_.clear();
  auto add = [&](const std::string& name, at::Tensor& t) {
    t = t.detach().contiguous().requires_grad_(true);
    names_.push_back(name);
    params_.push_back(t);
  };
  add("embed", weights_.embed);
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    LayerWeights& w = weights_.layers[l];
    const std::string p = absl::StrCat("layers.", l, ".");
    add(p + "attn_norm", w.attn_norm);
    add(p + "wqkv", w.wqkv);
    add(p + "wo", w.wo);
    add(p + "mlp_norm", w.mlp_norm);
    add(p + "w_gate_up", w.w_gate_up);
    add(p + "w_down", w.w_down);
  }
  add("final_norm", weights_.final_norm);
  if (config_.tie_word_embeddings) {
    weights_.lm_head = weights_.embed;  // one parameter, gradient from both uses
  } else {
    add("lm_head", weights_.lm_head);
  }
  exp_avg_.clear();
  exp_avg_sq_.clear();
  for (const at::Tensor& p : params_) {
    exp_avg_.push_back(at::zeros_like(p).detach());
    exp_avg_sq_.push_back(at::zeros_like(p).detach());
  }
  // The model shares the parameters' storage: optimizer updates in place are
  // what it computes with.
  model_ = std::make_unique<Model>(config_, weights_, c10::Device(c10::kCPU), at::kFloat);
}

int64_t Trainer::num_parameters() const {
  int64_t n = 0;
  for (const at::Tensor& p : params_) n += p.numel();
  return n;
}

double Trainer::LearningRate(int step) const {
  const TrainOptions& o = options_;
  if (step < o.warmup) return o.lr * (step + 1) / o.warmup;
  const double span = std::max(1, o.steps - o.warmup);
  const double progress = std::min(1.0, (step - o.warmup) / span);
  const double min_lr = o.lr * o.min_lr_ratio;
  return min_lr + (o.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

int Trainer::MaxChunksAt(int step) const {
  const TrainOptions& o = options_;
  const int lo = std::min(std::max(2, o.min_chunks), o.chunks);
  if (o.curriculum_steps <= 0) return o.chunks;
  const double f = std::min(1.0, static_cast<double>(step) / o.curriculum_steps);
  return lo + static_cast<int>(std::lround(f * (o.chunks - lo)));
}

Document Trainer::MakeDocument(uint64_t key, int max_chunks, bool training,
                               const std::string& task_override) const {
  const TrainOptions& o = options_;
  const uint64_t r = SplitMix(key);
  const std::string task = task_override.empty() ? o.tasks[r % o.tasks.size()] : task_override;
  const int lo = std::min(std::max(2, o.min_chunks), max_chunks);
  int n = lo + static_cast<int>((r >> 20) % static_cast<uint64_t>(max_chunks - lo + 1));
  int words = o.chunk_words;
  if (o.max_chunk_words > o.chunk_words) {
    words += static_cast<int>(SplitMix(r ^ 0x5A17ull) % (o.max_chunk_words - o.chunk_words + 1));
  }
  Document doc;
  for (;; --n) {
    std::vector<std::string> chunks;
    std::vector<std::pair<std::string, std::string>> qa;  // question, answer
    // Multi-question documents (every fact asked); the rest are eval-style.
    std::optional<TrainingDocument> multi;
    if (task == "mixed" || task == "needles") {
      TrainingDocOptions t;
      t.n_chunks = n;
      t.chunk_words = words;
      t.seed = key;
      if (task == "needles") {
        // 1..6 needles about different people: the name, not the phrase
        // "secret code", must pick the code.
        t.max_needles = 6;
        t.max_multihops = 0;
        t.max_corefs = 0;
      }
      multi = GenerateTrainingDocument(t);
    } else if ((task == "xref" || task == "split") && training) {
      multi = GenerateXrefTrainingDocument(n, words, key, task == "split");
    }
    if (multi) {
      chunks = std::move(multi->chunks);
      for (size_t i = 0; i < multi->questions.size(); ++i) {
        qa.emplace_back(multi->questions[i], multi->answers[i]);
      }
    } else {
      EvalSetOptions g;
      g.n_examples = 1;
      g.n_chunks = n;
      g.chunk_words = words;
      g.seed = key;
      g.tasks = {task};
      EvalExample ex = GenerateEvalSet(g).at(0);
      chunks = std::move(ex.chunks);
      qa.emplace_back(ex.question, ex.answers[0]);
    }
    std::vector<int64_t> context = {bos_};
    std::vector<size_t> chunk_starts;
    for (const std::string& c : chunks) {
      chunk_starts.push_back(context.size());
      for (int32_t id : tokenizer_->Encode(c)) context.push_back(id);
    }
    // Questions and answers; answer tokens (" A", "\n", final "</s>") flagged.
    std::vector<int64_t> tail;
    std::vector<uint8_t> tail_answer;
    for (const auto& [question, answer] : qa) {
      for (int32_t id : tokenizer_->Encode(absl::StrCat("\nQuestion: ", question, "\nAnswer:"))) {
        tail.push_back(id);
        tail_answer.push_back(0);
      }
      for (int32_t id : tokenizer_->Encode(absl::StrCat(" ", answer, "\n"))) {
        tail.push_back(id);
        tail_answer.push_back(1);
      }
    }
    tail.push_back(eos_);
    tail_answer.push_back(1);
    const int64_t total = static_cast<int64_t>(context.size() + tail.size());
    if (total > o.seq_len && n > 2) continue;
    if (total > o.seq_len) {
      // Even two chunks are too long: drop the oldest context tokens (after BOS).
      const int64_t drop = std::min<int64_t>(total - o.seq_len, context.size() - 1);
      context.erase(context.begin() + 1, context.begin() + 1 + drop);
      chunk_starts.clear();  // chunk boundaries are gone; no gaps for this one
    }
    doc.tokens = context;
    doc.tokens.insert(doc.tokens.end(), tail.begin(), tail.end());
    doc.weights.assign(doc.tokens.size() - 1, static_cast<float>(o.context_weight));
    doc.answer.assign(doc.tokens.size() - 1, 0);
    for (size_t i = 0; i < tail.size(); ++i) {
      if (!tail_answer[i]) continue;
      const size_t t = context.size() + i - 1;  // target index predicting tail[i]
      doc.weights[t] = static_cast<float>(o.answer_weight);
      doc.answer[t] = 1;
    }
    doc.chunks = n;
    doc.task = task;
    const int64_t T = static_cast<int64_t>(doc.tokens.size());
    doc.positions.resize(T);
    for (int64_t t = 0; t < T; ++t) doc.positions[t] = t;
    const uint64_t g_r = SplitMix(r ^ 0x9A95ull);
    const int64_t spare = static_cast<int64_t>(o.position_span) - T;
    if (training && spare > 0 && !chunk_starts.empty() &&
        static_cast<double>(g_r % 1000000) < o.gap_fraction * 1e6) {
      // Total skip uniform in [0, spare], cut at random points into one gap
      // before each chunk; the question's tokens follow the last chunk.
      const int64_t total_gap = static_cast<int64_t>(SplitMix(g_r) % (spare + 1));
      std::vector<int64_t> cuts = {0, total_gap};
      for (size_t c = 1; c < chunk_starts.size(); ++c) {
        cuts.push_back(static_cast<int64_t>(SplitMix(g_r + c) % (total_gap + 1)));
      }
      std::sort(cuts.begin(), cuts.end());
      int64_t shift = 0;
      size_t next_chunk = 0;
      for (int64_t t = 0; t < T; ++t) {
        while (next_chunk < chunk_starts.size() && static_cast<size_t>(t) == chunk_starts[next_chunk]) {
          shift += cuts[next_chunk + 1] - cuts[next_chunk];
          ++next_chunk;
        }
        doc.positions[t] = t + shift;
      }
    }
    return doc;
  }
}

Document Trainer::TrainDocument(int step, int index) const {
  return MakeDocument(Key(options_.seed, 0, step, index), MaxChunksAt(step), true, "");
}

Document Trainer::EvalDocument(int index) const {
  // Held-out documents are eval-style (one question) even for "mixed".
  std::string task;
  if (std::find(options_.tasks.begin(), options_.tasks.end(), "mixed") != options_.tasks.end()) {
    task = EvalTaskNames()[index % EvalTaskNames().size()];
  }
  return MakeDocument(Key(options_.seed, kEvalStream, index, 0), options_.chunks, false, task);
}

at::Tensor Trainer::TargetLosses(const Document& doc, at::Tensor* logits_out) const {
  const int64_t T = static_cast<int64_t>(doc.tokens.size());
  at::Tensor tokens = at::tensor(doc.tokens, at::kLong);
  at::Tensor positions = doc.positions.empty() ? at::arange(T, at::kLong)
                                              : at::tensor(doc.positions, at::kLong);
  KvCache cache(model_->n_layers());
  ForwardOptions fo;
  fo.logits = ForwardOptions::Logits::kAll;
  ForwardResult r = model_->Forward(tokens, positions, at::Tensor(), &cache, fo);
  if (logits_out) *logits_out = r.logits;
  at::Tensor logp = at::log_softmax(r.logits.narrow(0, 0, T - 1), -1);
  at::Tensor targets = tokens.narrow(0, 1, T - 1).unsqueeze(1);
  return -logp.gather(1, targets).squeeze(1);
}

StepStats Trainer::Step() {
  const auto t0 = std::chrono::steady_clock::now();
  const TrainOptions& o = options_;
  StepStats st;
  std::vector<Document> docs;
  double total_weight = 0;
  for (int b = 0; b < o.batch; ++b) {
    docs.push_back(TrainDocument(step_, b));
    for (float w : docs.back().weights) total_weight += w;
  }
  if (total_weight <= 0) total_weight = 1;
  // Per-document gradients (torch::autograd::grad, not .backward()), so
  // documents can run on several threads and still be summed in document
  // order: the result does not depend on --workers.
  std::vector<std::vector<at::Tensor>> grads(o.batch);
  std::vector<double> loss_b(o.batch, 0), answer_ce_b(o.batch, 0);
  std::vector<int64_t> answer_n_b(o.batch, 0);
  std::atomic<int> next{0};
  auto work = [&]() {
    for (int b = next++; b < o.batch; b = next++) {
      const Document& doc = docs[b];
      at::Tensor ce = TargetLosses(doc);
      at::Tensor w = at::tensor(doc.weights, at::kFloat);
      at::Tensor loss = (ce * w).sum() / total_weight;
      grads[b] = torch::autograd::grad({loss}, params_, /*grad_outputs=*/{},
                                       /*retain_graph=*/false, /*create_graph=*/false,
                                       /*allow_unused=*/true);
      loss_b[b] = loss.item<double>();
      at::Tensor mask =
          at::tensor(std::vector<int64_t>(doc.answer.begin(), doc.answer.end())).to(at::kBool);
      answer_ce_b[b] = ce.detach().masked_select(mask).sum().item<double>();
      answer_n_b[b] = mask.sum().item<int64_t>();
    }
  };
  const int workers = std::max(1, std::min(o.workers, o.batch));
  if (workers == 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (int i = 0; i < workers; ++i) pool.emplace_back(work);
    for (std::thread& t : pool) t.join();
  }
  double answer_ce = 0;
  int64_t answer_n = 0;
  for (int b = 0; b < o.batch; ++b) {
    st.loss += loss_b[b];
    answer_ce += answer_ce_b[b];
    answer_n += answer_n_b[b];
    st.tokens += static_cast<int64_t>(docs[b].tokens.size());
  }
  st.answer_loss = answer_n ? answer_ce / answer_n : 0;
  {
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor sum;
      for (int b = 0; b < o.batch; ++b) {
        const at::Tensor& g = grads[b][i];
        if (!g.defined()) continue;
        if (sum.defined()) {
          sum.add_(g);
        } else {
          sum = g.clone();
        }
      }
      params_[i].mutable_grad() = sum;
    }
  }

  at::NoGradGuard no_grad;
  double sq = 0;
  for (const at::Tensor& p : params_) {
    if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
  }
  st.grad_norm = std::sqrt(sq);
  const double clip = (o.clip > 0 && st.grad_norm > o.clip) ? o.clip / (st.grad_norm + 1e-12) : 1.0;
  st.lr = LearningRate(step_);
  const int t = step_ + 1;
  const double bc1 = 1.0 - std::pow(o.beta1, t), bc2 = 1.0 - std::pow(o.beta2, t);
  for (size_t i = 0; i < params_.size(); ++i) {
    at::Tensor& p = params_[i];
    if (!p.grad().defined()) continue;
    at::Tensor g = p.grad();
    if (clip != 1.0) g = g * clip;
    exp_avg_[i].mul_(o.beta1).add_(g, 1.0 - o.beta1);
    exp_avg_sq_[i].mul_(o.beta2).addcmul_(g, g, 1.0 - o.beta2);
    if (p.dim() >= 2 && o.weight_decay > 0) p.mul_(1.0 - st.lr * o.weight_decay);
    at::Tensor denom = (exp_avg_sq_[i] / bc2).sqrt_().add_(o.adam_eps);
    p.addcdiv_(exp_avg_[i], denom, -st.lr / bc1);
    p.mutable_grad() = at::Tensor();
  }
  ++step_;
  st.step = step_;
  st.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

EvalStats Trainer::Evaluate(int n) {
  at::NoGradGuard no_grad;
  EvalStats e;
  double ce_sum = 0, ans_sum = 0;
  int64_t ce_n = 0, ans_n = 0, ans_right = 0;
  for (int i = 0; i < n; ++i) {
    Document doc = EvalDocument(i);
    at::Tensor logits;
    at::Tensor ce = TargetLosses(doc, &logits);
    at::Tensor pred = logits.narrow(0, 0, logits.size(0) - 1).argmax(-1).contiguous();
    const float* c = ce.contiguous().data_ptr<float>();
    const int64_t* p = pred.data_ptr<int64_t>();
    bool all = true;
    for (size_t t = 0; t + 1 < doc.tokens.size(); ++t) {
      ce_sum += c[t];
      ++ce_n;
      if (!doc.answer[t]) continue;
      ans_sum += c[t];
      ++ans_n;
      const bool right = p[t] == doc.tokens[t + 1];
      ans_right += right;
      all &= right;
    }
    e.exact += all;
  }
  e.docs = n;
  e.loss = ce_n ? ce_sum / ce_n : 0;
  e.answer_loss = ans_n ? ans_sum / ans_n : 0;
  e.answer_acc = ans_n ? static_cast<double>(ans_right) / ans_n : 0;
  e.exact = n ? e.exact / n : 0;
  return e;
}

absl::Status Trainer::Train(std::ostream& log) {
  const TrainOptions& o = options_;
  log << absl::StrFormat(
             "infoflow-train: %lld parameters, %d layers, hidden %d, heads %d/%d, ffn %d, "
             "vocab %lld (tokenizer %d), seq-len %d, batch %d, steps %d (from %d), threads %d, "
             "workers %d\n",
             static_cast<long long>(num_parameters()), config_.num_hidden_layers,
             config_.hidden_size, config_.num_attention_heads, config_.num_key_value_heads,
             config_.intermediate_size, static_cast<long long>(config_.vocab_size),
             tokenizer_->vocab_size(), o.seq_len, o.batch, o.steps, step_, o.threads, o.workers)
      << std::flush;
  const auto start = std::chrono::steady_clock::now();
  const int first = step_;
  int64_t tokens = 0;
  double loss_acc = 0, ans_acc = 0;
  int acc_n = 0;
  auto do_eval = [&]() {
    const auto e0 = std::chrono::steady_clock::now();
    EvalStats e = Evaluate(o.eval_docs);
    log << absl::StrFormat(
               "eval step %d: loss %.4f answer_loss %.4f answer_acc %.3f exact %.3f (%d docs, "
               "%.1fs)\n",
               step_, e.loss, e.answer_loss, e.answer_acc, e.exact, e.docs,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - e0).count())
        << std::flush;
  };
  const int stop = o.until > 0 ? std::min(o.until, o.steps) : o.steps;
  while (step_ < stop) {
    StepStats st = Step();
    tokens += st.tokens;
    loss_acc += st.loss;
    ans_acc += st.answer_loss;
    ++acc_n;
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (step_ % std::max(1, o.log_every) == 0 || step_ == stop) {
      const double per_step = elapsed / (step_ - first);
      log << absl::StrFormat(
                 "step %d/%d loss %.4f answer_loss %.4f lr %.2e gnorm %.3f chunks<=%d tok/s %.0f "
                 "elapsed %s eta %s\n",
                 step_, o.steps, loss_acc / acc_n, ans_acc / acc_n, st.lr, st.grad_norm,
                 MaxChunksAt(step_ - 1), tokens / std::max(elapsed, 1e-9), Duration(elapsed).c_str(),
                 Duration(per_step * (stop - step_)).c_str())
          << std::flush;
      loss_acc = ans_acc = 0;
      acc_n = 0;
    }
    if (o.eval_every > 0 && step_ % o.eval_every == 0 && step_ < stop) do_eval();
    if (!o.out.empty() && o.save_every > 0 && step_ % o.save_every == 0 && step_ < stop) {
      if (absl::Status s = Save(o.out); !s.ok()) return s;
      log << "saved " << o.out << " at step " << step_ << "\n" << std::flush;
    }
  }
  if (o.eval_docs > 0) do_eval();
  if (!o.out.empty()) {
    if (absl::Status s = Save(o.out); !s.ok()) return s;
    log << "saved " << o.out << " at step " << step_ << "\n" << std::flush;
  }
  return absl::OkStatus();
}

absl::Status Trainer::Save(const std::string& dir) const {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError("cannot create " + dir + ": " + ec.message());
  const ModelConfig& c = config_;
  const int64_t hd = c.head_dim, nh = c.num_attention_heads, nkv = c.num_key_value_heads;

  // Hugging Face names, q/k/v and gate/up split out of the fused tensors.
  std::vector<std::pair<std::string, at::Tensor>> hf;
  auto put = [&](const std::string& name, const at::Tensor& t) {
    hf.emplace_back(name, t.detach().to(at::kFloat).contiguous());
  };
  put("model.embed_tokens.weight", weights_.embed);
  put("model.norm.weight", weights_.final_norm);
  if (!c.tie_word_embeddings) put("lm_head.weight", weights_.lm_head);
  for (size_t l = 0; l < weights_.layers.size(); ++l) {
    const LayerWeights& w = weights_.layers[l];
    const std::string p = absl::StrCat("model.layers.", l, ".");
    std::vector<at::Tensor> qkv = w.wqkv.detach().split_with_sizes({nh * hd, nkv * hd, nkv * hd}, 0);
    std::vector<at::Tensor> gu = w.w_gate_up.detach().chunk(2, 0);
    put(p + "input_layernorm.weight", w.attn_norm);
    put(p + "self_attn.q_proj.weight", qkv[0]);
    put(p + "self_attn.k_proj.weight", qkv[1]);
    put(p + "self_attn.v_proj.weight", qkv[2]);
    put(p + "self_attn.o_proj.weight", w.wo);
    put(p + "post_attention_layernorm.weight", w.mlp_norm);
    put(p + "mlp.gate_proj.weight", gu[0]);
    put(p + "mlp.up_proj.weight", gu[1]);
    put(p + "mlp.down_proj.weight", w.w_down);
  }
  auto write = [](const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& ts,
                  const std::map<std::string, std::string>& meta) {
    std::vector<TensorToWrite> out;
    for (const auto& [name, t] : ts) {
      out.push_back({name, DType::kF32, t.sizes().vec(), t.data_ptr<float>()});
    }
    return WriteSafetensors(path, out, meta);
  };
  if (absl::Status s = write(dir + "/model.safetensors", hf, {{"format", "pt"}}); !s.ok()) return s;
  std::vector<std::pair<std::string, at::Tensor>> opt;
  for (size_t i = 0; i < params_.size(); ++i) {
    opt.emplace_back(names_[i] + ".exp_avg", exp_avg_[i].contiguous());
    opt.emplace_back(names_[i] + ".exp_avg_sq", exp_avg_sq_[i].contiguous());
  }
  if (absl::Status s = write(dir + "/optimizer.safetensors", opt, {{"step", std::to_string(step_)}});
      !s.ok()) {
    return s;
  }
  if (absl::Status s = WriteFile(dir + "/config.json", ModelConfigToJson(c)); !s.ok()) return s;
  if (absl::Status s = WriteFile(dir + "/tokenizer.json", tokenizer_json_); !s.ok()) return s;
  const TrainOptions& o = options_;
  nlohmann::json st;
  st["step"] = step_;
  if (!o.init_from.empty()) st["init_from"] = o.init_from;
  st["seed"] = o.seed;
  st["steps"] = o.steps;
  st["batch"] = o.batch;
  st["seq_len"] = o.seq_len;
  st["lr"] = o.lr;
  st["warmup"] = o.warmup;
  st["tasks"] = o.tasks;
  st["chunks"] = o.chunks;
  st["min_chunks"] = o.min_chunks;
  st["curriculum_steps"] = o.curriculum_steps;
  st["chunk_words"] = o.chunk_words;
  st["context_weight"] = o.context_weight;
  st["answer_weight"] = o.answer_weight;
  return WriteFile(dir + "/trainer_state.json", st.dump(2) + "\n");
}

absl::Status Trainer::LoadWeights(const std::string& dir) {
  LoadOptions lo;
  lo.device = "cpu";
  lo.dtype = "f32";
  absl::StatusOr<std::unique_ptr<Model>> loaded = Model::Load(dir, lo);
  if (!loaded.ok()) return loaded.status();
  config_ = (*loaded)->config();
  weights_ = (*loaded)->weights();
  for (LayerWeights& w : weights_.layers) {
    if (w.bqkv.defined() || w.bo.defined() || w.q_norm.defined()) {
      return absl::InvalidArgumentError(dir + ": only plain llama checkpoints can be resumed");
    }
  }
  // Own storage, detached from the loaded model.
  weights_.embed = weights_.embed.clone();
  weights_.final_norm = weights_.final_norm.clone();
  weights_.lm_head = config_.tie_word_embeddings ? weights_.embed : weights_.lm_head.clone();
  options_.tie_embeddings = config_.tie_word_embeddings;
  for (LayerWeights& w : weights_.layers) {
    for (at::Tensor* t : {&w.attn_norm, &w.wqkv, &w.wo, &w.mlp_norm, &w.w_gate_up, &w.w_down}) {
      *t = t->clone();
    }
  }
  bool ok = false;
  tokenizer_json_ = ReadFile(dir + "/tokenizer.json", &ok);
  if (!ok) return absl::NotFoundError("cannot read " + dir + "/tokenizer.json");
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJsonString(tokenizer_json_);
  if (!tok.ok()) return tok.status();
  tokenizer_ = *std::move(tok);
  bos_ = *tokenizer_->TokenToId("<s>");
  eos_ = *tokenizer_->TokenToId("</s>");
  options_.layers = static_cast<int>(config_.num_hidden_layers);
  options_.hidden = static_cast<int>(config_.hidden_size);
  options_.heads = static_cast<int>(config_.num_attention_heads);
  options_.kv_heads = static_cast<int>(config_.num_key_value_heads);
  options_.ffn = static_cast<int>(config_.intermediate_size);
  options_.vocab = static_cast<int>(config_.vocab_size);
  CollectParameters();
  return absl::OkStatus();
}

absl::Status Trainer::LoadCheckpoint(const std::string& dir) {
  if (absl::Status s = LoadWeights(dir); !s.ok()) return s;
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opt =
      SafetensorsFile::Open(dir + "/optimizer.safetensors");
  if (!opt.ok()) return opt.status();
  auto it = (*opt)->metadata().find("step");
  if (it == (*opt)->metadata().end() || !absl::SimpleAtoi(it->second, &step_)) {
    return absl::InvalidArgumentError(dir + "/optimizer.safetensors: no step in metadata");
  }
  auto read = [&](const std::string& name, at::Tensor& dst) -> absl::Status {
    const TensorInfo* info = (*opt)->Find(name);
    if (info == nullptr || info->dtype != DType::kF32 || info->shape != dst.sizes().vec()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/optimizer.safetensors: missing or mismatched ", name));
    }
    std::memcpy(dst.data_ptr<float>(), info->data, info->nbytes);
    return absl::OkStatus();
  };
  for (size_t i = 0; i < params_.size(); ++i) {
    if (absl::Status s = read(names_[i] + ".exp_avg", exp_avg_[i]); !s.ok()) return s;
    if (absl::Status s = read(names_[i] + ".exp_avg_sq", exp_avg_sq_[i]); !s.ok()) return s;
  }
  return absl::OkStatus();
}

// --- Flags -----------------------------------------------------------------

const char kTrainUsage[] = R"(infoflow-train: train the engine's Model on synthetic InfoFlow documents.

Usage: infoflow-train [flags]
Data:
  --data synthetic          the only source (engine/eval/eval_set.h generator)
  --tasks LIST              multihop,needle,coref,xref,split,twohop or all (default all: the first
                            five); "mixed" =
                            documents with several facts of every task and one question per fact
                            (eval_set.h GenerateTrainingDocument); "needles" = 1..6 needles, all
                            asked; repeat a name to weight it. xref training documents ask every
                            pair of the document
  --chunks N                most chunks per document (default 6)
  --min-chunks N            fewest chunks per document (default 2)
  --curriculum-steps N      most chunks grows from --min-chunks to --chunks over N steps (0 = off)
  --chunk-words N           approximate words per chunk (default 60)
  --max-chunk-words N       words per chunk uniform in [--chunk-words, N] per document (0 = off)
  --tokenizer-docs N        documents the BPE tokenizer is trained on (default 200)
  --split-digits            tokenizer: every digit its own token (= --digit-group 1)
  --digit-group N           tokenizer: numbers cut into tokens of at most N digits (1..3), each
                            group of 2..N digits one token ("48213" -> "48" "21" "3" for N=2)
  --position-span N         positional skips: a --gap-fraction of training documents get random
                            position gaps between chunks, last position < N (0 = off)
  --gap-fraction F          (default 0.5)
Model (llama; head_dim = hidden / heads):
  --layers 2 --hidden 64 --heads 4 --kv-heads 2 --ffn 128 --vocab 1024 --rope-theta 10000
  --tie-embeddings          the LM head is the embedding matrix (tie_word_embeddings)
  --seq-len 512             longest document in tokens (fewer chunks are used to fit)
Optimization:
  --steps 100 --batch 4 --lr 3e-3 --min-lr-ratio 0.1 --warmup 10 --weight-decay 0.1 --clip 1.0
  --context-weight 1.0      loss weight of targets before the answer (0 = answer-only loss)
  --answer-weight 1.0       loss weight of the answer targets (" answer", "\n", "</s>")
  --threads 1 --seed 0        --threads: CPU cores for the math in all
  --workers N               documents of a batch run on N threads at once (gradients are summed
                            in document order, so results do not depend on N; default 1)
Output:
  --out DIR                 checkpoint directory (HF layout Model::Load reads, + optimizer state)
  --resume                  continue from --out if it holds a checkpoint
  --init-from DIR           fine-tune: start from DIR's weights and tokenizer (architecture flags
                            are taken from it) with a fresh optimizer at step 0
  --until N                 stop (and save) after step N; the LR schedule still spans --steps, so a
                            run can change its data flags between --resume phases
  --eval-every N            held-out teacher-forced eval every N steps (and at the end)
  --eval-docs 32 --save-every N --log-every 1
)";

absl::Status ParseTrainFlags(int argc, char** argv, TrainOptions* o, bool* help) {
  std::string tasks = "all", data = "synthetic";
  FlagTable flags;
  flags.ints = {
      {"--chunks", &o->chunks},         {"--min-chunks", &o->min_chunks},
      {"--curriculum-steps", &o->curriculum_steps},
      {"--chunk-words", &o->chunk_words}, {"--tokenizer-docs", &o->tokenizer_docs},
      {"--digit-group", &o->max_digits},
      {"--max-chunk-words", &o->max_chunk_words}, {"--position-span", &o->position_span},
      {"--layers", &o->layers},         {"--hidden", &o->hidden},
      {"--heads", &o->heads},           {"--kv-heads", &o->kv_heads},
      {"--ffn", &o->ffn},               {"--vocab", &o->vocab},
      {"--seq-len", &o->seq_len},       {"--steps", &o->steps},
      {"--batch", &o->batch},           {"--warmup", &o->warmup},
      {"--threads", &o->threads},       {"--eval-every", &o->eval_every},
      {"--workers", &o->workers},       {"--until", &o->until},
      {"--eval-docs", &o->eval_docs},   {"--save-every", &o->save_every},
      {"--log-every", &o->log_every}};
  flags.doubles = {
      {"--lr", &o->lr},
      {"--min-lr-ratio", &o->min_lr_ratio},
      {"--weight-decay", &o->weight_decay},
      {"--clip", &o->clip},
      {"--context-weight", &o->context_weight},
      {"--answer-weight", &o->answer_weight},
      {"--gap-fraction", &o->gap_fraction},
      {"--rope-theta", &o->rope_theta}};
  flags.strings = {
      {"--out", &o->out}, {"--tasks", &tasks}, {"--data", &data}, {"--init-from", &o->init_from}};
  flags.uint64s = {{"--seed", &o->seed}};
  bool split_digits = false;
  flags.switches = {{"--resume", &o->resume},
                    {"--split-digits", &split_digits},
                    {"--tie-embeddings", &o->tie_embeddings}};
  if (absl::Status s = flags.Parse(argc, argv, help); !s.ok() || *help) return s;
  if (split_digits) o->max_digits = 1;
  if (data != "synthetic") return absl::InvalidArgumentError("--data: only 'synthetic' is supported");
  if (tasks == "all") {
    o->tasks = EvalTaskNames();
  } else {
    o->tasks = absl::StrSplit(tasks, ',', absl::SkipWhitespace());
  }
  if (o->tasks.empty()) return absl::InvalidArgumentError("--tasks is empty");
  return absl::OkStatus();
}

}  // namespace infoflow
