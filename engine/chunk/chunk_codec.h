// The one place that converts between the engine's ChunkKv tensors and the
// store's KV records (cache_store/kv_record.h), and that names a chunk's key.
//
// Records hold K (pre-RoPE) and V per layer in the model's compute dtype
// (KvCodec kRaw: a round trip is bit-exact), or quantized to int8 / int4 in
// groups (kv_quant.h: a round trip is within half a quantization step per
// element; docs/DESIGN.md §5). Pure functions over the codec: no RocksDB
// here. All functions are thread-safe.
#ifndef INFOFLOW_ENGINE_CHUNK_CHUNK_CODEC_H_
#define INFOFLOW_ENGINE_CHUNK_CHUNK_CODEC_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "cache_store/chunk_key.h"
#include "cache_store/kv_record.h"
#include "engine/model/kv_cache.h"
#include "engine/model/model.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/chunk/kv_codec.h"

namespace infoflow {

// Bytes per token of a record's K/V under `codec` for `model` (payload only:
// 2 x layers x kv heads x head dim x bytes per element, plus group scales).
double KvBytesPerToken(const Model& model, const KvCodec& codec);

// The store's persisted prefix-mode value for the engine's mode.
store::PrefixMode ToStorePrefixMode(PrefixMode mode);

// The store dtype for `model`'s compute dtype. InvalidArgument for dtypes a
// record cannot hold.
absl::StatusOr<store::KvDtype> StoreDtypeFor(const Model& model);

// Key of the chunk `ids` as `model` would store it under `mode`
// (fingerprint, mode, compute dtype, ids). Requires a model whose dtype
// StoreDtypeFor accepts (f32/bf16/f16; every loadable model).
store::ChunkKey ChunkKeyFor(const Model& model, const std::vector<int32_t>& ids, PrefixMode mode,
                            const KvCodec& codec = {});

// Encodes `kv` (as produced by PrefillChunk for `model` under `mode`) into a
// record. FailedPrecondition when the model has no fingerprint;
// InvalidArgument when kv's shapes do not fit the model.
absl::StatusOr<std::string> EncodeChunkRecord(const Model& model, const ChunkKv& kv,
                                              PrefixMode mode, const KvCodec& codec = {});

// Decodes a verified record into tensors on the model's device. Without
// `owner` the bytes are copied (the result does not reference the record's
// buffer); quantized records are dequantized into the model's dtype. With
// `owner` (what keeps the bytes `record` points into alive, e.g. the store's
// ChunkValue) a raw record on a CPU model is not copied: its K/V tensors are
// views of those bytes and hold `owner` until the last one is gone. The
// engine only reads a ChunkKv (reposition writes rotated copies into the
// query's cache), so the stored bytes never change. FailedPrecondition when the record
// was made by another model (fingerprint, n_layers, n_kv_heads, head_dim, or
// a raw dtype other than the model's) or prefilled under another prefix mode than
// `mode` (its KV sits at other local positions: using it would be silently
// wrong).
absl::StatusOr<std::shared_ptr<const ChunkKv>> DecodeChunkRecord(
    const Model& model, const store::KvRecord& record, PrefixMode mode,
    std::shared_ptr<const void> owner = nullptr);

// EncodeChunkRecord + DecodeRecord + DecodeChunkRecord: `kv` as a reader of
// its stored record under `codec` sees it (what the server's fetch path
// returns). For evals and benchmarks that skip the store.
absl::StatusOr<std::shared_ptr<const ChunkKv>> ThroughRecord(const Model& model, const ChunkKv& kv,
                                                             PrefixMode mode,
                                                             const KvCodec& codec);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHUNK_CHUNK_CODEC_H_
