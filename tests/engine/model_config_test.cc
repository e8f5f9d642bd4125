#include "engine/checkpoint/model_config.h"

#include <cmath>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace infoflow {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kQwen2[] = R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})";

constexpr char kQwen3[] = R"({
  "architectures": ["Qwen3ForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 151643,
  "eos_token_id": 151645,
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 1024,
  "intermediate_size": 3072,
  "max_position_embeddings": 40960,
  "model_type": "qwen3",
  "num_attention_heads": 16,
  "num_hidden_layers": 28,
  "num_key_value_heads": 8,
  "rms_norm_eps": 1e-06,
  "rope_scaling": null,
  "rope_theta": 1000000,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "vocab_size": 151936
})";

constexpr char kLlama31[] = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "bos_token_id": 128000,
  "eos_token_id": [128001, 128008, 128009],
  "hidden_act": "silu",
  "hidden_size": 4096,
  "intermediate_size": 14336,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "vocab_size": 128256
})";

// A minimal valid config to mutate in error tests.
constexpr char kMinimal[] = R"({"model_type": "llama", "vocab_size": 32,
  "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
  "num_attention_heads": 4})";

std::string ErrorOf(const std::string& json) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(json);
  EXPECT_FALSE(c.ok()) << json;
  return c.ok() ? "" : std::string(c.status().message());
}

// kMinimal with one more field (inserted after the opening brace; later
// keys win in nlohmann only for duplicates, so only add new keys).
std::string MinimalWith(const std::string& field) {
  return std::string("{") + field + "," + (kMinimal + 1);
}

// GLM-4-0414 style (Glm4ForCausalLM): the fields and values of the 9B
// config.json as transformers 4.51 writes it (no download is possible here).
constexpr char kGlm4[] = R"({
  "architectures": ["Glm4ForCausalLM"],
  "attention_bias": true,
  "attention_dropout": 0.0,
  "eos_token_id": [151329, 151336, 151338],
  "head_dim": 128,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 13696,
  "max_position_embeddings": 32768,
  "model_type": "glm4",
  "num_attention_heads": 32,
  "num_hidden_layers": 40,
  "num_key_value_heads": 2,
  "pad_token_id": 151329,
  "partial_rotary_factor": 0.5,
  "rms_norm_eps": 1e-05,
  "rope_theta": 10000.0,
  "tie_word_embeddings": false,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.51.3",
  "use_cache": true,
  "vocab_size": 151552
})";

// A glm config giving only the sizes: the rest are GlmConfig's defaults.
constexpr char kGlmMinimal[] = R"({
  "model_type": "glm",
  "vocab_size": 64,
  "hidden_size": 256,
  "intermediate_size": 64,
  "num_hidden_layers": 2,
  "num_attention_heads": 2
})";

TEST(ModelConfigTest, Stories260K) {
  absl::StatusOr<ModelConfig> c =
      LoadModelConfig(INFOFLOW_STORIES260K_DIR);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "llama");
  EXPECT_EQ(c->num_hidden_layers, 5);
  EXPECT_EQ(c->num_attention_heads, 8);
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->hidden_size, 64);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->intermediate_size, 172);
  EXPECT_EQ(c->vocab_size, 512);
  EXPECT_EQ(c->max_position_embeddings, 512);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_EQ(c->bos_token_id, 1);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(2));
  EXPECT_EQ(c->torch_dtype, "float32");

  // The file path works as well as the directory.
  absl::StatusOr<ModelConfig> c2 =
      LoadModelConfig(INFOFLOW_STORIES260K_DIR "/config.json");
  ASSERT_TRUE(c2.ok()) << c2.status();
  EXPECT_EQ(c2->num_hidden_layers, 5);
}

TEST(ModelConfigTest, Qwen2) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen2);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen2");
  EXPECT_EQ(c->head_dim, 64);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_TRUE(c->attention_bias);  // Qwen2 default.
  EXPECT_FALSE(c->qk_norm);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c->rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-6);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151643));
  EXPECT_EQ(c->vocab_size, 151936);

  // An explicit attention_bias wins over the model_type default.
  std::string no_bias = kQwen2;
  no_bias.replace(no_bias.find("\"attention_dropout\""), 0,
                  "\"attention_bias\": false, ");
  c = ParseModelConfig(no_bias);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->attention_bias);
}

