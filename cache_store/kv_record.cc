#include "cache_store/kv_record.h"

#define XXH_STATIC_LINKING_ONLY  // for the stack-allocated XXH64_state_t
#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace infoflow::store {
namespace {

constexpr char kMagic[4] = {'I', 'F', 'K', 'V'};
constexpr size_t kChecksumOffset = 32;

// Overflow-checked arithmetic: every size in the codec goes through these so
// a hostile header cannot wrap a size around to something small.
bool MulOk(size_t a, size_t b, size_t* out) {
  return !__builtin_mul_overflow(a, b, out);
}
bool AddOk(size_t a, size_t b, size_t* out) {
  return !__builtin_add_overflow(a, b, out);
}
bool AlignUpOk(size_t v, size_t align, size_t* out) {
  size_t bumped;
  if (!AddOk(v, align - 1, &bumped)) return false;
  *out = bumped - bumped % align;
  return true;
}

void PutU16(char* p, uint16_t v) {
  p[0] = static_cast<char>(v & 0xff);
  p[1] = static_cast<char>(v >> 8);
}
void PutU32(char* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
uint16_t GetU16(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return static_cast<uint16_t>(u[0] | (u[1] << 8));
}
uint32_t GetU32(const char* p) {
  const auto* u = reinterpret_cast<const uint8_t*>(p);
  return static_cast<uint32_t>(u[0]) | (static_cast<uint32_t>(u[1]) << 8) |
         (static_cast<uint32_t>(u[2]) << 16) |
         (static_cast<uint32_t>(u[3]) << 24);
}
uint64_t GetU64(const char* p) {
  return static_cast<uint64_t>(GetU32(p)) |
         (static_cast<uint64_t>(GetU32(p + 4)) << 32);
}

uint64_t RecordChecksum(std::string_view bytes) {
  XXH64_state_t state;
  XXH64_reset(&state, 0);
  XXH64_update(&state, bytes.data(), kChecksumOffset);
  XXH64_update(&state, bytes.data() + kRecordFixedHeaderSize,
               bytes.size() - kRecordFixedHeaderSize);
  return XXH64_digest(&state);
}

bool AllZero(const char* p, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

// Layout without the validity checks that distinguish "bad argument" from
// "corrupt input"; nullopt-like false on overflow.
// Sizes of one layer's K and V sections of a quantized record.
bool QuantizedSectionsFor(const KvRecordHeader& h, KvRecordLayout* l) {
  const size_t bits = static_cast<size_t>(QuantizedBits(h.dtype));
  const size_t g = h.group_size;
  size_t elems, code_bits, k_groups, v_groups, k_params, v_params;
  if (g == 0 || !MulOk(size_t{h.n_kv_heads}, h.n_tokens, &elems) ||
      !MulOk(elems, h.head_dim, &elems) || !MulOk(elems, bits, &code_bits) ||
      !AlignUpOk((code_bits + 7) / 8, 4, &l->codes_bytes) ||
      // keys: [H, ceil(T/G), D] groups; values: [H, T, ceil(D/G)]
      !MulOk(size_t{h.n_kv_heads}, (size_t{h.n_tokens} + g - 1) / g, &k_groups) ||
      !MulOk(k_groups, h.head_dim, &k_groups) ||
      !MulOk(size_t{h.n_kv_heads}, h.n_tokens, &v_groups) ||
      !MulOk(v_groups, (size_t{h.head_dim} + g - 1) / g, &v_groups) ||
      !MulOk(k_groups, 8, &k_params) || !MulOk(v_groups, 8, &v_params) ||
      !AddOk(l->codes_bytes, k_params, &l->k_bytes) ||
      !AddOk(l->codes_bytes, v_params, &l->v_bytes)) {
    return false;
  }
  return true;
}

bool LayoutFor(const KvRecordHeader& h, KvRecordLayout* out) {
  KvRecordLayout l;
  size_t fp_end, tok_bytes, tok_end, per_layer;
  if (!AddOk(kRecordFixedHeaderSize, h.model_fingerprint.size(), &fp_end) ||
      !AlignUpOk(fp_end, 4, &l.token_ids_offset) ||
      !MulOk(h.n_tokens, 4, &tok_bytes) ||
      !AddOk(l.token_ids_offset, tok_bytes, &tok_end) ||
      !AlignUpOk(tok_end, kPayloadAlignment, &l.payload_offset)) {
    return false;
  }
  if (IsQuantizedKvDtype(h.dtype)) {
    if (!QuantizedSectionsFor(h, &l)) return false;
  } else {
    size_t per_head;
    if (!MulOk(size_t{h.n_tokens}, h.head_dim, &per_head) ||
        !MulOk(per_head, KvDtypeSize(h.dtype), &per_head) ||
        !MulOk(per_head, h.n_kv_heads, &l.layer_bytes)) {
      return false;
    }
    l.k_bytes = l.v_bytes = l.layer_bytes;
  }
  if (!AddOk(l.k_bytes, l.v_bytes, &per_layer) ||
      !MulOk(per_layer, h.n_layers, &l.payload_bytes) ||
      !AddOk(l.payload_offset, l.payload_bytes, &l.total_bytes)) {
    return false;
  }
  *out = l;
  return true;
}

absl::Status CheckHeaderFields(const KvRecordHeader& h) {
  if (!IsValidKvDtype(static_cast<uint8_t>(h.dtype))) {
    return absl::InvalidArgumentError("bad dtype");
  }
  if (IsQuantizedKvDtype(h.dtype)
          ? (h.group_size == 0 || h.group_size > kMaxGroupSize ||
             (QuantizedBits(h.dtype) == 4 && h.head_dim % 2 != 0))
          : h.group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "group size ", h.group_size, " does not fit dtype ", static_cast<int>(h.dtype),
        " (quantized: 1..", kMaxGroupSize, ", int4 needs an even head_dim; raw: 0)"));
  }
  if (!IsValidPrefixMode(static_cast<uint8_t>(h.prefix_mode))) {
    return absl::InvalidArgumentError("bad prefix mode");
  }
  if (h.n_layers == 0 || h.n_kv_heads == 0 || h.head_dim == 0 ||
      h.n_tokens == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "record dimensions must be non-zero: n_layers=", h.n_layers,
        " n_kv_heads=", h.n_kv_heads, " head_dim=", h.head_dim,
        " n_tokens=", h.n_tokens));
  }
  if (h.model_fingerprint.empty() ||
      h.model_fingerprint.size() > kMaxFingerprintBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("model fingerprint must be 1..", kMaxFingerprintBytes,
                     " bytes, got ", h.model_fingerprint.size()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<KvRecordLayout> ComputeRecordLayout(
    const KvRecordHeader& header) {
  if (absl::Status s = CheckHeaderFields(header); !s.ok()) return s;
  KvRecordLayout layout;
  if (!LayoutFor(header, &layout)) {
    return absl::InvalidArgumentError("record size overflows size_t");
  }
  return layout;
}

ChunkKey KvRecord::Key() const {
  return ComputeChunkKey(header.model_fingerprint, header.prefix_mode,
                         header.dtype, token_ids, header.group_size);
}

absl::StatusOr<KvRecordBuilder> KvRecordBuilder::Create(
    const KvRecordHeader& header, const std::vector<int32_t>& token_ids) {
  absl::StatusOr<KvRecordLayout> layout = ComputeRecordLayout(header);
  if (!layout.ok()) return layout.status();
  if (token_ids.size() != header.n_tokens) {
    return absl::InvalidArgumentError(
        absl::StrCat("header says ", header.n_tokens, " tokens, got ",
                     token_ids.size(), " token ids"));
  }
  KvRecordBuilder b;
  b.layout_ = *layout;
  b.n_layers_ = header.n_layers;
  // Value-initialised: padding and reserved fields must be zero (decode
  // insists), and a layer the caller forgets stays deterministic.
  b.buf_.assign(layout->total_bytes, '\0');
  char* p = b.buf_.data();
  std::memcpy(p, kMagic, 4);
  PutU16(p + 4, kRecordFormatVersion);
  p[6] = static_cast<char>(header.dtype);
  p[7] = static_cast<char>(header.prefix_mode);
  PutU32(p + 8, header.n_layers);
  PutU32(p + 12, header.n_kv_heads);
  PutU32(p + 16, header.head_dim);
  PutU32(p + 20, header.n_tokens);
  PutU16(p + 24, static_cast<uint16_t>(header.model_fingerprint.size()));
  PutU16(p + 26, header.group_size);
  std::memcpy(p + kRecordFixedHeaderSize, header.model_fingerprint.data(),
              header.model_fingerprint.size());
  char* tok = p + layout->token_ids_offset;
  for (size_t i = 0; i < token_ids.size(); ++i) {
    PutU32(tok + 4 * i, static_cast<uint32_t>(token_ids[i]));
  }
  return b;
}

std::string KvRecordBuilder::Finish() && {
  PutU64(buf_.data() + kChecksumOffset, RecordChecksum(buf_));
  return std::move(buf_);
}

absl::StatusOr<std::string> EncodeRecord(const KvRecordHeader& header,
                                         const std::vector<int32_t>& token_ids,
                                         absl::Span<const KvLayerBytes> layers) {
  absl::StatusOr<KvRecordBuilder> b = KvRecordBuilder::Create(header, token_ids);
  if (!b.ok()) return b.status();
  if (layers.size() != header.n_layers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "header says ", header.n_layers, " layers, got ", layers.size()));
  }
  for (uint32_t l = 0; l < header.n_layers; ++l) {
    if (layers[l].k.size() != b->layout().k_bytes ||
        layers[l].v.size() != b->layout().v_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "layer ", l, ": K/V must be ", b->layout().k_bytes, "/", b->layout().v_bytes,
          " bytes, got ", layers[l].k.size(), "/", layers[l].v.size()));
    }
    std::memcpy(b->MutableK(l), layers[l].k.data(), b->layout().k_bytes);
    std::memcpy(b->MutableV(l), layers[l].v.data(), b->layout().v_bytes);
  }
  return std::move(*b).Finish();
}

