#include "engine/blend/scoring.h"

#include <ATen/ATen.h>

#include <algorithm>

#include "engine/model/forward.h"

namespace infoflow {

at::Tensor ScoreByAttentionNorm(const Model& model, KvCache* cache,
                                const std::vector<int32_t>& question_ids, int64_t question_start,
                                int64_t context_begin, int64_t context_end,
                                const std::vector<int>& layers, ScoreVariant variant) {
  const int64_t n_before = cache->size();
  ForwardOptions options;
  options.logits = ForwardOptions::Logits::kNone;
  options.last_layer = *std::max_element(layers.begin(), layers.end());
  options.capture_attention = layers;
  ForwardResult r = PrefillTokens(model, question_ids, question_start, cache, options);

  const int64_t n_ctx = context_end - context_begin;
  at::Tensor total = at::zeros({n_ctx}, at::TensorOptions().dtype(at::kDouble));
  for (int l : layers) {
    // Head-mean attention, summed (or L2) over question tokens, cut to the
    // context slots. The forward pass reduces it per block of rows.
    const AttentionColumnStats& a = r.attention.at(l);
    at::Tensor s = variant == ScoreVariant::kSum ? a.sum.narrow(0, context_begin, n_ctx).clone()
                                                 : a.sum_sq.narrow(0, context_begin, n_ctx).sqrt();
    if (variant == ScoreVariant::kVNorm) {
      // ||v_t|| over heads and dims at this layer.
      at::Tensor v = cache->values(l).narrow(1, context_begin, n_ctx).to(at::kDouble);
      s = s * v.pow(2).sum(at::IntArrayRef{0, 2}).sqrt();
    }
    total += s.cpu();
  }
  cache->Truncate(n_before);  // drop the question's K/V: only the context stays
  return total / static_cast<double>(layers.size());
}

}  // namespace infoflow
