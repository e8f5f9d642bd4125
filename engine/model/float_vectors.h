// Float vectors for the CPU attention kernels (blocked_attention.cc,
// decode_attention.cc): GCC/Clang vector types and the few operations both
// need, force-inlined so each ISA-specific copy of a kernel (target_clones
// or per-ISA templates) compiles them for its own instruction set.
// Internal to engine/model; not an API.
#ifndef INFOFLOW_ENGINE_MODEL_FLOAT_VECTORS_H_
#define INFOFLOW_ENGINE_MODEL_FLOAT_VECTORS_H_

#include <algorithm>
#include <cstring>

namespace infoflow::simd {

// GCC/Clang vectors of 16 and 8 floats. The kernels below are templates on
// the vector type, force-inlined into one function per instruction set
// (AVX-512, AVX2 + FMA, baseline), so each copy is compiled for its ISA.
// Passing these by value has another ABI per ISA (-Wpsabi); no real call
// passes them.
#pragma GCC diagnostic ignored "-Wpsabi"
typedef float F16 __attribute__((vector_size(64)));
typedef float F8 __attribute__((vector_size(32)));

#define INFOFLOW_INLINE inline __attribute__((always_inline))

template <typename V>
constexpr int kLanes = sizeof(V) / sizeof(float);

template <typename V>
INFOFLOW_INLINE V Load(const float* p) {
  V r;
  std::memcpy(&r, p, sizeof r);
  return r;
}
template <typename V>
INFOFLOW_INLINE void Store(float* p, V x) {
  std::memcpy(p, &x, sizeof x);
}
template <typename V>
INFOFLOW_INLINE V Splat(float x) {
  return V{} + x;
}
template <typename V>
INFOFLOW_INLINE float HorizontalSum(V x) {
  float s = 0;
  for (int i = 0; i < kLanes<V>; ++i) s += x[i];
  return s;
}
template <typename V>
INFOFLOW_INLINE float HorizontalMax(V x) {
  float m = x[0];
  for (int i = 1; i < kLanes<V>; ++i) m = std::max(m, x[i]);
  return m;
}

// exp(x) for x <= 0, a vector at a time (Cephes expf:
// x = n ln2 + r, a degree-6 polynomial in r, times 2^n from the exponent
// bits); within 2 ulp of std::exp. Below -87 it gives exp(-87) ~ 1.6e-38:
// weights that small change no sum.
template <typename V>
INFOFLOW_INLINE V ExpNonPositive(V x) {
  typedef int IV __attribute__((vector_size(sizeof(V))));
  const V lo = Splat<V>(-87.0f);
  x = x < lo ? lo : x;
  const V magic = Splat<V>(12582912.0f);  // 1.5 * 2^23: adding it rounds to an integer
  const V n = (x * 1.44269504088896341f + magic) - magic;
  const V r = (x - n * 0.693359375f) - n * -2.12194440e-4f;  // ln2 in two parts
  V p = Splat<V>(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const V y = p * r * r + r + 1.0f;
  const IV bits = (__builtin_convertvector(n, IV) + 127) << 23;
  V scale;
  std::memcpy(&scale, &bits, sizeof scale);
  return y * scale;
}

}  // namespace infoflow::simd

#endif  // INFOFLOW_ENGINE_MODEL_FLOAT_VECTORS_H_
