// QueryRunner: one Query request end to end over the engine -- resolve the
// chunks (ChunkResolver), build the prompt from the template, run the
// pipeline (engine/blend/pipeline.h RunQuery) streaming tokens, and summarise the
// run as a report. The gRPC service only translates to and from this.
//
// Thread-safe; one Run per request thread.
#ifndef INFOFLOW_SERVER_QUERY_RUNNER_H_
#define INFOFLOW_SERVER_QUERY_RUNNER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/text/tokenizer.h"
#include "engine/blend/method.h"
#include "engine/blend/pipeline.h"
#include "engine/decode/decode.h"
#include "server/chunk_resolver.h"

namespace infoflow::server {

struct QuerySpec {
  std::vector<ChunkRef> chunks;
  PrefixMode prefix_mode;
  std::string prompt_template;  // contains "{question}" (or the question is appended)
  std::string question;
  Method method = kDefaultMethod;
  double ratio = DefaultRatio(kDefaultMethod);
  bool reorder = false;
  std::vector<int> scoring_layers;
  int lego_k = 4;
  Deviation deviation = Deviation::kV;
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
  int max_new_tokens = 64;
  int min_new_tokens = 0;  // stop ids masked out before this many tokens
  // max_new_tokens is a default, not the client's number (an OpenAI chat
  // request without max_tokens): once the context length is known it
  // shrinks to the model's positions left after the prompt, as OpenAI's and
  // vLLM's chat endpoints answer "until done", instead of refusing the query.
  bool fit_new_tokens = false;
  std::vector<std::string> stop;
  // Text before the chunks (system prompt + chat header); "" = none (then
  // [BOS] precedes the chunks in kBos mode). Special tokens parsed.
  std::string prefix;
  // When a prefix the store lacks is written (ChunkResolver::ResolvePrefix).
  PrefixStorePolicy prefix_store = PrefixStorePolicy::kAlways;
  // Special-token spellings in the question (and chunk texts: ChunkRef) are
  // special tokens; false: plain text. The template's always are.
  bool parse_special = false;
  std::vector<int32_t> stop_ids;  // added to the model's StopTokenIds
  // Filled by QueryRunner::Prepare.
  std::vector<int32_t> question_ids;
  std::vector<int32_t> prompt_ids;  // rendered template + question
  std::vector<int32_t> prefix_ids;  // tokens of `prefix`
};

// The server's per-query limits (ServerOptions) and the model's positions.
struct QueryLimits {
  int64_t max_context_tokens = 8192;
  int64_t max_prompt_tokens = 2048;
  int64_t max_prefix_tokens = 2048;
  int64_t max_positions = 0;  // the model's max_position_embeddings; 0 = unknown
  bool allow_beyond_model_positions = false;
};

struct PrefilledQuery;  // server/prefilled_query.h

struct QueryOutcome {
  double ttft_ms = 0;  // from Run's start to the first token
  double fetch_ms = 0;
  double reposition_ms = 0, score_ms = 0, select_ms = 0, reorder_ms = 0, recompute_ms = 0,
         prompt_ms = 0, first_token_ms = 0, decode_ms = 0;
  int64_t context_tokens = 0;
  int64_t recomputed_tokens = 0;
  int64_t prefilled_tokens = 0;  // chunk tokens prefilled now (write-through)
  int chunk_hits = 0, chunk_misses = 0;
  int chunk_remote_hits = 0;  // of chunk_hits: from the shared tier
  std::vector<int> chunk_order;
  std::vector<std::string> chunk_keys;
  std::string stop_reason;  // StopReasonName
  bool cancelled = false;
  int64_t generated_tokens = 0;
  std::string text;
  // Positions the query may use: prefix + context + prompt + max_new_tokens.
  int64_t positions = 0;
  bool beyond_model_positions = false;  // positions > max_position_embeddings
  int64_t prefix_tokens = 0;  // tokens before the chunks
  bool prefix_cached = false;  // the text prefix's KV came from the store
  std::string prefix_key;      // its record's key; "" without a text prefix
};

// Copies what the engine's plan says into `out`: the blend stages' times
// (reposition, score, select, reorder, recompute), the context length, the
// recomputed token count and the chunk order.
void SetPlanOutcome(const RecomputePlan& plan, QueryOutcome* out);

// Copies how decoding ended into `out`: stop reason, cancelled, generated
// token count and text.
void SetDecodeOutcome(const DecodeResult& result, QueryOutcome* out);

// Receives each generated token; return false to cancel.
using TokenSink = std::function<bool(int32_t id, std::string_view text)>;

// Prompt = template with every "{question}" replaced by `question`, or
// template + question when it has no placeholder; empty template = "\n{question}\n".
std::string RenderPrompt(const std::string& prompt_template, const std::string& question);

// Bytes RenderPrompt would return, computed without building the string (a
// small template that repeats the placeholder can expand a lot).
uint64_t RenderedPromptBytes(const std::string& prompt_template, const std::string& question);

// RenderPrompt as tokenizer pieces: the template's text parses special tokens
// (it is the operator's chat format), each substituted question parses them
// only when `question_parse_special`. Views into the arguments (or a static
// default template), valid while they are.
std::vector<Tokenizer::Piece> RenderPromptPieces(const std::string& prompt_template,
                                                 const std::string& question,
                                                 bool question_parse_special);

class QueryRunner {
 public:
  // Pointers must outlive the runner.
  QueryRunner(const Model* model, const Tokenizer* tokenizer, const ChunkResolver* resolver,
              const QueryLimits& limits);

