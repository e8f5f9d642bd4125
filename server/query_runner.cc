#include "server/query_runner.h"

#include <ATen/ATen.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/pipeline.h"
#include "engine/tokenizer.h"

namespace infoflow::server {
namespace {

double MsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

std::string RenderPrompt(const std::string& prompt_template, const std::string& question) {
  const std::string tmpl = prompt_template.empty() ? "\n{question}\n" : prompt_template;
  if (tmpl.find("{question}") == std::string::npos) return tmpl + question;
  return absl::StrReplaceAll(tmpl, {{"{question}", question}});
}

QueryRunner::QueryRunner(const Model* model, const Tokenizer* tokenizer,
                         const ChunkResolver* resolver, int64_t max_context_tokens)
    : model_(model),
      tokenizer_(tokenizer),
      resolver_(resolver),
      max_context_tokens_(max_context_tokens) {}

absl::StatusOr<QueryOutcome> QueryRunner::Run(const QuerySpec& spec, const TokenSink& sink) const {
  const auto t0 = std::chrono::steady_clock::now();
  QueryOutcome out;
  // The resolver refuses a context over the limit before prefilling anything.
  absl::StatusOr<ResolvedChunks> resolved =
      resolver_->Resolve(spec.chunks, spec.prefix_mode, max_context_tokens_);
  if (!resolved.ok()) return resolved.status();
  out.fetch_ms = MsSince(t0);
  out.chunk_hits = resolved->hits;
  out.chunk_misses = resolved->misses;
  out.chunk_keys = resolved->keys_hex;
  out.prefilled_tokens = resolved->prefilled_tokens;
  QueryInput input;
  if (spec.prefix_mode == PrefixMode::kBos) {
    input.prefix_ids = {static_cast<int32_t>(model_->config().bos_token_id.value_or(1))};
  }
  input.chunks = std::move(resolved->chunks);
  input.chunk_prefix_mode = spec.prefix_mode;
  input.question_ids = tokenizer_->Encode(spec.question);
  input.prompt_ids = tokenizer_->Encode(RenderPrompt(spec.prompt_template, spec.question));

  MethodOptions options;
  options.method = spec.method;
  options.ratio = spec.ratio;
  options.reorder = spec.reorder;
  options.scoring_layers = spec.scoring_layers;
  options.lego_k = spec.lego_k;
  options.seed = spec.seed;

  DecodeOptions decode;
  decode.sampling = {spec.temperature, spec.top_p, spec.seed};
  decode.max_new_tokens = spec.max_new_tokens;
  decode.stop_strings = spec.stop;
  for (int64_t id : model_->config().eos_token_ids) decode.stop_ids.push_back(static_cast<int32_t>(id));

  bool first = true;
  absl::StatusOr<QueryResult> result =
      RunQuery(*model_, tokenizer_, input, options, decode, [&](int32_t id, std::string_view text) {
        if (first) {
          out.ttft_ms = MsSince(t0);
          first = false;
        }
        return sink(id, text);
      });
  if (!result.ok()) return result.status();
  const StageTimings& t = result->plan.timings;
  out.reposition_ms = t.reposition_ms;
  out.score_ms = t.score_ms;
  out.select_ms = t.select_ms;
  out.reorder_ms = t.reorder_ms;
  out.recompute_ms = t.recompute_ms;
  out.prompt_ms = t.prompt_ms;
  out.first_token_ms = t.first_token_ms;
  out.decode_ms = t.decode_ms;
  if (first) out.ttft_ms = MsSince(t0);  // nothing generated
  out.context_tokens = result->plan.context_tokens;
  out.recomputed_tokens = static_cast<int64_t>(result->plan.selected.size());
  out.chunk_order = result->plan.chunk_order;
  out.stop_reason = StopReasonName(result->decode.stop_reason);
  out.cancelled = result->decode.stop_reason == StopReason::kCancelled;
  out.generated_tokens = static_cast<int64_t>(result->decode.ids.size());
  out.text = result->decode.text;
  return out;
}

}  // namespace infoflow::server
