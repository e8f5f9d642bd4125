#include "engine/model/decode_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "engine/model/float_vectors.h"
#include "engine/model/helper_threads.h"

namespace infoflow {
namespace {

// Eight floats (simd::F8): one AVX register in the x86-64-v3 clone below,
// two SSE registers in the baseline one.
using simd::ExpNonPositive;
using simd::F8;
using simd::Load;
using simd::Store;
// Pairwise, in this order: the kernel's results are pinned bit for bit
// across thread counts.
inline float Sum8(F8 x) {
  return ((x[0] + x[4]) + (x[1] + x[5])) + ((x[2] + x[6]) + (x[3] + x[7]));
}

// The build targets baseline x86-64 (SSE2); the kernel is also compiled for
// x86-64-v3 (AVX2 + FMA) and picked at load time where the CPU has it.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define INFOFLOW_AVX2_CLONE __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define INFOFLOW_AVX2_CLONE
#endif

// Rows idx[t, t + 4) of a K or V block, requested ahead of their use: the
// loops below stall on these loads otherwise (at batch 16 the K/V of all
// requests are tens of MB, past the caches).
constexpr int64_t kAhead = 16;
inline void Prefetch(const float* base, int64_t row, int64_t hd, const int64_t* idx, int64_t m,
                     int64_t t) {
  for (int64_t i = t; i < std::min(t + 4, m); ++i) {
    const float* r = base + idx[i] * row;
    for (int64_t d = 0; d < hd; d += 16) __builtin_prefetch(r + d);
  }
}

// Below this many (key, query head) pairs in a call DecodeAttentionCpu runs
// on the calling thread alone.
constexpr int64_t kMinKeysPerThread = int64_t{1} << 14;

// One kv head and the `group` query heads that share it, for one query row.
// q: group rows of hd floats, `q_head` apart; K/V rows `k_row` / `v_row`
// apart; idx[0, m): the visible key rows; out: group rows `out_head` apart.
// Scratch: qs [group * hd], s [group * m].
INFOFLOW_AVX2_CLONE
void AttendKvHead(const float* q, int64_t q_head, int64_t group, int64_t hd, float scale,
                  const float* k, int64_t k_row, const float* v, int64_t v_row,
                  const int64_t* idx, int64_t m, float* qs, float* s, float* out,
                  int64_t out_head) {
  if (m == 0) {  // nothing visible: softmax over an empty set, NaN like Model::Attention
    for (int64_t h = 0; h < group; ++h) {
      std::fill_n(out + h * out_head, hd, std::numeric_limits<float>::quiet_NaN());
    }
    return;
  }
  // q * scale first, as Model::Attention does.
  for (int64_t h = 0; h < group; ++h) {
    for (int64_t d = 0; d < hd; ++d) qs[h * hd + d] = q[h * q_head + d] * scale;
  }
  // Scores s[h][t] = qs_h . k_idx[t], four keys at a time (four sums in flight).
  int64_t t = 0;
  for (; t + 4 <= m; t += 4) {
    const float* k0 = k + idx[t] * k_row;
    const float* k1 = k + idx[t + 1] * k_row;
    const float* k2 = k + idx[t + 2] * k_row;
    const float* k3 = k + idx[t + 3] * k_row;
    Prefetch(k, k_row, hd, idx, m, t + kAhead);
    for (int64_t h = 0; h < group; ++h) {
      const float* qh = qs + h * hd;
      F8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t d = 0; d < hd; d += 8) {
        const F8 x = Load<F8>(qh + d);
        a0 += x * Load<F8>(k0 + d);
        a1 += x * Load<F8>(k1 + d);
        a2 += x * Load<F8>(k2 + d);
        a3 += x * Load<F8>(k3 + d);
      }
      float* sh = s + h * m + t;
      sh[0] = Sum8(a0), sh[1] = Sum8(a1), sh[2] = Sum8(a2), sh[3] = Sum8(a3);
    }
  }
  for (; t < m; ++t) {
    const float* k0 = k + idx[t] * k_row;
    for (int64_t h = 0; h < group; ++h) {
      F8 a0 = {};
      for (int64_t d = 0; d < hd; d += 8) a0 += Load<F8>(qs + h * hd + d) * Load<F8>(k0 + d);
      s[h * m + t] = Sum8(a0);
    }
  }
  // Softmax of each query head's scores: max subtracted, exp, normalized.
  for (int64_t h = 0; h < group; ++h) {
    float* sh = s + h * m;
    float max = sh[0];
    for (int64_t j = 1; j < m; ++j) max = std::max(max, sh[j]);
    F8 sums = {};
    int64_t i = 0;
    for (; i + 8 <= m; i += 8) {
      const F8 e = ExpNonPositive<F8>(Load<F8>(sh + i) - max);
      Store<F8>(sh + i, e);
      sums += e;
    }
    float sum = Sum8(sums);
    for (; i < m; ++i) sum += (sh[i] = std::exp(sh[i] - max));
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < m; ++j) sh[j] *= inv;
  }
  // out_h = sum_t p[h][t] * v_idx[t], four value rows per pass over out.
  for (int64_t h = 0; h < group; ++h) std::memset(out + h * out_head, 0, hd * sizeof(float));
  for (t = 0; t + 4 <= m; t += 4) {
    const float* v0 = v + idx[t] * v_row;
    const float* v1 = v + idx[t + 1] * v_row;
    const float* v2 = v + idx[t + 2] * v_row;
    const float* v3 = v + idx[t + 3] * v_row;
    Prefetch(v, v_row, hd, idx, m, t + kAhead);
    for (int64_t d = 0; d < hd; d += 8) {
      const F8 x0 = Load<F8>(v0 + d), x1 = Load<F8>(v1 + d);
      const F8 x2 = Load<F8>(v2 + d), x3 = Load<F8>(v3 + d);
      for (int64_t h = 0; h < group; ++h) {
        const float* p = s + h * m + t;
        float* o = out + h * out_head + d;
        Store<F8>(o, Load<F8>(o) + (p[0] * x0 + p[1] * x1) + (p[2] * x2 + p[3] * x3));
      }
    }
  }
  for (; t < m; ++t) {
    const float* v0 = v + idx[t] * v_row;
    for (int64_t d = 0; d < hd; d += 8) {
      const F8 x0 = Load<F8>(v0 + d);
      for (int64_t h = 0; h < group; ++h) {
        float* o = out + h * out_head + d;
        Store<F8>(o, Load<F8>(o) + s[h * m + t] * x0);
      }
    }
  }
}

