// Selective recompute (docs/DESIGN.md §2.7) and CacheBlend's layer-1 selection.
#ifndef INFOFLOW_ENGINE_BLEND_RECOMPUTE_H_
#define INFOFLOW_ENGINE_BLEND_RECOMPUTE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/blend/method.h"

namespace infoflow {

// Recomputes the cache slots `slots` (sorted, each < cache->size(), holding
// token `slot_ids[slot]`) under the global causal mask: from `first_layer`
// on, each layer computes Q, K, V for those rows only with RoPE at their
// positions, overwrites their K/V in the cache, and lets them attend to every
// cache entry with position <= theirs; other slots keep their cached K/V.
// Layer input at `first_layer` is `hidden` ([|slots|, d]) or, when
// undefined, the token embeddings (first_layer must then be 0).
// Cost per layer: O(|slots| * N) attention + O(|slots|) projections/MLP.
void RecomputeTokens(const Model& model, KvCache* cache, const std::vector<int32_t>& slot_ids,
                     const std::vector<int64_t>& slots, int first_layer = 0,
                     const at::Tensor& hidden = at::Tensor());

// Which layer-1 K/V CacheBlendRecompute leaves for the tokens it did not
// select.
enum class Layer1Update {
  kAll,       // the fresh ones, for every token (CacheBlend's own code)
  kSelected,  // the cached ones: only the selected keep fresh K/V (LMCache)
};

// CacheBlend: runs layers 0 and 1 for every slot in [begin, end) (layer 0
// full), measures per token the layer-1 deviation sum((new - cached)^2) over
// heads and dims of V (or K, pre-RoPE-equivalent since both are rotated at
// the same position), keeps the top `k` (context indices relative to
// `begin`, sorted) and recomputes them from layer 2 on. With
// Layer1Update::kAll every token keeps its fresh layer-1 K/V (layer 0 K/V
// depend only on token and position, so layers 0-1 then equal FULL's for
// the whole context: k = 0 is NONE with FULL's layer 0-1 K/V); with
// kSelected only the top k do, and k = 0 leaves the cache as it was (== NONE).
std::vector<int64_t> CacheBlendRecompute(const Model& model, KvCache* cache,
                                         const std::vector<int32_t>& slot_ids, int64_t begin,
                                         int64_t end, int64_t k, Deviation deviation,
                                         Layer1Update update = Layer1Update::kAll);

// Layer 0's output [|slots|, d] for the cache slots `slots` (sorted), the
// input RecomputeTokens needs to start at layer 1. Layer 0's K/V depend only
// on token and position, so the cache is left as it was.
at::Tensor LayerZeroOutput(const Model& model, KvCache* cache, const std::vector<int32_t>& slot_ids,
                           const std::vector<int64_t>& slots);

// INFOFLOW_BLEND's staleness signal at one layer's cost: runs layer 0 for
// the cache slots `slots` (sorted; layer 0 K/V depend only on token and
// position, so the cache is left as it was) and projects layer 1's K/V from
// its output without running layer 1. Returns the per-slot deviation
// sum((fresh - cached)^2) of layer-1 V (or K) as [|slots|] f64 on CPU —
// the same numbers CacheBlendRecompute ranks by — and sets `*layer1_input`
// to layer 0's output [|slots|, d] (exact when layer 0 was), from which
// RecomputeTokens can start at layer 1. A one-layer model gets zeros.
at::Tensor Layer1DeviationAtLayerZeroCost(const Model& model, KvCache* cache,
                                          const std::vector<int32_t>& slot_ids,
                                          const std::vector<int64_t>& slots, Deviation deviation,
                                          at::Tensor* layer1_input);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_RECOMPUTE_H_
