// Thin helpers that run Model::Forward over token-id vectors: the full
// prefill every method is pinned against, and the tensors it needs.
#ifndef INFOFLOW_ENGINE_MODEL_FORWARD_H_
#define INFOFLOW_ENGINE_MODEL_FORWARD_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"

namespace infoflow {

// Full prefill: runs `tokens` at positions start..start+n-1 appended to
// `cache` and returns the forward result (logits per `options`).
ForwardResult PrefillTokens(const Model& model, const std::vector<int32_t>& tokens,
                            int64_t start_position, KvCache* cache,
                            const ForwardOptions& options = {});

// [n] int64 tensor of `ids` / of start..start+n-1, on `model`'s device.
at::Tensor TokenTensor(const Model& model, const std::vector<int32_t>& ids);
at::Tensor PositionRange(const Model& model, int64_t start, int64_t n);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_FORWARD_H_