TEST(ModelConfigTest, Qwen3) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kQwen3);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "qwen3");
  EXPECT_EQ(c->head_dim, 128);  // Explicit, != 1024 / 16.
  EXPECT_EQ(c->num_attention_heads, 16);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_EQ(c->num_hidden_layers, 28);
  EXPECT_TRUE(c->qk_norm);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_TRUE(c->tie_word_embeddings);
  EXPECT_EQ(c->max_position_embeddings, 40960);
  EXPECT_EQ(c->bos_token_id, 151643);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151645));
}

TEST(ModelConfigTest, Llama31WithRopeScaling) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kLlama31);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 8);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 8.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.low_freq_factor, 1.0);
  EXPECT_DOUBLE_EQ(c->rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c->rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_THAT(c->eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(c->bos_token_id, 128000);
  EXPECT_EQ(c->max_position_embeddings, 131072);
}

TEST(ModelConfigTest, Defaults) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->num_key_value_heads, 4);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_FALSE(c->tie_word_embeddings);
  EXPECT_FALSE(c->attention_bias);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_TRUE(c->eos_token_ids.empty());
  EXPECT_EQ(c->max_position_embeddings, 2048);
  // "type" is the older spelling of "rope_type"; null head_dim and kv heads
  // mean "default".
  c = ParseModelConfig(MinimalWith(
      R"("rope_scaling": {"type": "linear", "factor": 2},
         "head_dim": null, "num_key_value_heads": null)"));
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(c->rope_scaling.factor, 2.0);
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->num_key_value_heads, 4);
}

TEST(ModelConfigTest, ErrorsNameTheField) {
  EXPECT_THAT(ErrorOf("{nope"), HasSubstr("JSON"));
  EXPECT_THAT(ErrorOf("[]"), HasSubstr("object"));
  std::string gemma = kMinimal;
  gemma.replace(gemma.find("llama"), 5, "gemma");
  EXPECT_THAT(ErrorOf(gemma), ::testing::AllOf(HasSubstr("model_type"),
                                               HasSubstr("gemma")));
  EXPECT_THAT(ErrorOf(R"({"vocab_size": 3})"), HasSubstr("model_type"));
  EXPECT_THAT(ErrorOf(R"({"model_type": "llama", "vocab_size": 32,
      "intermediate_size": 32, "num_hidden_layers": 2,
      "num_attention_heads": 4})"),
              HasSubstr("'hidden_size'"));
  std::string neg = kMinimal;
  neg.replace(neg.find("\"num_hidden_layers\": 2"), 22,
              "\"num_hidden_layers\": -2");
  EXPECT_THAT(ErrorOf(neg), HasSubstr("'num_hidden_layers'"));
  std::string str_vocab = kMinimal;
  str_vocab.replace(str_vocab.find("\"vocab_size\": 32"), 16,
                    "\"vocab_size\": \"32\"");
  EXPECT_THAT(ErrorOf(str_vocab), HasSubstr("'vocab_size'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("num_key_value_heads": 3)")),
              HasSubstr("'num_key_value_heads'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("num_key_value_heads": 0)")),
              HasSubstr("'num_key_value_heads'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("head_dim": 5)")),
              HasSubstr("'head_dim'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("rms_norm_eps": "x")")),
              HasSubstr("'rms_norm_eps'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("tie_word_embeddings": 1)")),
              HasSubstr("'tie_word_embeddings'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("hidden_act": "gelu")")),
              HasSubstr("'hidden_act'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("eos_token_id": [1, "x"])")),
              HasSubstr("'eos_token_id'"));
  EXPECT_THAT(
      ErrorOf(MinimalWith(R"("rope_scaling": {"rope_type": "yarn",
                                              "factor": 4})")),
      ::testing::AllOf(HasSubstr("rope_scaling"), HasSubstr("yarn")));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("rope_scaling": {"factor": 4})")),
              HasSubstr("rope_type"));
  EXPECT_THAT(ErrorOf(MinimalWith(
                  R"("rope_scaling": {"rope_type": "linear"})")),
              HasSubstr("'factor'"));
  EXPECT_THAT(ErrorOf(MinimalWith(R"("rope_scaling": {"rope_type": "llama3",
      "factor": 8, "low_freq_factor": 1, "high_freq_factor": 4})")),
              HasSubstr("'original_max_position_embeddings'"));
  // hidden_size not divisible by heads, and no head_dim to rescue it.
  std::string odd = kMinimal;
  odd.replace(odd.find("\"hidden_size\": 16"), 17, "\"hidden_size\": 18");
  EXPECT_THAT(ErrorOf(odd), HasSubstr("'hidden_size'"));

  absl::StatusOr<ModelConfig> missing = LoadModelConfig("/nonexistent/dir");
  ASSERT_FALSE(missing.ok());
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
}

