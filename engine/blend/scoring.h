// InfoFlow scoring (docs/DESIGN.md §2.4): how strongly the question attends to
// each context token, under the RoPE geometry decoding will use.
#ifndef INFOFLOW_ENGINE_BLEND_SCORING_H_
#define INFOFLOW_ENGINE_BLEND_SCORING_H_

#include <ATen/core/Tensor.h>

#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/blend/method.h"

namespace infoflow {

// Runs `question_ids` at positions question_start.. over `cache` (context
// KV, left unchanged on return) through the last scoring layer, and scores
// the cache slots [context_begin, context_end):
//   A_l[h, q, t]  attention probability (softmax over context + question)
//   S_l[t] = || mean_h A_l[h, :, t] ||_2 over question tokens   (kL2)
//          = sum_q mean_h A_l[h, q, t]                           (kSum)
//          = kL2 score * || v_l[t] ||_2                          (kVNorm)
//   score[t] = mean over layers of S_l[t].
// Cost: O(|question| * N) attention per layer; the pass stops after the last
// scoring layer. Memory: O(N) per scoring layer besides the forward pass's own
// blocks (the statistics are reduced per block of question rows). Returns
// [context_end - context_begin] f64 on CPU.
at::Tensor ScoreByAttentionNorm(const Model& model, KvCache* cache,
                                const std::vector<int32_t>& question_ids, int64_t question_start,
                                int64_t context_begin, int64_t context_end,
                                const std::vector<int>& layers, ScoreVariant variant);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_SCORING_H_
