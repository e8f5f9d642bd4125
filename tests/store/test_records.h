// Deterministic KV records for the store tests, the crash helper and the
// benchmark: the same seed always yields the same key and bytes, so a
// separate process can check what another one wrote.
#ifndef INFOFLOW_TESTS_STORE_TEST_RECORDS_H_
#define INFOFLOW_TESTS_STORE_TEST_RECORDS_H_

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cache_store/chunk_key.h"
#include "cache_store/kv_record.h"

namespace infoflow::store::testing {

struct RecordShape {
  uint32_t n_layers = 2;
  uint32_t n_kv_heads = 2;
  uint32_t head_dim = 8;
  uint32_t n_tokens = 16;
  KvDtype dtype = KvDtype::kBf16;
  PrefixMode prefix_mode = PrefixMode::kBos;
};

struct TestRecord {
  ChunkKey key;
  std::string bytes;
};

// Payload: bf16/f16/f32 values drawn from N(0, 1) -- activations look like
// this, which matters for the compression measurements.
inline TestRecord MakeRecord(uint64_t seed, const RecordShape& shape = {},
                             const std::string& fingerprint = "test-model") {
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull + 1);
  KvRecordHeader h;
  h.dtype = shape.dtype;
  h.prefix_mode = shape.prefix_mode;
  h.n_layers = shape.n_layers;
  h.n_kv_heads = shape.n_kv_heads;
  h.head_dim = shape.head_dim;
  h.n_tokens = shape.n_tokens;
  h.model_fingerprint = fingerprint;
  std::vector<int32_t> ids(shape.n_tokens);
  for (auto& id : ids) id = static_cast<int32_t>(rng() % 150000);
  // The seed itself goes into the ids so distinct seeds give distinct keys.
  ids[0] = static_cast<int32_t>(seed & 0x7fffffff);
  if (ids.size() > 1) ids[1] = static_cast<int32_t>((seed >> 31) & 0x7fffffff);
  auto builder = KvRecordBuilder::Create(h, ids);
  std::normal_distribution<float> normal(0.f, 1.f);
  char* p = builder->MutablePayload();
  const size_t esize = KvDtypeSize(shape.dtype);
  const size_t n = builder->payload_bytes() / esize;
  for (size_t i = 0; i < n; ++i) {
    float f = normal(rng);
    uint32_t bits;
    std::memcpy(&bits, &f, 4);
    if (esize == 4) {
      std::memcpy(p + 4 * i, &bits, 4);
    } else {
      // bf16 truncation (f16 tests only need realistic-looking bits too).
      const uint16_t half = static_cast<uint16_t>(bits >> 16);
      std::memcpy(p + 2 * i, &half, 2);
    }
  }
  TestRecord r;
  r.key = ComputeChunkKey(fingerprint, h.prefix_mode, h.dtype, ids);
  r.bytes = std::move(*builder).Finish();
  return r;
}

}  // namespace infoflow::store::testing

#endif  // INFOFLOW_TESTS_STORE_TEST_RECORDS_H_