  const Tokenizer* tokenizer() const { return tokenizer_; }

  // Checks the prefix, the prompt and the question against the limits and
  // tokenizes them into spec->prefix_ids / prompt_ids / question_ids. Cheap
  // and bounded (the byte length is checked before tokenizing); call before
  // queueing the request. InvalidArgument naming `prefix`, `question` or
  // `prompt_template` and the limit.
  absl::Status Prepare(QuerySpec* spec) const;

  // Runs a Prepare'd spec. Before any prefill: InvalidArgument when the
  // context is over max_context_tokens, OutOfRange when prefix + context +
  // prompt + max_new_tokens exceed the model's positions (unless allowed);
  // the resolver's and the pipeline's errors as they are. A text prefix's KV
  // comes from the store (ChunkResolver::ResolvePrefix: prefilled once per
  // distinct prefix); without one, kBos puts the model's BOS before the chunks.
  // Stops at the model's StopTokenIds and spec.stop_ids / spec.stop.
  absl::StatusOr<QueryOutcome> Run(const QuerySpec& spec, const TokenSink& sink) const;

  // Called once the query's positions (prefix + context + prompt +
  // max_new_tokens) are known and before any prefill; an error refuses the
  // query. The scheduler reserves KV memory here.
  using PositionsCheck = std::function<absl::Status(int64_t positions)>;

  // Run's first phase: the same checks, chunk resolution, context and
  // prompt prefill; returns the state to decode from (decode alone with
  // DecodeAlone, or in the scheduler's batch). `positions_check` may be null.
  absl::StatusOr<std::unique_ptr<PrefilledQuery>> Prefill(
      const QuerySpec& spec, const PositionsCheck& positions_check) const;

  // Run's second phase, alone: Decode with Model::Forward, one token a step.
  QueryOutcome DecodeAlone(std::unique_ptr<PrefilledQuery> q, const TokenSink& sink) const;

  // Prefill's first half, shared with the sequence-parallel path
  // (server/group/): the context and positions checks, chunk resolution and
  // the prefix, into the engine's QueryInput. Fills out's fetch time (from
  // `start`), chunk hits/misses/keys, positions and prefix fields.
  absl::StatusOr<QueryInput> ResolveInput(const QuerySpec& spec,
                                          const PositionsCheck& positions_check,
                                          std::chrono::steady_clock::time_point start,
                                          QueryOutcome* out) const;
  // The engine's method and decode options for `spec` (stop ids: the
  // model's plus the request's; the answer's length: `input`'s
  // decode_reserve, which ResolveInput set).
  MethodOptions MethodOptionsFor(const QuerySpec& spec) const;
  DecodeOptions DecodeOptionsFor(const QuerySpec& spec, const QueryInput& input) const;

 private:
  // The K/V of the lone BOS token at position 0 (PREFIX_MODE_BOS without a
  // text prefix): the same for every query, so prefilled once, on first use,
  // and placed as a stored prefix is (AppendChunkAt, bit-identical to a fresh
  // prefill) instead of a one-token forward pass per query, a whole read of
  // the weights. Null when the model has no BOS or that prefill failed; the
  // query then prefills it itself, as before.
  std::shared_ptr<const ChunkKv> BosKv() const;

  const Model* model_;
  const Tokenizer* tokenizer_;
  const ChunkResolver* resolver_;
  QueryLimits limits_;
  mutable std::once_flag bos_once_;
  mutable std::shared_ptr<const ChunkKv> bos_kv_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_QUERY_RUNNER_H_
