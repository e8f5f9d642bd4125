#include "engine/model/blocked_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <new>
#include <numeric>
#include <vector>

#include "engine/model/float_vectors.h"
#include "engine/model/helper_threads.h"
#include "engine/model/yield_point.h"

namespace infoflow {
namespace {

using namespace simd;  // NOLINT: the kernel is written in these vector helpers

// Tile sizes. A tile is kTileRows rows of (query, head-in-group) pairs of
// one kv head; it meets the keys kBlockKeys at a time. The score block
// (24 x 256 floats, 24 KB) and the query tile (6 KB at hd 64) stay in L1
// beside the key panels. Chosen by timing 12/24/36/48/96 rows x 128/256/512
// keys on one core at 1K-8K tokens on a loaded VM (24 x 256 best or within
// noise; 48 x 256, whose scores fill the 48 KB L1, took 125 vs 100-104 ms
// at 4K).
constexpr int64_t kTileRows = 24;
constexpr int64_t kBlockKeys = 256;

// Below this many (row, key) pairs of work a call runs on the calling thread
// alone. A started thread could wait milliseconds for a core while
// OpenBLAS's threads still spun after each matmul (measured then: a
// 64-token call took 0.12 ms on one thread, 3.7 ms with a helper; 2M pairs
// is ~4 ms of one core's work). Not measured again since OpenBLAS's short
// wait and the kept helpers (engine/model/helper_threads.h).
constexpr int64_t kMinPairsForThreads = int64_t{2} << 20;

// Per-ISA register blocking: the QK^T micro-kernel computes kQkRows rows x
// two vectors of keys (keys are packed as panels of kLanes keys, K^T per
// panel); the PV micro-kernel kPvRows rows x up to 4 vectors of head dims.
// AVX-512: 12x2 and 6x4 accumulators of 32 registers; AVX2: 6x2 and 3x4 of 16.
template <typename V>
struct Blocking;
template <>
struct Blocking<F16> {
  static constexpr int kQkRows = 12, kPvRows = 6;
};
template <>
struct Blocking<F8> {
  static constexpr int kQkRows = 6, kPvRows = 3;
};
static_assert(kTileRows % 12 == 0, "tile rows: whole QK^T and PV row groups of every ISA");

// s[r][0, 2L) = q_r . keys of panels p0, p1 for r < MR. q rows hd apart;
// a panel is hd x L floats (dim-major); s rows kBlockKeys apart. With
// kTrackMax, rmax[r] (a vector per row) also takes the elementwise max of the
// new scores, so the softmax needs no separate pass for the row max.
template <typename V, int MR, bool kTrackMax>
INFOFLOW_INLINE void QkMicro(const float* q, int64_t hd, const float* p0, const float* p1, float* s,
                             float* rmax) {
  constexpr int L = kLanes<V>;
  V acc0[MR], acc1[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) acc0[r] = V{}, acc1[r] = V{};
  for (int64_t d = 0; d < hd; ++d) {
    const V b0 = Load<V>(p0 + d * L), b1 = Load<V>(p1 + d * L);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V a = Splat<V>(q[r * hd + d]);
      acc0[r] += a * b0;
      acc1[r] += a * b1;
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
    Store(s + r * kBlockKeys, acc0[r]);
    Store(s + r * kBlockKeys + L, acc1[r]);
    if (kTrackMax) {
      const V mx = acc0[r] > acc1[r] ? acc0[r] : acc1[r];
      const V old = Load<V>(rmax + r * L);
      Store(rmax + r * L, old > mx ? old : mx);
    }
  }
}

// o[r][0, NV*L) += sum_{j < n} p[r][j] * v[j][0, NV*L) for r < MR. p rows
// kBlockKeys apart, v rows and o rows hd apart.
template <typename V, int MR, int NV>
INFOFLOW_INLINE void PvMicro(const float* p, const float* v, int64_t hd, int64_t n, float* o) {
  constexpr int L = kLanes<V>;
  V acc[MR][NV];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) acc[r][c] = Load<V>(o + r * hd + c * L);
  }
  for (int64_t j = 0; j < n; ++j) {
    V x[NV];
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) x[c] = Load<V>(v + j * hd + c * L);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const V a = Splat<V>(p[r * kBlockKeys + j]);
#pragma GCC unroll 4
      for (int c = 0; c < NV; ++c) acc[r][c] += a * x[c];
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) {
#pragma GCC unroll 4
    for (int c = 0; c < NV; ++c) Store(o + r * hd + c * L, acc[r][c]);
  }
}

