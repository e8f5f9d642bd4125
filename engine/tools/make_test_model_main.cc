// infoflow-make-test-model: writes a tiny deterministic LLaMA-family or GLM
// model in Hugging Face format (config.json, model.safetensors or shards,
// tokenizer.json with a real byte-level BPE) for tests, demos and benchmarks.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/model/test_model.h"

namespace {

constexpr char kUsage[] =
    "usage: infoflow-make-test-model --out DIR [--type llama|qwen2|qwen3|glm|glm4] [--layers N]\n"
    "          [--hidden N] [--heads N] [--kv-heads N] [--ffn N] [--vocab N]\n"
    "          [--max-positions N] [--dtype f32|bf16|f16] [--llama3-rope-scaling]\n"
    "          [--partial-rotary-factor F] [--tie-embeddings] [--shards N] [--seed S]\n"
    "          [--tokenizer-json FILE [--bos-token T] [--eos-token T]... [--generation-eos-token T]...]\n"
    "--tokenizer-json ships FILE (e.g. a real Qwen3/Llama-3 tokenizer.json) instead of the\n"
    "trained BPE; the vocabulary grows to its size. --bos-token '' = no bos_token_id.\n"
    "--generation-eos-token writes generation_config.json (its eos ids are stop ids too).\n"
    "glm/glm4: GLM-4's special tokens ([gMASK], <sop>, <|user|>, ...), no BOS, eos\n"
    "<|endoftext|>,<|user|>,<|observation|>; --partial-rotary-factor (default 0.5).\n"
    "--shards N > 1 writes model-0000i-of-0000N.safetensors + model.safetensors.index.json.\n"
    "Random weights (seeded): the model computes, it does not know anything.\n"
    "Defaults: llama, 4 layers, hidden 64, 4/2 heads, ffn 128, vocab 512, f32, seed 0.\n";

}  // namespace

int main(int argc, char** argv) {
  infoflow::TestModelSpec spec;
  std::string out;
  bool eos_given = false, bos_given = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "flag %s needs a value\n\n%s", f.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--help" || f == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (f == "--out") {
      out = value();
    } else if (f == "--type") {
      spec.model_type = value();
    } else if (f == "--layers") {
      spec.num_layers = std::atoll(value());
    } else if (f == "--hidden") {
      spec.hidden_size = std::atoll(value());
    } else if (f == "--heads") {
      spec.num_heads = std::atoll(value());
    } else if (f == "--kv-heads") {
      spec.num_kv_heads = std::atoll(value());
    } else if (f == "--ffn") {
      spec.intermediate_size = std::atoll(value());
    } else if (f == "--vocab") {
      spec.vocab_size = std::atoll(value());
    } else if (f == "--max-positions") {
      spec.max_position_embeddings = std::atoll(value());
    } else if (f == "--dtype") {
      spec.dtype = value();
    } else if (f == "--seed") {
      spec.seed = std::strtoull(value(), nullptr, 10);
    } else if (f == "--llama3-rope-scaling") {
      spec.llama3_rope_scaling = true;
    } else if (f == "--partial-rotary-factor") {
      spec.partial_rotary_factor = std::atof(value());
    } else if (f == "--shards") {
      spec.shards = std::atoi(value());
    } else if (f == "--tie-embeddings") {
      spec.tie_word_embeddings = true;
    } else if (f == "--tokenizer-json") {
      spec.tokenizer_json_path = value();
    } else if (f == "--bos-token") {
      spec.bos_token = value();
      bos_given = true;
    } else if (f == "--eos-token") {
      if (!eos_given) spec.eos_tokens.clear();
      eos_given = true;
      spec.eos_tokens.push_back(value());
    } else if (f == "--generation-eos-token") {
      spec.generation_eos_tokens.push_back(value());
    } else {
      std::fprintf(stderr, "unknown flag %s\n\n%s", f.c_str(), kUsage);
      return 2;
    }
  }
  if (out.empty()) {
    std::fprintf(stderr, "--out is required\n\n%s", kUsage);
    return 2;
  }
  if (spec.model_type != "llama" && spec.model_type != "qwen2" && spec.model_type != "qwen3" &&
      spec.model_type != "glm" && spec.model_type != "glm4") {
    std::fprintf(stderr, "--type must be llama, qwen2, qwen3, glm or glm4\n");
    return 2;
  }
  // The family's special tokens unless the flags named others.
  const infoflow::TestModelSpec family = infoflow::DefaultTestModelSpec(spec.model_type);
  if (!bos_given) spec.bos_token = family.bos_token;
  if (!eos_given) spec.eos_tokens = family.eos_tokens;
  if (spec.tokenizer_json_path.empty()) spec.pad_token = family.pad_token;
  if (spec.shards < 1 || !(spec.partial_rotary_factor > 0 && spec.partial_rotary_factor <= 1)) {
    std::fprintf(stderr, "--shards must be >= 1 and --partial-rotary-factor in (0, 1]\n");
    return 2;
  }
  if (spec.num_heads <= 0 || spec.num_kv_heads <= 0 || spec.hidden_size % spec.num_heads != 0 ||
      spec.num_heads % spec.num_kv_heads != 0 || spec.num_layers <= 0 || spec.vocab_size < 300) {
    std::fprintf(stderr, "inconsistent sizes (hidden %% heads, heads %% kv-heads, vocab >= 300)\n");
    return 2;
  }
  absl::Status s = infoflow::WriteTestModel(out, spec);
  if (!s.ok()) {
    std::fprintf(stderr, "infoflow-make-test-model: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("wrote %s (%s, %lld layers, hidden %lld)\n", out.c_str(), spec.model_type.c_str(),
              static_cast<long long>(spec.num_layers), static_cast<long long>(spec.hidden_size));
  return 0;
}
