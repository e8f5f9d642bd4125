// Sampler's contract (engine/decode/sampler.h): greedy argmax with ties to
// the lower id, same seed + same logits = same tokens, the draw follows the
// softmax at the temperature, and top_p < 1 never draws outside the nucleus.
#include "engine/decode/sampler.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace infoflow {
namespace {

std::vector<int32_t> Draws(const SamplingParams& params, const at::Tensor& logits, int n) {
  Sampler s(params);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) out.push_back(s.Sample(logits));
  return out;
}

TEST(Sampler, GreedyIsArgmaxWithTiesToTheLowerId) {
  at::Tensor logits = at::tensor({0.5f, 2.0f, -1.0f, 2.0f, 1.0f});
  Sampler s({0.0f, 1.0f, 7});
  EXPECT_EQ(s.Sample(logits), 1);
  EXPECT_EQ(s.Sample(logits.unsqueeze(0)), 1);  // [1, vocab] as well
}

// A mask over the whole vocabulary (stop ids listing every id, before
// min_new_tokens) leaves every logit -inf: each mode answers id 0, as greedy
// does, rather than drawing from NaN weights.
TEST(Sampler, AllMaskedLogitsGiveIdZero) {
  const at::Tensor logits = at::full({8}, -std::numeric_limits<float>::infinity());
  for (float t : {0.0f, 1.0f}) {
    for (float top_p : {1.0f, 0.5f}) {
      Sampler s({t, top_p, 5});
      EXPECT_EQ(s.Sample(logits), 0) << "T " << t << " top_p " << top_p;
    }
  }
}

TEST(Sampler, SameSeedSameTokensOtherSeedOtherTokens) {
  at::Tensor logits = at::randn({300}, at::TensorOptions().dtype(at::kFloat));
  for (float top_p : {1.0f, 0.9f}) {
    const std::vector<int32_t> a = Draws({1.0f, top_p, 11}, logits, 64);
    EXPECT_EQ(a, Draws({1.0f, top_p, 11}, logits, 64)) << "top_p " << top_p;
    EXPECT_NE(a, Draws({1.0f, top_p, 12}, logits, 64)) << "top_p " << top_p;
  }
}

// Observed frequencies over 20000 draws against the softmax at T, on a
// 6-token vocabulary, both for the unsorted top_p = 1 draw and the sorted
// nucleus path with top_p just under 1 (which keeps every token here). A
// wrong temperature, a draw that skips a token or one biased towards either
// end fails by many standard errors; the seed makes the run fixed.
TEST(Sampler, DrawFollowsTheSoftmaxAtTheTemperature) {
  const std::vector<float> raw = {1.0f, -0.5f, 2.0f, 0.0f, 1.5f, -2.0f};
  at::Tensor logits = at::tensor(raw);
  const int n = 20000;
  for (float temperature : {1.0f, 0.5f}) {
    std::vector<double> expected(raw.size());
    double z = 0;
    for (size_t i = 0; i < raw.size(); ++i) z += expected[i] = std::exp(raw[i] / temperature);
    for (double& e : expected) e /= z;
    for (float top_p : {1.0f, 0.99999f}) {
      std::vector<int> count(raw.size(), 0);
      for (int32_t id : Draws({temperature, top_p, 5}, logits, n)) ++count.at(id);
      for (size_t i = 0; i < raw.size(); ++i) {
        const double f = static_cast<double>(count[i]) / n;
        const double se = std::sqrt(expected[i] * (1 - expected[i]) / n);
        EXPECT_NEAR(f, expected[i], 5 * se + 1e-4)
            << "token " << i << " T " << temperature << " top_p " << top_p;
      }
    }
  }
}

TEST(Sampler, NucleusNeverDrawsOutsideTopP) {
  // Weights 0.5, 0.3, 0.15, 0.05: top_p 0.7 keeps {0, 1} (0.5 < 0.7 <= 0.8).
  at::Tensor logits = at::log(at::tensor({0.3f, 0.05f, 0.5f, 0.15f}));
  std::vector<int> count(4, 0);
  for (int32_t id : Draws({1.0f, 0.7f, 3}, logits, 5000)) ++count.at(id);
  EXPECT_EQ(count[1], 0);
  EXPECT_EQ(count[3], 0);
  EXPECT_GT(count[0], 1500);  // 0.3 / 0.8 of the draws, about 1875
  EXPECT_GT(count[2], 2500);  // 0.5 / 0.8, about 3125
}

TEST(Sampler, TokensWithZeroWeightAreNeverDrawn) {
  // -inf (a masked stop id) and logits so low their weight underflows to 0.
  const float inf = std::numeric_limits<float>::infinity();
  at::Tensor logits = at::tensor({-inf, 0.0f, -1e30f, 0.0f, -inf});
  for (float top_p : {1.0f, 0.5f}) {
    for (int32_t id : Draws({1.0f, top_p, 9}, logits, 2000)) {
      EXPECT_TRUE(id == 1 || id == 3) << id << " top_p " << top_p;
    }
  }
}

}  // namespace
}  // namespace infoflow
