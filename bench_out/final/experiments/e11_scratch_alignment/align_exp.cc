// EXPERIMENT (not committed): blocked attention at 16K with scratch offsets.
#include <ATen/ATen.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>
#include "engine/model/blocked_attention.h"
#include "engine/model/runtime.h"
int main(int argc, char** argv) {
  infoflow::InitTorchRuntime(2);
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int rounds = argc > 2 ? std::atoi(argv[2]) : 4;
  at::manual_seed(1);
  at::Tensor q = at::randn({8, n, 64}), k = at::randn({4, n, 64}), v = at::randn({4, n, 64});
  at::Tensor pos = at::arange(n, at::kLong);
  std::vector<int> offs;
  for (int i = 3; i < argc; ++i) offs.push_back(std::atoi(argv[i]));
  const int K = offs.size();
  std::vector<double> tot(K, 0);
  for (int r = 0; r < rounds; ++r) {
    for (int i = 0; i < K; ++i) {
      setenv("IFKV_SCRATCH_OFF", std::to_string(offs[(i + r) % K]).c_str(), 1);
      auto t0 = std::chrono::steady_clock::now();
      at::Tensor out = infoflow::BlockedAttentionCpu(q, k, v, pos, pos, 2);
      double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      if (r > 0) tot[(i + r) % K] += ms;
      
    }
  }
  for (int i = 0; i < K; ++i) std::printf("offset %2d bytes: mean %.1f ms\n", offs[i] * 4, tot[i] / (rounds - 1));
}
