#include "engine/model/model.h"

#include <ATen/ATen.h>
#include <ATen/Context.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <limits>
#include <vector>

#include "engine/model/blocked_attention.h"
#include "engine/model/decode_attention.h"
#include "engine/model/runtime.h"
#include "engine/model/small_batch_linear.h"
#include "engine/model/yield_point.h"

namespace infoflow {
namespace {

std::atomic<int64_t> g_attention_rows{0};

// Query x key pairs from which Model::Attention uses the blocked kernel
// (Model::SetBlockedAttentionMinPairs).
std::atomic<int64_t> g_blocked_min_pairs{int64_t{64} * 64};
// And from this many query rows: its tiles are 24 (query, head) rows, so a
// few queries would mostly compute padding.
constexpr int64_t kBlockedAttentionMinQueries = 16;

at::Tensor RmsNorm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // Statistics in f32 even for bf16 activations, as Hugging Face does.
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return normed.to(x.scalar_type()) * weight;
}

// RoPE on x [n, T, hd] with cos/sin [T, rd] from Model::RopeTables, paired
// as Hugging Face does. Rotate-half (LlamaForCausalLM: dim i with i + hd/2)
// over the whole head (rd == hd), or GLM's (GlmForCausalLM: dim 2i with
// 2i+1, its rotate_half being stack(-x[1::2], x[0::2]) flattened) over the
// first rd dims, dims rd.. passing through. ParseModelConfig allows partial
// rotary only with the interleaved pairing.
at::Tensor ApplyRope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     bool interleaved) {
  if (!interleaved) {
    const int64_t half = x.size(-1) / 2;
    at::Tensor x1 = x.narrow(-1, 0, half);
    at::Tensor x2 = x.narrow(-1, half, half);
    at::Tensor rotated = at::cat({-x2, x1}, -1);
    return x * cos + rotated * sin;
  }
  const int64_t rotary_dim = cos.size(-1);
  at::Tensor x_rot = x.narrow(-1, 0, rotary_dim);
  // The rotary dims as rd/2 pairs (x[2i], x[2i+1]) -> (-x[2i+1], x[2i]).
  at::Tensor pairs = x_rot.unflatten(-1, {rotary_dim / 2, 2});
  at::Tensor rotated = at::stack({-pairs.select(-1, 1), pairs.select(-1, 0)}, -1).flatten(-2);
  at::Tensor out = x_rot * cos + rotated * sin;
  if (rotary_dim == x.size(-1)) return out;
  return at::cat({out, x.narrow(-1, rotary_dim, x.size(-1) - rotary_dim)}, -1);
}

// Runs f(first_row, n_rows) over [0, n) in blocks of at most YieldMaxRows()
// rows (one block when no yield policy is installed), yielding between
// blocks, and concatenates the results along dim 0. Every op f applies is
// row-wise, so the blocks change only the size of each piece of work and the
// BLAS summation order (a matmul over fewer rows may block its sums
// differently; within 1e-4, pinned by a test).
at::Tensor ByRowBlocks(int64_t n, const std::function<at::Tensor(int64_t, int64_t)>& f) {
  const int64_t max_rows = YieldMaxRows();
  if (max_rows <= 0 || n <= max_rows) return f(0, n);
  std::vector<at::Tensor> parts;
  for (int64_t r0 = 0; r0 < n; r0 += max_rows) {
    if (r0 > 0) YieldPoint();
    parts.push_back(f(r0, std::min(max_rows, n - r0)));
  }
  return at::cat(parts, 0);
}

}  // namespace

Model::Model(ModelConfig config, ModelWeights weights, c10::Device device, c10::ScalarType dtype)
    : config_(std::move(config)), weights_(std::move(weights)), device_(device), dtype_(dtype) {
  std::vector<double> inv = RopeInverseFrequencies(config_);
  inv_freq_ = at::tensor(inv, at::TensorOptions().dtype(at::kDouble)).to(device_);
}

