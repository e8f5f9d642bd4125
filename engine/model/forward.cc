#include "engine/model/forward.h"

#include <ATen/ATen.h>

namespace infoflow {

at::Tensor TokenTensor(const Model& model, const std::vector<int32_t>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return at::tensor(wide, at::TensorOptions().dtype(at::kLong)).to(model.device());
}

at::Tensor PositionRange(const Model& model, int64_t start, int64_t n) {
  return at::arange(start, start + n, at::TensorOptions().dtype(at::kLong).device(model.device()));
}

ForwardResult PrefillTokens(const Model& model, const std::vector<int32_t>& tokens,
                            int64_t start_position, KvCache* cache, const ForwardOptions& options) {
  return model.Forward(TokenTensor(model, tokens),
                       PositionRange(model, start_position, static_cast<int64_t>(tokens.size())),
                       at::Tensor(), cache, options);
}

}  // namespace infoflow
