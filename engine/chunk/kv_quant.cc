#include "engine/chunk/kv_quant.h"

#include <ATen/ATen.h>

#include <cstring>

namespace infoflow {
namespace {

// [H, N, M] view with the group axis in the middle.
at::Tensor GroupAxisInMiddle(const at::Tensor& x, QuantAxis axis) {
  return axis == QuantAxis::kTokens ? x : x.transpose(1, 2);
}

}  // namespace

size_t QuantCodeBytes(int64_t h, int64_t t, int64_t d, int bits) {
  return static_cast<size_t>(h * t * d * bits / 8);
}

void QuantizeSection(const at::Tensor& x, const QuantSpec& spec, size_t codes_bytes, char* out) {
  const int64_t H = x.size(0), T = x.size(1), D = x.size(2);
  at::Tensor xt = GroupAxisInMiddle(x.to(at::kCPU, at::kFloat), spec.axis);  // [H, N, M]
  const int64_t N = xt.size(1), M = xt.size(2), G = spec.group;
  const int64_t groups = (N + G - 1) / G, pad = groups * G - N;
  // The last partial group is padded with copies of its last element, which
  // leaves its min and max unchanged.
  if (pad > 0) xt = at::cat({xt, xt.narrow(1, N - 1, 1).expand({H, pad, M})}, 1);
  at::Tensor g = xt.reshape({H, groups, G, M});
  const at::Tensor mn = g.amin(2), mx = g.amax(2);  // [H, groups, M]
  const double qmax = static_cast<double>((1 << spec.bits) - 1);
  at::Tensor scale = (mx - mn) / qmax;
  scale = at::where(scale > 0, scale, at::ones_like(scale));  // a constant group
  at::Tensor codes = ((g - mn.unsqueeze(2)) / scale.unsqueeze(2))
                         .round_()
                         .clamp_(0, qmax)
                         .to(at::kByte)
                         .reshape({H, groups * G, M})
                         .narrow(1, 0, N);
  codes = GroupAxisInMiddle(codes, spec.axis).contiguous();  // back to [H, T, D]
  if (spec.bits == 4) {
    at::Tensor pairs = codes.view({H, T, D / 2, 2});
    codes = (pairs.select(3, 0) | pairs.select(3, 1).__lshift__(4)).contiguous();
  }
  std::memcpy(out, codes.data_ptr(), QuantCodeBytes(H, T, D, spec.bits));
  const at::Tensor params = at::stack({scale, mn}, -1).contiguous();  // [H, groups, M, 2]
  std::memcpy(out + codes_bytes, params.data_ptr(), params.numel() * sizeof(float));
}

at::Tensor DequantizeSection(const char* in, int64_t h, int64_t t, int64_t d,
                             const QuantSpec& spec, size_t codes_bytes, at::ScalarType dtype) {
  const auto u8 = at::TensorOptions().dtype(at::kByte);
  at::Tensor codes = at::empty({h, t, d * spec.bits / 8}, u8);
  std::memcpy(codes.data_ptr(), in, QuantCodeBytes(h, t, d, spec.bits));
  if (spec.bits == 4) codes = at::stack({codes.bitwise_and(0x0F), codes.__rshift__(4)}, -1).view({h, t, d});
  at::Tensor qt = GroupAxisInMiddle(codes.to(at::kFloat), spec.axis);  // [H, N, M]
  const int64_t N = qt.size(1), M = qt.size(2), G = spec.group;
  const int64_t groups = (N + G - 1) / G;
  at::Tensor params = at::empty({h, groups, M, 2}, at::TensorOptions().dtype(at::kFloat));
  std::memcpy(params.data_ptr(), in + codes_bytes, params.numel() * sizeof(float));
  auto per_element = [&](int which) {  // [H, groups, M] -> [H, N, M]
    return params.select(3, which).repeat_interleave(G, 1).narrow(1, 0, N);
  };
  at::Tensor x = qt * per_element(0) + per_element(1);
  return GroupAxisInMiddle(x, spec.axis).to(dtype).contiguous();
}

}  // namespace infoflow
