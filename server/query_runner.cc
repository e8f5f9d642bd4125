#include "server/query_runner.h"

#include <ATen/ATen.h>

#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/forward.h"
#include "engine/model/stopwatch.h"
#include "engine/text/tokenizer.h"
#include "server/prefilled_query.h"
#include "server/token_limit.h"

namespace infoflow::server {

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

std::vector<Tokenizer::Piece> RenderPromptPieces(const std::string& prompt_template,
                                                 const std::string& question,
                                                 bool question_parse_special) {
  static constexpr std::string_view kPlaceholder = "{question}";
  const std::string_view tmpl =
      prompt_template.empty() ? std::string_view("\n{question}\n") : prompt_template;
  std::vector<Tokenizer::Piece> pieces;
  size_t from = 0;
  bool substituted = false;
  for (size_t at = tmpl.find(kPlaceholder); at != std::string_view::npos;
       at = tmpl.find(kPlaceholder, from)) {
    if (at > from) pieces.push_back({tmpl.substr(from, at - from), true});
    pieces.push_back({question, question_parse_special});
    from = at + kPlaceholder.size();
    substituted = true;
  }
  if (from < tmpl.size()) pieces.push_back({tmpl.substr(from), true});
  if (!substituted) pieces.push_back({question, question_parse_special});
  return pieces;
}

QueryRunner::QueryRunner(const Model* model, const Tokenizer* tokenizer,
                         const ChunkResolver* resolver, const QueryLimits& limits)
    : model_(model), tokenizer_(tokenizer), resolver_(resolver), limits_(limits) {}

std::shared_ptr<const ChunkKv> QueryRunner::BosKv() const {
  std::call_once(bos_once_, [&] {
    if (!model_->config().bos_token_id.has_value()) return;
    try {
      absl::StatusOr<ChunkKv> kv = PrefillChunk(
          *model_, {static_cast<int32_t>(*model_->config().bos_token_id)}, PrefixMode::kNone);
      if (kv.ok()) bos_kv_ = std::make_shared<const ChunkKv>(*std::move(kv));
    } catch (const std::exception&) {
      // Left null: every query prefills its BOS, as before.
    }
  });
  return bos_kv_;
}

absl::Status QueryRunner::Prepare(QuerySpec* spec) const {
  // A query without chunks (a plain prompt over the HTTP API) has no
  // context: the context's budget goes to its prefix (a chat's history) and
  // what the prefix leaves to its prompt, prefilled whole as FULL would
  // prefill that many context tokens.
  const bool plain = spec->chunks.empty();
  const int64_t context_budget = limits_.max_context_tokens;
  int64_t spare = plain ? context_budget : 0;
  spec->prefix_ids.clear();
  if (!spec->prefix.empty()) {
    const int64_t prefix_limit = limits_.max_prefix_tokens + spare;
    // The flags behind the limit, for a refusal's message (built only then).
    auto flags = [&] {
      return plain ? absl::StrCat("--max-prefix-tokens ", limits_.max_prefix_tokens,
                                  " + --max-context-tokens ", context_budget,
                                  ", a prompt without chunks")
                   : absl::StrCat("--max-prefix-tokens ", prefix_limit);
    };
    if (spec->prefix.size() > static_cast<uint64_t>(prefix_limit) * kMaxBytesPerToken) {
      return TokenLimitError(absl::StatusCode::kInvalidArgument,
                             absl::StrCat("prefix: ", spec->prefix.size(), " bytes, more than ",
                                          prefix_limit, " tokens can hold (", flags(), "; ",
                                          kMaxBytesPerToken, " bytes per token)"));
    }
    spec->prefix_ids = tokenizer_->EncodePieces({{spec->prefix, true}});
    const int64_t n = static_cast<int64_t>(spec->prefix_ids.size());
    if (n > prefix_limit) {
      return TokenLimitError(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("prefix: ", n, " tokens, limit is ", prefix_limit, " (", flags(), ")"));
    }
    for (int32_t id : spec->prefix_ids) {
      if (id < 0 || id >= model_->config().vocab_size) {
        return absl::InvalidArgumentError(absl::StrCat(
            "prefix: token id ", id, " is outside the model's vocabulary of ",
            model_->config().vocab_size));
      }
    }
    spare -= std::max<int64_t>(0, n - limits_.max_prefix_tokens);
  }
  const int64_t limit = limits_.max_prompt_tokens + spare;
  auto flags = [&] {
    std::string f = absl::StrCat("--max-prompt-tokens ", limits_.max_prompt_tokens);
    if (plain && spare == context_budget) {
      absl::StrAppend(&f, " + --max-context-tokens ", context_budget, ", a prompt without chunks");
    } else if (plain) {
      absl::StrAppend(&f, " + the ", spare, " of --max-context-tokens ", context_budget,
                      " that the prefix left, a prompt without chunks");
    }
    return f;
  };
  const uint64_t byte_limit = static_cast<uint64_t>(limit) * kMaxBytesPerToken;
  if (spec->question.size() > byte_limit) {
    return TokenLimitError(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("question: ", spec->question.size(), " bytes, more than ", limit,
                     " tokens can hold (", flags(), "; ", kMaxBytesPerToken, " bytes per token)"));
  }
  const uint64_t rendered = RenderedPromptBytes(spec->prompt_template, spec->question);
  if (rendered > byte_limit) {
    return TokenLimitError(absl::StatusCode::kInvalidArgument,
                           absl::StrCat("prompt_template: the prompt expands to ", rendered,
                                        " bytes with the question, more than ", limit,
                                        " tokens can hold (", flags(), ")"));
  }
  spec->question_ids = tokenizer_->EncodePieces({{spec->question, spec->parse_special}});
  if (static_cast<int64_t>(spec->question_ids.size()) > limit) {
    return TokenLimitError(absl::StatusCode::kInvalidArgument,
                           absl::StrCat("question: ", spec->question_ids.size(),
                                        " tokens, limit is ", limit, " (", flags(), ")"));
  }
  spec->prompt_ids = tokenizer_->EncodePieces(
      RenderPromptPieces(spec->prompt_template, spec->question, spec->parse_special));
  if (static_cast<int64_t>(spec->prompt_ids.size()) > limit) {
    return TokenLimitError(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("prompt_template: the rendered prompt has ", spec->prompt_ids.size(),
                     " tokens, limit is ", limit, " (", flags(), ")"));
  }
  return absl::OkStatus();
}

void SetPlanOutcome(const RecomputePlan& plan, QueryOutcome* out) {
  const StageTimings& t = plan.timings;
  out->reposition_ms = t.reposition_ms;
  out->score_ms = t.score_ms;
  out->select_ms = t.select_ms;
  out->reorder_ms = t.reorder_ms;
  out->recompute_ms = t.recompute_ms;
  out->context_tokens = plan.context_tokens;
  out->recomputed_tokens = static_cast<int64_t>(plan.selected.size());
  out->chunk_order = plan.chunk_order;
}

void MarkFirstToken(PrefilledQuery* q) {
  q->outcome.ttft_ms = MsSince(q->start);
  q->outcome.first_token_ms = MsSince(q->prompt_done);
}

void FinishOutcome(PrefilledQuery* q, const DecodeResult& result) {
  QueryOutcome& out = q->outcome;
  if (result.ids.empty() && out.ttft_ms == 0) out.ttft_ms = MsSince(q->start);  // nothing generated
  out.decode_ms = MsSince(q->prompt_done);
  SetDecodeOutcome(result, &out);
}

void SetDecodeOutcome(const DecodeResult& result, QueryOutcome* out) {
  out->stop_reason = StopReasonName(result.stop_reason);
  out->cancelled = result.stop_reason == StopReason::kCancelled;
  out->generated_tokens = static_cast<int64_t>(result.ids.size());
  out->text = result.text;
}

absl::StatusOr<QueryInput> QueryRunner::ResolveInput(const QuerySpec& spec,
                                                     const PositionsCheck& positions_check,
                                                     std::chrono::steady_clock::time_point start,
                                                     QueryOutcome* out_ptr) const {
  QueryOutcome& out = *out_ptr;
  // The resolver calls this once it knows the context length (keys fetched,
  // texts tokenized) and before it prefills anything.
  const int64_t prefix_len = spec.prefix_ids.empty()
                                 ? PrefixLength(spec.prefix_mode)
                                 : static_cast<int64_t>(spec.prefix_ids.size());
  const int64_t prompt_len = static_cast<int64_t>(spec.prompt_ids.size());
  int64_t new_tokens = spec.max_new_tokens;
  auto check_context = [&](int64_t context_tokens) -> absl::Status {
    if (context_tokens > limits_.max_context_tokens) {
      return TokenLimitError(
          absl::StatusCode::kInvalidArgument,
          absl::StrCat("chunks: context of ", context_tokens, " tokens is over the limit of ",
                       limits_.max_context_tokens, " (--max-context-tokens)"));
    }
    const int64_t before_answer = prefix_len + context_tokens + prompt_len;
    if (spec.fit_new_tokens && limits_.max_positions > 0 && !limits_.allow_beyond_model_positions &&
        before_answer < limits_.max_positions) {
      new_tokens = std::min(new_tokens, limits_.max_positions - before_answer);
    }
    out.positions = before_answer + new_tokens;
    out.beyond_model_positions =
        limits_.max_positions > 0 && out.positions > limits_.max_positions;
    if (out.beyond_model_positions && !limits_.allow_beyond_model_positions) {
      return TokenLimitError(
          absl::StatusCode::kOutOfRange,
          absl::StrCat(
              "chunks + prompt + max_new_tokens: ", prefix_len, " prefix + ", context_tokens,
              " context + ", prompt_len, " prompt + ", new_tokens, " new tokens = ", out.positions,
              " positions, over the model's max_position_embeddings of ", limits_.max_positions));
    }
    return positions_check ? positions_check(out.positions) : absl::OkStatus();
  };
  absl::StatusOr<ResolvedChunks> resolved =
      resolver_->Resolve(spec.chunks, spec.prefix_mode, check_context);
  if (!resolved.ok()) return resolved.status();
  out.fetch_ms = MsSince(start);
  out.chunk_hits = resolved->hits;
  out.chunk_misses = resolved->misses;
  out.chunk_remote_hits = resolved->remote_hits;
  out.chunk_keys = resolved->keys_hex;
  out.prefilled_tokens = resolved->prefilled_tokens;
  QueryInput input;
  if (!spec.prefix_ids.empty()) {
    // After the context check, so a refused query stores nothing.
    absl::StatusOr<ResolvedPrefix> prefix =
        resolver_->ResolvePrefix(spec.prefix_ids, spec.prefix_store);
    if (!prefix.ok()) return prefix.status();
    input.prefix_ids = spec.prefix_ids;
    input.prefix_kv = prefix->kv;
    out.prefix_cached = prefix->cached;
    out.prefix_key = prefix->key_hex;
    out.fetch_ms = MsSince(start);
  } else if (spec.prefix_mode == PrefixMode::kBos) {
    if (!model_->config().bos_token_id.has_value()) {
      return absl::InvalidArgumentError(
          "prefix_mode: PREFIX_MODE_BOS, but the model's config.json has no bos_token_id; use "
          "PREFIX_MODE_NONE");
    }
    input.prefix_ids = {static_cast<int32_t>(*model_->config().bos_token_id)};
    input.prefix_kv = BosKv();
  }
  out.prefix_tokens = static_cast<int64_t>(input.prefix_ids.size());
  input.chunks = std::move(resolved->chunks);
  input.chunk_prefix_mode = spec.prefix_mode;
  input.question_ids = spec.question_ids;
  input.prompt_ids = spec.prompt_ids;
  input.decode_reserve = new_tokens;
  return input;
}

MethodOptions QueryRunner::MethodOptionsFor(const QuerySpec& spec) const {
  MethodOptions options;
  options.method = spec.method;
  options.ratio = spec.ratio;
  options.reorder = spec.reorder;
  options.scoring_layers = spec.scoring_layers;
  options.lego_k = spec.lego_k;
  options.deviation = spec.deviation;
  options.seed = spec.seed;
  return options;
}

DecodeOptions QueryRunner::DecodeOptionsFor(const QuerySpec& spec, const QueryInput& input) const {
  DecodeOptions decode;
  decode.sampling = {spec.temperature, spec.top_p, spec.seed};
  // ResolveInput's count: the spec's, or what the positions left of a default.
  decode.max_new_tokens = static_cast<int>(input.decode_reserve);
  decode.min_new_tokens = std::min(spec.min_new_tokens, decode.max_new_tokens);
  decode.stop_strings = spec.stop;
  for (int64_t id : StopTokenIds(model_->config())) decode.stop_ids.push_back(static_cast<int32_t>(id));
  decode.stop_ids.insert(decode.stop_ids.end(), spec.stop_ids.begin(), spec.stop_ids.end());
  return decode;
}

absl::StatusOr<std::unique_ptr<PrefilledQuery>> QueryRunner::Prefill(
    const QuerySpec& spec, const PositionsCheck& positions_check) const {
  auto q = std::make_unique<PrefilledQuery>();
  q->start = std::chrono::steady_clock::now();
  QueryOutcome& out = q->outcome;
  absl::StatusOr<QueryInput> resolved = ResolveInput(spec, positions_check, q->start, &out);
  if (!resolved.ok()) return resolved.status();
  QueryInput& input = *resolved;
  const MethodOptions options = MethodOptionsFor(spec);
  q->decode = DecodeOptionsFor(spec, input);

  // As RunQuery (engine/blend/pipeline.h): BuildContext, then the prompt.
  absl::StatusOr<BlendedContext> ctx = BuildContext(*model_, input, options);
  if (!ctx.ok()) return ctx.status();
  const auto prompt_t0 = std::chrono::steady_clock::now();
  q->logits = PrefillTokens(*model_, input.prompt_ids, ctx->next_position, &ctx->cache).logits;
  q->prompt_done = std::chrono::steady_clock::now();
  q->next_position = ctx->next_position + static_cast<int64_t>(input.prompt_ids.size());
  q->cache = std::make_unique<KvCache>(std::move(ctx->cache));
  SetPlanOutcome(ctx->plan, &out);
  out.prompt_ms = MsSince(prompt_t0);
  return q;
}

QueryOutcome QueryRunner::DecodeAlone(std::unique_ptr<PrefilledQuery> q,
                                      const TokenSink& sink) const {
  bool first = true;
  DecodeResult result = Decode(*model_, q->cache.get(), q->next_position, q->logits, q->decode,
                               tokenizer_, [&](int32_t id, std::string_view text) {
                                 if (first) {
                                   MarkFirstToken(q.get());
                                   first = false;
                                 }
                                 return sink(id, text);
                               });
  FinishOutcome(q.get(), result);
  return std::move(q->outcome);
}

absl::StatusOr<QueryOutcome> QueryRunner::Run(const QuerySpec& spec, const TokenSink& sink) const {
  absl::StatusOr<std::unique_ptr<PrefilledQuery>> q = Prefill(spec, nullptr);
  if (!q.ok()) return q.status();
  return DecodeAlone(*std::move(q), sink);
}

}  // namespace infoflow::server
