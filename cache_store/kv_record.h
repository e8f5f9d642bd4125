// On-disk format of one stored KV chunk (docs/DESIGN.md §5) and its codec.
//
// Layout (all integers little-endian; offsets in bytes):
//    0  char[4] magic "IFKV"
//    4  u16     format version (kRecordFormatVersion)
//    6  u8      dtype (KvDtype)
//    7  u8      prefix mode (PrefixMode)
//    8  u32     n_layers
//   12  u32     n_kv_heads
//   16  u32     head_dim
//   20  u32     n_tokens
//   24  u16     model fingerprint length F (1..kMaxFingerprintBytes)
//   26  u16     group size G: 0 for raw dtypes, 1..kMaxGroupSize for
//               quantized ones (kInt8, kInt4)
//   28  u32     reserved, 0
//   32  u64     checksum: xxh64 (seed 0) of bytes [0, 32) followed by
//               bytes [40, end) -- every byte except the checksum itself
//   40  F bytes model fingerprint
//       zero padding to a multiple of 4
//       n_tokens x u32 token ids
//       zero padding to a multiple of kPayloadAlignment
//       payload: for each layer l: K[l] then V[l].
//         raw dtypes: each [n_kv_heads, n_tokens, head_dim] elements, raw.
//         quantized (b = 8 or 4 bits, H heads, T tokens, D head_dim):
//           K[l]: codes [H, T, D] (b bits each; 4-bit codes two per byte,
//                 element d in the low nibble when d is even), zero padding
//                 to a multiple of 4, then f32 (scale, min) pairs for the
//                 groups [H, ceil(T / G), D]: keys are quantized per
//                 channel, G consecutive tokens of one (head, dim) a group;
//           V[l]: codes [H, T, D] as for K, padding, then f32 (scale, min)
//                 for the groups [H, ceil(D / G), T]: values are quantized
//                 per token, G consecutive dims of one (head, token) a group.
//         A value decodes as code * scale + min (asymmetric, KIVI-style).
//
// Why the checksum covers the header too and not just the payload: a flipped
// bit in e.g. the fingerprint or prefix mode would otherwise decode cleanly
// into a record that claims to be something it is not. Why the payload is
// 64-byte aligned: the engine can wrap K/V of a layer as a tensor in place
// (at::from_blob) without a copy, and SIMD loads stay aligned, given the
// buffer itself is 64-aligned (heap std::string buffers are 16-aligned;
// from_blob needs only element alignment).
//
// DecodeRecord never trusts a length read from the input: every size is
// computed with overflow checks and must add up to exactly the input size
// before anything is allocated or read. Any mismatch returns a DataLoss
// status (IsCorruptRecord()), never a crash.
//
// All functions here are pure and thread-safe.
#ifndef INFOFLOW_CACHE_STORE_KV_RECORD_H_
#define INFOFLOW_CACHE_STORE_KV_RECORD_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "cache_store/chunk_key.h"

namespace infoflow::store {

inline constexpr uint16_t kRecordFormatVersion = 1;
inline constexpr size_t kRecordFixedHeaderSize = 40;
inline constexpr size_t kMaxFingerprintBytes = 256;
inline constexpr size_t kPayloadAlignment = 64;
inline constexpr uint16_t kMaxGroupSize = 4096;

// Everything about a record except its token ids and K/V bytes.
struct KvRecordHeader {
  KvDtype dtype = KvDtype::kBf16;
  PrefixMode prefix_mode = PrefixMode::kNone;
  uint32_t n_layers = 0;
  uint32_t n_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t n_tokens = 0;
  uint16_t group_size = 0;  // quantized dtypes only (see the layout above)
  // Opaque to the store (the engine uses Sha256Hex of the model; see
  // chunk_key.h). 1..kMaxFingerprintBytes bytes.
  std::string model_fingerprint;
};

// Byte sizes implied by a header. Returned by ComputeRecordLayout, which
// rejects headers whose sizes overflow size_t.
struct KvRecordLayout {
  size_t token_ids_offset = 0;
  size_t payload_offset = 0;
  size_t layer_bytes = 0;  // raw dtypes: bytes of K (== bytes of V) of one layer; else 0
  size_t k_bytes = 0;      // bytes of K[l] (codes + padding + scales for quantized)
  size_t v_bytes = 0;      // bytes of V[l]
  size_t codes_bytes = 0;  // quantized: bytes of the codes of K[l] (== of V[l]), padded
  size_t payload_bytes = 0;
  size_t total_bytes = 0;
};

// Validates `header` (known dtype/prefix mode, non-zero dimensions,
// fingerprint length) and computes its layout with overflow checks.
// InvalidArgument if the header is not encodable.
absl::StatusOr<KvRecordLayout> ComputeRecordLayout(
    const KvRecordHeader& header);

// A decoded record. `payload` is a view: it points into the buffer given to
// DecodeRecord (or owned by the ChunkValue the store returned), which must
// outlive this struct. Token ids are copied out (they are small and the
// buffer need not be 4-aligned).
struct KvRecord {
  KvRecordHeader header;
  std::vector<int32_t> token_ids;
  std::string_view payload;  // n_layers x (K, V), see layout above
  size_t layer_bytes = 0;    // raw dtypes: bytes of K (== V) of one layer; else 0
  size_t k_bytes = 0;        // bytes of K[l] / V[l] (any dtype)
  size_t v_bytes = 0;
  size_t codes_bytes = 0;    // quantized: bytes of the codes of K[l] (== V[l])
  uint64_t checksum = 0;

