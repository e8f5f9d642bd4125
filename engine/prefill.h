// Chunk-local prefill (ingest) and placing stored chunks at global positions.
#ifndef INFOFLOW_ENGINE_PREFILL_H_
#define INFOFLOW_ENGINE_PREFILL_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/kv_cache.h"
#include "engine/model.h"

namespace infoflow {

// What sits before a chunk when it is prefilled alone. kBos: the chunk is
// computed after a BOS token whose own KV is then dropped, so the chunk's
// tokens occupy local positions 1..n (as in the paper); kNone: positions 0..n-1.
enum class PrefixMode : uint8_t { kNone = 0, kBos = 1 };

// Number of positions the prefix occupies (0 or 1).
int64_t PrefixLength(PrefixMode mode);

// Prefills `tokens` alone (local causal mask, local positions after the
// prefix) and returns their per-layer pre-RoPE K and V. InvalidArgument if
// `tokens` is empty or holds an id outside the vocabulary.
absl::StatusOr<ChunkKv> PrefillChunk(const Model& model, const std::vector<int32_t>& tokens,
                                     PrefixMode prefix_mode);

// Applies RoPE at `positions` ([n] int64) to pre-RoPE keys [Hkv, n, hd].
at::Tensor RepositionKeys(const Model& model, const at::Tensor& unrotated_keys,
                          const at::Tensor& positions);

// Appends `chunk` to `cache` at global positions offset..offset+n-1, RoPE
// applied there. Exact because stored keys are pre-RoPE.
void AppendChunkAt(const Model& model, const ChunkKv& chunk, int64_t offset, KvCache* cache);

// Full prefill: runs `tokens` at positions start..start+n-1 appended to
// `cache` and returns the forward result (logits per `options`).
ForwardResult PrefillTokens(const Model& model, const std::vector<int32_t>& tokens,
                            int64_t start_position, KvCache* cache,
                            const ForwardOptions& options = {});

// [n] int64 tensor of `ids` / of start..start+n-1, on `model`'s device.
at::Tensor TokenTensor(const Model& model, const std::vector<int32_t>& ids);
at::Tensor PositionRange(const Model& model, int64_t start, int64_t n);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_PREFILL_H_
