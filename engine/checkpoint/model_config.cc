#include "engine/checkpoint/model_config.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <sstream>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using json = nlohmann::json;

constexpr double kPi = 3.14159265358979323846;

// The field `name` of `obj`, or nullptr when absent or null (HF writes null
// for "use the default").
const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status FieldError(absl::string_view prefix, const char* name,
                        absl::string_view what, const json& got) {
  return absl::InvalidArgumentError(absl::StrCat(
      prefix, "field '", name, "' ", what, ", got ", got.dump()));
}

// Reads an integer field (a float with an integral value is accepted).
// Absent: `fallback` if given, else an error naming the field.
absl::StatusOr<int64_t> GetInt(const json& obj, const char* name,
                               std::optional<int64_t> fallback,
                               absl::string_view prefix = "") {
  const json* v = Field(obj, name);
  if (v == nullptr) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "missing required field '", name, "'"));
  }
  if (v->is_number_integer()) {
    if (v->is_number_unsigned() &&
        v->get<uint64_t>() >
            static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return FieldError(prefix, name, "is out of range", *v);
    }
    return v->get<int64_t>();
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9e15) {
      return static_cast<int64_t>(d);
    }
  }
  return FieldError(prefix, name, "must be an integer", *v);
}

absl::StatusOr<int64_t> GetPositiveInt(const json& obj, const char* name,
                                       std::optional<int64_t> fallback,
                                       absl::string_view prefix = "") {
  absl::StatusOr<int64_t> v = GetInt(obj, name, fallback, prefix);
  if (!v.ok()) return v;
  if (*v <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        prefix, "field '", name, "' must be a positive integer, got ", *v));
  }
  return v;
}

absl::StatusOr<double> GetDouble(const json& obj, const char* name,
                                 std::optional<double> fallback,
                                 absl::string_view prefix = "") {
  const json* v = Field(obj, name);
  if (v == nullptr) {
    if (fallback.has_value()) return *fallback;
    return absl::InvalidArgumentError(
        absl::StrCat(prefix, "missing required field '", name, "'"));
  }
  if (!v->is_number()) return FieldError(prefix, name, "must be a number", *v);
  return v->get<double>();
}

absl::StatusOr<bool> GetBool(const json& obj, const char* name,
                             bool fallback) {
  const json* v = Field(obj, name);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) return FieldError("", name, "must be a boolean", *v);
  return v->get<bool>();
}

// Assigns the value of a StatusOr expression or returns its error.
#define INFOFLOW_ASSIGN_OR_RETURN_CFG(lhs, expr) \
  do {                                           \
    auto status_or = (expr);                           \
    if (!status_or.ok()) return status_or.status();          \
    lhs = *std::move(status_or);                       \
  } while (0)

absl::StatusOr<RopeScaling> ParseRopeScaling(const json* v) {
  RopeScaling rs;
  if (v == nullptr) return rs;
  if (!v->is_object()) {
    return FieldError("", "rope_scaling", "must be null or an object", *v);
  }
  const json* type = Field(*v, "rope_type");
  if (type == nullptr) type = Field(*v, "type");
  if (type == nullptr || !type->is_string()) {
    return absl::InvalidArgumentError(
        "field 'rope_scaling' needs a string \"rope_type\" (or \"type\")");
  }
  const std::string& t = type->get_ref<const std::string&>();
  constexpr absl::string_view kPrefix = "rope_scaling: ";
  if (t == "default") return rs;
  if (t == "linear") {
    rs.type = RopeScaling::Type::kLinear;
  } else if (t == "llama3") {
    rs.type = RopeScaling::Type::kLlama3;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'rope_scaling' has unsupported rope_type \"", t,
        "\" (supported: linear, llama3)"));
  }
  INFOFLOW_ASSIGN_OR_RETURN_CFG(rs.factor,
                                GetDouble(*v, "factor", std::nullopt, kPrefix));
  if (!(rs.factor > 0) || !std::isfinite(rs.factor)) {
    return absl::InvalidArgumentError(absl::StrCat(
        kPrefix, "field 'factor' must be positive, got ", rs.factor));
  }
  if (rs.type == RopeScaling::Type::kLlama3) {
    INFOFLOW_ASSIGN_OR_RETURN_CFG(
        rs.low_freq_factor,
        GetDouble(*v, "low_freq_factor", std::nullopt, kPrefix));
    INFOFLOW_ASSIGN_OR_RETURN_CFG(
        rs.high_freq_factor,
        GetDouble(*v, "high_freq_factor", std::nullopt, kPrefix));
    INFOFLOW_ASSIGN_OR_RETURN_CFG(
        rs.original_max_position_embeddings,
        GetPositiveInt(*v, "original_max_position_embeddings", std::nullopt,
                       kPrefix));
    if (!(rs.low_freq_factor > 0) ||
        !(rs.high_freq_factor > rs.low_freq_factor)) {
      return absl::InvalidArgumentError(absl::StrCat(
          kPrefix, "fields 'low_freq_factor' (", rs.low_freq_factor,
          ") and 'high_freq_factor' (", rs.high_freq_factor,
          ") must satisfy 0 < low < high"));
    }
  }
  return rs;
}

