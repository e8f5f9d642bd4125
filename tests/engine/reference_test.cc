// The engine against independent implementations: tests/reference/llama_ref.py
// (LLaMA/Qwen) and tests/reference/glm_ref.py (GLM/GLM-4), Python + numpy,
// float64, written from the Hugging Face model definitions without reading
// engine/. Needs /usr/bin/python3 with numpy (python3-numpy).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/str_join.h"
#include "engine/decode/decode.h"
#include "engine/chunk/chunk_prefill.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

constexpr char kPython[] = "/usr/bin/python3";

bool HaveNumpy() {
  static const bool ok = std::system("/usr/bin/python3 -c 'import numpy' >/dev/null 2>&1") == 0;
  return ok;
}

std::string RunCapture(const std::string& cmd) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) out.append(buf, n);
  pclose(p);
  return out;
}

std::vector<int32_t> Ids(int n, uint32_t seed, int vocab) {
  std::vector<int32_t> ids;
  uint32_t x = 88172645u + seed;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    ids.push_back(static_cast<int32_t>(x % vocab));
  }
  return ids;
}

class ReferenceLogits : public ::testing::TestWithParam<std::string> {};

// Full-sequence logits equal the reference's to 1e-4 for every architecture
// variant the engine supports.
TEST_P(ReferenceLogits, MatchIndependentImplementation) {
  if (!HaveNumpy()) GTEST_SKIP() << "python3-numpy not installed";
  const std::string kind = GetParam();
  const std::string dir =
      kind == "stories260K" ? testing::Stories260KDir() : testing::GeneratedModelDir(kind);
  auto model = testing::LoadOrDie(dir);
  ASSERT_NE(model, nullptr);
  const auto ids = Ids(48, 11, static_cast<int>(model->config().vocab_size));
  const bool glm = model->config().rope_interleaved;  // glm, glm4
  const std::string script = glm ? "glm_ref.py" : "llama_ref.py";
  const std::string out =
      RunCapture(std::string(kPython) + " " INFOFLOW_SOURCE_DIR "/tests/reference/" + script +
                 " logits --model " + dir + " --ids " + absl::StrJoin(ids, ",") + " --json");
  nlohmann::json j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_TRUE(j.is_object() && j.contains("logits")) << out.substr(0, 500);
  std::vector<double> flat;
  for (const auto& row : j["logits"]) for (double v : row) flat.push_back(v);
  at::Tensor ref = at::tensor(flat, at::kDouble).view({48, -1});

  KvCache cache(model->n_layers());
  ForwardOptions all;
  all.logits = ForwardOptions::Logits::kAll;
  at::Tensor got = PrefillTokens(*model, ids, 0, &cache, all).logits;
  // bf16-stored weights are exact in both; compute is f32 here vs f64 there.
  EXPECT_LE(testing::MaxAbsDiff(got, ref), 1e-4) << kind;
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceLogits,
                         ::testing::Values("stories260K", "llama", "qwen2", "qwen3",
                                           "llama3-scaled", "bf16", "glm", "glm4",
                                           "glm4-sharded", "glm-full-rotary", "glm4-bf16"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (char& c : n) c = isalnum(c) ? c : '_';
                           return n;
                         });

// Greedy decoding of the real pretrained checkpoint from [BOS] reproduces the
// reference's 400 ids (tests/reference/stories260K_greedy_bos_400.txt) at
// every length: the sequence is a prefix-stable function of the model.
TEST(Stories260K, GreedyFromBosMatchesReferenceFor400Tokens) {
  std::ifstream in(INFOFLOW_SOURCE_DIR "/tests/reference/stories260K_greedy_bos_400.txt");
  ASSERT_TRUE(in) << "missing reference ids";
  std::vector<int32_t> expected;
  for (int32_t id; in >> id;) expected.push_back(id);
  ASSERT_EQ(expected.size(), 400u);

  auto model = testing::LoadOrDie(testing::Stories260KDir());
  ASSERT_NE(model, nullptr);
  KvCache cache(model->n_layers());
  at::Tensor logits = PrefillTokens(*model, {1}, 0, &cache).logits;
  DecodeOptions options;
  options.max_new_tokens = 400;
  DecodeResult r = Decode(*model, &cache, 1, logits, options, nullptr, nullptr);
  ASSERT_EQ(r.ids.size(), expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    ASSERT_EQ(r.ids[i], expected[i]) << "first difference at generated token " << i;
  }
}

}  // namespace
}  // namespace infoflow
