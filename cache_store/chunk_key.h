// Content addressing for stored KV chunks (docs/DESIGN.md §2.1).
//
// A chunk's KV depends on exactly four things: the model weights, how the
// chunk was prefilled (prefix mode), the KV dtype, and the token ids. The
// chunk key is a SHA-256 over those four, so equal keys mean interchangeable
// KV and the store can dedupe without ever comparing payloads.
//
// Hashed bytes, in order (all integers little-endian):
//   u32 len(model_fingerprint) ‖ model_fingerprint ‖ u8 prefix_mode ‖
//   u8 kv_dtype ‖ [u16 group_size, quantized dtypes only] ‖ token ids as u32
// The length prefix is a clarification of DESIGN §2.1's plain "‖": without it
// a variable-length fingerprint could run into the next field and two
// different (fingerprint, mode) pairs could hash the same byte string.
//
// Everything here is a pure function and safe to call from any thread.
#ifndef INFOFLOW_CACHE_STORE_CHUNK_KEY_H_
#define INFOFLOW_CACHE_STORE_CHUNK_KEY_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace infoflow::store {

// Element type of stored K/V. The numeric values are persisted in records and
// hashed into keys: never renumber. kInt8 / kInt4 are quantized payloads
// (kv_record.h: keys per channel, values per token, in groups of
// `group_size` with an f32 scale and minimum each); they decode into
// whatever compute dtype the reader uses.
enum class KvDtype : uint8_t { kF32 = 1, kF16 = 2, kBf16 = 3, kInt8 = 4, kInt4 = 5 };

// How a chunk was prefilled before its KV was captured (DESIGN §2.1): alone,
// after BOS, or after the model's chat header. Persisted and hashed: never
// renumber; append new modes.
enum class PrefixMode : uint8_t { kNone = 0, kBos = 1, kChatHeader = 2 };

// Size in bytes of one element of a raw (unquantized) `dtype`; 0 for the
// quantized dtypes and for values outside the enum.
size_t KvDtypeSize(KvDtype dtype);
// Bits per stored value of a quantized dtype (8, 4); 0 otherwise.
int QuantizedBits(KvDtype dtype);
bool IsQuantizedKvDtype(KvDtype dtype);
bool IsValidKvDtype(uint8_t raw);
bool IsValidPrefixMode(uint8_t raw);

// 32-byte SHA-256 chunk identifier. A plain value type: cheap to copy, usable
// as a hash-map key (absl and std).
struct ChunkKey {
  static constexpr size_t kSize = 32;
  std::array<uint8_t, kSize> bytes{};

  // Lowercase hex, 64 characters: the form used on the API and in logs.
  std::string Hex() const;
  // The raw 32 bytes as a string (the RocksDB key).
  std::string_view AsBytes() const {
    return std::string_view(reinterpret_cast<const char*>(bytes.data()),
                            bytes.size());
  }

  // Parses 64 hex digits (either case). InvalidArgument otherwise.
  static absl::StatusOr<ChunkKey> FromHex(std::string_view hex);
  // Wraps exactly 32 raw bytes. InvalidArgument otherwise.
  static absl::StatusOr<ChunkKey> FromBytes(std::string_view raw);

  friend bool operator==(const ChunkKey& a, const ChunkKey& b) {
    return a.bytes == b.bytes;
  }
  friend bool operator!=(const ChunkKey& a, const ChunkKey& b) {
    return !(a == b);
  }
  template <typename H>
  friend H AbslHashValue(H h, const ChunkKey& k) {
    return H::combine(std::move(h), k.AsBytes());
  }
};

// Key of the chunk `token_ids` prefilled by the model identified by
// `model_fingerprint` under `prefix_mode`, stored as `dtype`. For a
// quantized dtype the group size is hashed too (u16 after the dtype byte),
// so two codecs of one chunk are two records; raw keys are unchanged.
ChunkKey ComputeChunkKey(std::string_view model_fingerprint,
                         PrefixMode prefix_mode, KvDtype dtype,
                         const std::vector<int32_t>& token_ids,
                         uint16_t group_size = 0);

// Lowercase hex SHA-256 of `bytes`. The engine builds the model fingerprint
// from it (DESIGN §2.1); the store treats the fingerprint as opaque.
std::string Sha256Hex(std::string_view bytes);

// Incremental SHA-256 for inputs that are not contiguous (config + tensor
// names + weight samples) so the caller need not concatenate them. Not
// thread-safe; one instance per computation.
class Sha256Hasher {
 public:
  Sha256Hasher();
  ~Sha256Hasher();
  Sha256Hasher(const Sha256Hasher&) = delete;
  Sha256Hasher& operator=(const Sha256Hasher&) = delete;

  void Update(std::string_view bytes);
  // Returns the 32-byte digest. The hasher must not be used afterwards.
  std::array<uint8_t, 32> Finish();
  // Lowercase hex of Finish().
  std::string FinishHex();

 private:
  struct Ctx;
  std::unique_ptr<Ctx> ctx_;
};

// Lowercase hex of arbitrary bytes.
std::string BytesToHex(std::string_view bytes);

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_CHUNK_KEY_H_
