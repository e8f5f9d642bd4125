#include "engine/chunk/chunk_codec.h"

#include <ATen/ATen.h>

#include <cstring>

#include "absl/strings/str_cat.h"

namespace infoflow {
namespace {

struct Geometry {
  int64_t n_layers, n_kv_heads, head_dim;
};

Geometry GeometryOf(const Model& model) {
  const ModelConfig& c = model.config();
  return {c.num_hidden_layers, c.num_key_value_heads, c.head_dim};
}

}  // namespace

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

store::ChunkKey ChunkKeyFor(const Model& model, const std::vector<int32_t>& ids, PrefixMode mode) {
  absl::StatusOr<store::KvDtype> dtype = StoreDtypeFor(model);
  return store::ComputeChunkKey(model.fingerprint(), ToStorePrefixMode(mode),
                                dtype.ok() ? *dtype : store::KvDtype::kF32, ids);
}

absl::StatusOr<std::string> EncodeChunkRecord(const Model& model, const ChunkKv& kv,
                                              PrefixMode mode) {
  if (model.fingerprint().empty()) {
    return absl::FailedPreconditionError("model has no fingerprint; cannot key its KV");
  }
  absl::StatusOr<store::KvDtype> dtype = StoreDtypeFor(model);
  if (!dtype.ok()) return dtype.status();
  const Geometry g = GeometryOf(model);
  const int64_t n = kv.size();
  if (n == 0) return absl::InvalidArgumentError("chunk has no tokens");
  if (static_cast<int64_t>(kv.k.size()) != g.n_layers ||
      static_cast<int64_t>(kv.v.size()) != g.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk KV has ", kv.k.size(), " layers, model ", g.n_layers));
  }
  store::KvRecordHeader header;
  header.dtype = *dtype;
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
      at::Tensor host = t.to(at::kCPU, model.dtype()).contiguous();
      const size_t bytes = host.numel() * host.element_size();
      if (bytes != builder->layer_bytes()) {
        return absl::InternalError("record layer size does not match tensor size");
      }
      char* dst = which == 0 ? builder->MutableK(l) : builder->MutableV(l);
      std::memcpy(dst, host.data_ptr(), bytes);
    }
  }
  return std::move(*builder).Finish();
}

absl::StatusOr<std::shared_ptr<const ChunkKv>> DecodeChunkRecord(const Model& model,
                                                                 const store::KvRecord& record,
                                                                 PrefixMode mode) {
  const Geometry g = GeometryOf(model);
  const store::KvRecordHeader& h = record.header;
  absl::StatusOr<store::KvDtype> dtype = StoreDtypeFor(model);
  if (!dtype.ok()) return dtype.status();
  if (h.model_fingerprint != model.fingerprint()) {
    return absl::FailedPreconditionError(
        absl::StrCat("chunk was stored by model ", h.model_fingerprint.substr(0, 16),
                     "…, served model is ", model.fingerprint().substr(0, 16), "…"));
  }
  if (h.n_layers != g.n_layers || h.n_kv_heads != g.n_kv_heads || h.head_dim != g.head_dim ||
      h.dtype != *dtype) {
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
  const int64_t n = h.n_tokens;
  const auto opts = at::TensorOptions().dtype(model.dtype()).device(at::kCPU);
  kv->k.reserve(g.n_layers);
  kv->v.reserve(g.n_layers);
  for (uint32_t l = 0; l < h.n_layers; ++l) {
    for (int which = 0; which < 2; ++which) {
      at::Tensor t = at::empty({g.n_kv_heads, n, g.head_dim}, opts);
      std::memcpy(t.data_ptr(), which == 0 ? record.K(l) : record.V(l), record.layer_bytes);
      if (model.device() != at::kCPU) t = t.to(model.device());
      (which == 0 ? kv->k : kv->v).push_back(std::move(t));
    }
  }
  return std::shared_ptr<const ChunkKv>(std::move(kv));
}

}  // namespace infoflow
