// Group-wise asymmetric quantization of one K or V section of a chunk record
// (the byte layout is cache_store/kv_record.h's). Keys are quantized per
// channel (a group is G consecutive tokens of one head dim), values per token
// (G consecutive dims of one token), as KIVI does: pre-RoPE keys have
// outlier channels, values outlier tokens. A value decodes as
// code * scale + min, so the error of each element is at most scale / 2 =
// (group max - group min) / (2 * (2^bits - 1)).
//
// Pure functions; thread-safe.
#ifndef INFOFLOW_ENGINE_CHUNK_KV_QUANT_H_
#define INFOFLOW_ENGINE_CHUNK_KV_QUANT_H_

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>

namespace infoflow {

// Which axis of [H, T, D] a group runs along.
enum class QuantAxis { kTokens, kDims };  // keys: kTokens; values: kDims

struct QuantSpec {
  int bits = 8;    // 8 or 4 (4-bit codes two per byte, even d in the low nibble)
  int group = 64;  // >= 1
  QuantAxis axis = QuantAxis::kTokens;
};

// Bytes of the codes of an [h, t, d] section (before the 4-byte padding).
size_t QuantCodeBytes(int64_t h, int64_t t, int64_t d, int bits);

// Quantizes `x` ([H, T, D], any floating dtype, any device) into `out`:
// codes, then (at `codes_bytes`, the padded code size of the record layout)
// f32 (scale, min) pairs for the groups [H, ceil(T/G), D] (kTokens) or
// [H, ceil(D/G), T] (kDims). `out` must hold the whole section.
void QuantizeSection(const at::Tensor& x, const QuantSpec& spec, size_t codes_bytes, char* out);

// Inverse of QuantizeSection: an [h, t, d] CPU tensor of `dtype`.
at::Tensor DequantizeSection(const char* in, int64_t h, int64_t t, int64_t d,
                             const QuantSpec& spec, size_t codes_bytes, at::ScalarType dtype);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHUNK_KV_QUANT_H_
