// Ingest: a chunk is prefilled once, alone, and its per-layer pre-RoPE K and
// V are what the store keeps (docs/DESIGN.md §2.1).
#ifndef INFOFLOW_ENGINE_CHUNK_CHUNK_PREFILL_H_
#define INFOFLOW_ENGINE_CHUNK_CHUNK_PREFILL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/forward.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"

namespace infoflow {

// What sits before a chunk when it is prefilled alone. kBos: the chunk is
// computed after a BOS token whose own KV is then dropped, so the chunk's
// tokens occupy local positions 1..n (as in the paper); kNone: positions 0..n-1.
enum class PrefixMode : uint8_t { kNone = 0, kBos = 1 };

// Number of positions the prefix occupies (0 or 1).
int64_t PrefixLength(PrefixMode mode);

// Prefills `tokens` alone (local causal mask, local positions after the
// prefix) and returns their per-layer pre-RoPE K and V. InvalidArgument if
// `tokens` is empty or holds an id outside the vocabulary, or for kBos on a
// model whose config has no bos_token_id (no id is made up).
absl::StatusOr<ChunkKv> PrefillChunk(const Model& model, const std::vector<int32_t>& tokens,
                                     PrefixMode prefix_mode);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHUNK_CHUNK_PREFILL_H_