TEST(ModelConfigTest, Glm4) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGlm4);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model_type, "glm4");
  EXPECT_EQ(c->head_dim, 128);
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.5);
  EXPECT_EQ(RotaryDim(*c), 64);
  EXPECT_TRUE(c->rope_interleaved);
  EXPECT_TRUE(c->sandwich_norms);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_FALSE(c->qk_norm);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1e-5);
  EXPECT_FALSE(c->bos_token_id.has_value());
  EXPECT_THAT(c->eos_token_ids, ElementsAre(151329, 151336, 151338));
  EXPECT_EQ(c->pad_token_id, 151329);
  EXPECT_EQ(RopeInverseFrequencies(*c).size(), 32u);
  // glm differs from glm4 only by the sandwich norms.
  std::string glm = kGlm4;
  glm.replace(glm.find("\"glm4\""), 6, "\"glm\"");
  c = ParseModelConfig(glm);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->rope_interleaved);
  EXPECT_FALSE(c->sandwich_norms);
}

TEST(ModelConfigTest, GlmDefaultsAreGlmConfigs) {
  absl::StatusOr<ModelConfig> c = ParseModelConfig(kGlmMinimal);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 128);  // not hidden / heads
  EXPECT_EQ(c->num_key_value_heads, 2);
  EXPECT_DOUBLE_EQ(c->partial_rotary_factor, 0.5);
  EXPECT_DOUBLE_EQ(c->rms_norm_eps, 1.5625e-7);
  EXPECT_DOUBLE_EQ(c->rope_theta, 10000.0);
  EXPECT_TRUE(c->attention_bias);
  EXPECT_EQ(c->max_position_embeddings, 131072);
  EXPECT_FALSE(c->sandwich_norms);
  // transformers v5's rope_parameters carries theta and the rotary factor.
  std::string v5 = kGlmMinimal;
  v5.insert(v5.rfind('}'), R"(, "rope_parameters": {"rope_type": "default",
      "rope_theta": 500000.0, "partial_rotary_factor": 0.25})");
  c = ParseModelConfig(v5);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_DOUBLE_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(RotaryDim(*c), 32);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);
}

TEST(ModelConfigTest, GlmErrorsNameTheField) {
  auto glm_with = [](const std::string& fields) {
    std::string s = kGlmMinimal;
    s.insert(s.rfind('}'), ", " + fields);
    return s;
  };
  EXPECT_THAT(ErrorOf(glm_with(R"("partial_rotary_factor": 0)")),
              HasSubstr("'partial_rotary_factor'"));
  EXPECT_THAT(ErrorOf(glm_with(R"("partial_rotary_factor": 1.5)")),
              HasSubstr("'partial_rotary_factor'"));
  // int(128 * 0.3) = 38 is even, int(128 * 0.3046875) = 39 is not.
  EXPECT_TRUE(ParseModelConfig(glm_with(R"("partial_rotary_factor": 0.3)")).ok());
  EXPECT_THAT(ErrorOf(glm_with(R"("partial_rotary_factor": 0.3046875)")),
              ::testing::AllOf(HasSubstr("'partial_rotary_factor'"), HasSubstr("39")));
  EXPECT_THAT(ErrorOf(glm_with(R"("hidden_act": "gelu")")), HasSubstr("'hidden_act'"));
  EXPECT_THAT(ErrorOf(glm_with(R"("rope_parameters": 3)")), HasSubstr("'rope_parameters'"));
  // Partial RoPE on a model type whose forward rotates the whole head.
  EXPECT_THAT(ErrorOf(MinimalWith(R"("partial_rotary_factor": 0.5)")),
              ::testing::AllOf(HasSubstr("'partial_rotary_factor'"), HasSubstr("llama")));
  EXPECT_TRUE(ParseModelConfig(MinimalWith(R"("partial_rotary_factor": 1.0)")).ok());
  EXPECT_THAT(ErrorOf(MinimalWith(R"("mlp_bias": true)")), HasSubstr("'mlp_bias'"));
  std::string chatglm = kGlmMinimal;
  chatglm.replace(chatglm.find("\"glm\""), 5, "\"chatglm\"");
  EXPECT_THAT(ErrorOf(chatglm), ::testing::AllOf(HasSubstr("model_type"), HasSubstr("chatglm")));
}

