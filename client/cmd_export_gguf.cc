// `infoflow export-gguf`: writes a Hugging Face LLaMA-architecture model
// directory as a GGUF file llama.cpp loads (engine/checkpoint/gguf_export.h).
//
//   infoflow export-gguf --model DIR --out F.gguf [--dtype f32|f16] [--tokenizer-pre NAME]
#include <cstdio>
#include <string>

#include "client/commands.h"
#include "client/flags.h"
#include "engine/checkpoint/gguf_export.h"

namespace infoflow::cli {
namespace {

constexpr char kUsage[] =
    "usage: infoflow export-gguf --model DIR --out F.gguf [--dtype f32|f16]\n"
    "                            [--tokenizer-pre NAME] [--name NAME]\n"
    "\n"
    "Writes DIR (config.json, safetensors, tokenizer.json; model_type llama or\n"
    "mistral, byte-level BPE tokenizer) as GGUF v3, general.architecture llama.\n"
    "  --dtype          matrices as f32 (default) or f16; norms stay f32\n"
    "  --tokenizer-pre  llama.cpp pre-tokenizer name (gpt-2, llama-bpe, qwen2, ...);\n"
    "                   default: detected from tokenizer.json, refused when llama.cpp\n"
    "                   has no equivalent (e.g. models/infoflow-tiny's 1-2 digit split)\n"
    "  --name           general.name (default: the directory name)\n"
    "\n"
    "Exit status: 0 success, 1 refused or failed, 2 usage.\n";

}  // namespace

int RunExportGguf(int argc, char** argv) {
  Flags flags;
  if (!flags.Parse(argc, argv, {"model", "out", "dtype", "tokenizer-pre", "name"}, {"help"})) {
    std::fprintf(stderr, "infoflow export-gguf: %s\n\n%s", flags.error().c_str(), kUsage);
    return 2;
  }
  if (!flags.positional().empty()) {
    std::fprintf(stderr, "infoflow export-gguf: unexpected argument '%s'\n\n%s",
                 flags.positional()[0].c_str(), kUsage);
    return 2;
  }
  if (flags.Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  const std::string model = flags.Get("model"), out = flags.Get("out");
  const std::string dtype = flags.Get("dtype", "f32");
  if (model.empty() || out.empty() || (dtype != "f32" && dtype != "f16")) {
    std::fprintf(stderr, "infoflow export-gguf: need --model, --out and --dtype f32|f16\n\n%s",
                 kUsage);
    return 2;
  }
  GgufExportOptions options;
  options.dtype = dtype == "f16" ? gguf::TensorType::kF16 : gguf::TensorType::kF32;
  options.tokenizer_pre = flags.Get("tokenizer-pre");
  options.name = flags.Get("name");
  absl::StatusOr<GgufExportSummary> s = ExportGguf(model, out, options);
  if (!s.ok()) {
    std::fprintf(stderr, "infoflow export-gguf: %s\n", std::string(s.status().message()).c_str());
    return 1;
  }
  for (const std::string& note : s->notes) std::fprintf(stderr, "note: %s\n", note.c_str());
  std::printf("wrote %s: GGUF v3, %zu tensors, %zu metadata keys, %s, tokenizer.ggml.pre %s\n",
              out.c_str(), s->num_tensors, s->num_kvs, dtype.c_str(), s->tokenizer_pre.c_str());
  return 0;
}

}  // namespace infoflow::cli
