#include "tests/engine/test_util.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <mutex>

#include "engine/model/test_model.h"

namespace infoflow::testing {

std::unique_ptr<Model> LoadOrDie(const std::string& dir) {
  LoadOptions options;
  options.device = "cpu";
  absl::StatusOr<std::unique_ptr<Model>> m = Model::Load(dir, options);
  if (!m.ok()) {
    ADD_FAILURE() << "loading " << dir << ": " << m.status();
    return nullptr;
  }
  return *std::move(m);
}

std::string GeneratedModelDir(const std::string& kind) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  const std::string dir = std::string(INFOFLOW_TEST_DATA_DIR) + "/models/" + kind;
  if (std::filesystem::exists(dir + "/config.json")) return dir;
  // glm* kinds: GLM's special tokens (no BOS) unless the kind says "-bos".
  const bool glm = kind.rfind("glm", 0) == 0;
  TestModelSpec spec = DefaultTestModelSpec(glm ? kind.substr(0, kind.find('-')) : "llama");
  spec.seed = 7;
  if (kind == "glm4-sharded") spec.shards = 3;
  // GLM-4's architecture with <sop> as a BOS: runs the BOS-prefixed suites.
  if (kind == "glm4-bos") spec.bos_token = "<sop>";
  if (kind == "glm-full-rotary") spec.partial_rotary_factor = 1.0;
  if (kind == "glm4-bf16") spec.dtype = "bf16";
  if (kind == "qwen2") spec.model_type = "qwen2";
  if (kind == "qwen3") spec.model_type = "qwen3";
  if (kind == "llama3-scaled") spec.llama3_rope_scaling = true;
  if (kind == "bf16") spec.dtype = "bf16";
  absl::Status s = WriteTestModel(dir, spec);
  if (!s.ok()) ADD_FAILURE() << "writing test model " << kind << ": " << s;
  return dir;
}

}  // namespace infoflow::testing