at::Tensor Model::Embed(const at::Tensor& tokens) const {
  return weights_.embed.index_select(0, tokens);
}

std::pair<at::Tensor, at::Tensor> Model::RopeTables(const at::Tensor& positions) const {
  // Angles in f64 so that large positions keep full precision.
  at::Tensor angles = positions.to(at::kDouble).unsqueeze(1) * inv_freq_.unsqueeze(0);
  // Each pair's angle at both of its dims: [f0..f_{n-1}, f0..f_{n-1}] for
  // rotate-half, [f0, f0, f1, f1, ...] for interleaved (GLM).
  at::Tensor emb = config_.rope_interleaved ? angles.repeat_interleave(2, -1)
                                            : at::cat({angles, angles}, -1);
  return {emb.cos().to(dtype_), emb.sin().to(dtype_)};
}

at::Tensor Model::Rotate(const at::Tensor& k, const at::Tensor& positions) const {
  return Rotate(k, RopeTables(positions.to(device_)));
}

at::Tensor Model::Rotate(const at::Tensor& k,
                         const std::pair<at::Tensor, at::Tensor>& rope) const {
  return ApplyRope(k, rope.first, rope.second, config_.rope_interleaved);
}

void Model::RotateInto(const at::Tensor& k, const std::pair<at::Tensor, at::Tensor>& rope,
                       at::Tensor out, at::Tensor* scratch) const {
  if (config_.rope_interleaved) {
    out.copy_(Rotate(k, rope));
    return;
  }
  // ApplyRope computes x * cos + cat(-x2, x1) * sin, each product rounded,
  // then the sum; with cos/sin = [c, c] / [s, s] (RopeTables, rotate-half)
  // that is out1 = x1*c - x2*s and out2 = x2*c + x1*s, the same roundings in
  // the same order, without the four temporaries of k's size.
  const int64_t half = k.size(-1) / 2;
  const at::Tensor c = rope.first.narrow(-1, 0, half), s = rope.second.narrow(-1, 0, half);
  const at::Tensor x1 = k.narrow(-1, 0, half), x2 = k.narrow(-1, half, half);
  at::Tensor out1 = out.narrow(-1, 0, half), out2 = out.narrow(-1, half, half);
  at::Tensor local;
  at::Tensor& tmp = scratch != nullptr ? *scratch : local;
  if (!tmp.defined() || tmp.sizes() != x1.sizes() || tmp.scalar_type() != k.scalar_type()) {
    tmp = at::empty(x1.sizes(), k.options());
  }
  at::mul_out(out1, x1, c);
  at::mul_out(tmp, x2, s);
  out1.sub_(tmp);
  at::mul_out(out2, x2, c);
  at::mul_out(tmp, x1, s);
  out2.add_(tmp);
}

