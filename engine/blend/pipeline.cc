#include "engine/blend/pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/blend/recompute.h"
#include "engine/blend/reposition.h"
#include "engine/blend/scoring.h"
#include "engine/blend/selection.h"
#include "engine/model/stopwatch.h"

namespace infoflow {

absl::Status ValidateMethodOptions(const Model& model, const MethodOptions& options) {
  if (!(options.ratio >= 0.0 && options.ratio <= 1.0)) {
    return absl::InvalidArgumentError(absl::StrCat("ratio must be in [0, 1], got ", options.ratio));
  }
  if (options.lego_k < 0) return absl::InvalidArgumentError("lego_k must be >= 0");
  if (!(options.stale_share >= 0.0 && options.stale_share <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("stale_share must be in [0, 1], got ", options.stale_share));
  }
  if (!(options.probe_factor >= 0.0 && options.probe_factor <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("probe_factor must be in [0, 1e6], got ", options.probe_factor));
  }
  for (int l : options.scoring_layers) {
    if (l < 0 || l >= model.n_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("scoring_layers: layer ", l, " outside [0, ", model.n_layers(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckKvShape(const Model& model, const ChunkKv& kv, const std::string& what) {
  const auto& c = model.config();
  if (static_cast<int>(kv.k.size()) != model.n_layers() ||
      static_cast<int>(kv.v.size()) != model.n_layers() || kv.k[0].dim() != 3 ||
      kv.k[0].size(0) != c.num_key_value_heads || kv.k[0].size(1) != kv.size() ||
      kv.k[0].size(2) != c.head_dim) {
    return absl::FailedPreconditionError(absl::StrCat(what, ": KV shape does not match the model"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status Validate(const Model& model, const QueryInput& input, const MethodOptions& options) {
  if (absl::Status s = ValidateMethodOptions(model, options); !s.ok()) return s;
  if (input.prompt_ids.empty()) return absl::InvalidArgumentError("prompt: no tokens");
  for (size_t i = 0; i < input.chunks.size(); ++i) {
    const ChunkKv* ch = input.chunks[i].get();
    if (ch == nullptr || ch->size() == 0) {
      return absl::InvalidArgumentError(absl::StrCat("chunks[", i, "] is empty"));
    }
    if (absl::Status s = CheckKvShape(model, *ch, absl::StrCat("chunks[", i, "]")); !s.ok()) {
      return s;
    }
  }
  if (input.prefix_kv != nullptr) {
    if (input.prefix_kv->token_ids != input.prefix_ids) {
      return absl::InvalidArgumentError("prefix_kv: its tokens are not prefix_ids");
    }
    if (absl::Status s = CheckKvShape(model, *input.prefix_kv, "prefix_kv"); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace

std::vector<int> DefaultScoringLayers(const Model& model) {
  const int n = model.n_layers();
  if (n > 26) return {22, 23, 24, 25};
  std::vector<int> layers;
  for (int l = std::max(0, n - 5); l <= std::max(0, n - 2); ++l) layers.push_back(l);
  return layers;
}

absl::StatusOr<BlendedContext> BuildContext(const Model& model, const QueryInput& input,
                                            const MethodOptions& options) {
  if (absl::Status s = Validate(model, input, options); !s.ok()) return s;
  BlendedContext ctx(model.n_layers());
  RecomputePlan& plan = ctx.plan;
  StageTimings& t = plan.timings;
  plan.method = options.method;
  const int64_t n_prefix = static_cast<int64_t>(input.prefix_ids.size());
  std::vector<int64_t> lengths;
  for (const auto& c : input.chunks) lengths.push_back(c->size());
  const int64_t n_ctx = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
  plan.context_tokens = n_ctx;
  plan.chunk_order.resize(input.chunks.size());
  std::iota(plan.chunk_order.begin(), plan.chunk_order.end(), 0);
  ctx.next_position = n_prefix + n_ctx;
  ForwardOptions no_logits;
  no_logits.logits = ForwardOptions::Logits::kNone;
  // One allocation for everything this query will put in the cache: the
  // context, the question while scoring, the prompt and the answer. Growing
  // by doubling would copy the whole cache at each step (several times over
  // while chunks are appended, once more for the prompt).
  const auto& cfg = model.config();
  const int64_t after_context =
      std::max(static_cast<int64_t>(input.question_ids.size()),  // while scoring
               static_cast<int64_t>(input.prompt_ids.size()) +
                   std::max<int64_t>(0, input.decode_reserve));
  ctx.cache.Reserve(n_prefix + n_ctx + after_context,
                    cfg.num_key_value_heads, cfg.head_dim,
                    at::TensorOptions().dtype(model.dtype()).device(model.device()));

  if (options.method == Method::kFull) {
    // The exactness reference: no reuse at all.
    Stopwatch sw;
    std::vector<int32_t> ids = input.prefix_ids;
    for (const auto& c : input.chunks) ids.insert(ids.end(), c->token_ids.begin(), c->token_ids.end());
    if (!ids.empty()) PrefillTokens(model, ids, 0, &ctx.cache, no_logits);
    plan.selected.resize(n_ctx);
    std::iota(plan.selected.begin(), plan.selected.end(), 0);
    t.recompute_ms = sw.Ms();
    return ctx;
  }

  Stopwatch sw;
  if (n_prefix > 0) {
    // A stored prefix record is the prefix prefilled alone at 0..n-1: the
    // same K/V a fresh prefill gives, without the forward pass.
    if (input.prefix_kv != nullptr && !input.prefix_kv->lossy) {
      AppendChunkAt(model, *input.prefix_kv, 0, &ctx.cache);
    } else {
      PrefillTokens(model, input.prefix_ids, 0, &ctx.cache, no_logits);
    }
  }
  if (input.chunks.empty()) {
    // A plain prompt: no context to place, score or recompute.
    t.reposition_ms = sw.Ms();
    return ctx;
  }
  std::vector<int32_t> slot_ids = input.prefix_ids;
  std::vector<int32_t> ctx_ids =
      RepositionChunks(model, input.chunks, plan.chunk_order, n_prefix, &ctx.cache);
  slot_ids.insert(slot_ids.end(), ctx_ids.begin(), ctx_ids.end());
  t.reposition_ms = sw.Ms();

  const int64_t k = BudgetFor(options.ratio, n_ctx);
  // The first chunk's cached KV is already exact when it was prefilled after
  // exactly this prefix and stored losslessly: recomputing it would be wasted
  // budget. With a longer prefix (system prompt + chat header) no chunk was
  // prefilled after it, so every chunk is a candidate; the exact part is the
  // prefix itself, which is outside the candidate range.
  const std::optional<int64_t> bos = model.config().bos_token_id;
  const bool first_exact =
      !input.chunks[plan.chunk_order[0]]->lossy &&
      ((input.chunk_prefix_mode == PrefixMode::kNone && input.prefix_ids.empty()) ||
       (input.chunk_prefix_mode == PrefixMode::kBos && bos.has_value() &&
        input.prefix_ids == std::vector<int32_t>{static_cast<int32_t>(*bos)}));
  const std::vector<bool> eligible =
      first_exact ? ExcludeFirstChunk(n_ctx, lengths[plan.chunk_order[0]]) : std::vector<bool>{};

  switch (options.method) {
    case Method::kFull:
    case Method::kNone:
      break;
    case Method::kInfoFlow: {
      const std::vector<int> layers =
          options.scoring_layers.empty() ? DefaultScoringLayers(model) : options.scoring_layers;
      const std::vector<int32_t>& question =
          input.question_ids.empty() ? input.prompt_ids : input.question_ids;
      auto score = [&] {
        Stopwatch s;
        at::Tensor scores = ScoreByAttentionNorm(model, &ctx.cache, question, n_prefix + n_ctx,
                                                 n_prefix, n_prefix + n_ctx, layers, options.variant);
        t.score_ms += s.Ms();
        return scores;
      };
      at::Tensor scores = score();
      if (options.reorder && input.chunks.size() > 1) {
        Stopwatch s;
        std::vector<int64_t> first_pass = SelectTopK(scores, k);
        std::vector<int> order = ReorderChunks(first_pass, lengths, plan.chunk_order);
        if (order != plan.chunk_order) {
          plan.chunk_order = order;
          ctx.cache.Truncate(n_prefix);
          slot_ids.resize(n_prefix);
          ctx_ids = RepositionChunks(model, input.chunks, plan.chunk_order, n_prefix, &ctx.cache);
          slot_ids.insert(slot_ids.end(), ctx_ids.begin(), ctx_ids.end());
          t.reorder_ms += s.Ms();
          scores = score();
        } else {
          t.reorder_ms += s.Ms();
        }
        Stopwatch sel;
        plan.selected = SelectTopK(scores, k);
        t.select_ms += sel.Ms();
      } else {
        Stopwatch sel;
        plan.selected = SelectTopK(scores, k, eligible);
        t.select_ms += sel.Ms();
      }
      plan.scores.assign(scores.data_ptr<double>(), scores.data_ptr<double>() + n_ctx);
      break;
    }
    case Method::kCacheBlend:
    case Method::kCacheBlendPartial: {
      Stopwatch s;
      plan.selected = CacheBlendRecompute(
          model, &ctx.cache, slot_ids, n_prefix, n_prefix + n_ctx, k, options.deviation,
          options.method == Method::kCacheBlend ? Layer1Update::kAll : Layer1Update::kSelected);
      t.recompute_ms += s.Ms();
      return ctx;
    }
    case Method::kInfoFlowBlend: {
      if (k == 0) break;  // r = 0: nothing measured, nothing recomputed (== NONE)
      // 1. Relevance: INFOFLOW's attention norm of the question on the
      // stale cache.
      Stopwatch s;
      const std::vector<int> layers =
          options.scoring_layers.empty() ? DefaultScoringLayers(model) : options.scoring_layers;
      const std::vector<int32_t>& question =
          input.question_ids.empty() ? input.prompt_ids : input.question_ids;
      at::Tensor scores = ScoreByAttentionNorm(model, &ctx.cache, question, n_prefix + n_ctx,
                                               n_prefix, n_prefix + n_ctx, layers, options.variant);
      // 2. Staleness: CACHEBLEND's layer-1 deviation, for one layer's work
      // (layer 0 plus layer 1's K/V projection; CACHEBLEND runs layers 0 and
      // 1), on every eligible token or (probe_factor > 0) only on the
      // probe_factor x k_stale most relevant ones, a cost that scales with
      // r. On this project's model the stale tokens that matter are ones the
      // question does not attend to, so the relevance probe loses most of
      // the quality (MODEL_CARD.md) and the default probes every token.
      // Layer 0 leaves the cache as it was.
      const int64_t k_stale = static_cast<int64_t>(
          std::llround(options.stale_share * static_cast<double>(k)));
      std::vector<int64_t> probe_ctx;
      if (options.probe_factor > 0) {
        const double want = std::ceil(options.probe_factor * static_cast<double>(k_stale));
        probe_ctx = SelectTopK(scores, static_cast<int64_t>(std::min(want, static_cast<double>(n_ctx))),
                               eligible);
      } else {
        for (int64_t i = 0; i < n_ctx; ++i) {
          if (eligible.empty() || eligible[i]) probe_ctx.push_back(i);
        }
      }
      auto slots_of = [&](const std::vector<int64_t>& ctx_indices) {
        std::vector<int64_t> out;
        out.reserve(ctx_indices.size());
        for (int64_t i : ctx_indices) out.push_back(n_prefix + i);
        return out;
      };
      at::Tensor probe_input;
      at::Tensor dev = Layer1DeviationAtLayerZeroCost(model, &ctx.cache, slot_ids,
                                                      slots_of(probe_ctx), options.deviation,
                                                      &probe_input);
      t.score_ms += s.Ms();
      // 3. The most deviating probed tokens take stale_share of the budget;
      // relevance fills the rest.
      Stopwatch sel;
      plan.scores.assign(scores.data_ptr<double>(), scores.data_ptr<double>() + n_ctx);
      at::Tensor combined = scores.clone();
      double* cs = combined.data_ptr<double>();
      const int64_t k_dev = std::min<int64_t>(k_stale, static_cast<int64_t>(probe_ctx.size()));
      for (int64_t j : SelectTopK(dev, k_dev)) cs[probe_ctx[j]] = INFINITY;
      plan.selected = SelectTopK(combined, k, eligible);
      t.select_ms += sel.Ms();
      // 4. Recompute from layer 1 on: layer 0's output is exact already.
      // Selected tokens outside the probe get theirs now (layer 0 only).
      Stopwatch rc;
      std::vector<int64_t> row_of(n_ctx, -1), extra;
      for (size_t j = 0; j < probe_ctx.size(); ++j) row_of[probe_ctx[j]] = static_cast<int64_t>(j);
      for (int64_t i : plan.selected) {
        if (row_of[i] < 0) extra.push_back(i);
      }
      at::Tensor layer1_input = probe_input;
      if (!extra.empty()) {
        at::Tensor extra_input = LayerZeroOutput(model, &ctx.cache, slot_ids, slots_of(extra));
        for (size_t j = 0; j < extra.size(); ++j) {
          row_of[extra[j]] = static_cast<int64_t>(probe_ctx.size() + j);
        }
        layer1_input = probe_ctx.empty() ? extra_input : at::cat({probe_input, extra_input}, 0);
      }
      std::vector<int64_t> rows;
      for (int64_t i : plan.selected) rows.push_back(row_of[i]);
      if (!plan.selected.empty()) {
        at::Tensor row_t = at::tensor(rows, at::TensorOptions().dtype(at::kLong)).to(model.device());
        RecomputeTokens(model, &ctx.cache, slot_ids, slots_of(plan.selected), 1,
                        layer1_input.index_select(0, row_t));
      }
      t.recompute_ms += rc.Ms();
      return ctx;
    }
    case Method::kEpic: {
      std::vector<int64_t> ordered;
      for (int c : plan.chunk_order) ordered.push_back(lengths[c]);
      plan.selected = EpicSelect(ordered, options.lego_k, eligible);
      break;
    }
    case Method::kRandom:
      plan.selected = RandomSelect(n_ctx, k, options.seed, eligible);
      break;
  }

  Stopwatch rc;
  std::vector<int64_t> slots;
  slots.reserve(plan.selected.size());
  for (int64_t i : plan.selected) slots.push_back(n_prefix + i);
  RecomputeTokens(model, &ctx.cache, slot_ids, slots);
  t.recompute_ms += rc.Ms();
  return ctx;
}

absl::StatusOr<QueryResult> RunQuery(const Model& model, const Tokenizer* tokenizer,
                                     const QueryInput& input, const MethodOptions& options,
                                     const DecodeOptions& decode, const TokenCallback& on_token) {
  Stopwatch total;
  QueryInput sized = input;
  sized.decode_reserve = std::max<int64_t>(input.decode_reserve, decode.max_new_tokens);
  absl::StatusOr<BlendedContext> ctx = BuildContext(model, sized, options);
  if (!ctx.ok()) return ctx.status();
  QueryResult result;
  Stopwatch prompt;
  at::Tensor logits = PrefillTokens(model, input.prompt_ids, ctx->next_position, &ctx->cache).logits;
  ctx->plan.timings.prompt_ms = prompt.Ms();
  const int64_t next = ctx->next_position + static_cast<int64_t>(input.prompt_ids.size());
  Stopwatch first;
  bool got_first = false;
  Stopwatch decode_sw;
  result.decode = Decode(model, &ctx->cache, next, logits, decode, tokenizer,
                         [&](int32_t id, std::string_view text) {
                           if (!got_first) {
                             got_first = true;
                             ctx->plan.timings.first_token_ms = first.Ms();
                             result.ttft_ms = total.Ms();
                           }
                           return on_token ? on_token(id, text) : true;
                         });
  if (!got_first) result.ttft_ms = total.Ms();
  ctx->plan.timings.decode_ms = decode_sw.Ms();
  result.plan = std::move(ctx->plan);
  return result;
}

}  // namespace infoflow
