#include "engine/model/test_model.h"

#include <algorithm>
#include <cstdio>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "engine/text/bpe_trainer.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/text/tokenizer.h"

namespace infoflow {
namespace {

const char* const kSpecialTokens[] = {"<s>", "</s>", "<|user|>", "<|assistant|>"};
// GLM-4's special tokens, in the order of its tokenizer (ids 151329..).
const char* const kGlmSpecialTokens[] = {"<|endoftext|>", "[MASK]",     "[gMASK]",  "[sMASK]",
                                         "<sop>",         "<eop>",      "<|system|>", "<|user|>",
                                         "<|assistant|>", "<|observation|>"};

bool IsGlm(const std::string& model_type) {
  return model_type == "glm" || model_type == "glm4";
}

// A small fixed English corpus for the tokenizer: enough to learn common
// words, spaces and punctuation; everything else falls back to bytes.
std::vector<std::string> TokenizerCorpus() {
  const char* names[] = {"Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Grace", "Heidi"};
  const char* places[] = {"Paris", "Berlin", "Tokyo", "Lima", "Oslo", "Cairo", "Quito", "Rome"};
  const char* things[] = {"the red book", "a small cat", "the old map", "a blue car",
                          "the secret code", "a silver key", "the garden", "the river"};
  std::vector<std::string> corpus;
  for (int i = 0; i < 8; ++i) {
    for (int j = 0; j < 8; ++j) {
      corpus.push_back(absl::StrCat(names[i], " lives in ", places[j], ". ", names[(i + j) % 8],
                                    " found ", things[(i * 3 + j) % 8], " near ", places[(i + 5) % 8],
                                    ", and the number was ", i * 97 + j * 13, ".\n"));
      corpus.push_back(absl::StrCat("Question: where does ", names[i], " work? Answer: ",
                                    places[(i + j) % 8], ". The manager of ", names[j], " is ",
                                    names[(j + 1) % 8], "; they met in ", 1990 + i * j, "."));
    }
  }
  return corpus;
}

// Deterministic normal(0, std) values, independent of libtorch's RNG.
std::vector<float> Normal(std::mt19937_64& rng, int64_t n, double stddev, double mean = 0.0) {
  std::normal_distribution<double> dist(mean, stddev);
  std::vector<float> out(n);
  for (float& x : out) x = static_cast<float>(dist(rng));
  return out;
}

}  // namespace

TestModelSpec DefaultTestModelSpec(const std::string& model_type) {
  TestModelSpec spec;
  spec.model_type = model_type;
  if (IsGlm(model_type)) {
    spec.bos_token = "";
    spec.eos_tokens = {"<|endoftext|>", "<|user|>", "<|observation|>"};
    spec.pad_token = "<|endoftext|>";
  }
  return spec;
}

ModelConfig TestModelConfig(const TestModelSpec& spec) {
  ModelConfig c;
  c.model_type = spec.model_type;
  c.vocab_size = spec.vocab_size;
  c.hidden_size = spec.hidden_size;
  c.intermediate_size = spec.intermediate_size;
  c.num_hidden_layers = spec.num_layers;
  c.num_attention_heads = spec.num_heads;
  c.num_key_value_heads = spec.num_kv_heads;
  c.head_dim = spec.hidden_size / spec.num_heads;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = spec.rope_theta;
  c.max_position_embeddings = spec.max_position_embeddings;
  c.tie_word_embeddings = spec.tie_word_embeddings;
  c.attention_bias = spec.model_type == "qwen2" || IsGlm(spec.model_type);
  c.qk_norm = spec.model_type == "qwen3";
  if (IsGlm(spec.model_type)) {
    c.partial_rotary_factor = spec.partial_rotary_factor;
    c.rope_interleaved = true;
    c.sandwich_norms = spec.model_type == "glm4";
  }
  c.bos_token_id = 1;  // WriteTestModel sets the trained tokenizer's <s>, </s> ids
  c.eos_token_ids = {2};
  c.torch_dtype = spec.dtype == "bf16" ? "bfloat16" : spec.dtype == "f16" ? "float16" : "float32";
  if (spec.llama3_rope_scaling) {
    c.rope_scaling.type = RopeScaling::Type::kLlama3;
    c.rope_scaling.factor = 8.0;
    c.rope_scaling.low_freq_factor = 1.0;
    c.rope_scaling.high_freq_factor = 4.0;
    c.rope_scaling.original_max_position_embeddings = 256;
  }
  return c;
}

absl::Status WriteTestModel(const std::string& dir, const TestModelSpec& spec) {
  ModelConfig c = TestModelConfig(spec);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError("cannot create " + dir + ": " + ec.message());

  // Tokenizer first: its special-token ids must match the config.
  absl::StatusOr<std::string> tok_json;
  if (spec.tokenizer_json_path.empty()) {
    std::vector<std::string> specials(std::begin(kSpecialTokens), std::end(kSpecialTokens));
    if (IsGlm(spec.model_type)) {
      specials.assign(std::begin(kGlmSpecialTokens), std::end(kGlmSpecialTokens));
    }
    tok_json =
        TrainByteLevelBpeTokenizerJson(TokenizerCorpus(), static_cast<int>(c.vocab_size), specials);
  } else {
    std::ifstream in(spec.tokenizer_json_path, std::ios::binary);
    if (!in) return absl::NotFoundError("cannot read " + spec.tokenizer_json_path);
    std::stringstream text;
    text << in.rdbuf();
    tok_json = text.str();
  }
  if (!tok_json.ok()) return tok_json.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJsonString(*tok_json);
  if (!tok.ok()) return tok.status();
  if (!spec.tokenizer_json_path.empty()) {
    c.vocab_size = std::max<int64_t>(c.vocab_size, (*tok)->vocab_size());
  }
  auto id_of = [&](const std::string& spelling) -> absl::StatusOr<int64_t> {
    std::optional<int32_t> id = (*tok)->TokenToId(spelling);
    if (!id) return absl::InvalidArgumentError("the tokenizer has no token " + spelling);
    return *id;
  };
  c.bos_token_id.reset();
  if (!spec.bos_token.empty()) {
    absl::StatusOr<int64_t> bos = id_of(spec.bos_token);
    if (!bos.ok()) return bos.status();
    c.bos_token_id = *bos;
  }
  c.eos_token_ids.clear();
  for (const std::string& e : spec.eos_tokens) {
    absl::StatusOr<int64_t> eos = id_of(e);
    if (!eos.ok()) return eos.status();
    c.eos_token_ids.push_back(*eos);
  }
  c.pad_token_id.reset();
  if (!spec.pad_token.empty()) {
    absl::StatusOr<int64_t> pad = id_of(spec.pad_token);
    if (!pad.ok()) return pad.status();
    c.pad_token_id = *pad;
  }
  std::vector<int64_t> generation_eos;
  for (const std::string& e : spec.generation_eos_tokens) {
    absl::StatusOr<int64_t> eos = id_of(e);
    if (!eos.ok()) return eos.status();
    generation_eos.push_back(*eos);
  }
  if ((*tok)->vocab_size() > c.vocab_size) {
    return absl::InternalError("trained tokenizer is larger than the model vocabulary");
  }

  // Weights: scaled so activations stay O(1) through the layers and attention
  // is far from uniform (a degenerate random model hides RoPE/mask bugs).
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + 1);
  const int64_t d = c.hidden_size, hd = c.head_dim, nh = c.num_attention_heads,
                nkv = c.num_key_value_heads, ff = c.intermediate_size;
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, double stddev,
                 double mean = 0.0) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    tensors[name] = {shape, Normal(rng, n, stddev, mean)};
  };
  const double proj = 1.0 / std::sqrt(static_cast<double>(d));
  add("model.embed_tokens.weight", {c.vocab_size, d}, 1.0);
  for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
    const std::string p = absl::StrCat("model.layers.", l, ".");
    add(p + "input_layernorm.weight", {d}, 0.1, 1.0);
    add(p + "self_attn.q_proj.weight", {nh * hd, d}, 2.0 * proj);
    add(p + "self_attn.k_proj.weight", {nkv * hd, d}, 2.0 * proj);
    add(p + "self_attn.v_proj.weight", {nkv * hd, d}, proj);
    add(p + "self_attn.o_proj.weight", {d, nh * hd}, proj);
    if (c.attention_bias) {
      add(p + "self_attn.q_proj.bias", {nh * hd}, 0.2);
      add(p + "self_attn.k_proj.bias", {nkv * hd}, 0.2);
      add(p + "self_attn.v_proj.bias", {nkv * hd}, 0.2);
    }
    if (c.qk_norm) {
      add(p + "self_attn.q_norm.weight", {hd}, 0.1, 1.0);
      add(p + "self_attn.k_norm.weight", {hd}, 0.1, 1.0);
    }
    add(p + "post_attention_layernorm.weight", {d}, 0.1, 1.0);
    if (IsGlm(c.model_type)) {
      add(p + "mlp.gate_up_proj.weight", {2 * ff, d}, proj);  // gate rows, then up rows
    } else {
      add(p + "mlp.gate_proj.weight", {ff, d}, proj);
      add(p + "mlp.up_proj.weight", {ff, d}, proj);
    }
    add(p + "mlp.down_proj.weight", {d, ff}, 1.0 / std::sqrt(static_cast<double>(ff)));
    if (c.sandwich_norms) {
      add(p + "post_self_attn_layernorm.weight", {d}, 0.1, 1.0);
      add(p + "post_mlp_layernorm.weight", {d}, 0.1, 1.0);
    }
  }
  add("model.norm.weight", {d}, 0.1, 1.0);
  if (!c.tie_word_embeddings) add("lm_head.weight", {c.vocab_size, d}, proj);

  DType dtype = spec.dtype == "bf16" ? DType::kBF16 : spec.dtype == "f16" ? DType::kF16 : DType::kF32;
  std::vector<std::vector<uint16_t>> halves;  // keeps converted data alive
  std::vector<TensorToWrite> to_write;
  for (auto& [name, entry] : tensors) {
    TensorToWrite t{name, dtype, entry.first, entry.second.data()};
    if (dtype != DType::kF32) {
      std::vector<uint16_t> h(entry.second.size());
      for (size_t i = 0; i < h.size(); ++i) {
        h[i] = dtype == DType::kBF16 ? F32ToBF16(entry.second[i]) : F32ToF16(entry.second[i]);
      }
      halves.push_back(std::move(h));
      t.data = halves.back().data();
    }
    to_write.push_back(t);
  }
  if (spec.shards <= 1) {
    absl::Status s = WriteSafetensors(dir + "/model.safetensors", to_write, {{"format", "pt"}});
    if (!s.ok()) return s;
  } else {
    // Contiguous runs of tensors (name order) per shard, and the index that
    // maps each name to its file.
    const size_t n_shards = std::min<size_t>(static_cast<size_t>(spec.shards), to_write.size());
    nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
    uint64_t total_bytes = 0;
    for (size_t shard = 0; shard < n_shards; ++shard) {
      const size_t begin = shard * to_write.size() / n_shards;
      const size_t end = (shard + 1) * to_write.size() / n_shards;
      char file[64];
      std::snprintf(file, sizeof(file), "model-%05zu-of-%05zu.safetensors", shard + 1, n_shards);
      std::vector<TensorToWrite> part(to_write.begin() + begin, to_write.begin() + end);
      absl::Status s = WriteSafetensors(dir + "/" + file, part, {{"format", "pt"}});
      if (!s.ok()) return s;
      for (const TensorToWrite& t : part) {
        weight_map[t.name] = file;
        uint64_t n = 1;
        for (int64_t dim : t.shape) n *= static_cast<uint64_t>(dim);
        total_bytes += n * (dtype == DType::kF32 ? 4 : 2);
      }
    }
    nlohmann::ordered_json index;
    index["metadata"] = {{"total_size", total_bytes}};
    index["weight_map"] = weight_map;
    std::ofstream idx(dir + "/model.safetensors.index.json");
    idx << index.dump(2) << "\n";
    if (!idx) return absl::InternalError("cannot write model.safetensors.index.json in " + dir);
  }

  std::ofstream cfg(dir + "/config.json");
  cfg << ModelConfigToJson(c);
  std::ofstream tj(dir + "/tokenizer.json");
  tj << *tok_json;
  if (!cfg || !tj) return absl::InternalError("cannot write config/tokenizer in " + dir);
  if (!generation_eos.empty()) {
    std::ofstream gen(dir + "/generation_config.json");
    gen << "{\n  \"eos_token_id\": [";
    for (size_t i = 0; i < generation_eos.size(); ++i) gen << (i ? ", " : "") << generation_eos[i];
    gen << "]\n}\n";
    if (!gen) return absl::InternalError("cannot write generation_config.json in " + dir);
  }
  return absl::OkStatus();
}

}  // namespace infoflow
