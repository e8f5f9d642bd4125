// Global positional reconstruction (docs/DESIGN.md §2.3).
#ifndef INFOFLOW_ENGINE_BLEND_REPOSITION_H_
#define INFOFLOW_ENGINE_BLEND_REPOSITION_H_

#include <memory>
#include <vector>

#include "engine/model/kv_cache.h"
#include "engine/model/model.h"

namespace infoflow {

// Applies RoPE at `positions` ([n] int64) to pre-RoPE keys [Hkv, n, hd].
at::Tensor RepositionKeys(const Model& model, const at::Tensor& unrotated_keys,
                          const at::Tensor& positions);

// Appends `chunk` to `cache` at global positions offset..offset+n-1, RoPE
// applied there. Exact because stored keys are pre-RoPE.
void AppendChunkAt(const Model& model, const ChunkKv& chunk, int64_t offset, KvCache* cache);

// Fills `cache` (which must already hold the prefix KV at slots
// 0..prefix_len-1) with the chunks in `order`: chunk order[i] starts at
// offset_i = prefix_len + sum of the lengths before it, and its pre-RoPE keys
// get RoPE at those global positions. Slot index == position afterwards.
// Returns the context token ids in layout order.
std::vector<int32_t> RepositionChunks(const Model& model,
                                      const std::vector<std::shared_ptr<const ChunkKv>>& chunks,
                                      const std::vector<int>& order, int64_t prefix_len,
                                      KvCache* cache);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_REPOSITION_H_
