#include "engine/chunk/chunk_codec.h"

#include <ATen/ATen.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/chunk/kv_quant.h"

namespace infoflow {
namespace {

struct Geometry {
  int64_t n_layers, n_kv_heads, head_dim;
};

Geometry GeometryOf(const Model& model) {
  const ModelConfig& c = model.config();
  return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
}

// The record dtype and group size for `codec` on `model`.
absl::StatusOr<std::pair<store::KvDtype, uint16_t>> RecordFormat(const Model& model,
                                                                 const KvCodec& codec) {
  switch (codec.kind) {
    case KvCodec::Kind::kRaw: {
      absl::StatusOr<store::KvDtype> dtype = StoreDtypeFor(model);
      if (!dtype.ok()) return dtype.status();
      return std::make_pair(*dtype, uint16_t{0});
    }
    case KvCodec::Kind::kInt8:
      return std::make_pair(store::KvDtype::kInt8, static_cast<uint16_t>(codec.group_size));
    case KvCodec::Kind::kInt4:
      return std::make_pair(store::KvDtype::kInt4, static_cast<uint16_t>(codec.group_size));
  }
  return absl::InvalidArgumentError("unknown KV codec");
}

QuantSpec SpecFor(const store::KvRecordHeader& h, QuantAxis axis) {
  return {store::QuantizedBits(h.dtype), h.group_size, axis};
}

}  // namespace

const char* KvCodecName(KvCodec::Kind kind) {
  switch (kind) {
    case KvCodec::Kind::kRaw: return "raw";
    case KvCodec::Kind::kInt8: return "int8";
    case KvCodec::Kind::kInt4: return "int4";
  }
  return "unknown";
}

absl::StatusOr<KvCodec> ParseKvCodec(const std::string& name, int group_size) {
  KvCodec codec;
  codec.group_size = group_size;
  if (name == "raw") codec.kind = KvCodec::Kind::kRaw;
  else if (name == "int8") codec.kind = KvCodec::Kind::kInt8;
  else if (name == "int4") codec.kind = KvCodec::Kind::kInt4;
  else return absl::InvalidArgumentError("--kv-codec: expected raw, int8 or int4, got '" + name + "'");
  if (group_size < 1 || group_size > store::kMaxGroupSize) {
    return absl::InvalidArgumentError(absl::StrCat("--kv-group-size: expected 1..",
                                                   store::kMaxGroupSize, ", got ", group_size));
  }
  return codec;
}

double KvBytesPerToken(const Model& model, const KvCodec& codec) {
  const Geometry g = GeometryOf(model);
  const double elems = 2.0 * g.n_layers * g.n_kv_heads * g.head_dim;  // K and V per token
  if (codec.kind == KvCodec::Kind::kRaw) {
    return elems * static_cast<double>(c10::elementSize(model.dtype()));
  }
  const double bits = codec.kind == KvCodec::Kind::kInt8 ? 8 : 4;
  // One (scale, min) f32 pair per group of `group_size` elements.
  return elems * (bits / 8.0 + 8.0 / codec.group_size);
}

store::PrefixMode ToStorePrefixMode(PrefixMode mode) {
  return mode == PrefixMode::kBos ? store::PrefixMode::kBos : store::PrefixMode::kNone;
}

absl::StatusOr<store::KvDtype> StoreDtypeFor(const Model& model) {
  switch (model.dtype()) {
    case at::kFloat:
      return store::KvDtype::kF32;
    case at::kHalf:
      return store::KvDtype::kF16;
    case at::kBFloat16:
      return store::KvDtype::kBf16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("model dtype ", c10::toString(model.dtype()), " has no KV record dtype"));
  }
}

store::ChunkKey ChunkKeyFor(const Model& model, const std::vector<int32_t>& ids, PrefixMode mode,
                            const KvCodec& codec) {
  absl::StatusOr<std::pair<store::KvDtype, uint16_t>> format = RecordFormat(model, codec);
  return store::ComputeChunkKey(model.fingerprint(), ToStorePrefixMode(mode),
                                format.ok() ? format->first : store::KvDtype::kF32, ids,
                                format.ok() ? format->second : 0);
}

