#include "engine/dist/sp_pipeline.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/blend/reposition.h"
#include "engine/blend/selection.h"
#include "engine/dist/ring_attention.h"
#include "engine/model/forward.h"
#include "engine/model/stopwatch.h"

namespace infoflow {
namespace {

at::Tensor LongTensor(const Model& model, const std::vector<int64_t>& v) {
  return at::tensor(v, at::TensorOptions().dtype(at::kLong)).to(model.device());
}

// One rank's part of the query: its cache (prefix on rank 0, then its
// share of the context at global positions), the token id of each local
// slot, and every rank's cache size (what the ring's receivers allocate).
struct Shard {
  const Model& model;
  SequenceParallelGroup* group;
  ShardLayout layout;
  KvCache cache;
  std::vector<int32_t> slot_ids;
  std::vector<int64_t> rows;

  Shard(const Model& m, SequenceParallelGroup* g, ShardLayout l)
      : model(m), group(g), layout(std::move(l)), cache(m.n_layers()) {}

  int me() const { return group->rank(); }
  int64_t share(int r) const { return layout.ctx_end[r] - layout.ctx_begin[r]; }
  // Local slot of the context's first token on this rank.
  int64_t ctx_offset() const { return me() == 0 ? layout.n_prefix : 0; }
  bool Mine(int64_t i) const { return i >= layout.ctx_begin[me()] && i < layout.ctx_end[me()]; }
  int64_t LocalSlot(int64_t i) const { return ctx_offset() + i - layout.ctx_begin[me()]; }

  at::Tensor Keys(int l) const { return cache.size() ? cache.keys(l) : EmptyKv(); }
  at::Tensor Values(int l) const { return cache.size() ? cache.values(l) : EmptyKv(); }
  at::Tensor EmptyKv() const {
    const auto& c = model.config();
    return at::empty({c.num_key_value_heads, 0, c.head_dim},
                     at::TensorOptions().dtype(model.dtype()).device(model.device()));
  }
  at::Tensor EmptyQ(int64_t n) const {
    const auto& c = model.config();
    return at::empty({c.num_attention_heads, n, c.head_dim},
                     at::TensorOptions().dtype(model.dtype()).device(model.device()));
  }

  // Layers [first, last] for the local slots `slots` (sorted; may be empty:
  // the rank then only passes its keys around), input h [|slots|, d]: each
  // layer writes their K/V and attends them over every rank's keys by ring
  // attention. Returns the last layer's output (undefined when no slots).
  absl::StatusOr<at::Tensor> RingLayers(const std::vector<int64_t>& slots, at::Tensor h, int first,
                                        int last) {
    const bool has = !slots.empty();
    at::Tensor slot_t, pos = at::empty({0}, at::kLong);
    std::pair<at::Tensor, at::Tensor> rope;
    if (has) {
      slot_t = LongTensor(model, slots);
      pos = cache.positions().index_select(0, slot_t);
      rope = model.RopeTables(pos);
    }
    for (int l = first; l <= last; ++l) {
      at::Tensor q = EmptyQ(0);
      if (has) {
        auto [qq, k, v] = model.LayerQkv(l, h, rope);
        cache.WriteAt(l, slot_t, k, v);
        q = qq;
      }
      absl::StatusOr<at::Tensor> attn =
          RingAttention(group, q, pos, Keys(l), Values(l), cache.positions(), rows);
      if (!attn.ok()) return attn.status();
      if (has) h = model.LayerOutput(l, h, *attn);
    }
    return has ? h : at::Tensor();
  }

  std::vector<int64_t> LocalSlots(const std::vector<int64_t>& ctx_indices) const {
    std::vector<int64_t> out;
    for (int64_t i : ctx_indices) {
      if (Mine(i)) out.push_back(LocalSlot(i));
    }
    return out;
  }
  at::Tensor EmbedSlots(const std::vector<int64_t>& slots) const {
    std::vector<int32_t> ids;
    for (int64_t s : slots) ids.push_back(slot_ids[s]);
    return model.Embed(TokenTensor(model, ids));
  }