const char* Architecture(const std::string& model_type) {
  if (model_type == "mistral") return "MistralForCausalLM";
  if (model_type == "qwen2") return "Qwen2ForCausalLM";
  if (model_type == "qwen3") return "Qwen3ForCausalLM";
  if (model_type == "glm") return "GlmForCausalLM";
  if (model_type == "glm4") return "Glm4ForCausalLM";
  return "LlamaForCausalLM";
}

}  // namespace

namespace {

// "eos_token_id": absent/null (none), an integer, or a list of integers.
absl::StatusOr<std::vector<int64_t>> GetEosIds(const json& root) {
  std::vector<int64_t> ids;
  const json* eos = Field(root, "eos_token_id");
  if (eos == nullptr) return ids;
  if (eos->is_array()) {
    for (const json& id : *eos) {
      if (!id.is_number_integer()) {
        return FieldError("", "eos_token_id", "must be an integer or a list of integers", *eos);
      }
      ids.push_back(id.get<int64_t>());
    }
    return ids;
  }
  absl::StatusOr<int64_t> id = GetInt(root, "eos_token_id", {});
  if (!id.ok()) return id.status();
  ids.push_back(*id);
  return ids;
}

}  // namespace

absl::StatusOr<std::vector<int64_t>> ParseGenerationConfigEos(std::string_view text) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("not valid JSON: ", e.what()));
  }
  if (!root.is_object()) return absl::InvalidArgumentError("not a JSON object");
  return GetEosIds(root);
}

