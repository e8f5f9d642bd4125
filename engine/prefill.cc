#include "engine/prefill.h"

#include <ATen/ATen.h>

#include "absl/strings/str_cat.h"

namespace infoflow {

int64_t PrefixLength(PrefixMode mode) { return mode == PrefixMode::kBos ? 1 : 0; }

at::Tensor TokenTensor(const Model& model, const std::vector<int32_t>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  return at::tensor(wide, at::TensorOptions().dtype(at::kLong)).to(model.device());
}

at::Tensor PositionRange(const Model& model, int64_t start, int64_t n) {
  return at::arange(start, start + n, at::TensorOptions().dtype(at::kLong).device(model.device()));
}

absl::StatusOr<ChunkKv> PrefillChunk(const Model& model, const std::vector<int32_t>& tokens,
                                     PrefixMode prefix_mode) {
  if (tokens.empty()) return absl::InvalidArgumentError("chunk has no tokens");
  const int64_t vocab = model.config().vocab_size;
  for (int32_t t : tokens) {
    if (t < 0 || t >= vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " outside the vocabulary [0, ", vocab, ")"));
    }
  }
  std::vector<int32_t> input;
  const int64_t prefix = PrefixLength(prefix_mode);
  if (prefix_mode == PrefixMode::kBos) input.push_back(static_cast<int32_t>(model.config().bos_token_id.value_or(1)));
  input.insert(input.end(), tokens.begin(), tokens.end());

  KvCache cache(model.n_layers());
  ForwardOptions options;
  options.logits = ForwardOptions::Logits::kNone;
  options.return_unrotated_keys = true;
  ForwardResult r = PrefillTokens(model, input, 0, &cache, options);

  ChunkKv chunk;
  chunk.token_ids = tokens;
  const int64_t n = static_cast<int64_t>(tokens.size());
  for (int l = 0; l < model.n_layers(); ++l) {
    chunk.k.push_back(r.unrotated_keys[l].narrow(1, prefix, n).contiguous());
    chunk.v.push_back(cache.values(l).narrow(1, prefix, n).contiguous());
  }
  return chunk;
}

at::Tensor RepositionKeys(const Model& model, const at::Tensor& unrotated_keys,
                          const at::Tensor& positions) {
  return model.Rotate(unrotated_keys, positions);
}

void AppendChunkAt(const Model& model, const ChunkKv& chunk, int64_t offset, KvCache* cache) {
  at::Tensor positions = PositionRange(model, offset, chunk.size());
  const int64_t first = cache->AppendPositions(positions);
  const auto rope = model.RopeTables(positions);  // shared by every layer
  for (int l = 0; l < model.n_layers(); ++l) {
    cache->WriteRange(l, first, Model::Rotate(chunk.k[l].to(model.device()), rope),
                      chunk.v[l].to(model.device()));
  }
}

ForwardResult PrefillTokens(const Model& model, const std::vector<int32_t>& tokens,
                            int64_t start_position, KvCache* cache, const ForwardOptions& options) {
  return model.Forward(TokenTensor(model, tokens),
                       PositionRange(model, start_position, static_cast<int64_t>(tokens.size())),
                       at::Tensor(), cache, options);
}

}  // namespace infoflow