at::Tensor Model::Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& q_pos, const at::Tensor& k_pos,
                            AttentionColumnStats* stats_out, bool keys_sorted) {
  const int64_t n_heads = q.size(0), n_q = q.size(1), hd = q.size(2);
  g_attention_rows.fetch_add(n_q, std::memory_order_relaxed);
  // Long prefill and recompute on the CPU in f32: the blocked kernel
  // (engine/model/blocked_attention.h), unless column statistics are wanted
  // (they need the normalised probabilities, which it never forms) or the
  // call is too small for it to win (g_blocked_min_pairs, measured).
  if (stats_out == nullptr && BlockedAttentionPays(n_q, k.size(1)) &&
      BlockedAttentionCpuSupports(q, k, v, q_pos, k_pos)) {
    return BlockedAttentionCpu(q, k, v, q_pos, k_pos, MathThreads());
  }
  const int64_t n_kv = k.size(0), n_keys = k.size(1);
  const int64_t group = n_heads / n_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  // Query heads [H] = [Hkv, group]: kv head j serves query heads j*group..,
  // so no copy of K/V per query head is needed.
  at::Tensor q4 = q.reshape({n_kv, group, n_q, hd});
  // Bound the score matrix to ~2M elements (8 MB f32) per block of query
  // rows: blocks stay cache-friendly and out of mmap'd allocations, whose
  // page faults cost more than the matmuls on small VMs. Measured on 2
  // cores, 2048-token prefill: 1M 1048 ms, 2M ~860 ms, 4M 1068 ms, 8M 1594 ms.
  // On a GPU each block costs ~10 kernel launches and the caching allocator
  // reuses memory, so blocks are 64x larger (512 MB of f32 scores): at 32K
  // keys and 32 heads that is 256 rows per block, not 2.
  const int64_t score_elements = q.device().is_cpu() ? int64_t{2} << 20 : int64_t{128} << 20;
  const int64_t block =
      std::max<int64_t>(1, score_elements / std::max<int64_t>(1, n_heads * n_keys));
  at::Tensor q_pos_cpu, k_pos_cpu;
  if (keys_sorted) {
    q_pos_cpu = q_pos.cpu().contiguous();
    k_pos_cpu = k_pos.cpu().contiguous();
  }
  std::vector<at::Tensor> outs;
  if (stats_out) {
    const auto f64 = at::TensorOptions().dtype(at::kDouble);
    stats_out->sum = at::zeros({n_keys}, f64);
    stats_out->sum_sq = at::zeros({n_keys}, f64);
  }
  for (int64_t b0 = 0; b0 < n_q; b0 += block) {
    const int64_t nb = std::min(block, n_q - b0);
    // Keys [0, nk) can be visible to some query of the block; keys [0, lo)
    // are visible to all of them and need no mask.
    int64_t nk = n_keys, lo = 0;
    if (keys_sorted) {
      const int64_t* qp = q_pos_cpu.data_ptr<int64_t>() + b0;
      const int64_t* kp = k_pos_cpu.data_ptr<int64_t>();
      const auto [first, last] = std::minmax_element(qp, qp + nb);
      nk = std::upper_bound(kp, kp + n_keys, *last) - kp;
      lo = std::upper_bound(kp, kp + n_keys, *first) - kp;
    }
    at::Tensor kb = k.narrow(1, 0, nk), vb = v.narrow(1, 0, nk);
    // Scaling q (nb x hd) is cheaper than scaling the scores (nb x nk).
    at::Tensor qb = (q4.narrow(2, b0, nb) * scale).reshape({n_kv, group * nb, hd});
    // at::matmul, not at::bmm: libtorch 1.13's CPU bmm is ~4x slower with
    // a transposed right operand (measured, 2048 keys x 64 dims).
    at::Tensor scores = at::matmul(qb, kb.transpose(1, 2)).view({n_kv, group, nb, nk});
    if (scores.scalar_type() != at::kFloat) scores = scores.to(at::kFloat);
    if (lo < nk) {
      at::Tensor hidden =
          k_pos.narrow(0, lo, nk - lo).unsqueeze(0) > q_pos.narrow(0, b0, nb).unsqueeze(1);
      scores.narrow(3, lo, nk - lo).masked_fill_(hidden, -std::numeric_limits<float>::infinity());
    }
    // Positive dim on purpose: libtorch 1.13 softmax(x, -1) on this 4-D
    // tensor takes a ~6x slower path than softmax(x, 3) (measured).
    at::Tensor p = at::softmax(scores, 3);
    at::Tensor o = at::bmm(p.to(v.scalar_type()).view({n_kv, group * nb, nk}), vb);
    outs.push_back(o.view({n_kv, group, nb, hd}));
    if (b0 + nb < n_q) YieldPoint();
    if (stats_out) {
      // Keys past nk are hidden from the whole block: probability 0 there.
      at::Tensor a = p.view({n_heads, nb, nk}).mean(0).to(at::kDouble).cpu();  // [nb, nk]
      stats_out->sum.narrow(0, 0, nk) += a.sum(0);
      stats_out->sum_sq.narrow(0, 0, nk) += a.pow(2).sum(0);
    }
  }
  at::Tensor out = outs.size() == 1 ? outs[0] : at::cat(outs, 2);
  return out.reshape({n_heads, n_q, hd});
}