  // K or V section of `layer` (raw: [n_kv_heads, n_tokens, head_dim]
  // elements of header.dtype; quantized: see the layout above); `layer`
  // must be < header.n_layers.
  const char* K(uint32_t layer) const { return payload.data() + layer * (k_bytes + v_bytes); }
  const char* V(uint32_t layer) const { return K(layer) + k_bytes; }

  // The content key of this record (ComputeChunkKey over its header and ids).
  ChunkKey Key() const;
};

// Builds a record with a single copy of the K/V bytes: Create() allocates
// the final buffer, the caller writes each layer's K and V straight into
// MutableK/MutableV (e.g. from a contiguous tensor), Finish() seals the
// checksum. Not thread-safe; distinct layers may be filled from distinct
// threads if the caller synchronises before Finish().
class KvRecordBuilder {
 public:
  // InvalidArgument when the header is not encodable or
  // token_ids.size() != header.n_tokens.
  static absl::StatusOr<KvRecordBuilder> Create(
      const KvRecordHeader& header, const std::vector<int32_t>& token_ids);

  KvRecordBuilder(KvRecordBuilder&&) = default;
  KvRecordBuilder& operator=(KvRecordBuilder&&) = default;

  size_t layer_bytes() const { return layout_.layer_bytes; }
  const KvRecordLayout& layout() const { return layout_; }
  uint32_t n_layers() const { return n_layers_; }
  // Writable K / V section of `layer` (layout().k_bytes / v_bytes);
  // zero-filled.
  char* MutableK(uint32_t layer) {
    return buf_.data() + layout_.payload_offset + layer * (layout_.k_bytes + layout_.v_bytes);
  }
  char* MutableV(uint32_t layer) { return MutableK(layer) + layout_.k_bytes; }
  // The whole payload region (n_layers x (K, V)), for callers that already
  // hold it contiguously.
  char* MutablePayload() { return buf_.data() + layout_.payload_offset; }
  size_t payload_bytes() const { return layout_.payload_bytes; }

  // Computes the checksum and returns the encoded record. The builder is
  // empty afterwards.
  std::string Finish() &&;

 private:
  KvRecordBuilder() = default;
  KvRecordLayout layout_;
  uint32_t n_layers_ = 0;
  std::string buf_;
};

// K and V bytes of one layer, each exactly layer_bytes long.
struct KvLayerBytes {
  std::string_view k;
  std::string_view v;
};

// Encodes from per-layer K/V spans. InvalidArgument when the header is not
// encodable, the token count differs, or any span has the wrong size.
absl::StatusOr<std::string> EncodeRecord(const KvRecordHeader& header,
                                         const std::vector<int32_t>& token_ids,
                                         absl::Span<const KvLayerBytes> layers);

// Encodes from an already interleaved payload (n_layers x (K, V)).
absl::StatusOr<std::string> EncodeRecord(const KvRecordHeader& header,
                                         const std::vector<int32_t>& token_ids,
                                         std::string_view payload);

struct DecodeOptions {
  // The store verifies once when a record enters memory; callers that hold
  // bytes already verified may skip the payload hash (it is the only
  // O(payload) step of decoding).
  bool verify_checksum = true;
};

// Parses `bytes`. On success the returned record's payload points into
// `bytes`. On any malformed, truncated, oversized or checksum-mismatching
// input returns a DataLoss status (see IsCorruptRecord); never reads out of
// bounds and never allocates more than `bytes.size()`.
absl::StatusOr<KvRecord> DecodeRecord(std::string_view bytes,
                                      DecodeOptions options = {});

// True for the statuses DecodeRecord uses to report corrupt input.
inline bool IsCorruptRecord(const absl::Status& status) {
  return absl::IsDataLoss(status);
}

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_KV_RECORD_H_
