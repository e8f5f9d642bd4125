#include "server/query_runner.h"

#include <ATen/ATen.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/text/tokenizer.h"

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

uint64_t RenderedPromptBytes(const std::string& prompt_template, const std::string& question) {
  static constexpr std::string_view kPlaceholder = "{question}";
  const std::string_view tmpl =
      prompt_template.empty() ? std::string_view("\n{question}\n") : prompt_template;
  uint64_t n = 0;
  for (size_t at = tmpl.find(kPlaceholder); at != std::string_view::npos;
       at = tmpl.find(kPlaceholder, at + kPlaceholder.size())) {
    ++n;
  }
  if (n == 0) return tmpl.size() + question.size();
  return tmpl.size() - n * kPlaceholder.size() + n * static_cast<uint64_t>(question.size());
}

QueryRunner::QueryRunner(const Model* model, const Tokenizer* tokenizer,
                         const ChunkResolver* resolver, const QueryLimits& limits)
    : model_(model), tokenizer_(tokenizer), resolver_(resolver), limits_(limits) {}

absl::Status QueryRunner::Prepare(QuerySpec* spec) const {
  const int64_t limit = limits_.max_prompt_tokens;
  const uint64_t byte_limit = static_cast<uint64_t>(limit) * kMaxBytesPerToken;
  if (spec->question.size() > byte_limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "question: ", spec->question.size(), " bytes, more than ", limit,
        " tokens can hold (--max-prompt-tokens ", limit, ", ", kMaxBytesPerToken,
        " bytes per token)"));
  }
  const uint64_t rendered = RenderedPromptBytes(spec->prompt_template, spec->question);
  if (rendered > byte_limit) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt_template: the prompt expands to ", rendered, " bytes with the question, more than ",
        limit, " tokens can hold (--max-prompt-tokens ", limit, ")"));
  }
  spec->question_ids = tokenizer_->Encode(spec->question);
  if (static_cast<int64_t>(spec->question_ids.size()) > limit) {
    return absl::InvalidArgumentError(absl::StrCat("question: ", spec->question_ids.size(),
                                                   " tokens, limit is ", limit,
                                                   " (--max-prompt-tokens)"));
  }
  spec->prompt_ids = tokenizer_->Encode(RenderPrompt(spec->prompt_template, spec->question));
  if (static_cast<int64_t>(spec->prompt_ids.size()) > limit) {
    return absl::InvalidArgumentError(
        absl::StrCat("prompt_template: the rendered prompt has ", spec->prompt_ids.size(),
                     " tokens, limit is ", limit, " (--max-prompt-tokens)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<QueryOutcome> QueryRunner::Run(const QuerySpec& spec, const TokenSink& sink) const {
  const auto t0 = std::chrono::steady_clock::now();
  QueryOutcome out;
  // The resolver calls this once it knows the context length (keys fetched,
  // texts tokenized) and before it prefills anything.
  const int64_t prefix_len = PrefixLength(spec.prefix_mode);
  const int64_t after_context =
      static_cast<int64_t>(spec.prompt_ids.size()) + spec.max_new_tokens;
  auto check_context = [&](int64_t context_tokens) -> absl::Status {
    if (context_tokens > limits_.max_context_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunks: context of ", context_tokens, " tokens is over the limit of ",
                       limits_.max_context_tokens, " (--max-context-tokens)"));
    }
    out.positions = prefix_len + context_tokens + after_context;
    out.beyond_model_positions =
        limits_.max_positions > 0 && out.positions > limits_.max_positions;
    if (out.beyond_model_positions && !limits_.allow_beyond_model_positions) {
      return absl::OutOfRangeError(absl::StrCat(
          "chunks + prompt + max_new_tokens: ", prefix_len, " prefix + ", context_tokens,
          " context + ", spec.prompt_ids.size(), " prompt + ", spec.max_new_tokens,
          " new tokens = ", out.positions, " positions, over the model's max_position_embeddings of ",
          limits_.max_positions));
    }
    return absl::OkStatus();
  };
  absl::StatusOr<ResolvedChunks> resolved =
      resolver_->Resolve(spec.chunks, spec.prefix_mode, check_context);
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
  input.question_ids = spec.question_ids;
  input.prompt_ids = spec.prompt_ids;

  MethodOptions options;
  options.method = spec.method;
  options.ratio = spec.ratio;
  options.reorder = spec.reorder;
  options.scoring_layers = spec.scoring_layers;
  options.lego_k = spec.lego_k;
  options.deviation = spec.deviation;
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
