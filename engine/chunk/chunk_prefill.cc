#include "engine/chunk/chunk_prefill.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace infoflow {

int64_t PrefixLength(PrefixMode mode) { return mode == PrefixMode::kBos ? 1 : 0; }

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
  const int64_t prefix = PrefixLength(prefix_mode);
  std::vector<int32_t> input(prefix + tokens.size());
  if (prefix_mode == PrefixMode::kBos) {
    if (!model.config().bos_token_id.has_value()) {
      return absl::InvalidArgumentError(
          "prefix mode BOS: the model's config.json has no bos_token_id; use prefix mode NONE");
    }
    input[0] = static_cast<int32_t>(*model.config().bos_token_id);
  }
  std::copy(tokens.begin(), tokens.end(), input.begin() + prefix);

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

}  // namespace infoflow
