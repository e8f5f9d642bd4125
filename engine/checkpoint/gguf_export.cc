#include "engine/checkpoint/gguf_export.h"

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/checkpoint/model_config.h"
#include "engine/checkpoint/safetensors.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using nlohmann::json;

// llama.cpp token types (llama_token_type).
constexpr int32_t kTokenNormal = 1;
constexpr int32_t kTokenControl = 3;
constexpr int32_t kTokenUserDefined = 4;
constexpr int32_t kTokenUnused = 5;

// The split regexes of the Llama-3 and Qwen2 tokenizer.json files, whose
// llama.cpp pre-tokenizers ("llama-bpe", "qwen2") implement the same rule.
constexpr char kLlama3Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr char kQwen2Regex[] =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

bool IsByteLevel(const json& p) { return p.is_object() && p.value("type", "") == "ByteLevel"; }

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tensor `name` as float32, checked to have `shape`.
absl::StatusOr<std::vector<float>> ReadF32(const SafetensorsModel& st, const std::string& name,
                                           const std::vector<int64_t>& shape) {
  absl::StatusOr<const TensorInfo*> t = st.Get(name);
  if (!t.ok()) return t.status();
  if ((*t)->shape != shape) {
    std::string want, got;
    for (int64_t d : shape) absl::StrAppend(&want, want.empty() ? "" : ",", d);
    for (int64_t d : (*t)->shape) absl::StrAppend(&got, got.empty() ? "" : ",", d);
    return absl::InvalidArgumentError(
        absl::StrCat(name, " has shape [", got, "], want [", want, "]"));
  }
  switch ((*t)->dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(name, " has dtype ", DTypeName((*t)->dtype),
                                                     "; only F32, F16, BF16 are exported"));
  }
  std::vector<float> out(static_cast<size_t>((*t)->NumElements()));
  ConvertToF32((*t)->dtype, (*t)->data, out.size(), out.data());
  return out;
}

// Adds `w` (HF row-major `hf_shape`) as a GGUF tensor: dims reversed, F16
// when requested and the tensor is a matrix.
absl::Status AddWeight(gguf::GgufWriter* w, const std::string& name, const std::vector<float>& data,
                       const std::vector<int64_t>& hf_shape, gguf::TensorType dtype) {
  const std::vector<int64_t> dims(hf_shape.rbegin(), hf_shape.rend());
  if (dtype == gguf::TensorType::kF16 && hf_shape.size() >= 2) {
    std::vector<uint16_t> h(data.size());
    for (size_t i = 0; i < data.size(); ++i) h[i] = F32ToF16(data[i]);
    return w->AddTensor(name, dims, gguf::TensorType::kF16, h.data(), h.size() * 2);
  }
  return w->AddTensor(name, dims, gguf::TensorType::kF32, data.data(), data.size() * 4);
}

