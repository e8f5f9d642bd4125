// Shared helpers for engine tests: model paths, max-abs differences.
#ifndef INFOFLOW_TESTS_ENGINE_TEST_UTIL_H_
#define INFOFLOW_TESTS_ENGINE_TEST_UTIL_H_

#include <ATen/ATen.h>

#include <memory>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model.h"

namespace infoflow::testing {

inline std::string Stories260KDir() { return INFOFLOW_STORIES260K_DIR; }

inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// n token ids in [3, vocab) from an xorshift stream of `seed` (ids 0-2
// are left to special tokens).
inline std::vector<int32_t> Ids(int n, int seed, int vocab) {
  std::vector<int32_t> ids;
  uint32_t x = 2463534242u + seed;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    ids.push_back(static_cast<int32_t>(3 + x % (vocab - 3)));
  }
  return ids;
}

// Loads a model or fails the calling test (use with ASSERT_NO_FATAL_FAILURE).
std::unique_ptr<Model> LoadOrDie(const std::string& dir);

// Directory of a generated test model (written once per process under the
// test data dir). kind: "llama", "qwen2", "qwen3", "llama3-scaled", "bf16",
// "glm", "glm4", "glm4-sharded" (3 safetensors shards), "glm4-bos" (<sop>
// as bos_token_id), "glm-full-rotary" (partial_rotary_factor 1), "glm4-bf16".
std::string GeneratedModelDir(const std::string& kind);

}  // namespace infoflow::testing

#endif  // INFOFLOW_TESTS_ENGINE_TEST_UTIL_H_