at::Tensor Model::Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                         Matmul matmul) {
  const bool in_place = matmul == Matmul::kInPlace || x.size(0) <= kInPlaceMaxRows;
  if (in_place && SmallBatchLinearCpuSupports(x, w, bias)) {
    return SmallBatchLinearCpu(x, w, bias, MathThreads());
  }
  return at::linear(x, w, bias);
}

Model::Qkv Model::ProjectQkv(int layer, const at::Tensor& h,
                             const std::pair<at::Tensor, at::Tensor>& rope,
                             at::Tensor* unrotated_keys, Matmul matmul) const {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t n_q = h.size(0);
  const int64_t n_heads = config_.num_attention_heads, n_kv = config_.num_key_value_heads;
  const int64_t hd = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  at::Tensor qkv = ByRowBlocks(n_q, [&](int64_t r0, int64_t n) {
    return Linear(RmsNorm(h.narrow(0, r0, n), w.attn_norm, eps), w.wqkv, w.bqkv, matmul);
  });
  std::vector<at::Tensor> parts = qkv.split_with_sizes({n_heads * hd, n_kv * hd, n_kv * hd}, 1);
  at::Tensor q = parts[0].view({n_q, n_heads, hd});
  at::Tensor k = parts[1].view({n_q, n_kv, hd});
  at::Tensor v = parts[2].view({n_q, n_kv, hd});
  if (w.q_norm.defined()) {
    q = RmsNorm(q, w.q_norm, eps);
    k = RmsNorm(k, w.k_norm, eps);
  }
  Qkv out;
  out.q = Rotate(q.transpose(0, 1), rope);  // [H, q, hd]
  if (unrotated_keys) *unrotated_keys = k.transpose(0, 1).contiguous();
  out.k = Rotate(k.transpose(0, 1), rope);  // [Hkv, q, hd]
  out.v = v.transpose(0, 1);                // [Hkv, q, hd]
  return out;
}

at::Tensor Model::OutputAndMlp(int layer, const at::Tensor& h, const at::Tensor& attn,
                               Matmul matmul) const {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t n_q = h.size(0);
  const int64_t width = config_.num_attention_heads * config_.head_dim;
  const double eps = config_.rms_norm_eps;
  at::Tensor attn_rows = attn.transpose(0, 1).reshape({n_q, width});
  return ByRowBlocks(n_q, [&](int64_t r0, int64_t n) {
    at::Tensor attn_out = Linear(attn_rows.narrow(0, r0, n), w.wo, w.bo, matmul);
    if (w.post_attn_norm.defined()) attn_out = RmsNorm(attn_out, w.post_attn_norm, eps);
    at::Tensor out = h.narrow(0, r0, n) + attn_out;
    // SwiGLU MLP block: silu(gate) * up, gate the first half of the fused rows.
    at::Tensor x = RmsNorm(out, w.mlp_norm, eps);
    std::vector<at::Tensor> gate_up = Linear(x, w.w_gate_up, {}, matmul).chunk(2, -1);
    at::Tensor mlp_out = Linear(at::silu(gate_up[0]) * gate_up[1], w.w_down, {}, matmul);
    if (w.post_mlp_norm.defined()) mlp_out = RmsNorm(mlp_out, w.post_mlp_norm, eps);
    return out + mlp_out;
  });
}