absl::StatusOr<std::string> EncodeChunkRecord(const Model& model, const ChunkKv& kv,
                                              PrefixMode mode, const KvCodec& codec) {
  if (model.fingerprint().empty()) {
    return absl::FailedPreconditionError("model has no fingerprint; cannot key its KV");
  }
  absl::StatusOr<std::pair<store::KvDtype, uint16_t>> format = RecordFormat(model, codec);
  if (!format.ok()) return format.status();
  const Geometry g = GeometryOf(model);
  const int64_t n = kv.size();
  if (n == 0) return absl::InvalidArgumentError("chunk has no tokens");
  if (static_cast<int64_t>(kv.k.size()) != g.n_layers ||
      static_cast<int64_t>(kv.v.size()) != g.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk KV has ", kv.k.size(), " layers, model ", g.n_layers));
  }
  store::KvRecordHeader header;
  header.dtype = format->first;
  header.group_size = format->second;
  header.prefix_mode = ToStorePrefixMode(mode);
  header.n_layers = static_cast<uint32_t>(g.n_layers);
  header.n_kv_heads = static_cast<uint32_t>(g.n_kv_heads);
  header.head_dim = static_cast<uint32_t>(g.head_dim);
  header.n_tokens = static_cast<uint32_t>(n);
  header.model_fingerprint = model.fingerprint();
  absl::StatusOr<store::KvRecordBuilder> builder =
      store::KvRecordBuilder::Create(header, kv.token_ids);
  if (!builder.ok()) return builder.status();
  const std::vector<int64_t> want = {g.n_kv_heads, n, g.head_dim};
  for (int64_t l = 0; l < g.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const at::Tensor& t = which == 0 ? kv.k[l] : kv.v[l];
      if (!t.defined() || t.sizes().vec() != want) {
        return absl::InvalidArgumentError(absl::StrCat("chunk ", which == 0 ? "K" : "V",
                                                       " of layer ", l, " has the wrong shape"));
      }
      char* dst = which == 0 ? builder->MutableK(l) : builder->MutableV(l);
      if (store::IsQuantizedKvDtype(header.dtype)) {
        QuantizeSection(t, SpecFor(header, which == 0 ? QuantAxis::kTokens : QuantAxis::kDims),
                        builder->layout().codes_bytes, dst);
        continue;
      }
      at::Tensor host = t.to(at::kCPU, model.dtype()).contiguous();
      const size_t bytes = host.numel() * host.element_size();
      if (bytes != builder->layer_bytes()) {
        return absl::InternalError("record layer size does not match tensor size");
      }
      std::memcpy(dst, host.data_ptr(), bytes);
    }
  }
  return std::move(*builder).Finish();
}

absl::StatusOr<std::shared_ptr<const ChunkKv>> DecodeChunkRecord(
    const Model& model, const store::KvRecord& record, PrefixMode mode,
    std::shared_ptr<const void> owner) {
  const Geometry g = GeometryOf(model);
  const store::KvRecordHeader& h = record.header;
  absl::StatusOr<store::KvDtype> dtype = StoreDtypeFor(model);
  if (!dtype.ok()) return dtype.status();
  if (h.model_fingerprint != model.fingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk was stored by model ", h.model_fingerprint.substr(0, 16),
                     "…, served model is ", model.fingerprint().substr(0, 16), "…"));
  }
  const bool quantized = store::IsQuantizedKvDtype(h.dtype);
  if (h.n_layers != g.n_layers || h.n_kv_heads != g.n_kv_heads || h.head_dim != g.head_dim ||
      (!quantized && h.dtype != *dtype)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "chunk geometry (layers ", h.n_layers, ", kv heads ", h.n_kv_heads, ", head dim ",
        h.head_dim, ") or dtype does not fit the served model"));
  }
  if (h.prefix_mode != ToStorePrefixMode(mode)) {
    auto name = [](store::PrefixMode m) { return m == store::PrefixMode::kBos ? "BOS" : "NONE"; };
    return absl::FailedPreconditionError(
        absl::StrCat("chunk was prefilled with prefix_mode ", name(h.prefix_mode),
                     ", the query uses ", name(ToStorePrefixMode(mode)),
                     ": query with the prefix_mode it was ingested with"));
  }
  auto kv = std::make_shared<ChunkKv>();
  kv->token_ids = record.token_ids;
  kv->lossy = quantized;
  const int64_t n = h.n_tokens;
  const auto opts = at::TensorOptions().dtype(model.dtype()).device(at::kCPU);
  kv->k.reserve(g.n_layers);
  kv->v.reserve(g.n_layers);
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      const char* src = which == 0 ? record.K(l) : record.V(l);
      at::Tensor t;
      if (quantized) {
        t = DequantizeSection(src, g.n_kv_heads, n, g.head_dim,
                              SpecFor(h, which == 0 ? QuantAxis::kTokens : QuantAxis::kDims),
                              record.codes_bytes, model.dtype());
      } else if (owner != nullptr && model.device() == at::kCPU &&
                 reinterpret_cast<uintptr_t>(src) % c10::elementSize(model.dtype()) == 0) {
        // A view of the stored bytes: fetching a chunk copies nothing
        // (docs/DESIGN.md §15). const_cast: from_blob takes void*, and no
        // stage writes a ChunkKv's tensors.
        t = at::from_blob(const_cast<char*>(src), {g.n_kv_heads, n, g.head_dim},
                          [owner](void*) {}, opts);
      } else {
        t = at::empty({g.n_kv_heads, n, g.head_dim}, opts);
        std::memcpy(t.data_ptr(), src, record.layer_bytes);
      }
      if (model.device() != at::kCPU) t = t.to(model.device());
      (which == 0 ? kv->k : kv->v).push_back(std::move(t));
    }
  }
  return std::shared_ptr<const ChunkKv>(std::move(kv));
}

absl::StatusOr<std::shared_ptr<const ChunkKv>> ThroughRecord(const Model& model, const ChunkKv& kv,
                                                             PrefixMode mode,
                                                             const KvCodec& codec) {
  absl::StatusOr<std::string> bytes = EncodeChunkRecord(model, kv, mode, codec);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<store::KvRecord> rec = store::DecodeRecord(*bytes);
  if (!rec.ok()) return rec.status();
  return DecodeChunkRecord(model, *rec, mode);
}

}  // namespace infoflow