// The inputs, packed (see BlockedAttentionCpu): per kv head g, qs rows
// [rows_pad][hd] (query-major, head-in-group minor, scaled, zero padding),
// K panels [n_pad / L][hd][L] and V rows [n_pad][hd] in key-position order
// (zero padding), and for each row the number of sorted keys it sees.
struct Packed {
  const float* qs;
  const float* kp;
  const float* vs;
  const int64_t* visible;  // [rows_pad]
  float* out;              // [n_kv][rows_pad][hd]
  int64_t hd, rows_pad, n_pad;
  // Optional [n_kv][rows_pad]: each row's log-sum-exp of its scaled visible
  // scores; with it, a row that sees no key gets output 0 and lse -inf (a
  // partial result to merge) instead of NaN.
  float* lse = nullptr;
};

// One tile: rows [r0, r0 + kTileRows) of kv head g. Scratch: s
// [kTileRows * kBlockKeys], o [kTileRows * hd], m and l [kTileRows], rmax
// [kTileRows * L] (a vector per row).
template <typename V>
INFOFLOW_INLINE void AttendTile(const Packed& in, int64_t g, int64_t r0, float* s, float* o,
                                float* m, float* l, float* rmax) {
  constexpr int L = kLanes<V>;
  constexpr int QR = Blocking<V>::kQkRows, PR = Blocking<V>::kPvRows;
  const int64_t hd = in.hd;
  const float* qs = in.qs + (g * in.rows_pad + r0) * hd;
  const float* kp = in.kp + g * in.n_pad * hd;
  const float* vs = in.vs + g * in.n_pad * hd;
  const int64_t* visible = in.visible + r0;
  // Every row sees keys [0, n_first); some see up to n_keys.
  const int64_t n_keys = *std::max_element(visible, visible + kTileRows);
  const int64_t n_first = *std::min_element(visible, visible + kTileRows);
  std::fill_n(o, kTileRows * hd, 0.0f);
  std::fill_n(m, kTileRows, -std::numeric_limits<float>::infinity());
  std::fill_n(l, kTileRows, 0.0f);
  for (int64_t k0 = 0; k0 < n_keys; k0 += kBlockKeys) {
    // Whole panel pairs; keys past n_pad do not exist, padding keys are zero.
    const int64_t nb = std::min<int64_t>(kBlockKeys, (n_keys - k0 + 2 * L - 1) / (2 * L) * 2 * L);
    // S = Qs K^T for the block, panel pair by panel pair (each stays in L1
    // while every row group of the tile uses it). When every row sees the
    // whole block (all blocks but the tile's last one or two in causal
    // prefill) the row maxima come out of the same pass.
    const bool unmasked = k0 + nb <= n_first;
    if (unmasked) std::fill_n(rmax, kTileRows * L, -std::numeric_limits<float>::infinity());
    for (int64_t j = 0; j < nb; j += 2 * L) {
      const float* p0 = kp + (k0 + j) * hd;
      for (int64_t r = 0; r < kTileRows; r += QR) {
        if (unmasked) {
          QkMicro<V, QR, true>(qs + r * hd, hd, p0, p0 + L * hd, s + r * kBlockKeys + j,
                               rmax + r * L);
        } else {
          QkMicro<V, QR, false>(qs + r * hd, hd, p0, p0 + L * hd, s + r * kBlockKeys + j, nullptr);
        }
      }
    }
    // Online softmax: keys [0, lim) of the block are visible to row r.
    for (int64_t r = 0; r < kTileRows; ++r) {
      float* sr = s + r * kBlockKeys;
      const int64_t lim = std::clamp<int64_t>(visible[r] - k0, 0, nb);
      if (lim == 0) {
        std::fill_n(sr, nb, 0.0f);
        continue;
      }
      int64_t j = 0;
      float mx;
      if (unmasked) {
        mx = HorizontalMax(Load<V>(rmax + r * L));
      } else {
        V vmax = Splat<V>(-std::numeric_limits<float>::infinity());
        for (; j + L <= lim; j += L) vmax = vmax > Load<V>(sr + j) ? vmax : Load<V>(sr + j);
        mx = HorizontalMax(vmax);
        for (; j < lim; ++j) mx = std::max(mx, sr[j]);
      }
      const float m_new = std::max(m[r], mx);
      const float corr = std::exp(m[r] - m_new);  // 0 for the first block (m = -inf)
      const V vm = Splat<V>(m_new);
      V vsum = V{};
      for (j = 0; j + L <= lim; j += L) {
        const V e = ExpNonPositive(Load<V>(sr + j) - vm);
        Store(sr + j, e);
        vsum += e;
      }
      float sum = HorizontalSum(vsum);
      for (; j < lim; ++j) sum += (sr[j] = std::exp(sr[j] - m_new));
      std::fill(sr + lim, sr + nb, 0.0f);  // hidden keys: weight exactly 0
      l[r] = l[r] * corr + sum;
      m[r] = m_new;
      if (corr != 1.0f) {
        float* orow = o + r * hd;
        for (int64_t d = 0; d < hd; ++d) orow[d] *= corr;
      }
    }
    // O += P V for the block, four vectors of head dims at a time.
    const float* vb = vs + k0 * hd;
    for (int64_t r = 0; r < kTileRows; r += PR) {
      const float* pr = s + r * kBlockKeys;
      float* orow = o + r * hd;
      int64_t d = 0;
      for (; d + 4 * L <= hd; d += 4 * L) PvMicro<V, PR, 4>(pr, vb + d, hd, nb, orow + d);
      const int64_t rest = (hd - d) / L;
      if (rest == 3) PvMicro<V, PR, 3>(pr, vb + d, hd, nb, orow + d);
      if (rest == 2) PvMicro<V, PR, 2>(pr, vb + d, hd, nb, orow + d);
      if (rest == 1) PvMicro<V, PR, 1>(pr, vb + d, hd, nb, orow + d);
    }
  }
  float* out = in.out + (g * in.rows_pad + r0) * hd;
  float* lse = in.lse != nullptr ? in.lse + g * in.rows_pad + r0 : nullptr;
  for (int64_t r = 0; r < kTileRows; ++r) {
    // A row that sees no key: softmax over nothing, NaN as in Model::Attention
    // (0 with lse -inf for a partial result).
    const float empty = lse != nullptr ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    const float inv = visible[r] > 0 ? 1.0f / l[r] : empty;
    for (int64_t d = 0; d < hd; ++d) out[r * hd + d] = o[r * hd + d] * inv;
    if (lse != nullptr) {
      lse[r] = visible[r] > 0 ? m[r] + std::log(l[r]) : -std::numeric_limits<float>::infinity();
    }
  }
}

