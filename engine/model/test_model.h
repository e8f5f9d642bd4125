// Deterministic tiny models in Hugging Face format, made by project code, for
// tests, demos and benchmarks (no checkpoint can be downloaded here).
#ifndef INFOFLOW_ENGINE_MODEL_TEST_MODEL_H_
#define INFOFLOW_ENGINE_MODEL_TEST_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/checkpoint/model_config.h"

namespace infoflow {

struct TestModelSpec {
  // llama | qwen2 (QKV bias) | qwen3 (q/k norm) | glm (QKV bias, fused
  // gate_up, partial interleaved RoPE) | glm4 (glm + sandwich norms). Start
  // from DefaultTestModelSpec(type) to get the family's special tokens.
  std::string model_type = "llama";
  int64_t vocab_size = 512;          // >= 256 + special tokens: byte-level BPE
  int64_t hidden_size = 64;
  int64_t num_layers = 4;
  int64_t num_heads = 4;
  int64_t num_kv_heads = 2;
  int64_t intermediate_size = 128;
  int64_t max_position_embeddings = 4096;
  double rope_theta = 10000.0;
  bool llama3_rope_scaling = false;  // Llama-3.1 style rope_scaling block
  bool tie_word_embeddings = false;
  // glm/glm4 only (the other types rotate the whole head): config.json's
  // partial_rotary_factor; RoPE rotates int(head_dim * factor) dims.
  double partial_rotary_factor = 0.5;
  std::string dtype = "f32";  // stored dtype: f32 | bf16 | f16
  // Number of safetensors files: 1 writes model.safetensors; N > 1 writes
  // model-0000i-of-0000N.safetensors and model.safetensors.index.json (the
  // Hugging Face sharded layout), the tensors split in name order.
  int shards = 1;
  uint64_t seed = 0;
  // A tokenizer.json to ship instead of training one (e.g. a real Qwen3 or
  // Llama-3 file); the vocabulary grows to its size when that is larger.
  std::string tokenizer_json_path;
  // Spellings of the special tokens in the tokenizer: the BOS ("" = the
  // config has no bos_token_id), config.json's eos_token_id, and the
  // generation_config.json eos_token_id (that file is written only when this
  // is non-empty).
  std::string bos_token = "<s>";
  std::vector<std::string> eos_tokens = {"</s>"};
  std::vector<std::string> generation_eos_tokens;
  // config.json's pad_token_id ("" = none).
  std::string pad_token;
};

// The spec for `model_type` with its family's special tokens: for glm/glm4
// GLM-4's ([gMASK], <sop>, <|system|>, <|user|>, <|assistant|>, ... in the
// trained tokenizer; no bos_token_id; eos <|endoftext|>, <|user|>,
// <|observation|> as GLM-4's config.json lists; pad <|endoftext|>), else
// the LLaMA-style defaults above (<s>, </s>).
TestModelSpec DefaultTestModelSpec(const std::string& model_type);

// The ModelConfig `spec` describes.
ModelConfig TestModelConfig(const TestModelSpec& spec);

// Writes config.json, model.safetensors (random weights drawn from `seed`)
// and tokenizer.json (a byte-level BPE trained on a fixed built-in English
// corpus, or a copy of spec.tokenizer_json_path) into `dir`, creating it, and
// generation_config.json when spec.generation_eos_tokens is set.
// InvalidArgument when a named special token is not in the tokenizer.
// Same spec (and tokenizer file) => byte-identical files.
absl::Status WriteTestModel(const std::string& dir, const TestModelSpec& spec);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_TEST_MODEL_H_
