// Next-token choice from logits: greedy, or temperature + top-p with a seed.
#ifndef INFOFLOW_ENGINE_DECODE_SAMPLER_H_
#define INFOFLOW_ENGINE_DECODE_SAMPLER_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <random>

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
  // `logits`: [vocab] or [1, vocab], any device/dtype.
  int32_t Sample(const at::Tensor& logits);

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DECODE_SAMPLER_H_
