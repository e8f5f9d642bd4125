#include "engine/blend/selection.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

namespace infoflow {

int64_t BudgetFor(double ratio, int64_t n_context) {
  if (!(ratio > 0)) return 0;
  // The epsilon keeps floor(r*N) stable for ratios like 0.15 whose binary
  // value sits just below the decimal one.
  const int64_t k = static_cast<int64_t>(std::floor(ratio * n_context + 1e-9));
  return std::clamp<int64_t>(k, 0, n_context);
}

std::vector<int64_t> SelectTopK(const at::Tensor& scores_in, int64_t k,
                                const std::vector<bool>& eligible) {
  at::Tensor scores = scores_in.to(at::kCPU, at::kDouble).contiguous();
  const double* s = scores.data_ptr<double>();
  const int64_t n = scores.size(0);
  std::vector<int64_t> idx;
  for (int64_t i = 0; i < n; ++i) {
    if (eligible.empty() || eligible[i]) idx.push_back(i);
  }
  k = std::min<int64_t>(k, static_cast<int64_t>(idx.size()));
  std::stable_sort(idx.begin(), idx.end(), [s](int64_t a, int64_t b) { return s[a] > s[b]; });
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<bool> ExcludeFirstChunk(int64_t n_context, int64_t first_chunk_len) {
  std::vector<bool> eligible(n_context, true);
  for (int64_t i = 0; i < std::min(first_chunk_len, n_context); ++i) eligible[i] = false;
  return eligible;
}

std::vector<int> ReorderChunks(const std::vector<int64_t>& selected,
                               const std::vector<int64_t>& chunk_lengths,
                               const std::vector<int>& order) {
  std::vector<double> ratio(order.size(), 0.0);
  std::vector<int64_t> start(order.size() + 1, 0);
  for (size_t i = 0; i < order.size(); ++i) start[i + 1] = start[i] + chunk_lengths[order[i]];
  for (int64_t t : selected) {
    const size_t i = std::upper_bound(start.begin(), start.end(), t) - start.begin() - 1;
    ratio[i] += 1.0;
  }
  std::vector<size_t> pos(order.size());
  std::iota(pos.begin(), pos.end(), 0);
  for (size_t i = 0; i < order.size(); ++i) ratio[i] /= std::max<int64_t>(1, chunk_lengths[order[i]]);
  std::stable_sort(pos.begin(), pos.end(), [&](size_t a, size_t b) { return ratio[a] < ratio[b]; });
  std::vector<int> out;
  for (size_t p : pos) out.push_back(order[p]);
  return out;
}

std::vector<int64_t> EpicSelect(const std::vector<int64_t>& chunk_lengths, int lego_k,
                                const std::vector<bool>& eligible) {
  std::vector<int64_t> out;
  int64_t start = 0;
  for (int64_t len : chunk_lengths) {
    for (int64_t i = start; i < start + std::min<int64_t>(lego_k, len); ++i) {
      if (eligible.empty() || eligible[i]) out.push_back(i);
    }
    start += len;
  }
  return out;
}

std::vector<int64_t> RandomSelect(int64_t n_context, int64_t k, uint64_t seed,
                                  const std::vector<bool>& eligible) {
  std::vector<int64_t> pool;
  for (int64_t i = 0; i < n_context; ++i) {
    if (eligible.empty() || eligible[i]) pool.push_back(i);
  }
  std::mt19937_64 rng(seed);
  k = std::min<int64_t>(k, static_cast<int64_t>(pool.size()));
  // Partial Fisher-Yates: the first k entries are a uniform sample.
  for (int64_t i = 0; i < k; ++i) {
    std::uniform_int_distribution<int64_t> pick(i, static_cast<int64_t>(pool.size()) - 1);
    std::swap(pool[i], pool[pick(rng)]);
  }
  pool.resize(k);
  std::sort(pool.begin(), pool.end());
  return pool;
}

}  // namespace infoflow