TEST(ModelConfigTest, JsonRoundTrip) {
  for (const char* text : {kQwen2, kQwen3, kLlama31, kMinimal, kGlm4, kGlmMinimal}) {
    absl::StatusOr<ModelConfig> c = ParseModelConfig(text);
    ASSERT_TRUE(c.ok()) << c.status();
    const std::string json = ModelConfigToJson(*c);
    absl::StatusOr<ModelConfig> back = ParseModelConfig(json);
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << json;
    EXPECT_EQ(back->model_type, c->model_type);
    EXPECT_EQ(back->vocab_size, c->vocab_size);
    EXPECT_EQ(back->hidden_size, c->hidden_size);
    EXPECT_EQ(back->intermediate_size, c->intermediate_size);
    EXPECT_EQ(back->num_hidden_layers, c->num_hidden_layers);
    EXPECT_EQ(back->num_attention_heads, c->num_attention_heads);
    EXPECT_EQ(back->num_key_value_heads, c->num_key_value_heads);
    EXPECT_EQ(back->head_dim, c->head_dim);
    EXPECT_EQ(back->rms_norm_eps, c->rms_norm_eps);
    EXPECT_EQ(back->rope_theta, c->rope_theta);
    EXPECT_EQ(back->rope_scaling.type, c->rope_scaling.type);
    EXPECT_EQ(back->rope_scaling.factor, c->rope_scaling.factor);
    EXPECT_EQ(back->rope_scaling.low_freq_factor,
              c->rope_scaling.low_freq_factor);
    EXPECT_EQ(back->rope_scaling.high_freq_factor,
              c->rope_scaling.high_freq_factor);
    EXPECT_EQ(back->rope_scaling.original_max_position_embeddings,
              c->rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(back->max_position_embeddings, c->max_position_embeddings);
    EXPECT_EQ(back->tie_word_embeddings, c->tie_word_embeddings);
    EXPECT_EQ(back->attention_bias, c->attention_bias);
    EXPECT_EQ(back->qk_norm, c->qk_norm);
    EXPECT_EQ(back->partial_rotary_factor, c->partial_rotary_factor);
    EXPECT_EQ(back->rope_interleaved, c->rope_interleaved);
    EXPECT_EQ(back->sandwich_norms, c->sandwich_norms);
    EXPECT_EQ(back->pad_token_id, c->pad_token_id);
    EXPECT_EQ(back->bos_token_id, c->bos_token_id);
    EXPECT_EQ(back->eos_token_ids, c->eos_token_ids);
    EXPECT_EQ(back->torch_dtype, c->torch_dtype);
  }
  absl::StatusOr<ModelConfig> q3 = ParseModelConfig(kQwen3);
  ASSERT_TRUE(q3.ok());
  EXPECT_THAT(ModelConfigToJson(*q3), HasSubstr("\"Qwen3ForCausalLM\""));
  absl::StatusOr<ModelConfig> q2 = ParseModelConfig(kQwen2);
  ASSERT_TRUE(q2.ok());
  EXPECT_THAT(ModelConfigToJson(*q2), HasSubstr("\"Qwen2ForCausalLM\""));
  absl::StatusOr<ModelConfig> l = ParseModelConfig(kLlama31);
  ASSERT_TRUE(l.ok());
  EXPECT_THAT(ModelConfigToJson(*l), HasSubstr("\"LlamaForCausalLM\""));
}

ModelConfig RopeConfig(double theta, int64_t head_dim) {
  ModelConfig c;
  c.model_type = "llama";
  c.rope_theta = theta;
  c.head_dim = head_dim;
  return c;
}

TEST(GenerationConfigTest, EosScalarListOrAbsentAndTheUnionWithConfig) {
  EXPECT_THAT(*ParseGenerationConfigEos(R"({"eos_token_id": 128009})"), ElementsAre(128009));
  EXPECT_THAT(*ParseGenerationConfigEos(R"({"bos_token_id": 1, "eos_token_id": [128001, 128008, 128009]})"),
              ElementsAre(128001, 128008, 128009));
  EXPECT_TRUE(ParseGenerationConfigEos(R"({"do_sample": true})")->empty());
  EXPECT_TRUE(ParseGenerationConfigEos(R"({"eos_token_id": null})")->empty());
  EXPECT_EQ(ParseGenerationConfigEos(R"({"eos_token_id": "x"})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseGenerationConfigEos(R"({"eos_token_id": [1, 2.5]})").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(ParseGenerationConfigEos("[1, 2]").ok());
  EXPECT_FALSE(ParseGenerationConfigEos("{").ok());
  ModelConfig c;
  c.eos_token_ids = {151645};
  c.generation_eos_token_ids = {151645, 151643};
  EXPECT_THAT(StopTokenIds(c), ElementsAre(151645, 151643));
  c.eos_token_ids = {};
  EXPECT_THAT(StopTokenIds(c), ElementsAre(151645, 151643));
}

TEST(RopeTest, Default) {
  // head_dim 8, theta 1e4: 1e4^(-0/8), 1e4^(-2/8), 1e4^(-4/8), 1e4^(-6/8).
  std::vector<double> inv = RopeInverseFrequencies(RopeConfig(10000, 8));
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[1], 0.1);
  EXPECT_DOUBLE_EQ(inv[2], 0.01);
  EXPECT_DOUBLE_EQ(inv[3], 0.001);
  // theta 16, head_dim 4: 1, 16^(-1/2) = 0.25.
  inv = RopeInverseFrequencies(RopeConfig(16, 4));
  EXPECT_THAT(inv, ElementsAre(1.0, 0.25));
}

// Partial rotary: the exponent's denominator is the rotary dim, not head_dim
// (HF: 1 / base ** (arange(0, dim, 2) / dim), dim = int(head_dim * factor)).
TEST(RopeTest, PartialRotaryUsesTheRotaryDim) {
  ModelConfig c = RopeConfig(10000, 16);
  c.partial_rotary_factor = 0.5;
  std::vector<double> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[1], 0.1);
  EXPECT_DOUBLE_EQ(inv[2], 0.01);
  EXPECT_DOUBLE_EQ(inv[3], 0.001);
}

TEST(RopeTest, Linear) {
  ModelConfig c = RopeConfig(10000, 8);
  c.rope_scaling.type = RopeScaling::Type::kLinear;
  c.rope_scaling.factor = 2;
  std::vector<double> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 0.5);
  EXPECT_DOUBLE_EQ(inv[1], 0.05);
  EXPECT_DOUBLE_EQ(inv[2], 0.005);
  EXPECT_DOUBLE_EQ(inv[3], 0.0005);
}