at::Tensor Model::Layer(int layer, const at::Tensor& h, const at::Tensor& positions,
                        const std::pair<at::Tensor, at::Tensor>& rope, const at::Tensor& slots,
                        KvCache* cache, const LayerTrace& trace) const {
  Qkv p = ProjectQkv(layer, h, rope, trace.unrotated_keys);
  cache->WriteAt(layer, slots, p.k, p.v);
  at::Tensor attn = Attention(p.q, cache->keys(layer), cache->values(layer), positions,
                              cache->positions(), trace.attention, cache->positions_sorted());
  YieldPoint();
  at::Tensor out = OutputAndMlp(layer, h, attn);
  YieldPoint();
  return out;
}

at::Tensor Model::DecodeStep(const at::Tensor& tokens_in, const at::Tensor& positions_in,
                             const std::vector<KvCache*>& caches) const {
  at::Tensor tokens = tokens_in.to(device_, at::kLong);
  at::Tensor positions = positions_in.to(device_, at::kLong);
  const int64_t batch = tokens.size(0);
  // Row b's token goes to a new slot at the end of its own cache.
  std::vector<int64_t> slots(batch);
  for (int64_t b = 0; b < batch; ++b) {
    slots[b] = caches[b]->AppendPositions(positions.narrow(0, b, 1));
  }
  auto rope = RopeTables(positions);  // one row per request: its own position
  at::Tensor h = Embed(tokens);       // [B, d]
  for (int l = 0; l < n_layers(); ++l) {
    // One matmul over the B rows, K/V row b into its own cache, attention
    // over its own cache only, one matmul again.
    Qkv p = ProjectQkv(l, h, rope, nullptr, Matmul::kInPlace);
    KvCache::WriteRows(l, caches, slots, p.k, p.v);
    at::Tensor attn = DecodeAttention(p.q, positions, caches, l);
    h = OutputAndMlp(l, h, attn, Matmul::kInPlace);
  }
  return LogitsWith(h, Matmul::kInPlace);
}

at::Tensor Model::DecodeAttention(const at::Tensor& q, const at::Tensor& q_pos,
                                  const std::vector<KvCache*>& caches, int layer) {
  const int64_t batch = q.size(1);
  std::vector<at::Tensor> keys, values, k_pos;
  for (KvCache* cache : caches) {
    keys.push_back(cache->keys(layer));
    values.push_back(cache->values(layer));
    k_pos.push_back(cache->positions());
  }
  if (DecodeAttentionCpuSupports(q, q_pos, keys, values, k_pos)) {
    g_attention_rows.fetch_add(batch, std::memory_order_relaxed);  // as Attention counts them
    return DecodeAttentionCpu(q, q_pos, keys, values, k_pos, MathThreads());
  }
  std::vector<at::Tensor> rows(batch);
  for (int64_t b = 0; b < batch; ++b) {
    rows[b] = Attention(q.narrow(1, b, 1), keys[b], values[b], q_pos.narrow(0, b, 1), k_pos[b],
                        nullptr, caches[b]->positions_sorted());
  }
  return batch == 1 ? rows[0] : at::cat(rows, 1);
}

std::pair<at::Tensor, at::Tensor> Model::LayerKv(
    int layer, const at::Tensor& h, const std::pair<at::Tensor, at::Tensor>& rope) const {
  const LayerWeights& w = weights_.layers[layer];
  const int64_t n_q = h.size(0);
  const int64_t n_heads = config_.num_attention_heads, n_kv = config_.num_key_value_heads;
  const int64_t hd = config_.head_dim;
  const double eps = config_.rms_norm_eps;
  // Layer()'s K and V rows of the fused projection, and nothing else.
  at::Tensor x = RmsNorm(h, w.attn_norm, eps);
  at::Tensor weight = w.wqkv.narrow(0, n_heads * hd, 2 * n_kv * hd);
  at::Tensor bias = w.bqkv.defined() ? w.bqkv.narrow(0, n_heads * hd, 2 * n_kv * hd) : at::Tensor();
  std::vector<at::Tensor> kv = Linear(x, weight, bias, Matmul::kByRows).split(n_kv * hd, 1);
  at::Tensor k = kv[0].view({n_q, n_kv, hd});
  at::Tensor v = kv[1].view({n_q, n_kv, hd});
  if (w.k_norm.defined()) k = RmsNorm(k, w.k_norm, eps);
  k = Rotate(k.transpose(0, 1), rope);
  return {k, v.transpose(0, 1)};
}

