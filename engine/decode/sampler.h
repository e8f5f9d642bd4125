// Next-token choice from logits: greedy, or temperature + top-p with a seed.
#ifndef INFOFLOW_ENGINE_DECODE_SAMPLER_H_
#define INFOFLOW_ENGINE_DECODE_SAMPLER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>
#include <vector>

namespace infoflow {

struct SamplingParams {
  float temperature = 0.0f;  // 0 = greedy (argmax, ties to the lowest id)
  float top_p = 1.0f;        // nucleus mass kept when sampling, in (0, 1]
  uint64_t seed = 0;         // same seed + same logits = same tokens
};

// Not thread-safe: one Sampler per generation.
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `logits`: [vocab] or [1, vocab], any device/dtype. Greedy is argmax. At
  // temperature T, token i has weight exp((logit_i - max) / T); top_p < 1
  // keeps the most likely tokens until their weight reaches top_p of the
  // total (stable sort, ties to the lower id) and draws among them. top_p = 1
  // draws over all tokens in id order without sorting: the same distribution
  // at a fraction of the cost, which a decode step pays once per request.
  // Every logit -inf (a mask over the whole vocabulary): 0 in every mode.
  int32_t Sample(const at::Tensor& logits);

 private:
  // One uniform draw over `p` (unnormalised weights summing to `total`).
  int32_t DrawInIdOrder(const std::vector<double>& p, double total);

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<double> weights_;  // scratch, kept to skip a per-token allocation
  std::vector<int32_t> order_;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DECODE_SAMPLER_H_