// Tokenizer metadata (tokenizer.ggml.*) from tokenizer.json.
absl::Status AddTokenizer(gguf::GgufWriter* w, const std::string& tokenizer_json,
                          const ModelConfig& c, const GgufExportOptions& options,
                          GgufExportSummary* summary) {
  const json t = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (t.is_discarded() || !t.is_object() || !t.contains("model") || !t["model"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json is not a tokenizer object");
  }
  const json& model = t["model"];
  const bool byte_level = t.contains("decoder") && IsByteLevel(t["decoder"]);
  if (model.value("type", "") != "BPE" || !byte_level) {
    return absl::InvalidArgumentError(
        "only byte-level BPE tokenizers (GPT-2 style, ByteLevel decoder) are exported; this "
        "tokenizer.json is not one (SentencePiece-style export is not implemented)");
  }
  std::string pre = options.tokenizer_pre;
  if (pre.empty()) {
    absl::StatusOr<std::string> detected = DetectLlamaCppPreTokenizer(tokenizer_json);
    if (!detected.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          detected.status().message(),
          "; llama.cpp has no pre-tokenizer with this rule. Pass --tokenizer-pre NAME (e.g. gpt-2) "
          "to export anyway: token ids fed directly are unaffected, but llama.cpp may tokenize "
          "text differently"));
    }
    pre = *detected;
  } else {
    summary->notes.push_back(absl::StrCat("tokenizer.ggml.pre = ", pre,
                                          " as given (llama.cpp's split rule may differ from the "
                                          "tokenizer.json's)"));
  }
  if (t.contains("normalizer") && !t["normalizer"].is_null()) {
    summary->notes.push_back("tokenizer.json has a normalizer, which llama.cpp does not apply");
  }
  summary->tokenizer_pre = pre;

  const int64_t n_vocab = c.vocab_size;
  std::vector<std::string> tokens(static_cast<size_t>(n_vocab));
  std::vector<int32_t> types(static_cast<size_t>(n_vocab), kTokenUnused);
  auto place = [&](const std::string& text, int64_t id, int32_t type) -> absl::Status {
    if (id < 0 || id >= n_vocab) {
      return absl::InvalidArgumentError(absl::StrCat("token '", text, "' has id ", id,
                                                     " outside the model's vocab_size ", n_vocab));
    }
    tokens[static_cast<size_t>(id)] = text;
    types[static_cast<size_t>(id)] = type;
    return absl::OkStatus();
  };
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return absl::InvalidArgumentError("tokenizer.json model.vocab is not an object");
  }
  for (const auto& [text, id] : model["vocab"].items()) {
    if (!id.is_number_integer())
      return absl::InvalidArgumentError("non-integer vocab id for " + text);
    if (absl::Status s = place(text, id.get<int64_t>(), kTokenNormal); !s.ok()) return s;
  }
  if (t.contains("added_tokens") && t["added_tokens"].is_array()) {
    for (const json& a : t["added_tokens"]) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return absl::InvalidArgumentError("malformed added_tokens entry in tokenizer.json");
      }
      const int32_t type = a.value("special", false) ? kTokenControl : kTokenUserDefined;
      if (absl::Status s = place(a["content"].get<std::string>(), a["id"].get<int64_t>(), type);
          !s.ok()) {
        return s;
      }
    }
  }
  int64_t padded = 0;
  for (int64_t i = 0; i < n_vocab; ++i) {
    if (types[static_cast<size_t>(i)] == kTokenUnused) {
      tokens[static_cast<size_t>(i)] = absl::StrCat("[PAD", i, "]");
      ++padded;
    }
  }
  if (padded > 0) {
    summary->notes.push_back(absl::StrCat(padded,
                                          " ids above the tokenizer's vocabulary written as "
                                          "[PAD<id>] (UNUSED)"));
  }
  std::vector<std::string> merges;
  if (model.contains("merges") && model["merges"].is_array()) {
    for (const json& m : model["merges"]) {
      if (m.is_string()) {
        merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
      } else {
        return absl::InvalidArgumentError("malformed merge in tokenizer.json");
      }
    }
  }
  // BOS is added by encode(add_special) when the post_processor's template
  // starts with a special token (TemplateProcessing).
  bool add_bos = false;
  if (t.contains("post_processor") && t["post_processor"].is_object()) {
    const json& pp = t["post_processor"];
    add_bos = pp.value("type", "") == "TemplateProcessing" && pp.contains("single") &&
              pp["single"].is_array() && !pp["single"].empty() && pp["single"][0].is_object() &&
              pp["single"][0].contains("SpecialToken");
  }
  w->AddString("tokenizer.ggml.model", "gpt2");
  w->AddString("tokenizer.ggml.pre", pre);
  w->AddStringArray("tokenizer.ggml.tokens", tokens);
  w->AddInt32Array("tokenizer.ggml.token_type", types);
  w->AddStringArray("tokenizer.ggml.merges", merges);
  if (c.bos_token_id)
    w->AddUint32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*c.bos_token_id));
  if (!c.eos_token_ids.empty()) {
    w->AddUint32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(c.eos_token_ids[0]));
  }
  if (c.pad_token_id) {
    w->AddUint32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(*c.pad_token_id));
  }
  w->AddBool("tokenizer.ggml.add_bos_token", add_bos && c.bos_token_id.has_value());
  w->AddBool("tokenizer.ggml.add_eos_token", false);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> DetectLlamaCppPreTokenizer(const std::string& tokenizer_json) {
  const json t = json::parse(tokenizer_json, nullptr, /*allow_exceptions=*/false);
  if (t.is_discarded() || !t.is_object())
    return absl::InvalidArgumentError("tokenizer.json is not JSON");
  const json pre = t.value("pre_tokenizer", json());
  std::vector<json> steps;
  if (pre.is_object() && pre.value("type", "") == "Sequence" && pre.contains("pretokenizers") &&
      pre["pretokenizers"].is_array()) {
    for (const json& p : pre["pretokenizers"]) steps.push_back(p);
  } else if (pre.is_object()) {
    steps.push_back(pre);
  }
  if (steps.size() == 1 && IsByteLevel(steps[0]) && steps[0].value("use_regex", true) &&
      !steps[0].value("add_prefix_space", false)) {
    return std::string("gpt-2");
  }
  if (steps.size() == 2 && steps[0].is_object() && steps[0].value("type", "") == "Split" &&
      IsByteLevel(steps[1]) && !steps[1].value("use_regex", true) &&
      !steps[1].value("add_prefix_space", false) && steps[0].contains("pattern") &&
      steps[0]["pattern"].is_object() && steps[0]["pattern"].contains("Regex") &&
      steps[0]["pattern"]["Regex"].is_string() && steps[0].value("behavior", "") == "Isolated" &&
      !steps[0].value("invert", false)) {
    const std::string regex = steps[0]["pattern"]["Regex"].get<std::string>();
    if (regex == kLlama3Regex) return std::string("llama-bpe");
    if (regex == kQwen2Regex) return std::string("qwen2");
    return absl::NotFoundError(absl::StrCat("the tokenizer splits text with the regex ", regex));
  }
  return absl::NotFoundError(absl::StrCat("unrecognised pre_tokenizer ", pre.dump()));
}

