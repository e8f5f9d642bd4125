// Model::Load: Hugging Face directory -> ModelConfig + ModelWeights.
#include <ATen/ATen.h>
#include <openssl/evp.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/model/model.h"
#include "engine/checkpoint/safetensors.h"

namespace infoflow {
namespace {

class WeightReader {
 public:
  WeightReader(const SafetensorsModel& st, c10::Device device, c10::ScalarType dtype)
      : st_(st), device_(device), dtype_(dtype) {}

  // Loads `name`, checking its shape; converts to the compute dtype/device.
  absl::StatusOr<at::Tensor> Read(const std::string& name, std::vector<int64_t> shape) const {
    const TensorInfo* info = st_.Find(name);
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("tensor '", name, "' missing in ", st_.path()));
    }
    if (info->shape != shape) {
      return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' has shape [",
                                                     absl::StrJoin(info->shape, ","),
                                                     "], expected [", absl::StrJoin(shape, ","),
                                                     "]"));
    }
    at::Tensor f32 = at::empty(shape, at::kFloat);
    ConvertToF32(info->dtype, info->data, static_cast<size_t>(info->NumElements()),
                 f32.data_ptr<float>());
    return f32.to(device_, dtype_);
  }
  bool Has(const std::string& name) const { return st_.Find(name) != nullptr; }

 private:
  const SafetensorsModel& st_;
  c10::Device device_;
  c10::ScalarType dtype_;
};

#define ASSIGN_OR_RETURN_TENSOR(lhs, expr) \
  do {                                     \
    auto _r = (expr);                      \
    if (!_r.ok()) return _r.status();      \
    lhs = *std::move(_r);                  \
  } while (0)