// Runs tiles items[i] for i taken from `next` until none is left.
struct Item {
  int64_t g, r0;
};

// One thread's AttendTile scratch in a single page-aligned block, each array
// starting on a 64-byte line. Why: as separate std::vectors the arrays landed
// wherever the thread's malloc arena had room, 16-byte aligned, so the
// 64-byte vector loads and stores of s and o could split cache lines, and
// where they landed changed from call to call in a process with many threads
// (the server) while it stayed put in a small one (the bench). Blocked
// attention at 16K (hd 64, 2 threads) with the scratch 16 bytes past a line
// took 1.4-3.3% longer than with it on the line (bench_out/final/experiments/
// e11_scratch_alignment).
class TileScratch {
 public:
  TileScratch(int64_t hd, int64_t lanes)
      : s_floats_(kTileRows * kBlockKeys),
        o_floats_(RoundUpToLine(kTileRows * hd)),
        rmax_floats_(RoundUpToLine(kTileRows * lanes)) {
    const size_t bytes =
        (s_floats_ + o_floats_ + rmax_floats_ + 2 * RoundUpToLine(kTileRows)) * sizeof(float);
    data_ = static_cast<float*>(std::aligned_alloc(kPage, (bytes + kPage - 1) / kPage * kPage));
    if (data_ == nullptr) throw std::bad_alloc();
  }
  ~TileScratch() { std::free(data_); }
  TileScratch(const TileScratch&) = delete;
  TileScratch& operator=(const TileScratch&) = delete;