std::vector<float> PermuteRowsForAdjacentRope(const std::vector<float>& w, int64_t n_heads,
                                              int64_t head_dim, int64_t cols) {
  std::vector<float> out(w.size());
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t i = 0; i < half; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        const float* src = w.data() + (h * head_dim + j * half + i) * cols;
        float* dst = out.data() + (h * head_dim + 2 * i + j) * cols;
        std::copy(src, src + cols, dst);
      }
    }
  }
  return out;
}

absl::StatusOr<GgufExportSummary> ExportGguf(const std::string& model_dir,
                                             const std::string& out_path,
                                             const GgufExportOptions& options) {
  absl::StatusOr<ModelConfig> config = LoadModelConfig(model_dir);
  if (!config.ok()) return config.status();
  const ModelConfig& c = *config;
  if (c.model_type != "llama" && c.model_type != "mistral") {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_type ", c.model_type,
        " cannot be exported as GGUF architecture llama (only llama and mistral: qwen2 has QKV "
        "bias, qwen3 q/k norms, glm/glm4 partial interleaved RoPE and fused gate_up)"));
  }
  if (c.attention_bias || c.qk_norm || c.sandwich_norms || c.rope_interleaved ||
      c.partial_rotary_factor != 1.0) {
    return absl::InvalidArgumentError(
        "attention_bias / q-k norms / partial or interleaved RoPE are not exported");
  }
  GgufExportSummary summary;
  gguf::GgufWriter w;
  std::string name = options.name;
  if (name.empty()) {
    name = std::filesystem::path(model_dir).lexically_normal().filename().string();
    if (name.empty()) name = std::filesystem::path(model_dir).parent_path().filename().string();
  }
  const int64_t d = c.hidden_size, nh = c.num_attention_heads, nkv = c.num_key_value_heads,
                hd = c.head_dim, ff = c.intermediate_size, v = c.vocab_size;
  w.AddString("general.architecture", "llama");
  w.AddString("general.name", name);
  w.AddUint32("general.file_type", options.dtype == gguf::TensorType::kF16 ? 1 : 0);
  w.AddUint32("llama.vocab_size", static_cast<uint32_t>(v));
  w.AddUint32("llama.context_length", static_cast<uint32_t>(c.max_position_embeddings));
  w.AddUint32("llama.embedding_length", static_cast<uint32_t>(d));
  w.AddUint32("llama.block_count", static_cast<uint32_t>(c.num_hidden_layers));
  w.AddUint32("llama.feed_forward_length", static_cast<uint32_t>(ff));
  w.AddUint32("llama.attention.head_count", static_cast<uint32_t>(nh));
  w.AddUint32("llama.attention.head_count_kv", static_cast<uint32_t>(nkv));
  w.AddUint32("llama.attention.key_length", static_cast<uint32_t>(hd));
  w.AddUint32("llama.attention.value_length", static_cast<uint32_t>(hd));
  w.AddUint32("llama.rope.dimension_count", static_cast<uint32_t>(hd));
  w.AddFloat32("llama.rope.freq_base", static_cast<float>(c.rope_theta));
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", static_cast<float>(c.rms_norm_eps));
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    w.AddString("llama.rope.scaling.type", "linear");
    w.AddFloat32("llama.rope.scaling.factor", static_cast<float>(c.rope_scaling.factor));
  }

  absl::StatusOr<std::string> tok_json = ReadFile(model_dir + "/tokenizer.json");
  if (!tok_json.ok()) return tok_json.status();
  if (absl::Status s = AddTokenizer(&w, *tok_json, c, options, &summary); !s.ok()) return s;

  absl::StatusOr<std::unique_ptr<SafetensorsModel>> st = SafetensorsModel::Open(model_dir);
  if (!st.ok()) return st.status();
  const SafetensorsModel& m = **st;
  auto copy = [&](const std::string& hf, const std::string& gg,
                  const std::vector<int64_t>& shape) -> absl::Status {
    absl::StatusOr<std::vector<float>> t = ReadF32(m, hf, shape);
    if (!t.ok()) return t.status();
    return AddWeight(&w, gg, *t, shape, options.dtype);
  };
  auto permuted = [&](const std::string& hf, const std::string& gg, int64_t heads) -> absl::Status {
    absl::StatusOr<std::vector<float>> t = ReadF32(m, hf, {heads * hd, d});
    if (!t.ok()) return t.status();
    return AddWeight(&w, gg, PermuteRowsForAdjacentRope(*t, heads, hd, d), {heads * hd, d},
                     options.dtype);
  };
  if (absl::Status s = copy("model.embed_tokens.weight", "token_embd.weight", {v, d}); !s.ok())
    return s;
  if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    // llama.cpp divides each frequency by rope_freqs[i]: the unscaled
    // inverse frequency over the scaled one.
    ModelConfig plain = c;
    plain.rope_scaling = RopeScaling();
    const std::vector<double> base = RopeInverseFrequencies(plain),
                              scaled = RopeInverseFrequencies(c);
    std::vector<float> factors(base.size());
    for (size_t i = 0; i < base.size(); ++i) factors[i] = static_cast<float>(base[i] / scaled[i]);
    if (absl::Status s = AddWeight(&w, "rope_freqs.weight", factors,
                                   {static_cast<int64_t>(factors.size())}, options.dtype);
        !s.ok()) {
      return s;
    }
  }
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    const std::string b = absl::StrCat("blk.", l, ".");
    absl::Status s = copy(p + "input_layernorm.weight", b + "attn_norm.weight", {d});
    if (s.ok()) s = permuted(p + "self_attn.q_proj.weight", b + "attn_q.weight", nh);
    if (s.ok()) s = permuted(p + "self_attn.k_proj.weight", b + "attn_k.weight", nkv);
    if (s.ok()) s = copy(p + "self_attn.v_proj.weight", b + "attn_v.weight", {nkv * hd, d});
    if (s.ok()) s = copy(p + "self_attn.o_proj.weight", b + "attn_output.weight", {d, nh * hd});
    if (s.ok()) s = copy(p + "post_attention_layernorm.weight", b + "ffn_norm.weight", {d});
    if (s.ok()) s = copy(p + "mlp.gate_proj.weight", b + "ffn_gate.weight", {ff, d});
    if (s.ok()) s = copy(p + "mlp.up_proj.weight", b + "ffn_up.weight", {ff, d});
    if (s.ok()) s = copy(p + "mlp.down_proj.weight", b + "ffn_down.weight", {d, ff});
    if (!s.ok()) return s;
  }
  if (absl::Status s = copy("model.norm.weight", "output_norm.weight", {d}); !s.ok()) return s;
  // The engine uses the embeddings as LM head when tied or when lm_head is
  // absent; llama.cpp does the same when output.weight is absent.
  if (!c.tie_word_embeddings && m.Find("lm_head.weight") != nullptr) {
    if (absl::Status s = copy("lm_head.weight", "output.weight", {v, d}); !s.ok()) return s;
  }
  summary.num_tensors = w.num_tensors();
  summary.num_kvs = w.num_kvs();
  if (absl::Status s = w.WriteFile(out_path); !s.ok()) return s;
  return summary;
}

}  // namespace infoflow
