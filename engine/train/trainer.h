// infoflow-train: trains the engine's own Model class (engine/model/model.h) on the
// synthetic multihop / needle / coref / xref documents of engine/eval/eval_set.h.
//
// The trainable parameters are the fused tensors Model runs with (wqkv,
// w_gate_up, ...), as leaf tensors with requires_grad. They are wrapped in an
// infoflow::Model once; every batch item runs Model::Forward with a fresh
// KvCache and ForwardOptions::Logits::kAll, so training exercises exactly the
// inference code (RoPE, GQA, position mask, cache writes).
//
// A training document is tokenized the way infoflow-eval builds FULL's input:
//   [<s>] + Encode(chunk_1) + ... + Encode(chunk_n)
//         + Encode("\nQuestion: " + question + "\nAnswer:")
//         + Encode(" " + answer + "\n") + [</s>]
// Loss: next-token cross-entropy at every position, weight `context_weight`
// for targets before the answer and `answer_weight` for the answer targets
// (" answer", "\n", "</s>"), normalized by the summed weights of the batch.
// context_weight = 0 trains on answers only.
//
// Optimizer: AdamW written on at::Tensors (decoupled weight decay on matrices
// only), global-norm gradient clipping, linear warmup then cosine decay to
// min_lr_ratio * lr. Data for (step, batch index) is a pure function of the
// seed, so a resumed run sees the same stream as an uninterrupted one.
//
// Checkpoints (Save / --out DIR) are a Hugging Face directory that
// Model::Load reads: config.json, model.safetensors (q/k/v and gate/up
// unfused), tokenizer.json; plus optimizer.safetensors (AdamW moments, step)
// and trainer_state.json for resuming.
#ifndef INFOFLOW_ENGINE_TRAIN_TRAINER_H_
#define INFOFLOW_ENGINE_TRAIN_TRAINER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/model.h"
#include "engine/text/tokenizer.h"

namespace infoflow {

struct TrainOptions {
  // Data (engine/eval/eval_set.h generator).
  std::vector<std::string> tasks = {"multihop", "needle", "coref"};
  int chunks = 6;            // most chunks per document
  int min_chunks = 2;        // fewest chunks per document
  int curriculum_steps = 0;  // the most chunks grows min_chunks -> chunks over these steps
  int chunk_words = 60;
  int max_chunk_words = 0;   // > chunk_words: words per chunk uniform in [chunk_words, this]
  int tokenizer_docs = 200;  // generated documents the BPE tokenizer is trained on
  // Tokenizer: numbers cut into tokens of at most this many digits (0 = GPT-2
  // rule). 1 = one token per digit; 2 = "48213" -> "48" "21" "3", with every
  // group of 2..max_digits digits guaranteed a token of its own.
  int max_digits = 0;
  // Positional skips (PoSE-style): with probability gap_fraction a training
  // document's chunks get random position gaps between them so its last
  // context position is uniform in [T, position_span); the question follows
  // the last chunk without a gap. Teaches distances beyond seq_len cheaply.
  int position_span = 0;     // 0 = contiguous positions only
  double gap_fraction = 0.5;
  // Model (llama architecture; head_dim = hidden / heads).
  int layers = 2;
  int hidden = 64;
  int heads = 4;
  int kv_heads = 2;
  int ffn = 128;
  int vocab = 1024;
  int seq_len = 512;  // longest training document (tokens); longer ones get fewer chunks
  double rope_theta = 10000.0;
  bool tie_embeddings = false;
  // Optimization.
  int steps = 100;
  int batch = 4;
  double lr = 3e-3;
  double min_lr_ratio = 0.1;
  int warmup = 10;
  double weight_decay = 0.1;
  double beta1 = 0.9, beta2 = 0.95, adam_eps = 1e-8;
  double clip = 1.0;
  double context_weight = 1.0;
  double answer_weight = 1.0;
  int threads = 1;  // CPU cores for the math (engine/model/runtime.h), shared by the workers
  int workers = 1;  // documents of a batch processed concurrently
  uint64_t seed = 0;
  // Output.
  std::string out;       // checkpoint directory ("" = none)
  bool resume = false;   // continue from `out` when it holds a checkpoint
  std::string init_from; // fine-tune: start from this checkpoint's weights at step 0
  int until = 0;         // > 0: stop after this step (schedule still spans `steps`)
  int eval_every = 0;    // 0 = only at the end
  int eval_docs = 32;
  int save_every = 0;    // 0 = only at the end
  int log_every = 1;
};

struct Document {
  std::vector<int64_t> tokens;
  std::vector<int64_t> positions;  // [tokens.size()]; ascending, 0..T-1 when no gaps
  std::vector<float> weights;  // [tokens.size() - 1]: loss weight of target t+1
  std::vector<uint8_t> answer;  // [tokens.size() - 1]: 1 if target t+1 is an answer token
  int chunks = 0;
  std::string task;
};

struct StepStats {
  int step = 0;           // steps done after this one
  double loss = 0;        // weighted loss that was optimized
  double answer_loss = 0; // mean CE over answer targets
  double lr = 0;
  double grad_norm = 0;   // before clipping
  int64_t tokens = 0;     // tokens forwarded
  double seconds = 0;
};

struct EvalStats {
  double loss = 0;         // mean CE over all targets
  double answer_loss = 0;  // mean CE over answer targets
  double answer_acc = 0;   // answer targets whose argmax is right
  double exact = 0;        // documents whose answer targets are all right (= greedy EM)
  int docs = 0;
};

class Trainer {
 public:
  // New model and tokenizer, or (options.resume and options.out holds a
  // checkpoint) the checkpoint's model, tokenizer, optimizer and step, or
  // (options.init_from) another checkpoint's model and tokenizer with a
  // fresh optimizer at step 0 (fine-tuning); the architecture flags are then
  // taken from the checkpoint.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const TrainOptions& options);