bool IsCpuF32(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 3 &&
         t.stride(2) == 1;
}

bool IsCpuLong(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1;
}

}  // namespace

bool DecodeAttentionCpuSupports(const at::Tensor& q, const at::Tensor& q_pos,
                                const std::vector<at::Tensor>& keys,
                                const std::vector<at::Tensor>& values,
                                const std::vector<at::Tensor>& k_pos) {
  if (!q.defined() || !q.device().is_cpu() || q.scalar_type() != at::kFloat || q.dim() != 3) {
    return false;
  }
  const int64_t n_heads = q.size(0), batch = q.size(1), hd = q.size(2);
  if (hd % 8 != 0 || !IsCpuLong(q_pos) || q_pos.size(0) != batch) return false;
  const size_t b_count = static_cast<size_t>(batch);
  if (keys.size() != b_count || values.size() != b_count || k_pos.size() != b_count) return false;
  for (size_t b = 0; b < b_count; ++b) {
    const at::Tensor &k = keys[b], &v = values[b];
    if (!IsCpuF32(k) || !IsCpuF32(v) || !IsCpuLong(k_pos[b])) return false;
    if (k.size(0) == 0 || n_heads % k.size(0) != 0 || k.size(2) != hd) return false;
    if (k.size(0) != keys[0].size(0)) return false;  // one model: one kv head count
    if (v.sizes() != k.sizes() || k_pos[b].size(0) != k.size(1)) return false;
  }
  return true;
}

