// The architecture hyper-parameters of a LLaMA-family model, read from a
// Hugging Face config.json, torch-free.
//
// Supported model_type values: llama, mistral, qwen2, qwen3, glm, glm4 (HF
// transformers' GlmForCausalLM / Glm4ForCausalLM; not the older remote-code
// "chatglm" layout). Differences the forward pass must honor are explicit
// fields here (attention_bias, qk_norm, head_dim, rope_scaling,
// partial_rotary_factor, rope_interleaved, sandwich_norms) rather than checks
// of model_type elsewhere; only the loader maps model_type to tensor names.
//
// All functions are pure and thread-safe.

#ifndef INFOFLOW_ENGINE_CHECKPOINT_MODEL_CONFIG_H_
#define INFOFLOW_ENGINE_CHECKPOINT_MODEL_CONFIG_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace infoflow {

// config.json "rope_scaling". kNone when absent, null, or rope_type
// "default".
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;  // kLinear and kLlama3.
  // kLlama3 only:
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;  // "llama", "mistral", "qwen2", "qwen3", "glm", "glm4".
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  // Defaults to num_attention_heads, except glm/glm4: 2 (HF GlmConfig).
  int64_t num_key_value_heads = 0;
  // Defaults to hidden_size / num_attention_heads, except glm/glm4: 128 (HF
  // GlmConfig's default, which GlmAttention then uses).
  int64_t head_dim = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  // Share of each head's dims that RoPE rotates: the first RotaryDim(config)
  // = int(head_dim * partial_rotary_factor) dims rotate, the rest pass
  // through unchanged. 1.0 except glm/glm4 (default 0.5); anything but 1.0
  // is refused for the other model types, whose HF code has no partial RoPE.
  double partial_rotary_factor = 1.0;
  // RoPE pairing. false: rotate-half, dim i pairs with i + rotary_dim/2
  // (LLaMA/Qwen). true: interleaved, dim 2i pairs with 2i+1, both at
  // frequency i (HF GLM's rotate_half over x[..., 0::2], x[..., 1::2] with
  // cos/sin repeat_interleave'd). Set from model_type: true for glm/glm4.
  bool rope_interleaved = false;
  int64_t max_position_embeddings = 0;  // Defaults per model_type.
  bool tie_word_embeddings = false;
  // Bias on the q/k/v projections. Default: true for qwen2, glm and glm4,
  // false otherwise; an explicit "attention_bias" wins. Llama/Mistral then
  // bias o_proj too; Qwen2 and GLM never do (the loader knows which).
  bool attention_bias = false;
  // Per-head RMSNorm on q and k before RoPE (q_norm/k_norm weights); qwen3.
  bool qk_norm = false;
  // GLM-4's "sandwich" norms: an RMSNorm on the attention output
  // (post_self_attn_layernorm) and on the MLP output (post_mlp_layernorm),
  // each applied before its residual add. Set from model_type: glm4.
  bool sandwich_norms = false;
  std::string hidden_act = "silu";  // Only "silu" is accepted.
  std::optional<int64_t> bos_token_id;
  std::vector<int64_t> eos_token_ids;  // "eos_token_id": int or list.
  std::optional<int64_t> pad_token_id;  // Kept for the config round trip only.
  // generation_config.json's "eos_token_id" (int or list), which often lists
  // more than config.json (Llama-3 <|eot_id|>, Qwen <|im_end|>). Not part of
  // config.json: Model::Load reads it from the model directory when present.
  std::vector<int64_t> generation_eos_token_ids;
  std::string torch_dtype;  // "float32", "bfloat16", ... or "" if absent.
};

// The number of leading dims of each head that RoPE rotates:
// int(head_dim * partial_rotary_factor), truncated as Python's int() does
// (HF: dim = int(head_dim * partial_rotary_factor)). head_dim unless partial.
int64_t RotaryDim(const ModelConfig& config);

// Parses the text of a config.json. Returns InvalidArgument, with a message
// naming the offending field, for invalid JSON, an unsupported model_type or
// rope_scaling type, a missing or non-positive size, or inconsistent sizes
// (num_attention_heads % num_key_value_heads != 0, hidden_size not divisible
// by num_attention_heads when head_dim is not given, odd head_dim, a
// partial_rotary_factor outside (0, 1] or giving an odd rotary dim, or one
// other than 1 on a model type without partial RoPE), and for fields whose
// values the forward does not implement (hidden_act other than silu,
// mlp_bias true). "rope_parameters" (the transformers v5 spelling) is read
// like rope_theta + partial_rotary_factor + rope_scaling.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json);

// Reads and parses the config.json at `path` (a file, or a directory holding
// config.json). Errors are those of ParseModelConfig prefixed with the path,
// or NotFound if the file cannot be read.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path);

// The "eos_token_id" of a generation_config.json text (an integer, a list of
// integers, or absent/null: none). InvalidArgument for invalid JSON or a
// non-integer id.
absl::StatusOr<std::vector<int64_t>> ParseGenerationConfigEos(std::string_view json);

// The ids that end generation: config.json's eos_token_ids, then the
// generation_config.json ones not already listed (a union, in that order).
std::vector<int64_t> StopTokenIds(const ModelConfig& config);

// Serializes `config` as a Hugging Face compatible config.json (pretty
// printed, with "architectures" set from model_type) that ParseModelConfig
// reads back to an equal config.
std::string ModelConfigToJson(const ModelConfig& config);

// The RotaryDim / 2 RoPE inverse frequencies, with rope_scaling applied the
// way Hugging Face transformers does (_compute_default_rope_parameters,
// _compute_linear_scaling_rope_parameters, _compute_llama3_parameters):
//   inv_freq[i] = 1 / rope_theta^(2i / rotary_dim)   (rotary_dim = RotaryDim)
//   linear: inv_freq[i] / factor
//   llama3: with wavelen = 2*pi / inv_freq[i],
//           high_wl = original_max / high_freq_factor,
//           low_wl = original_max / low_freq_factor:
//     wavelen < high_wl  -> inv_freq[i]
//     wavelen > low_wl   -> inv_freq[i] / factor
//     otherwise          -> (1 - s) * inv_freq[i] / factor + s * inv_freq[i],
//                           s = (original_max / wavelen - low_freq_factor) /
//                               (high_freq_factor - low_freq_factor)
// Computed in double; transformers computes in float32, so values agree to
// float precision (relative ~1e-7), not bit for bit.
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHECKPOINT_MODEL_CONFIG_H_