absl::StatusOr<std::string> EncodeRecord(const KvRecordHeader& header,
                                         const std::vector<int32_t>& token_ids,
                                         std::string_view payload) {
  absl::StatusOr<KvRecordBuilder> b = KvRecordBuilder::Create(header, token_ids);
  if (!b.ok()) return b.status();
  if (payload.size() != b->payload_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("payload must be ", b->payload_bytes(), " bytes, got ",
                     payload.size()));
  }
  std::memcpy(b->MutablePayload(), payload.data(), payload.size());
  return std::move(*b).Finish();
}

absl::StatusOr<KvRecord> DecodeRecord(std::string_view bytes,
                                      DecodeOptions options) {
  if (bytes.size() < kRecordFixedHeaderSize) {
    return absl::DataLossError(absl::StrCat("record truncated: ", bytes.size(),
                                            " bytes < fixed header"));
  }
  const char* p = bytes.data();
  if (std::memcmp(p, kMagic, 4) != 0) {
    return absl::DataLossError("record has bad magic");
  }
  const uint16_t version = GetU16(p + 4);
  if (version != kRecordFormatVersion) {
    // Not necessarily corrupt (could be a newer writer), but unreadable here:
    // the caller's remedy is the same -- recompute and overwrite.
    return absl::DataLossError(
        absl::StrCat("unsupported record format version ", version));
  }
  const auto raw_dtype = static_cast<uint8_t>(p[6]);
  const auto raw_mode = static_cast<uint8_t>(p[7]);
  if (!IsValidKvDtype(raw_dtype)) {
    return absl::DataLossError(absl::StrCat("bad dtype ", raw_dtype));
  }
  if (!IsValidPrefixMode(raw_mode)) {
    return absl::DataLossError(absl::StrCat("bad prefix mode ", raw_mode));
  }
  KvRecord rec;
  KvRecordHeader& h = rec.header;
  h.dtype = static_cast<KvDtype>(raw_dtype);
  h.prefix_mode = static_cast<PrefixMode>(raw_mode);
  h.n_layers = GetU32(p + 8);
  h.n_kv_heads = GetU32(p + 12);
  h.head_dim = GetU32(p + 16);
  h.n_tokens = GetU32(p + 20);
  const uint16_t fp_len = GetU16(p + 24);
  h.group_size = GetU16(p + 26);
  if (GetU32(p + 28) != 0) {
    return absl::DataLossError("reserved header fields are not zero");
  }
  if (IsQuantizedKvDtype(h.dtype) ? (h.group_size == 0 || h.group_size > kMaxGroupSize)
                                  : h.group_size != 0) {
    return absl::DataLossError(absl::StrCat("group size ", h.group_size, " does not fit dtype ",
                                            static_cast<int>(raw_dtype)));
  }
  if (h.n_layers == 0 || h.n_kv_heads == 0 || h.head_dim == 0 ||
      h.n_tokens == 0 || fp_len == 0 || fp_len > kMaxFingerprintBytes) {
    return absl::DataLossError("record header has an empty or oversized field");
  }
  if (QuantizedBits(h.dtype) == 4 && h.head_dim % 2 != 0) {
    return absl::DataLossError("int4 record with an odd head_dim");
  }
  if (fp_len > bytes.size() - kRecordFixedHeaderSize) {
    return absl::DataLossError("record truncated inside the fingerprint");
  }
  h.model_fingerprint.assign(p + kRecordFixedHeaderSize, fp_len);
  KvRecordLayout layout;
  if (!LayoutFor(h, &layout)) {
    return absl::DataLossError("record header sizes overflow");
  }
  if (layout.total_bytes != bytes.size()) {
    return absl::DataLossError(
        absl::StrCat("record size mismatch: header implies ",
                     layout.total_bytes, " bytes, have ", bytes.size()));
  }
  // From here on every offset is within `bytes`.
  const size_t fp_end = kRecordFixedHeaderSize + fp_len;
  const size_t tok_end = layout.token_ids_offset + size_t{4} * h.n_tokens;
  if (!AllZero(p + fp_end, layout.token_ids_offset - fp_end) ||
      !AllZero(p + tok_end, layout.payload_offset - tok_end)) {
    return absl::DataLossError("record padding is not zero");
  }
  rec.checksum = GetU64(p + kChecksumOffset);
  if (options.verify_checksum && RecordChecksum(bytes) != rec.checksum) {
    return absl::DataLossError("record checksum mismatch");
  }
  rec.token_ids.resize(h.n_tokens);
  const char* tok = p + layout.token_ids_offset;
  for (uint32_t i = 0; i < h.n_tokens; ++i) {
    rec.token_ids[i] = static_cast<int32_t>(GetU32(tok + size_t{4} * i));
  }
  rec.layer_bytes = layout.layer_bytes;
  rec.k_bytes = layout.k_bytes;
  rec.v_bytes = layout.v_bytes;
  rec.codes_bytes = layout.codes_bytes;
  rec.payload = bytes.substr(layout.payload_offset, layout.payload_bytes);
  return rec;
}

}  // namespace infoflow::store
