#include "engine/model/small_batch_linear.h"

#include <ATen/ATen.h>
#include <immintrin.h>

#include <algorithm>
#include <array>
#include <utility>
#include <vector>

#include "engine/model/helper_threads.h"

namespace infoflow {
namespace {

// Rows per pass over w: two 8-float vectors per weight broadcast.
constexpr int64_t kMaxLanes = 16;
// Below this many lane multiply-adds (lanes x in x out) one thread is
// quicker than handing half to a helper (a few microseconds when it is
// awake, tens when it sleeps): a 16-lane pass over a 512x512 matrix (4.2M)
// is about 100 us on one core.
constexpr int64_t kMinLaneFmasPerThread = int64_t{1} << 20;

// acc[j][r] = sum over k of w[j][k] * xt[k][r], one FMA chain per (j, r),
// for kCols weight rows and 8 * kVecs lanes. xt is x transposed ([in][lanes]);
// tile gets [kCols][lanes]. kVecs * kCols accumulators + kVecs loads + one
// broadcast stay within the 16 vector registers.
template <int kVecs, int kCols>
__attribute__((target("avx2,fma"))) void MultiplyTile(const float* xt, const float* w,
                                                      int64_t w_stride, int64_t in, float* tile) {
  __m256 acc[kCols][kVecs];
#pragma GCC unroll 12
  for (int j = 0; j < kCols; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < kVecs; ++v) acc[j][v] = _mm256_setzero_ps();
  }
  for (int64_t k = 0; k < in; ++k) {
    __m256 xv[kVecs];
#pragma GCC unroll 2
    for (int v = 0; v < kVecs; ++v) xv[v] = _mm256_loadu_ps(xt + (k * kVecs + v) * 8);
#pragma GCC unroll 12
    for (int j = 0; j < kCols; ++j) {
      const __m256 wj = _mm256_broadcast_ss(w + j * w_stride + k);
#pragma GCC unroll 2
      for (int v = 0; v < kVecs; ++v) acc[j][v] = _mm256_fmadd_ps(wj, xv[v], acc[j][v]);
    }
  }
#pragma GCC unroll 12
  for (int j = 0; j < kCols; ++j) {
#pragma GCC unroll 2
    for (int v = 0; v < kVecs; ++v) _mm256_storeu_ps(tile + (j * kVecs + v) * 8, acc[j][v]);
  }
}

using TileFn = void (*)(const float*, const float*, int64_t, int64_t, float*);

template <int kVecs, int... kCols>
constexpr std::array<TileFn, sizeof...(kCols)> TileTable(std::integer_sequence<int, kCols...>) {
  return {&MultiplyTile<kVecs, kCols + 1>...};
}

// Widest tile per lane count: 12 columns of 8 lanes, 6 columns of 16.
constexpr auto kTiles8 = TileTable<1>(std::make_integer_sequence<int, 12>());
constexpr auto kTiles16 = TileTable<2>(std::make_integer_sequence<int, 6>());

bool HasAvx2Fma() { return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"); }

}  // namespace

bool SmallBatchLinearCpuSupports(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  static const bool cpu_ok = HasAvx2Fma();
  auto f32_cpu = [](const at::Tensor& t) {
    return t.device().is_cpu() && t.scalar_type() == at::kFloat;
  };
  if (!cpu_ok || !f32_cpu(x) || !f32_cpu(w) || x.dim() != 2 || w.dim() != 2) return false;
  if (x.size(1) != w.size(1) || x.size(1) == 0 || x.stride(1) != 1 || w.stride(1) != 1) {
    return false;
  }
  if (bias.defined() &&
      (!f32_cpu(bias) || bias.dim() != 1 || bias.size(0) != w.size(0) || !bias.is_contiguous())) {
    return false;
  }
  return true;
}

at::Tensor SmallBatchLinearCpu(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                               int threads) {
  const int64_t rows = x.size(0), in = x.size(1), out_cols = w.size(0);
  at::Tensor out = at::empty({rows, out_cols}, x.options());
  if (rows == 0 || out_cols == 0) return out;
  const float* xp = x.data_ptr<float>();
  const float* wp = w.data_ptr<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* op = out.data_ptr<float>();
  const int64_t x_stride = x.stride(0), w_stride = w.stride(0);

  // x transposed, one block of [in][lanes] per pass of up to 16 rows; lanes
  // past the last row are zero and their results are dropped.
  struct Pass {
    int64_t first_row, n_rows, lanes;
    std::vector<float> xt;
  };
  std::vector<Pass> passes;
  int64_t lane_fmas = 0;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxLanes) {
    Pass p{r0, std::min(kMaxLanes, rows - r0), 0, {}};
    p.lanes = p.n_rows <= 8 ? 8 : 16;
    p.xt.assign(in * p.lanes, 0.0f);
    for (int64_t r = 0; r < p.n_rows; ++r) {
      const float* row = xp + (r0 + r) * x_stride;
      for (int64_t k = 0; k < in; ++k) p.xt[k * p.lanes + r] = row[k];
    }
    lane_fmas += p.lanes * in * out_cols;
    passes.push_back(std::move(p));
  }

  // Columns [c0, c1) for every pass, 12 columns at a time: every pass runs
  // over those 12 weight rows before the next 12, so a call with several
  // passes reads w from memory once and the later passes find the rows in
  // cache (12 x in floats: 48 KB at in = 1024). Tiles of the widest width,
  // then one narrower tile for the rest.
  auto run = [&](int64_t c0, int64_t c1) {
    float tile[kMaxLanes * 12];
    for (int64_t block = c0; block < c1; block += 12) {
      const int64_t block_end = std::min(block + 12, c1);
      for (const Pass& p : passes) {
        const int64_t width = p.lanes == 8 ? 12 : 6;
        for (int64_t c = block; c < block_end; c += width) {
          const int64_t n = std::min(width, block_end - c);
          const TileFn fn = p.lanes == 8 ? kTiles8[n - 1] : kTiles16[n - 1];
          fn(p.xt.data(), wp + c * w_stride, w_stride, in, tile);
          for (int64_t j = 0; j < n; ++j) {
            for (int64_t r = 0; r < p.n_rows; ++r) {
              const float acc = tile[j * p.lanes + r];
              op[(p.first_row + r) * out_cols + c + j] = bp ? acc + bp[c + j] : acc;
            }
          }
        }
      }
    }
  };
  // Parts cut at multiples of 12 columns (a whole number of tiles for either
  // width), so every part but the last runs full-width tiles only.
  const int64_t parts = std::clamp<int64_t>(
      std::min<int64_t>(threads, lane_fmas / kMinLaneFmasPerThread), 1, (out_cols + 11) / 12);
  const int64_t per_part = (out_cols + 11) / 12 / parts * 12;
  RunParts(static_cast<int>(parts),
           [&](int p) { run(p * per_part, p + 1 == parts ? out_cols : (p + 1) * per_part); });
  return out;
}

}  // namespace infoflow
