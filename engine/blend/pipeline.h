// The query-time pipeline of docs/DESIGN.md §2: given stored chunk KVs and a
// question, build the merged context KV by one Method, then prefill the
// prompt and decode. Every stage is one named function in its own file:
//   reposition.h  RepositionChunks       (§2.3)
//   scoring.h     ScoreByAttentionNorm   (§2.4)
//   selection.h   SelectTopK, ReorderChunks, EpicSelect, RandomSelect
//                                        (§2.5, §2.6, §3)
//   recompute.h   RecomputeTokens (§2.7), CacheBlendRecompute (§3)
// and this file composes them.
//
// Thread-safety: the functions are reentrant; a Model may be shared, each call
// owns its KvCache.
#ifndef INFOFLOW_ENGINE_BLEND_PIPELINE_H_
#define INFOFLOW_ENGINE_BLEND_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/decode/decode.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/blend/method.h"
#include "engine/chunk/chunk_prefill.h"

namespace infoflow {

// Paper's 22..25 for models with more than 26 layers, else L-5..L-2
// (clipped at 0).
std::vector<int> DefaultScoringLayers(const Model& model);

// One query's inputs, all as token ids.
struct QueryInput {
  // What precedes the chunks: [BOS], or a system prompt + chat header. Never
  // a recompute candidate: its KV is exact (positions 0..n-1, nothing before).
  std::vector<int32_t> prefix_ids;
  // Optional: the KV of exactly `prefix_ids` prefilled alone with nothing
  // before (a stored PrefixMode::kNone record), placed at positions 0..n-1
  // instead of prefilling the prefix again. Ignored when lossy (the prefix is
  // then prefilled fresh, so it stays exact) and by Method::kFull.
  std::shared_ptr<const ChunkKv> prefix_kv;
  // The stored chunks, in request order. Each was prefilled alone after
  // `chunk_prefix_mode`. May be empty: a plain prompt, prefix + prompt with
  // no context, which every method serves exactly (nothing to reuse).
  std::vector<std::shared_ptr<const ChunkKv>> chunks;
  PrefixMode chunk_prefix_mode = PrefixMode::kBos;
  // The raw question, used for scoring (not the instruction template).
  std::vector<int32_t> question_ids;
  // What is prefilled after the context before decoding: template + question.
  std::vector<int32_t> prompt_ids;
  // Tokens the caller will decode into the cache (max_new_tokens): the
  // cache is sized for them up front, so it never grows (and copies) later.
  int64_t decode_reserve = 0;
};

struct StageTimings {
  double reposition_ms = 0, score_ms = 0, select_ms = 0, reorder_ms = 0, recompute_ms = 0,
         prompt_ms = 0, first_token_ms = 0, decode_ms = 0;
};

struct RecomputePlan {
  Method method = Method::kInfoFlow;
  int64_t context_tokens = 0;    // chunk tokens, prefix excluded
  std::vector<int64_t> selected;  // recomputed context indices (0 = first chunk token), sorted
  std::vector<int> chunk_order;   // final order, as indices into QueryInput::chunks
  std::vector<double> scores;     // per context token (INFOFLOW), final layout order
  StageTimings timings;
};

// The merged context KV for prefix + chunks, ready for the prompt.
struct BlendedContext {
  KvCache cache;
  RecomputePlan plan;
  int64_t next_position = 0;  // where the prompt starts
  BlendedContext(int n_layers) : cache(n_layers) {}
};

// The checks BuildContext makes on `options` alone: ratio and stale_share
// in [0, 1], lego_k >= 0, probe_factor in [0, 1e6], scoring layers in
// range. InvalidArgument naming the field. (engine/dist reuses them.)
absl::Status ValidateMethodOptions(const Model& model, const MethodOptions& options);

// OK when `kv` has one [num_kv_heads, kv.size(), head_dim] K and V per
// layer; else FailedPrecondition "<what>: KV shape does not match the model".
absl::Status CheckKvShape(const Model& model, const ChunkKv& kv, const std::string& what);

// Builds the merged context by `options.method`. InvalidArgument for ratio
// outside [0, 1], bad scoring layers, an empty prompt, or a chunk that is
// empty or whose K/V shapes do not fit the model. With no chunks the context
// is the prefix alone, built as FULL builds it (a fresh prefill) or as the
// reusing methods place it (a stored prefix record), exact either way.
absl::StatusOr<BlendedContext> BuildContext(const Model& model, const QueryInput& input,
                                            const MethodOptions& options);

struct QueryResult {
  RecomputePlan plan;
  DecodeResult decode;
  double ttft_ms = 0;  // from BuildContext start to the first sampled token
};

// BuildContext + prompt prefill + Decode, streaming tokens to `on_token`.
absl::StatusOr<QueryResult> RunQuery(const Model& model, const Tokenizer* tokenizer,
                                     const QueryInput& input, const MethodOptions& options,
                                     const DecodeOptions& decode, const TokenCallback& on_token);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_PIPELINE_H_