std::vector<int64_t> StopTokenIds(const ModelConfig& c) {
  std::vector<int64_t> ids = c.eos_token_ids;
  for (int64_t id : c.generation_eos_token_ids) {
    if (std::find(ids.begin(), ids.end(), id) == ids.end()) ids.push_back(id);
  }
  return ids;
}

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view text) {
  json root;
  try {
    root = json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("config is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) {
    return absl::InvalidArgumentError("config is not a JSON object");
  }
  ModelConfig c;
  const json* type = Field(root, "model_type");
  if (type == nullptr || !type->is_string()) {
    return absl::InvalidArgumentError(
        "missing or non-string field 'model_type'");
  }
  c.model_type = type->get<std::string>();
  // GLM defaults are HF GlmConfig / Glm4Config's constructor defaults, which
  // a config.json without the field gets there.
  const bool glm = c.model_type == "glm" || c.model_type == "glm4";
  int64_t default_max_pos = 0;
  if (c.model_type == "llama") {
    default_max_pos = 2048;
  } else if (c.model_type == "mistral") {
    default_max_pos = 4096 * 32;
  } else if (c.model_type == "qwen2" || c.model_type == "qwen3") {
    default_max_pos = 32768;
  } else if (glm) {
    default_max_pos = 131072;
  } else if (c.model_type == "chatglm") {
    return absl::InvalidArgumentError(
        "field 'model_type' is \"chatglm\" (the THUDM remote-code layout: "
        "query_key_value, dense_h_to_4h), which is not supported; use the "
        "transformers checkpoint (model_type \"glm\" or \"glm4\", e.g. the "
        "-hf / -0414 repositories)");
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'model_type' is \"", c.model_type,
        "\", which is not supported (supported: llama, mistral, qwen2, "
        "qwen3, glm, glm4)"));
  }

  INFOFLOW_ASSIGN_OR_RETURN_CFG(c.vocab_size,
                                GetPositiveInt(root, "vocab_size", {}));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(c.hidden_size,
                                GetPositiveInt(root, "hidden_size", {}));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(c.intermediate_size,
                                GetPositiveInt(root, "intermediate_size", {}));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(c.num_hidden_layers,
                                GetPositiveInt(root, "num_hidden_layers", {}));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.num_attention_heads, GetPositiveInt(root, "num_attention_heads", {}));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.num_key_value_heads,
      GetPositiveInt(root, "num_key_value_heads",
                     glm ? int64_t{2} : c.num_attention_heads));
  if (c.num_attention_heads % c.num_key_value_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'num_key_value_heads' (", c.num_key_value_heads,
        ") must divide num_attention_heads (", c.num_attention_heads, ")"));
  }
  if (Field(root, "head_dim") != nullptr || glm) {
    INFOFLOW_ASSIGN_OR_RETURN_CFG(
        c.head_dim,
        GetPositiveInt(root, "head_dim",
                       glm ? std::optional<int64_t>(128) : std::nullopt));
  } else {
    if (c.hidden_size % c.num_attention_heads != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "field 'hidden_size' (", c.hidden_size,
          ") is not divisible by num_attention_heads (",
          c.num_attention_heads, ") and no 'head_dim' is given"));
    }
    c.head_dim = c.hidden_size / c.num_attention_heads;
  }
  if (c.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'head_dim' must be even for RoPE, got ", c.head_dim));
  }
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.rms_norm_eps, GetDouble(root, "rms_norm_eps", glm ? 1.5625e-7 : 1e-6));
  if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'rms_norm_eps' must be positive, got ", c.rms_norm_eps));
  }
  // transformers v5 moves rope_theta, partial_rotary_factor and the scaling
  // type into one "rope_parameters" object; read either spelling.
  const json* rope_params = Field(root, "rope_parameters");
  if (rope_params != nullptr && !rope_params->is_object()) {
    return FieldError("", "rope_parameters", "must be null or an object",
                      *rope_params);
  }
  const json& rope_root = rope_params != nullptr ? *rope_params : root;
  INFOFLOW_ASSIGN_OR_RETURN_CFG(c.rope_theta,
                                GetDouble(rope_root, "rope_theta", 10000.0));
  if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'rope_theta' must be greater than 1, got ", c.rope_theta));
  }
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.rope_scaling,
      ParseRopeScaling(rope_params != nullptr ? rope_params
                                              : Field(root, "rope_scaling")));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.partial_rotary_factor,
      GetDouble(rope_root, "partial_rotary_factor", glm ? 0.5 : 1.0));
  if (!(c.partial_rotary_factor > 0 && c.partial_rotary_factor <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'partial_rotary_factor' must be in (0, 1], got ",
                     c.partial_rotary_factor));
  }
  if (!glm && c.partial_rotary_factor != 1.0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'partial_rotary_factor' is ", c.partial_rotary_factor,
        ", but model_type \"", c.model_type,
        "\" rotates every head dim (only glm/glm4 support partial RoPE)"));
  }
  if (const int64_t rotary_dim = RotaryDim(c);
      rotary_dim < 2 || rotary_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "field 'partial_rotary_factor' (", c.partial_rotary_factor,
        ") gives rotary dim int(head_dim * factor) = ", rotary_dim,
        " for head_dim ", c.head_dim, "; it must be even and at least 2"));
  }
  c.rope_interleaved = glm;
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.max_position_embeddings,
      GetPositiveInt(root, "max_position_embeddings", default_max_pos));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.tie_word_embeddings, GetBool(root, "tie_word_embeddings", false));
  INFOFLOW_ASSIGN_OR_RETURN_CFG(
      c.attention_bias,
      GetBool(root, "attention_bias", c.model_type == "qwen2" || glm));
  c.qk_norm = c.model_type == "qwen3";
  c.sandwich_norms = c.model_type == "glm4";
  // Llama's mlp_bias adds gate/up/down biases the forward does not have.
  bool mlp_bias = false;
  INFOFLOW_ASSIGN_OR_RETURN_CFG(mlp_bias, GetBool(root, "mlp_bias", false));
  if (mlp_bias) {
    return absl::InvalidArgumentError(
        "field 'mlp_bias' is true, which is not supported (no MLP biases)");
  }

  if (const json* act = Field(root, "hidden_act"); act != nullptr) {
    if (!act->is_string()) {
      return FieldError("", "hidden_act", "must be a string", *act);
    }
    c.hidden_act = act->get<std::string>();
  }
  if (c.hidden_act != "silu") {
    return absl::InvalidArgumentError(
        absl::StrCat("field 'hidden_act' is \"", c.hidden_act,
                     "\"; only \"silu\" (SwiGLU) is supported"));
  }

  if (Field(root, "bos_token_id") != nullptr) {
    INFOFLOW_ASSIGN_OR_RETURN_CFG(c.bos_token_id,
                                  GetInt(root, "bos_token_id", {}));
  }
  INFOFLOW_ASSIGN_OR_RETURN_CFG(c.eos_token_ids, GetEosIds(root));
  if (Field(root, "pad_token_id") != nullptr) {
    INFOFLOW_ASSIGN_OR_RETURN_CFG(c.pad_token_id,
                                  GetInt(root, "pad_token_id", {}));
  }
  // Newer transformers write "dtype" instead of "torch_dtype".
  const json* dtype = Field(root, "torch_dtype");
  if (dtype == nullptr) dtype = Field(root, "dtype");
  if (dtype != nullptr) {
    if (!dtype->is_string()) {
      return FieldError("", "torch_dtype", "must be a string", *dtype);
    }
    c.torch_dtype = dtype->get<std::string>();
  }
  return c;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& path) {
  std::string file = path;
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    file = path + "/config.json";
  }
  std::ifstream in(file, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("cannot open ", file));
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("error reading ", file));
  }
  absl::StatusOr<ModelConfig> c = ParseModelConfig(buf.str());
  if (!c.ok()) {
    return absl::Status(c.status().code(),
                        absl::StrCat(file, ": ", c.status().message()));
  }
  return c;
}