  float* s() const { return data_; }
  float* o() const { return s() + s_floats_; }
  float* rmax() const { return o() + o_floats_; }
  float* m() const { return rmax() + rmax_floats_; }
  float* l() const { return m() + RoundUpToLine(kTileRows); }

 private:
  static constexpr size_t kPage = 4096;
  static constexpr int64_t kLineFloats = 64 / sizeof(float);
  static int64_t RoundUpToLine(int64_t floats) {
    return (floats + kLineFloats - 1) / kLineFloats * kLineFloats;
  }
  const int64_t s_floats_, o_floats_, rmax_floats_;
  float* data_ = nullptr;
};

template <typename V>
INFOFLOW_INLINE void RunTiles(const Packed& in, const std::vector<Item>& items,
                              std::atomic<size_t>* next) {
  const TileScratch scratch(in.hd, kLanes<V>);
  for (size_t i; (i = next->fetch_add(1, std::memory_order_relaxed)) < items.size();) {
    AttendTile<V>(in, items[i].g, items[i].r0, scratch.s(), scratch.o(), scratch.m(), scratch.l(),
                  scratch.rmax());
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
__attribute__((target("avx512f,avx512dq,avx512vl,avx512bw,avx2,fma,bmi,bmi2"))) void RunTilesAvx512(
    const Packed& in, const std::vector<Item>& items, std::atomic<size_t>* next) {
  RunTiles<F16>(in, items, next);
}
__attribute__((target("avx2,fma,bmi,bmi2"))) void RunTilesAvx2(const Packed& in,
                                                               const std::vector<Item>& items,
                                                               std::atomic<size_t>* next) {
  RunTiles<F8>(in, items, next);
}
bool HasAvx512() {
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw");
}
bool HasAvx2() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }
#else
void RunTilesAvx512(const Packed& in, const std::vector<Item>& items, std::atomic<size_t>* next) {
  RunTiles<F16>(in, items, next);
}
void RunTilesAvx2(const Packed& in, const std::vector<Item>& items, std::atomic<size_t>* next) {
  RunTiles<F8>(in, items, next);
}
bool HasAvx512() { return false; }
bool HasAvx2() { return false; }
#endif
void RunTilesBaseline(const Packed& in, const std::vector<Item>& items, std::atomic<size_t>* next) {
  RunTiles<F8>(in, items, next);
}

bool IsCpuF32(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 3 &&
         t.stride(2) == 1;
}

bool IsCpuLong(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1;
}

// A stable order of `pos` by value, or an empty vector when it is already
// non-decreasing.
std::vector<int64_t> SortedOrder(const int64_t* pos, int64_t n) {
  if (std::is_sorted(pos, pos + n)) return {};
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [pos](int64_t a, int64_t b) { return pos[a] < pos[b]; });
  return order;
}

}  // namespace

BlockedAttentionIsa BlockedAttentionBestIsa() {
  if (HasAvx512()) return BlockedAttentionIsa::kAvx512;
  if (HasAvx2()) return BlockedAttentionIsa::kAvx2;
  return BlockedAttentionIsa::kBaseline;
}

bool BlockedAttentionCpuSupports(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& q_pos, const at::Tensor& k_pos) {
  if (!IsCpuF32(q) || !IsCpuF32(k) || !IsCpuF32(v) || !IsCpuLong(q_pos) || !IsCpuLong(k_pos)) {
    return false;
  }
  const int64_t n_heads = q.size(0), hd = q.size(2), n_kv = k.size(0);
  if (hd % 16 != 0 || hd > 512 || n_kv == 0 || n_heads % n_kv != 0) return false;
  if (k.size(2) != hd || v.sizes() != k.sizes()) return false;
  return q_pos.size(0) == q.size(1) && k_pos.size(0) == k.size(1);
}