  // Every rank's `local` ([rows_of[r], ...]) concatenated in rank order.
  absl::StatusOr<at::Tensor> Concat(const at::Tensor& local, const std::vector<int64_t>& rows_of) {
    absl::StatusOr<std::vector<at::Tensor>> all = group->AllGather(local.contiguous(), rows_of);
    if (!all.ok()) return all.status();
    return at::cat(*all, 0);
  }

  // INFOFLOW scores of every context token (DESIGN §2.4), identical on
  // every rank. The question's rows sit on rank 0 at positions after the
  // context while scoring and are dropped after.
  absl::StatusOr<at::Tensor> Scores(const std::vector<int32_t>& question,
                                    const std::vector<int>& layers, ScoreVariant variant) {
    const int64_t nq = static_cast<int64_t>(question.size());
    const int64_t q_start = layout.n_prefix + layout.n_ctx;
    const int last = *std::max_element(layers.begin(), layers.end());
    const int64_t n_before = cache.size();
    at::Tensor q_pos = PositionRange(model, q_start, nq);
    at::Tensor h, slot_t;
    std::pair<at::Tensor, at::Tensor> rope;
    if (me() == 0) {
      const int64_t first = cache.AppendPositions(q_pos);
      slot_t = PositionRange(model, first, nq);
      h = model.Embed(TokenTensor(model, question));
      rope = model.RopeTables(q_pos);
    }
    const int64_t off = ctx_offset(), n_share = share(me());
    const auto& c = model.config();
    at::Tensor total = at::zeros({n_share}, at::TensorOptions().dtype(at::kDouble));
    for (int l = 0; l <= last; ++l) {
      at::Tensor q;
      if (me() == 0) {
        auto [qq, k, v] = model.LayerQkv(l, h, rope);
        cache.WriteAt(l, slot_t, k, v);
        q = qq.contiguous();
      } else {
        q = EmptyQ(nq);
      }
      if (absl::Status s = group->Broadcast(&q, 0); !s.ok()) return s;
      at::Tensor keys = Keys(l), vals = Values(l), pos = cache.positions();
      PartialAttention part = AttendPiece(q, keys, vals, q_pos, pos);
      at::Tensor packed = at::cat({part.out, part.lse.unsqueeze(2)}, 2).contiguous();
      absl::StatusOr<std::vector<at::Tensor>> parts = group->AllGather(
          packed, std::vector<int64_t>(group->world_size(), c.num_attention_heads));
      if (!parts.ok()) return parts.status();
      PartialAttention global;  // merged in rank order: the same bits on every rank
      for (const at::Tensor& p : *parts) {
        MergePartial(&global, {p.narrow(2, 0, c.head_dim), p.select(2, c.head_dim)});
      }
      if (std::find(layers.begin(), layers.end(), l) != layers.end() && n_share > 0) {
        auto [sum, sum_sq] = ColumnStats(q, keys.narrow(1, off, n_share), q_pos,
                                         pos.narrow(0, off, n_share), global.lse);
        at::Tensor s = variant == ScoreVariant::kSum ? sum : sum_sq.sqrt();
        if (variant == ScoreVariant::kVNorm) {
          at::Tensor v = vals.narrow(1, off, n_share).to(at::kDouble);
          s = s * v.pow(2).sum(at::IntArrayRef{0, 2}).sqrt().cpu();
        }
        total += s;
      }
      if (me() == 0) h = model.LayerOutput(l, h, global.out.to(model.dtype()));
    }
    if (me() == 0) cache.Truncate(n_before);
    std::vector<int64_t> shares;
    for (int r = 0; r < group->world_size(); ++r) shares.push_back(share(r));
    return Concat(total / static_cast<double>(layers.size()), shares);
  }
};

absl::Status Validate(const Model& model, const ShardedQueryInput& input,
                      const MethodOptions& options, const ShardLayout& layout, int rank) {
  if (!ShardedMethodSupported(options.method)) {
    return absl::UnimplementedError(absl::StrCat("method ", MethodName(options.method),
                                                 " is not supported with sequence parallelism"));
  }
  if (options.reorder) {
    return absl::InvalidArgumentError("reorder is not supported with sequence parallelism");
  }
  if (absl::Status s = ValidateMethodOptions(model, options); !s.ok()) return s;
  if (input.chunk_lengths.empty()) return absl::InvalidArgumentError("chunks: need at least one");
  if (input.prompt_ids.empty()) return absl::InvalidArgumentError("prompt: no tokens");
  const int n_local = layout.chunk_end[rank] - layout.chunk_begin[rank];
  if (static_cast<int>(input.local_chunks.size()) != n_local) {
    return absl::InvalidArgumentError(absl::StrCat("local_chunks: rank ", rank, " holds ", n_local,
                                                   " chunks, got ", input.local_chunks.size()));
  }
  for (int i = 0; i < n_local; ++i) {
    const ChunkKv* ch = input.local_chunks[i].get();
    const int64_t want = input.chunk_lengths[layout.chunk_begin[rank] + i];
    if (ch == nullptr || ch->size() != want || want == 0) {
      return absl::InvalidArgumentError(absl::StrCat("local_chunks[", i, "]: length mismatch"));
    }
    if (absl::Status s = CheckKvShape(model, *ch, absl::StrCat("local_chunks[", i, "]")); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

// FNV-1a over what every rank must agree on: method and knobs, ids,
// chunk lengths, decode length.
int64_t QueryDigest(const ShardedQueryInput& in, const MethodOptions& o, const DecodeOptions& d) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](int64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(x >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  auto mix_ids = [&mix](const std::vector<int32_t>& ids) {
    mix(static_cast<int64_t>(ids.size()));
    for (int32_t x : ids) mix(x);
  };
  mix(static_cast<int64_t>(o.method));
  mix(std::llround(o.ratio * 1e9));
  mix(std::llround(o.stale_share * 1e9));
  mix(std::llround(o.probe_factor * 1e9));
  mix(static_cast<int64_t>(o.variant));
  mix(static_cast<int64_t>(o.deviation));
  mix(static_cast<int64_t>(o.scoring_layers.size()));
  for (int l : o.scoring_layers) mix(l);
  mix_ids(in.prefix_ids);
  mix_ids(in.question_ids);
  mix_ids(in.prompt_ids);
  mix(static_cast<int64_t>(in.chunk_lengths.size()));
  for (int64_t x : in.chunk_lengths) mix(x);
  mix(static_cast<int64_t>(in.chunk_prefix_mode));
  mix(in.first_chunk_lossy ? 1 : 0);
  mix(d.max_new_tokens);
  return static_cast<int64_t>(h);
}

}  // namespace

bool ShardedMethodSupported(Method m) {
  return m == Method::kFull || m == Method::kNone || m == Method::kInfoFlow ||
         m == Method::kInfoFlowBlend;
}

ShardLayout SplitChunks(const std::vector<int64_t>& chunk_lengths, int64_t n_prefix,
                        int world_size) {
  ShardLayout l;
  l.world_size = world_size;
  l.n_prefix = n_prefix;
  l.n_ctx = std::accumulate(chunk_lengths.begin(), chunk_lengths.end(), int64_t{0});
  const int n_chunks = static_cast<int>(chunk_lengths.size());
  std::vector<int> owner(n_chunks);
  int64_t start = 0;
  for (int i = 0; i < n_chunks; ++i) {
    const int64_t mid2 = 2 * start + chunk_lengths[i];  // twice the middle token's index
    owner[i] = l.n_ctx == 0 ? 0
                            : static_cast<int>(std::min<int64_t>(
                                  world_size - 1, mid2 * world_size / (2 * l.n_ctx)));
    start += chunk_lengths[i];
  }
  l.chunk_begin.assign(world_size, 0);
  l.chunk_end.assign(world_size, 0);
  l.ctx_begin.assign(world_size, 0);
  l.ctx_end.assign(world_size, 0);
  int c = 0;
  int64_t at = 0;
  for (int r = 0; r < world_size; ++r) {
    l.chunk_begin[r] = c;
    l.ctx_begin[r] = at;
    while (c < n_chunks && owner[c] == r) at += chunk_lengths[c++];
    l.chunk_end[r] = c;
    l.ctx_end[r] = at;
  }
  return l;
}

absl::StatusOr<ShardedQueryResult> RunShardedQuery(const Model& model, SequenceParallelGroup* group,
                                                   const ShardedQueryInput& input,
                                                   const MethodOptions& options,
                                                   const DecodeOptions& decode,
                                                   const Tokenizer* tokenizer,
                                                   const TokenCallback& on_token) {
  Stopwatch total;
  const int me = group->rank(), n = group->world_size();
  const int64_t n_prefix = static_cast<int64_t>(input.prefix_ids.size());
  Shard sh(model, group, SplitChunks(input.chunk_lengths, n_prefix, n));
  const int64_t bytes_before = group->bytes_sent();
  // Every rank checks its own part, then all learn every verdict and a
  // digest of each rank's query: a rank that refused, or was given another
  // query, fails the query on every rank at once instead of leaving the
  // others to time out in the ring.
  const absl::Status valid = Validate(model, input, options, sh.layout, me);
  at::Tensor mine =
      at::tensor(std::vector<int64_t>{QueryDigest(input, options, decode), valid.ok() ? 1 : 0});
  absl::StatusOr<std::vector<at::Tensor>> verdicts =
      group->AllGather(mine.view({1, 2}), std::vector<int64_t>(n, 1));
  if (!verdicts.ok()) return verdicts.status();
  if (!valid.ok()) return valid;
  for (int r = 0; r < n; ++r) {
    const int64_t* v = (*verdicts)[r].data_ptr<int64_t>();
    if (v[1] == 0) {
      return absl::FailedPreconditionError(absl::StrCat("rank ", r, " refused the query"));
    }
    if (v[0] != mine.data_ptr<int64_t>()[0]) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", r, " was given a different query than rank ", me));
    }
  }
  const ShardLayout& L = sh.layout;
  ShardedQueryResult result;
  RecomputePlan& plan = result.plan;
  StageTimings& t = plan.timings;
  plan.method = options.method;
  plan.context_tokens = L.n_ctx;
  plan.chunk_order.resize(input.chunk_lengths.size());
  std::iota(plan.chunk_order.begin(), plan.chunk_order.end(), 0);
  for (int r = 0; r < n; ++r) sh.rows.push_back((r == 0 ? n_prefix : 0) + sh.share(r));
  const auto& cfg = model.config();
  const int64_t extra =
      me == 0 ? std::max<int64_t>(input.question_ids.size(), input.prompt_ids.size()) : 0;
  sh.cache.Reserve(std::max<int64_t>(1, sh.rows[me] + extra), cfg.num_key_value_heads, cfg.head_dim,
                   at::TensorOptions().dtype(model.dtype()).device(model.device()));
  if (me == 0) sh.slot_ids = input.prefix_ids;
  for (const auto& ch : input.local_chunks) {
    sh.slot_ids.insert(sh.slot_ids.end(), ch->token_ids.begin(), ch->token_ids.end());
  }
  std::vector<int64_t> all_local(sh.rows[me]);
  std::iota(all_local.begin(), all_local.end(), 0);

  // The prompt: rank 0's rows at positions after the context. FULL and
  // INFOFLOW run them in the same ring pass as the context rows they
  // (re)compute: exact, because the prompt's layer l reads the context's
  // layer-l K/V, which that pass has written before it attends; one pass
  // instead of two halves the bytes sent and the ring latency.
  const int64_t n_prompt = static_cast<int64_t>(input.prompt_ids.size());
  const int64_t next_position = n_prefix + L.n_ctx;
  std::vector<int64_t> prompt_slots;
  at::Tensor prompt_h;  // rank 0: the prompt rows' last-layer output
  bool prompt_done = false;
  auto ring_with_prompt = [&](const std::vector<int64_t>& ctx_slots) -> absl::Status {
    if (me == 0) {
      const int64_t first = sh.cache.AppendPositions(PositionRange(model, next_position, n_prompt));
      for (int64_t i = 0; i < n_prompt; ++i) {
        prompt_slots.push_back(first + i);
        sh.slot_ids.push_back(input.prompt_ids[i]);
      }
    }
    sh.rows[0] += n_prompt;
    std::vector<int64_t> slots = ctx_slots;
    slots.insert(slots.end(), prompt_slots.begin(), prompt_slots.end());
    absl::StatusOr<at::Tensor> h = sh.RingLayers(
        slots, slots.empty() ? at::Tensor() : sh.EmbedSlots(slots), 0, model.n_layers() - 1);
    if (!h.ok()) return h.status();
    if (me == 0) prompt_h = h->narrow(0, static_cast<int64_t>(ctx_slots.size()), n_prompt);
    prompt_done = true;
    return absl::OkStatus();
  };

  if (options.method == Method::kFull) {
    Stopwatch sw;
    const int64_t first_pos = me == 0 ? 0 : n_prefix + L.ctx_begin[me];
    if (sh.rows[me] > 0) sh.cache.AppendPositions(PositionRange(model, first_pos, sh.rows[me]));
    if (absl::Status s = ring_with_prompt(all_local); !s.ok()) return s;
    plan.selected.resize(L.n_ctx);
    std::iota(plan.selected.begin(), plan.selected.end(), 0);
    t.recompute_ms = sw.Ms();
  } else {
    Stopwatch sw;
    ForwardOptions no_logits;
    no_logits.logits = ForwardOptions::Logits::kNone;
    if (me == 0 && n_prefix > 0) {
      // The prefix comes first: its K/V need nothing from other ranks.
      if (input.prefix_kv != nullptr && !input.prefix_kv->lossy) {
        AppendChunkAt(model, *input.prefix_kv, 0, &sh.cache);
      } else {
        PrefillTokens(model, input.prefix_ids, 0, &sh.cache, no_logits);
      }
    }
    int64_t offset = n_prefix + L.ctx_begin[me];
    for (const auto& ch : input.local_chunks) {
      AppendChunkAt(model, *ch, offset, &sh.cache);
      offset += ch->size();
    }
    t.reposition_ms = sw.Ms();
    const int64_t k = BudgetFor(options.ratio, L.n_ctx);
    const std::optional<int64_t> bos = cfg.bos_token_id;
    const bool first_exact =
        !input.first_chunk_lossy &&
        ((input.chunk_prefix_mode == PrefixMode::kNone && input.prefix_ids.empty()) ||
         (input.chunk_prefix_mode == PrefixMode::kBos && bos.has_value() &&
          input.prefix_ids == std::vector<int32_t>{static_cast<int32_t>(*bos)}));
    const std::vector<bool> eligible =
        first_exact ? ExcludeFirstChunk(L.n_ctx, input.chunk_lengths[0]) : std::vector<bool>{};
    const std::vector<int> layers =
        options.scoring_layers.empty() ? DefaultScoringLayers(model) : options.scoring_layers;
    const std::vector<int32_t>& question =
        input.question_ids.empty() ? input.prompt_ids : input.question_ids;
    if (options.method == Method::kInfoFlow) {
      Stopwatch s;
      absl::StatusOr<at::Tensor> scores = sh.Scores(question, layers, options.variant);
      if (!scores.ok()) return scores.status();
      t.score_ms = s.Ms();
      Stopwatch sel;
      plan.selected = SelectTopK(*scores, k, eligible);
      t.select_ms = sel.Ms();
      Stopwatch rc;
      if (absl::Status st = ring_with_prompt(sh.LocalSlots(plan.selected)); !st.ok()) return st;
      t.recompute_ms = rc.Ms();
    } else if (options.method == Method::kInfoFlowBlend && k > 0) {
      // pipeline.cc's INFOFLOW_BLEND step by step, each rank on its share.
      Stopwatch s;
      absl::StatusOr<at::Tensor> scores = sh.Scores(question, layers, options.variant);
      if (!scores.ok()) return scores.status();
      const int64_t n_ctx = L.n_ctx;
      const int64_t k_stale =
          static_cast<int64_t>(std::llround(options.stale_share * static_cast<double>(k)));
      std::vector<int64_t> probe_ctx;
      if (options.probe_factor > 0) {
        const double want = std::ceil(options.probe_factor * static_cast<double>(k_stale));
        probe_ctx = SelectTopK(
            *scores, static_cast<int64_t>(std::min(want, static_cast<double>(n_ctx))), eligible);
      } else {
        for (int64_t i = 0; i < n_ctx; ++i) {
          if (eligible.empty() || eligible[i]) probe_ctx.push_back(i);
        }
      }
      std::vector<int64_t> probe_rows(n, 0);
      for (int64_t i : probe_ctx) {
        for (int r = 0; r < n; ++r) {
          if (i >= L.ctx_begin[r] && i < L.ctx_end[r]) ++probe_rows[r];
        }
      }
      const std::vector<int64_t> probe_slots = sh.LocalSlots(probe_ctx);
      at::Tensor probe_input;  // layer 0's output for this rank's probed rows
      at::Tensor dev = at::zeros({static_cast<int64_t>(probe_ctx.size())},
                                 at::TensorOptions().dtype(at::kDouble));
      if (!probe_ctx.empty()) {
        absl::StatusOr<at::Tensor> h0 = sh.RingLayers(
            probe_slots, probe_slots.empty() ? at::Tensor() : sh.EmbedSlots(probe_slots), 0, 0);
        if (!h0.ok()) return h0.status();
        probe_input = *h0;
        at::Tensor local_dev = at::zeros({static_cast<int64_t>(probe_slots.size())},
                                         at::TensorOptions().dtype(at::kDouble));
        if (!probe_slots.empty() && model.n_layers() >= 2) {
          at::Tensor slot_t = LongTensor(model, probe_slots);
          auto rope = model.RopeTables(sh.cache.positions().index_select(0, slot_t));
          auto [fk, fv] = model.LayerKv(1, probe_input, rope);
          at::Tensor fresh = options.deviation == Deviation::kV ? fv : fk;
          at::Tensor cached =
              (options.deviation == Deviation::kV ? sh.cache.values(1) : sh.cache.keys(1))
                  .index_select(1, slot_t);
          local_dev = (fresh.to(at::kDouble) - cached.to(at::kDouble))
                          .pow(2)
                          .sum(at::IntArrayRef{0, 2})
                          .cpu();
        }
        absl::StatusOr<at::Tensor> all_dev = sh.Concat(local_dev, probe_rows);
        if (!all_dev.ok()) return all_dev.status();
        dev = *all_dev;
      }
      t.score_ms = s.Ms();
      Stopwatch sel;
      at::Tensor combined = scores->clone();
      double* cs = combined.data_ptr<double>();
      const int64_t k_dev = std::min<int64_t>(k_stale, static_cast<int64_t>(probe_ctx.size()));
      for (int64_t j : SelectTopK(dev, k_dev)) cs[probe_ctx[j]] = INFINITY;
      plan.selected = SelectTopK(combined, k, eligible);
      t.select_ms = sel.Ms();
      Stopwatch rc;
      // Layer 1's input for the selected rows: the probe's layer-0 output,
      // or layer 0 now for selected rows outside the probe.
      std::vector<bool> probed(n_ctx, false);
      for (int64_t i : probe_ctx) probed[i] = true;
      std::vector<int64_t> extra_ctx;
      for (int64_t i : plan.selected) {
        if (!probed[i]) extra_ctx.push_back(i);
      }
      const std::vector<int64_t> extra_slots = sh.LocalSlots(extra_ctx);
      at::Tensor extra_input;
      if (!extra_ctx.empty()) {
        absl::StatusOr<at::Tensor> h0 = sh.RingLayers(
            extra_slots, extra_slots.empty() ? at::Tensor() : sh.EmbedSlots(extra_slots), 0, 0);
        if (!h0.ok()) return h0.status();
        extra_input = *h0;
      }
      std::vector<int64_t> sel_slots, rows_idx;
      for (int64_t i : plan.selected) {
        if (!sh.Mine(i)) continue;
        const int64_t slot = sh.LocalSlot(i);
        sel_slots.push_back(slot);
        if (probed[i]) {
          rows_idx.push_back(std::lower_bound(probe_slots.begin(), probe_slots.end(), slot) -
                             probe_slots.begin());
        } else {
          rows_idx.push_back(static_cast<int64_t>(probe_slots.size()) +
                             (std::lower_bound(extra_slots.begin(), extra_slots.end(), slot) -
                              extra_slots.begin()));
        }
      }
      at::Tensor layer1_input;
      if (!sel_slots.empty()) {
        std::vector<at::Tensor> parts;
        if (probe_input.defined())
          parts.push_back(probe_input);
        else
          parts.push_back(model.Embed(TokenTensor(model, {})).narrow(0, 0, 0));
        if (extra_input.defined()) parts.push_back(extra_input);
        layer1_input = at::cat(parts, 0).index_select(0, LongTensor(model, rows_idx));
      }
      absl::StatusOr<at::Tensor> h =
          sh.RingLayers(sel_slots, layer1_input, 1, model.n_layers() - 1);
      if (!h.ok()) return h.status();
      t.recompute_ms = rc.Ms();
    }
  }

  // NONE and INFOFLOW_BLEND: the prompt in a pass of its own (BLEND's
  // recompute starts at layer 1, the prompt's at layer 0).
  Stopwatch prompt;
  if (!prompt_done) {
    if (absl::Status s = ring_with_prompt({}); !s.ok()) return s;
  }
  t.prompt_ms = prompt.Ms();
  result.kv_bytes = sh.cache.bytes();

  std::optional<DecodeState> state;
  std::optional<NextToken> next;
  if (me == 0) {
    result.first_logits = model.Logits(prompt_h.narrow(0, n_prompt - 1, 1)).to(at::kFloat);
    state.emplace(decode, tokenizer, next_position + n_prompt, cfg.max_position_embeddings,
                  on_token);
    Stopwatch first;
    next = state->Advance(result.first_logits);
    t.first_token_ms = first.Ms();
    result.ttft_ms = total.Ms();
  }
  // Decode on rank 0 with the whole cache: every rank sends its share, layer
  // by layer (all ranks know whether this happens: max_new_tokens > 1).
  Stopwatch decode_sw;
  if (decode.max_new_tokens > 1) {
    std::vector<int64_t> ctx_rows(n);
    for (int r = 0; r < n; ++r) ctx_rows[r] = sh.share(r);
    ctx_rows[0] = n_prefix + sh.share(0);
    std::optional<KvCache> full;
    if (me == 0) {
      full.emplace(model.n_layers());
      full->Reserve(next_position + n_prompt + decode.max_new_tokens + 1, cfg.num_key_value_heads,
                    cfg.head_dim, at::TensorOptions().dtype(model.dtype()).device(model.device()));
      full->AppendPositions(PositionRange(model, 0, next_position + n_prompt));
    }
    for (int l = 0; l < model.n_layers(); ++l) {
      at::Tensor mine =
          ctx_rows[me] == 0
              ? at::empty({0, 2, cfg.num_key_value_heads, cfg.head_dim},
                          at::TensorOptions().dtype(model.dtype()))
              : at::stack({sh.cache.keys(l).narrow(1, 0, ctx_rows[me]),
                           sh.cache.values(l).narrow(1, 0, ctx_rows[me])})
                    .permute({2, 0, 1, 3})  // [n, 2, Hkv, hd]: rows first, as Gather wants
                    .contiguous();
      absl::StatusOr<std::vector<at::Tensor>> got = group->Gather(mine, ctx_rows, 0);
      if (!got.ok()) return got.status();
      if (me != 0) continue;
      int64_t at_slot = 0;
      for (int r = 0; r < n; ++r) {
        if (ctx_rows[r] == 0) continue;
        at::Tensor kv = (*got)[r].permute({1, 2, 0, 3});  // [2, Hkv, n, hd]
        full->WriteRange(l, at_slot, kv[0], kv[1]);
        at_slot += ctx_rows[r];
      }
      full->WriteRange(l, at_slot, sh.cache.keys(l).narrow(1, ctx_rows[0], n_prompt),
                       sh.cache.values(l).narrow(1, ctx_rows[0], n_prompt));
    }
    if (me == 0) {
      while (next) {
        at::Tensor logits = PrefillTokens(model, {next->id}, next->position, &*full).logits;
        next = state->Advance(logits);
      }
    }
  }
  if (me == 0) result.decode = state->TakeResult();
  t.decode_ms = decode_sw.Ms();
  result.bytes_sent = group->bytes_sent() - bytes_before;
  return result;
}

}  // namespace infoflow
