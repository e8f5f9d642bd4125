#include "engine/reposition.h"

#include "engine/prefill.h"

namespace infoflow {

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