at::Tensor DecodeAttentionCpu(const at::Tensor& q_in, const at::Tensor& q_pos_in,
                              const std::vector<at::Tensor>& keys,
                              const std::vector<at::Tensor>& values,
                              const std::vector<at::Tensor>& k_pos, int threads) {
  const at::Tensor q = q_in.stride(2) == 1 ? q_in : q_in.contiguous();
  const at::Tensor q_pos = q_pos_in.contiguous();
  const int64_t n_heads = q.size(0), batch = q.size(1), hd = q.size(2);
  at::Tensor out = at::empty({n_heads, batch, hd}, q.options());
  if (batch == 0) return out;
  const int64_t n_kv = keys[0].size(0), group = n_heads / n_kv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t* q_at = q_pos.data_ptr<int64_t>();
  std::vector<at::Tensor> kp(batch);
  for (int64_t b = 0; b < batch; ++b) kp[b] = k_pos[b].contiguous();
  // Work item i is (request i / n_kv, kv head i % n_kv); items [i0, i1).
  auto attend = [&](int64_t i0, int64_t i1) {
    // Scratch reused across calls: visible key rows, scaled q, scores.
    thread_local std::vector<int64_t> idx;
    thread_local std::vector<float> qs, s;
    qs.resize(group * hd);
    for (int64_t i = i0, b = -1; i < i1; ++i) {
      const at::Tensor &k = keys[i / n_kv], &v = values[i / n_kv];
      if (b != i / n_kv) {  // a new request: the keys visible to its query, for every head
        b = i / n_kv;
        const int64_t* pos = kp[b].data_ptr<int64_t>();
        idx.clear();
        for (int64_t j = 0; j < k.size(1); ++j) {
          if (pos[j] <= q_at[b]) idx.push_back(j);
        }
        s.resize(std::max<int64_t>(1, group * static_cast<int64_t>(idx.size())));
      }
      const int64_t g = i % n_kv;
      AttendKvHead(qp + g * group * q.stride(0) + b * q.stride(1), q.stride(0), group, hd, scale,
                   k.data_ptr<float>() + g * k.stride(0), k.stride(1),
                   v.data_ptr<float>() + g * v.stride(0), v.stride(1), idx.data(),
                   static_cast<int64_t>(idx.size()), qs.data(), s.data(),
                   op + g * group * out.stride(0) + b * hd, out.stride(0));
    }
  };
  // Split the items into `threads` runs of about equal keys. A part on a
  // helper (engine/model/helper_threads.h) costs microseconds, tens when the
  // helper has gone to sleep: only for enough work (16 requests x 200
  // keys x 8 heads is ~0.5 ms a layer on one core).
  const int64_t items = batch * n_kv;
  std::vector<int64_t> cum(items + 1, 0);
  for (int64_t i = 0; i < items; ++i) cum[i + 1] = cum[i] + keys[i / n_kv].size(1) + 16;
  const int64_t parts =
      cum[items] * group < kMinKeysPerThread ? 1 : std::min<int64_t>(std::max(threads, 1), items);
  std::vector<int64_t> bounds = {0};
  for (int64_t p = 1; p <= parts; ++p) {
    const int64_t end = p == parts ? items
                                   : std::lower_bound(cum.begin(), cum.end(),
                                                      cum[items] * p / parts) - cum.begin();
    bounds.push_back(std::max(bounds.back(), end));
  }
  RunParts(static_cast<int>(parts), [&](int p) {
    if (bounds[p + 1] > bounds[p]) attend(bounds[p], bounds[p + 1]);
  });
  return out;
}

}  // namespace infoflow