// Tensor names are Hugging Face's: LlamaForCausalLM's for llama/mistral/
// qwen2/qwen3; GlmForCausalLM / Glm4ForCausalLM's for glm/glm4, which differ
// only in the fused mlp.gate_up_proj ([2 * intermediate, d], gate rows
// first: HF GlmMLP chunks its output into gate, up), no o_proj bias, and
// (glm4) post_self_attn_layernorm / post_mlp_layernorm.
absl::StatusOr<ModelWeights> ReadWeights(const ModelConfig& c, const WeightReader& r) {
  const int64_t d = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, ff = c.intermediate_size;
  const bool glm = c.model_type == "glm" || c.model_type == "glm4";
  ModelWeights w;
  ASSIGN_OR_RETURN_TENSOR(w.embed, r.Read("model.embed_tokens.weight", {c.vocab_size, d}));
  ASSIGN_OR_RETURN_TENSOR(w.final_norm, r.Read("model.norm.weight", {d}));
  if (c.tie_word_embeddings || !r.Has("lm_head.weight")) {
    w.lm_head = w.embed;
  } else {
    ASSIGN_OR_RETURN_TENSOR(w.lm_head, r.Read("lm_head.weight", {c.vocab_size, d}));
  }
  for (int l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    LayerWeights lw;
    at::Tensor q, k, v, gate, up;
    ASSIGN_OR_RETURN_TENSOR(lw.attn_norm, r.Read(p + "input_layernorm.weight", {d}));
    ASSIGN_OR_RETURN_TENSOR(q, r.Read(p + "self_attn.q_proj.weight", {nh * hd, d}));
    ASSIGN_OR_RETURN_TENSOR(k, r.Read(p + "self_attn.k_proj.weight", {nkv * hd, d}));
    ASSIGN_OR_RETURN_TENSOR(v, r.Read(p + "self_attn.v_proj.weight", {nkv * hd, d}));
    lw.wqkv = at::cat({q, k, v}, 0);
    if (c.attention_bias) {
      at::Tensor bq, bk, bv;
      ASSIGN_OR_RETURN_TENSOR(bq, r.Read(p + "self_attn.q_proj.bias", {nh * hd}));
      ASSIGN_OR_RETURN_TENSOR(bk, r.Read(p + "self_attn.k_proj.bias", {nkv * hd}));
      ASSIGN_OR_RETURN_TENSOR(bv, r.Read(p + "self_attn.v_proj.bias", {nkv * hd}));
      lw.bqkv = at::cat({bq, bk, bv}, 0);
    }
    if (c.qk_norm) {
      ASSIGN_OR_RETURN_TENSOR(lw.q_norm, r.Read(p + "self_attn.q_norm.weight", {hd}));
      ASSIGN_OR_RETURN_TENSOR(lw.k_norm, r.Read(p + "self_attn.k_norm.weight", {hd}));
    }
    ASSIGN_OR_RETURN_TENSOR(lw.wo, r.Read(p + "self_attn.o_proj.weight", {d, nh * hd}));
    // Hugging Face Llama/Mistral bias o_proj too when attention_bias is set;
    // Qwen2 and GLM bias only q/k/v.
    if (c.attention_bias && c.model_type != "qwen2" && !glm) {
      ASSIGN_OR_RETURN_TENSOR(lw.bo, r.Read(p + "self_attn.o_proj.bias", {d}));
    }
    ASSIGN_OR_RETURN_TENSOR(lw.mlp_norm, r.Read(p + "post_attention_layernorm.weight", {d}));
    if (glm) {
      ASSIGN_OR_RETURN_TENSOR(lw.w_gate_up, r.Read(p + "mlp.gate_up_proj.weight", {2 * ff, d}));
    } else {
      ASSIGN_OR_RETURN_TENSOR(gate, r.Read(p + "mlp.gate_proj.weight", {ff, d}));
      ASSIGN_OR_RETURN_TENSOR(up, r.Read(p + "mlp.up_proj.weight", {ff, d}));
      lw.w_gate_up = at::cat({gate, up}, 0);
    }
    ASSIGN_OR_RETURN_TENSOR(lw.w_down, r.Read(p + "mlp.down_proj.weight", {d, ff}));
    if (c.sandwich_norms) {
      ASSIGN_OR_RETURN_TENSOR(lw.post_attn_norm,
                              r.Read(p + "post_self_attn_layernorm.weight", {d}));
      ASSIGN_OR_RETURN_TENSOR(lw.post_mlp_norm, r.Read(p + "post_mlp_layernorm.weight", {d}));
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

// SHA-256 over config.json, every tensor's name/dtype/shape and the first
// bytes of its data: a different checkpoint never shares chunk keys.
std::string Fingerprint(const std::string& config_text, const SafetensorsModel& st) {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr);
  EVP_DigestUpdate(ctx, config_text.data(), config_text.size());
  for (const std::string& name : st.Names()) {
    const TensorInfo* t = st.Find(name);
    std::string desc = absl::StrCat(name, ":", std::string(DTypeName(t->dtype)), ":",
                                    absl::StrJoin(t->shape, ","), ";");
    EVP_DigestUpdate(ctx, desc.data(), desc.size());
    EVP_DigestUpdate(ctx, t->data, std::min<size_t>(t->nbytes, 256));
  }
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_DigestFinal_ex(ctx, digest, &len);
  EVP_MD_CTX_free(ctx);
  static const char* kHex = "0123456789abcdef";
  std::string hex;
  for (unsigned int i = 0; i < len; ++i) {
    hex.push_back(kHex[digest[i] >> 4]);
    hex.push_back(kHex[digest[i] & 15]);
  }
  return hex;
}

absl::StatusOr<c10::ScalarType> ResolveDtype(const std::string& name, c10::Device device,
                                             const ModelConfig& c) {
  if (name == "f32" || name == "float32") return at::kFloat;
  if (name == "bf16" || name == "bfloat16") return at::kBFloat16;
  if (name == "f16" || name == "float16") return at::kHalf;
  if (name != "auto") {
    return absl::InvalidArgumentError("dtype must be auto, f32, bf16 or f16, got '" + name + "'");
  }
  if (device.is_cpu()) return at::kFloat;
  if (c.torch_dtype == "float16") return at::kHalf;
  if (c.torch_dtype == "float32") return at::kFloat;
  return at::kBFloat16;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& dir,
                                                   const LoadOptions& options) {
  std::ifstream in(dir + "/config.json");
  if (!in) return absl::NotFoundError("cannot read " + dir + "/config.json");
  std::stringstream text;
  text << in.rdbuf();
  absl::StatusOr<ModelConfig> config = ParseModelConfig(text.str());
  if (!config.ok()) {
    return absl::Status(config.status().code(),
                        absl::StrCat(dir, "/config.json: ", config.status().message()));
  }
  // generation_config.json (optional) adds stop ids: Llama-3.x lists
  // <|eot_id|> there, Qwen <|im_end|>/<|endoftext|>.
  if (std::ifstream gen(dir + "/generation_config.json"); gen) {
    std::stringstream gen_text;
    gen_text << gen.rdbuf();
    absl::StatusOr<std::vector<int64_t>> eos = ParseGenerationConfigEos(gen_text.str());
    if (!eos.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir, "/generation_config.json: ", eos.status().message()));
    }
    for (int64_t id : *eos) {
      if (id < 0 || id >= config->vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat(dir, "/generation_config.json: eos_token_id ", id,
                         " is outside the vocabulary [0, ", config->vocab_size, ")"));
      }
    }
    config->generation_eos_token_ids = *std::move(eos);
  }
  absl::StatusOr<c10::Device> device = ResolveDevice(options.device);
  if (!device.ok()) return device.status();
  absl::StatusOr<c10::ScalarType> dtype = ResolveDtype(options.dtype, *device, *config);
  if (!dtype.ok()) return dtype.status();
  absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(dir);
  if (!st.ok()) return st.status();
  absl::StatusOr<ModelWeights> weights = ReadWeights(*config, WeightReader(**st, *device, *dtype));
  if (!weights.ok()) return weights.status();
  auto model = std::make_unique<Model>(*std::move(config), *std::move(weights), *device, *dtype);
  model->set_fingerprint(Fingerprint(text.str(), **st));
  return model;
}

}  // namespace infoflow