std::string ModelConfigToJson(const ModelConfig& c) {
  // ordered_json keeps the conventional HF field order, which makes
  // generated files easy to diff against real ones.
  nlohmann::ordered_json j;
  j["architectures"] = {Architecture(c.model_type)};
  j["model_type"] = c.model_type;
  j["vocab_size"] = c.vocab_size;
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["max_position_embeddings"] = c.max_position_embeddings;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  // Written for GLM (whose default is 0.5, not 1) and whenever it is not 1;
  // non-GLM HF configs lack the field.
  if (c.rope_interleaved || c.partial_rotary_factor != 1.0) {
    j["partial_rotary_factor"] = c.partial_rotary_factor;
  }
  switch (c.rope_scaling.type) {
    case RopeScaling::Type::kNone:
      j["rope_scaling"] = nullptr;
      break;
    case RopeScaling::Type::kLinear:
      j["rope_scaling"] = {{"rope_type", "linear"},
                           {"factor", c.rope_scaling.factor}};
      break;
    case RopeScaling::Type::kLlama3: {
      nlohmann::ordered_json rs;
      rs["rope_type"] = "llama3";
      rs["factor"] = c.rope_scaling.factor;
      rs["low_freq_factor"] = c.rope_scaling.low_freq_factor;
      rs["high_freq_factor"] = c.rope_scaling.high_freq_factor;
      rs["original_max_position_embeddings"] =
          c.rope_scaling.original_max_position_embeddings;
      j["rope_scaling"] = rs;
      break;
    }
  }
  j["hidden_act"] = c.hidden_act;
  j["attention_bias"] = c.attention_bias;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.bos_token_id.has_value()) j["bos_token_id"] = *c.bos_token_id;
  if (c.pad_token_id.has_value()) j["pad_token_id"] = *c.pad_token_id;
  if (c.eos_token_ids.size() == 1) {
    j["eos_token_id"] = c.eos_token_ids[0];
  } else if (!c.eos_token_ids.empty()) {
    j["eos_token_id"] = c.eos_token_ids;
  }
  if (!c.torch_dtype.empty()) j["torch_dtype"] = c.torch_dtype;
  return j.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) +
         "\n";
}

int64_t RotaryDim(const ModelConfig& c) {
  return static_cast<int64_t>(static_cast<double>(c.head_dim) *
                              c.partial_rotary_factor);
}

std::vector<double> RopeInverseFrequencies(const ModelConfig& c) {
  const int64_t rotary_dim = RotaryDim(c);
  const int64_t half = rotary_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half > 0 ? half : 0));
  const RopeScaling& rs = c.rope_scaling;
  const double old_ctx =
      static_cast<double>(rs.original_max_position_embeddings);
  const double low_wavelen = old_ctx / rs.low_freq_factor;
  const double high_wavelen = old_ctx / rs.high_freq_factor;
  for (int64_t i = 0; i < half; ++i) {
    double f = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) /
                                                static_cast<double>(rotary_dim));
    switch (rs.type) {
      case RopeScaling::Type::kNone:
        break;
      case RopeScaling::Type::kLinear:
        f /= rs.factor;
        break;
      case RopeScaling::Type::kLlama3: {
        const double wavelen = 2 * kPi / f;
        if (wavelen < high_wavelen) {
          // High frequency: unchanged.
        } else if (wavelen > low_wavelen) {
          f /= rs.factor;
        } else {
          const double smooth = (old_ctx / wavelen - rs.low_freq_factor) /
                                (rs.high_freq_factor - rs.low_freq_factor);
          f = (1 - smooth) * f / rs.factor + smooth * f;
        }
        break;
      }
    }
    inv[static_cast<size_t>(i)] = f;
  }
  return inv;
}

#undef INFOFLOW_ASSIGN_OR_RETURN_CFG

}  // namespace infoflow
