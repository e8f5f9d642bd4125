// Shared helpers for engine tests: model paths, max-abs differences.
#ifndef INFOFLOW_TESTS_ENGINE_TEST_UTIL_H_
#define INFOFLOW_TESTS_ENGINE_TEST_UTIL_H_

#include <ATen/ATen.h>

#include <memory>
#include <string>

#include "engine/model/model.h"

namespace infoflow::testing {

inline std::string Stories260KDir() { return INFOFLOW_STORIES260K_DIR; }

inline double MaxAbsDiff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// Loads a model or fails the calling test (use with ASSERT_NO_FATAL_FAILURE).
std::unique_ptr<Model> LoadOrDie(const std::string& dir);

// Directory of a generated test model (written once per process under the
// test data dir). kind: "llama", "qwen2", "qwen3", "llama3-scaled".
std::string GeneratedModelDir(const std::string& kind);

}  // namespace infoflow::testing

#endif  // INFOFLOW_TESTS_ENGINE_TEST_UTIL_H_