namespace {

at::Tensor BlockedAttentionImpl(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                const at::Tensor& q_pos_in, const at::Tensor& k_pos_in,
                                int threads, BlockedAttentionIsa isa, at::Tensor* lse_out) {
  const int64_t n_heads = q.size(0), n_q = q.size(1), hd = q.size(2);
  const int64_t n_kv = k.size(0), n_keys = k.size(1), group = n_heads / n_kv;
  if (n_q == 0) {
    if (lse_out != nullptr) *lse_out = at::empty({n_heads, 0}, q.options().dtype(at::kFloat));
    return at::empty({n_heads, 0, hd}, q.options());
  }
  if (isa == BlockedAttentionIsa::kAuto) isa = BlockedAttentionBestIsa();
  if (isa == BlockedAttentionIsa::kAvx512 && !HasAvx512()) isa = BlockedAttentionIsa::kAvx2;
  if (isa == BlockedAttentionIsa::kAvx2 && !HasAvx2()) isa = BlockedAttentionIsa::kBaseline;
  const int64_t lanes = isa == BlockedAttentionIsa::kAvx512 ? 16 : 8;
  const at::Tensor q_pos = q_pos_in.contiguous(), k_pos = k_pos_in.contiguous();
  const auto long_options = at::TensorOptions().dtype(at::kLong);

  // Keys in position order, padded with zero keys to whole panel pairs.
  const std::vector<int64_t> key_order = SortedOrder(k_pos.data_ptr<int64_t>(), n_keys);
  at::Tensor ks = k, vs = v, k_pos_sorted = k_pos;
  if (!key_order.empty()) {
    at::Tensor idx = at::tensor(key_order, long_options);
    ks = k.index_select(1, idx), vs = v.index_select(1, idx);
    k_pos_sorted = k_pos.index_select(0, idx);
  }
  const int64_t n_pad = std::max<int64_t>(1, (n_keys + 2 * lanes - 1) / (2 * lanes)) * 2 * lanes;
  const auto f32 = q.options().dtype(at::kFloat);
  // K^T panels [n_kv, n_pad / lanes, hd, lanes]; V rows [n_kv, n_pad, hd].
  at::Tensor kp = at::zeros({n_kv, n_pad / lanes, lanes, hd}, f32);
  kp.view({n_kv, n_pad, hd}).narrow(1, 0, n_keys).copy_(ks);
  kp = kp.transpose(2, 3).contiguous();
  at::Tensor vp = at::zeros({n_kv, n_pad, hd}, f32);
  vp.narrow(1, 0, n_keys).copy_(vs);

  // Queries in position order; rows of kv head g are (query, head-in-group)
  // pairs, scaled by 1/sqrt(hd) as Model::Attention scales q.
  const std::vector<int64_t> query_order = SortedOrder(q_pos.data_ptr<int64_t>(), n_q);
  at::Tensor qq = q, q_pos_sorted = q_pos, q_idx;
  if (!query_order.empty()) {
    q_idx = at::tensor(query_order, long_options);
    qq = q.index_select(1, q_idx);
    q_pos_sorted = q_pos.index_select(0, q_idx);
  }
  const int64_t rows = n_q * group;
  const int64_t rows_pad = (rows + kTileRows - 1) / kTileRows * kTileRows;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor qs = at::zeros({n_kv, rows_pad, hd}, f32);
  qs.narrow(1, 0, rows)
      .view({n_kv, n_q, group, hd})
      .copy_((qq.reshape({n_kv, group, n_q, hd}) * scale).permute({0, 2, 1, 3}));

  // Row r (query r / group) sees the sorted keys [0, visible[r]).
  std::vector<int64_t> visible(rows_pad, 0);
  {
    const int64_t* kps = k_pos_sorted.data_ptr<int64_t>();
    const int64_t* qps = q_pos_sorted.data_ptr<int64_t>();
    for (int64_t i = 0; i < n_q; ++i) {
      const int64_t seen = std::upper_bound(kps, kps + n_keys, qps[i]) - kps;
      std::fill_n(visible.begin() + i * group, group, seen);
    }
  }

  at::Tensor packed_out = at::empty({n_kv, rows_pad, hd}, f32);
  at::Tensor packed_lse;
  if (lse_out != nullptr) packed_lse = at::empty({n_kv, rows_pad}, f32);
  Packed in{qs.data_ptr<float>(),
            kp.data_ptr<float>(),
            vp.data_ptr<float>(),
            visible.data(),
            packed_out.data_ptr<float>(),
            hd,
            rows_pad,
            n_pad,
            lse_out != nullptr ? packed_lse.data_ptr<float>() : nullptr};
  // Tiles, the most keys first, taken by the threads as they free up.
  // A tile's cost is the keys its last (farthest) row sees.
  std::vector<std::pair<int64_t, Item>> by_cost;
  for (int64_t g = 0; g < n_kv; ++g) {
    for (int64_t r0 = 0; r0 < rows_pad; r0 += kTileRows) {
      by_cost.push_back({*std::max_element(&visible[r0], &visible[r0] + kTileRows), {g, r0}});
    }
  }
  std::stable_sort(by_cost.begin(), by_cost.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // Under a yield policy the tiles run in rounds of about max_rows query
  // rows' worth of full-length work, with YieldPoint() between rounds on this
  // thread (what Model::Attention does between its query blocks).
  const int64_t max_rows = YieldMaxRows();
  const int64_t budget = max_rows > 0 ? std::max<int64_t>(1, max_rows * group * n_keys)
                                      : std::numeric_limits<int64_t>::max();
  auto run = isa == BlockedAttentionIsa::kAvx512 ? RunTilesAvx512
             : isa == BlockedAttentionIsa::kAvx2 ? RunTilesAvx2
                                                 : RunTilesBaseline;
  for (size_t first = 0; first < by_cost.size();) {
    if (first > 0) YieldPoint();
    std::vector<Item> items;
    int64_t work = 0;
    for (; first < by_cost.size() && (items.empty() || work < budget); ++first) {
      work += by_cost[first].first * kTileRows;
      items.push_back(by_cost[first].second);
    }
    std::atomic<size_t> next{0};
    const int64_t n_threads =
        work < kMinPairsForThreads
            ? 1
            : std::clamp<int64_t>(threads, 1, static_cast<int64_t>(items.size()));
    RunParts(static_cast<int>(n_threads), [&](int) { run(in, items, &next); });
  }

  // Back to [H, nq, hd] in the callers' query order.
  at::Tensor out = packed_out.narrow(1, 0, rows)
                       .view({n_kv, n_q, group, hd})
                       .permute({0, 2, 1, 3})
                       .reshape({n_heads, n_q, hd});
  if (lse_out != nullptr) {
    at::Tensor lse = packed_lse.narrow(1, 0, rows)
                         .view({n_kv, n_q, group})
                         .permute({0, 2, 1})
                         .reshape({n_heads, n_q});
    if (q_idx.defined()) {
      *lse_out = at::empty_like(lse);
      lse_out->index_copy_(1, q_idx, lse);
    } else {
      *lse_out = lse.contiguous();
    }
  }
  if (q_idx.defined()) {
    at::Tensor unsorted = at::empty_like(out);
    unsorted.index_copy_(1, q_idx, out);
    return unsorted;
  }
  return out;
}

}  // namespace

at::Tensor BlockedAttentionCpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& q_pos, const at::Tensor& k_pos, int threads,
                               BlockedAttentionIsa isa) {
  return BlockedAttentionImpl(q, k, v, q_pos, k_pos, threads, isa, nullptr);
}

at::Tensor BlockedAttentionCpuPartial(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& q_pos,
                                      const at::Tensor& k_pos, at::Tensor* lse, int threads,
                                      BlockedAttentionIsa isa) {
  return BlockedAttentionImpl(q, k, v, q_pos, k_pos, threads, isa, lse);
}

}  // namespace infoflow
