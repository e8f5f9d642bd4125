// Which context tokens to recompute (docs/DESIGN.md §2.5, §2.6, §3). Pure
// functions over scores and chunk lengths; indices are context indices
// (0 = first token of the first chunk in the current layout).
#ifndef INFOFLOW_ENGINE_BLEND_SELECTION_H_
#define INFOFLOW_ENGINE_BLEND_SELECTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace infoflow {

// k = floor(ratio * n_context), clamped to [0, n_context].
int64_t BudgetFor(double ratio, int64_t n_context);

// The k highest-scoring eligible indices, sorted ascending. Ties go to the
// lower index. Fewer than k if fewer are eligible. `eligible` empty = all.
std::vector<int64_t> SelectTopK(const at::Tensor& scores, int64_t k,
                                const std::vector<bool>& eligible = {});

// Eligibility mask of `n_context` tokens with the first `first_chunk_len`
// excluded (they already saw the true prefix).
std::vector<bool> ExcludeFirstChunk(int64_t n_context, int64_t first_chunk_len);

// Per chunk ratio_i = |selected ∩ chunk_i| / len_i in the layout `order`
// (chunk_lengths indexed by chunk id); returns the new order: stable sort
// ascending by (ratio, position in `order`), so the chunk with the highest
// ratio sits last, next to the question, and ties keep their relative order.
std::vector<int> ReorderChunks(const std::vector<int64_t>& selected,
                               const std::vector<int64_t>& chunk_lengths,
                               const std::vector<int>& order);

// EPIC: the first `lego_k` tokens of every chunk (all of a shorter chunk),
// eligible ones only. chunk_lengths in layout order.
std::vector<int64_t> EpicSelect(const std::vector<int64_t>& chunk_lengths, int lego_k,
                                const std::vector<bool>& eligible = {});

// k eligible indices drawn uniformly without replacement with `seed`, sorted.
std::vector<int64_t> RandomSelect(int64_t n_context, int64_t k, uint64_t seed,
                                  const std::vector<bool>& eligible = {});

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_SELECTION_H_
