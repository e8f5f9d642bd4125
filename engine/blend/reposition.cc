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
  for (int l = 0; l < model.n_layers(); ++l) {
    cache->WriteRange(l, first, model.Rotate(chunk.k[l].to(model.device()), rope),
                      chunk.v[l].to(model.device()));
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
