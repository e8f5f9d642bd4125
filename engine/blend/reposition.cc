#include "engine/blend/reposition.h"

#include "engine/model/forward.h"

namespace infoflow {

at::Tensor RepositionKeys(const Model& model, const at::Tensor& unrotated_keys,
                          const at::Tensor& positions) {
  return model.Rotate(unrotated_keys, positions);
}

void AppendChunkAt(const Model& model, const ChunkKv& chunk, int64_t offset, KvCache* cache) {
  at::Tensor positions = PositionRange(model, offset, chunk.size());
  const int64_t first = cache->AppendPositions(positions);
  const auto rope = model.RopeTables(positions);  // shared by every layer
  at::Tensor scratch;  // one half-head product, reused by every layer
  for (int l = 0; l < model.n_layers(); ++l) {
    // Rotated keys go straight into the cache slots: the only bytes this
    // stage must write are the query's cache (K rotated, V copied).
    const at::Tensor k = chunk.k[l].to(model.device()), v = chunk.v[l].to(model.device());
    auto [k_slots, v_slots] = cache->SlotsForWrite(l, first, chunk.size(), k, v);
    model.RotateInto(k, rope, k_slots, &scratch);
    v_slots.copy_(v);
  }
}

std::vector<int32_t> RepositionChunks(const Model& model,
                                      const std::vector<std::shared_ptr<const ChunkKv>>& chunks,
                                      const std::vector<int>& order, int64_t prefix_len,
                                      KvCache* cache) {
  std::vector<int32_t> ids;
  int64_t offset = prefix_len;
  for (int c : order) {
    AppendChunkAt(model, *chunks[c], offset, cache);
    offset += chunks[c]->size();
    ids.insert(ids.end(), chunks[c]->token_ids.begin(), chunks[c]->token_ids.end());
  }
  return ids;
}

}  // namespace infoflow