TEST(RopeTest, Llama3) {
  ModelConfig c = RopeConfig(10000, 8);
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_position_embeddings = 64;
  // high_freq_wavelen = 64/4 = 16, low_freq_wavelen = 64/1 = 64.
  // Wavelengths 2*pi/inv: 6.28 (< 16: keep), 62.83 (between: smooth),
  // 628.3 and 6283 (> 64: divide by 8).
  // Smooth for inv 0.1: s = (64 / 62.8319 - 1) / 3 = 0.0061973,
  // (1 - s) * 0.1 / 8 + s * 0.1 = 0.0130423.
  std::vector<double> inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_NEAR(inv[1], 0.013042256043820465, 1e-15);
  EXPECT_DOUBLE_EQ(inv[2], 0.00125);
  EXPECT_DOUBLE_EQ(inv[3], 0.000125);

  // Llama 3.1 parameters: only the lowest frequency (wavelength 6283,
  // between 2048 and 8192) is smoothed: s = (8192 / 6283.19 - 1) / 3 =
  // 0.101266, (1 - s) * 0.001 / 8 + s * 0.001 = 0.000213608.
  c.rope_scaling.original_max_position_embeddings = 8192;
  inv = RopeInverseFrequencies(c);
  ASSERT_EQ(inv.size(), 4u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[1], 0.1);
  EXPECT_DOUBLE_EQ(inv[2], 0.01);
  EXPECT_NEAR(inv[3], 0.00021360754402756864, 1e-17);

  // The real Llama 3.1 config: 64 frequencies, first unchanged, last
  // divided by 8, all monotonically decreasing.
  absl::StatusOr<ModelConfig> l = ParseModelConfig(kLlama31);
  ASSERT_TRUE(l.ok());
  inv = RopeInverseFrequencies(*l);
  ASSERT_EQ(inv.size(), 64u);
  EXPECT_DOUBLE_EQ(inv[0], 1.0);
  EXPECT_DOUBLE_EQ(inv[63], std::pow(500000.0, -126.0 / 128.0) / 8);
  for (size_t i = 1; i < inv.size(); ++i) EXPECT_LT(inv[i], inv[i - 1]) << i;
}

}  // namespace
}  // namespace infoflow