  // One optimizer step over `options.batch` documents.
  StepStats Step();
  // Steps until options.steps, logging to `log`, evaluating and saving as
  // the options say (and at the end).
  absl::Status Train(std::ostream& log);
  // Teacher-forced evaluation on `n` held-out documents (a seed stream
  // disjoint from training's).
  EvalStats Evaluate(int n);
  absl::Status Save(const std::string& dir) const;

  // Document `index` of step `step` (deterministic in the seed).
  Document TrainDocument(int step, int index) const;
  Document EvalDocument(int index) const;
  // Per-target CE [T-1] of `doc` under the current weights.
  at::Tensor TargetLosses(const Document& doc, at::Tensor* logits_out = nullptr) const;

  const Model& model() const { return *model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  const TrainOptions& options() const { return options_; }
  int step() const { return step_; }
  double LearningRate(int step) const;
  int MaxChunksAt(int step) const;
  int64_t num_parameters() const;

 private:
  Trainer() = default;
  // task_override "" = pick from options.tasks by the key.
  Document MakeDocument(uint64_t key, int max_chunks, bool training,
                        const std::string& task_override) const;
  void InitWeights();
  void CollectParameters();
  // Weights and tokenizer of the checkpoint in `dir`; fresh AdamW moments.
  absl::Status LoadWeights(const std::string& dir);
  // LoadWeights, then the optimizer moments and step saved beside them.
  absl::Status LoadCheckpoint(const std::string& dir);

  TrainOptions options_;
  ModelConfig config_;
  std::string tokenizer_json_;
  std::unique_ptr<Tokenizer> tokenizer_;
  int64_t bos_ = 0, eos_ = 1;
  ModelWeights weights_;
  std::unique_ptr<Model> model_;
  std::vector<std::string> names_;    // parameter names (fused layout)
  std::vector<at::Tensor> params_;    // leaf tensors, requires_grad
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_;
  int step_ = 0;
};

// The options flags parse into; InvalidArgument naming the flag on error.
// Sets *help for --help.
absl::Status ParseTrainFlags(int argc, char** argv, TrainOptions* options, bool* help);
extern const char kTrainUsage[];

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TRAIN_TRAINER_H_
