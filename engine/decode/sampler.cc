#include "engine/decode/sampler.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

namespace infoflow {

Sampler::Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}

int32_t Sampler::Sample(const at::Tensor& logits_in) {
  at::Tensor logits = logits_in.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
  const float* x = logits.data_ptr<float>();
  const int64_t n = logits.size(0);
  if (params_.temperature <= 0.0f) {
    int64_t best = 0;
    for (int64_t i = 1; i < n; ++i) {
      if (x[i] > x[best]) best = i;
    }
    return static_cast<int32_t>(best);
  }
  // Softmax at temperature (unnormalised: the draw scales by the total).
  const float max = *std::max_element(x, x + n);
  // Every logit -inf (a mask that covers the vocabulary): no distribution to
  // draw from; the greedy answer, id 0, instead of NaN weights.
  if (!(max > -std::numeric_limits<float>::infinity())) return 0;
  std::vector<double>& p = weights_;
  p.resize(n);
  double total = 0;
  for (int64_t i = 0; i < n; ++i) total += p[i] = std::exp((x[i] - max) / params_.temperature);
  if (params_.top_p >= 1.0f) return DrawInIdOrder(p, total);
  // Nucleus: keep the smallest set of most likely tokens whose mass reaches
  // top_p, then draw among them, most likely first.
  std::vector<int32_t>& order = order_;
  order.resize(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return p[a] > p[b]; });
  const double keep = std::clamp<double>(params_.top_p, 1e-6, 1.0) * total;
  double mass = 0;
  size_t kept = 0;
  while (kept < order.size() && (kept == 0 || mass < keep)) mass += p[order[kept++]];
  double u = std::uniform_real_distribution<double>(0.0, mass)(rng_);
  for (size_t i = 0; i < kept; ++i) {
    u -= p[order[i]];
    if (u <= 0) return order[i];
  }
  return order[kept - 1];
}

int32_t Sampler::DrawInIdOrder(const std::vector<double>& p, double total) {
  // Token i owns [sum of p below i, that + p[i]) of [0, total): a token whose
  // weight underflowed to 0 owns nothing and is never drawn.
  double u = std::uniform_real_distribution<double>(0.0, total)(rng_);
  int32_t last_nonzero = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (p[i] <= 0) continue;
    if (u < p[i]) return static_cast<int32_t>(i);
    u -= p[i];
    last_nonzero = static_cast<int32_t>(i);
  }
  return last_nonzero;  // u was left over only by rounding
}

}  // namespace infoflow
