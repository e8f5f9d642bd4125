// How a server stores chunk K/V (--kv-codec, --kv-group-size): the compute
// dtype as is (kRaw, bit-exact) or quantized in groups (kv_quant.h). Torch-
// free, so server headers can hold a KvCodec without pulling in ATen.
#ifndef INFOFLOW_ENGINE_CHUNK_KV_CODEC_H_
#define INFOFLOW_ENGINE_CHUNK_KV_CODEC_H_

#include <string>

#include "absl/status/statusor.h"

namespace infoflow {

struct KvCodec {
  enum class Kind { kRaw, kInt8, kInt4 };
  Kind kind = Kind::kRaw;
  int group_size = 64;  // quantized kinds: elements per (scale, min) group
};

const char* KvCodecName(KvCodec::Kind kind);  // "raw", "int8", "int4"

// "raw" | "int8" | "int4" and a group size in 1..store::kMaxGroupSize;
// InvalidArgument naming the flag otherwise.
absl::StatusOr<KvCodec> ParseKvCodec(const std::string& name, int group_size);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHUNK_KV_CODEC_H_
