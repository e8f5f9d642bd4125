// infoflow generate: in-process generation from a model directory.
#include <ATen/ATen.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <iostream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/flags.h"
#include "engine/decode/decode.h"
#include "engine/model/model.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/runtime.h"
#include "engine/text/tokenizer.h"

namespace infoflow::cli {
namespace {

constexpr char kUsage[] =
    "usage: infoflow generate --model DIR (--prompt TEXT | --prompt-ids 1,2,3)\n"
    "                         [--max-new-tokens N] [--temperature T] [--top-p P] [--seed S]\n"
    "                         [--stop STRING]... [--print-ids] [--device auto|cpu|cuda]\n"
    "                         [--dtype auto|f32|bf16|f16] [--threads N] [--add-bos]\n"
    "\n"
    "Runs the model in-process (no server) and streams the generated text to stdout.\n"
    "  --prompt TEXT       encoded with DIR/tokenizer.json\n"
    "  --prompt-ids LIST   comma-separated token ids, used as given (no BOS added)\n"
    "  --max-new-tokens N  default 64\n"
    "  --temperature T     0 (default) = greedy\n"
    "  --print-ids         print the generated ids space-separated instead of text\n"
    "  --add-bos           with --prompt: prepend the model's BOS id\n"
    "Stops at max-new-tokens, the model's stop ids (config.json and generation_config.json\n"
    "eos_token_id), or a --stop string.\n";

}  // namespace

int RunGenerate(int argc, char** argv) {
  Flags flags;
  if (!flags.Parse(argc, argv,
                   {"model", "prompt", "prompt-ids", "max-new-tokens", "temperature", "top-p", "seed",
                    "stop", "device", "dtype", "threads"},
                   {"print-ids", "add-bos", "help"})) {
    std::fprintf(stderr, "infoflow generate: %s\n\n%s", flags.error().c_str(), kUsage);
    return 2;
  }
  if (flags.Has("help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!flags.Has("model") || flags.Has("prompt") == flags.Has("prompt-ids")) {
    std::fprintf(stderr, "infoflow generate: need --model and exactly one of --prompt, --prompt-ids\n\n%s",
                 kUsage);
    return 2;
  }
  int threads = 0, max_new = 64;
  uint64_t seed = 0;
  float temperature = 0, top_p = 1;
  if (!absl::SimpleAtoi(flags.Get("threads", "0"), &threads) ||
      !absl::SimpleAtoi(flags.Get("max-new-tokens", "64"), &max_new) || max_new < 0 ||
      !absl::SimpleAtoi(flags.Get("seed", "0"), &seed) ||
      !absl::SimpleAtof(flags.Get("temperature", "0"), &temperature) || temperature < 0 ||
      !absl::SimpleAtof(flags.Get("top-p", "1"), &top_p) || top_p <= 0 || top_p > 1) {
    std::fprintf(stderr, "infoflow generate: bad numeric flag value\n\n%s", kUsage);
    return 2;
  }
  InitTorchRuntime(threads);

  const std::string dir = flags.Get("model");
  LoadOptions load;
  load.device = flags.Get("device", "auto");
  load.dtype = flags.Get("dtype", "auto");
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(dir, load);
  if (!model.ok()) {
    std::fprintf(stderr, "infoflow generate: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  std::unique_ptr<Tokenizer> tokenizer;
  if (std::filesystem::exists(dir + "/tokenizer.json")) {
    absl::StatusOr<std::unique_ptr<Tokenizer>> t = Tokenizer::FromFile(dir + "/tokenizer.json");
    if (!t.ok()) {
      std::fprintf(stderr, "infoflow generate: %s\n", std::string(t.status().message()).c_str());
      return 1;
    }
    tokenizer = *std::move(t);
  }

  std::vector<int32_t> prompt;
  if (flags.Has("prompt-ids")) {
    for (absl::string_view part : absl::StrSplit(flags.Get("prompt-ids"), ',', absl::SkipEmpty())) {
      int32_t id;
      if (!absl::SimpleAtoi(part, &id) || id < 0 || id >= (*model)->config().vocab_size) {
        std::fprintf(stderr, "infoflow generate: bad token id '%s' in --prompt-ids\n",
                     std::string(part).c_str());
        return 2;
      }
      prompt.push_back(id);
    }
  } else {
    if (!tokenizer) {
      std::fprintf(stderr, "infoflow generate: %s has no tokenizer.json; use --prompt-ids\n",
                   dir.c_str());
      return 2;
    }
    if (flags.Has("add-bos")) {
      if (!(*model)->config().bos_token_id.has_value()) {
        std::fprintf(stderr, "infoflow generate: --add-bos: %s/config.json has no bos_token_id\n",
                     dir.c_str());
        return 2;
      }
      prompt.push_back(static_cast<int32_t>(*(*model)->config().bos_token_id));
    }
    std::vector<int32_t> ids = tokenizer->Encode(flags.Get("prompt"));
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  }
  if (prompt.empty()) {
    std::fprintf(stderr, "infoflow generate: empty prompt\n");
    return 2;
  }

  DecodeOptions options;
  options.sampling = {temperature, top_p, seed};
  options.max_new_tokens = max_new;
  options.stop_strings = flags.GetAll("stop");
  // Token ids given explicitly are a debugging path: run to max-new-tokens so
  // the output can be compared with a reference at every length.
  if (!flags.Has("prompt-ids")) {
    for (int64_t id : StopTokenIds((*model)->config())) options.stop_ids.push_back(static_cast<int32_t>(id));
  }
  const bool print_ids = flags.Has("print-ids");

  const auto start = std::chrono::steady_clock::now();
  KvCache cache((*model)->n_layers());
  at::Tensor logits = PrefillTokens(**model, prompt, 0, &cache).logits;
  bool first = true;
  DecodeResult result = Decode(
      **model, &cache, static_cast<int64_t>(prompt.size()), logits, options,
      print_ids ? nullptr : tokenizer.get(), [&](int32_t id, std::string_view text) {
        if (print_ids) {
          if (id >= 0) std::printf(first ? "%d" : " %d", id);
          first = false;
        } else {
          std::fwrite(text.data(), 1, text.size(), stdout);
        }
        std::fflush(stdout);
        return true;
      });
  std::printf("\n");
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(stderr, "[%zu prompt tokens, %zu generated, %.1f tok/s, stop: %s]\n", prompt.size(),
               result.ids.size(), result.ids.size() / std::max(secs, 1e-9),
               StopReasonName(result.stop_reason));
  return 0;
}

}  // namespace infoflow::cli