at::Tensor Model::Logits(const at::Tensor& hidden) const {
  return LogitsWith(hidden, Matmul::kByRows);
}

at::Tensor Model::LogitsWith(const at::Tensor& hidden, Matmul matmul) const {
  return Linear(RmsNorm(hidden, weights_.final_norm, config_.rms_norm_eps), weights_.lm_head, {},
                matmul)
      .to(at::kFloat);
}

ForwardResult Model::Forward(const at::Tensor& tokens_in, const at::Tensor& positions_in,
                             const at::Tensor& slots_in, KvCache* cache,
                             const ForwardOptions& options) const {
  at::Tensor tokens = tokens_in.to(device_, at::kLong);
  at::Tensor positions = positions_in.to(device_, at::kLong);
  at::Tensor slots;
  if (slots_in.defined()) {
    slots = slots_in.to(device_, at::kLong);
    cache->SetPositions(slots, positions);
  } else {
    const int64_t first = cache->AppendPositions(positions);
    slots = at::arange(first, first + tokens.size(0), tokens.options());
  }
  const int last = options.last_layer < 0 ? n_layers() - 1 : options.last_layer;
  auto rope = RopeTables(positions);

  ForwardResult result;
  at::Tensor h = Embed(tokens);
  for (int l = 0; l <= last; ++l) {
    bool capture = false;
    for (int c : options.capture_attention) capture |= (c == l);
    AttentionColumnStats stats;
    at::Tensor unrotated;
    LayerTrace trace;
    if (capture) trace.attention = &stats;
    if (options.return_unrotated_keys) trace.unrotated_keys = &unrotated;
    h = Layer(l, h, positions, rope, slots, cache, trace);
    if (capture) result.attention[l] = std::move(stats);
    if (options.return_unrotated_keys) result.unrotated_keys.push_back(unrotated);
  }
  result.hidden = h;
  if (options.logits == ForwardOptions::Logits::kLast) {
    result.logits = Logits(h.narrow(0, h.size(0) - 1, 1));
  } else if (options.logits == ForwardOptions::Logits::kAll) {
    result.logits = Logits(h);
  }
  return result;
}

void Model::SetBlockedAttentionMinPairs(int64_t pairs) {
  g_blocked_min_pairs.store(pairs, std::memory_order_relaxed);
}

bool Model::BlockedAttentionPays(int64_t n_q, int64_t n_keys) {
  return n_q >= kBlockedAttentionMinQueries &&
         n_q * n_keys >= g_blocked_min_pairs.load(std::memory_order_relaxed);
}

int64_t AttentionQueryRows() { return g_attention_rows.load(std::memory_order_relaxed); }

absl::StatusOr<c10::Device> ResolveDevice(const std::string& name) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "auto") return at::hasCUDA() ? c10::Device(c10::kCUDA, 0) : c10::Device(c10::kCPU);
  if (name.rfind("cuda", 0) == 0) {
    if (!at::hasCUDA()) {
      return absl::FailedPreconditionError("device '" + name +
                                           "' requested but this libtorch has no CUDA");
    }
    try {
      c10::Device device(name);
      // "cuda" means cuda:0, as for "auto": a device with an index compares
      // equal to the device its tensors report (found on the first GPU run).
      if (!device.has_index()) device.set_index(0);
      return device;
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError("bad device '" + name + "': " + e.what());
    }
  }
  return absl::InvalidArgumentError("device must be auto, cpu or cuda[:N], got '" + name + "'");
}

}  // namespace infoflow
