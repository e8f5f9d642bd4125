#include "engine/dist/ring_attention.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/model/blocked_attention.h"
#include "engine/model/model.h"
#include "engine/model/runtime.h"

namespace infoflow {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Rows per block of queries so one block's scores stay ~2M elements, as
// Model::Attention bounds its own.
int64_t QueryBlock(int64_t n_heads, int64_t n_keys) {
  return std::max<int64_t>(1, (int64_t{2} << 20) / std::max<int64_t>(1, n_heads * n_keys));
}

// Scaled scores [Hkv, group, nb, nk] f32 of query rows [b0, b0+nb) against
// keys [0, nk), hidden keys at -inf; keys [0, lo) are visible to every row
// of the block and need no mask.
at::Tensor Scores(const at::Tensor& q, const at::Tensor& k, const at::Tensor& q_pos,
                  const at::Tensor& k_pos, int64_t b0, int64_t nb, int64_t lo, int64_t nk) {
  const int64_t n_heads = q.size(0), n_q = q.size(1), hd = q.size(2);
  const int64_t n_kv = k.size(0), group = n_heads / n_kv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  at::Tensor q4 = q.reshape({n_kv, group, n_q, hd});
  at::Tensor qb = (q4.narrow(2, b0, nb) * scale).reshape({n_kv, group * nb, hd});
  at::Tensor s = at::matmul(qb, k.narrow(1, 0, nk).transpose(1, 2)).view({n_kv, group, nb, nk});
  if (s.scalar_type() != at::kFloat) s = s.to(at::kFloat);
  if (lo < nk) {
    at::Tensor hidden =
        k_pos.narrow(0, lo, nk - lo).unsqueeze(0) > q_pos.narrow(0, b0, nb).unsqueeze(1);
    s.narrow(3, lo, nk - lo).masked_fill_(hidden, kNegInf);
  }
  return s;
}

// Which keys a block of query rows can see. With keys sorted by position
// (every rank's cache is: prefix, share, then question or prompt rows) a
// block reads only the keys up to its last position, so causal prefill does
// about half the work of a full mask, as Model::Attention's keys_sorted.
class KeyRange {
 public:
  KeyRange(const at::Tensor& q_pos, const at::Tensor& k_pos)
      : q_(q_pos.cpu().contiguous()), k_(k_pos.cpu().contiguous()) {
    const int64_t* kp = k_.data_ptr<int64_t>();
    sorted_ = std::is_sorted(kp, kp + k_.numel());
  }
  // {lo, nk} for query rows [b0, b0 + nb).
  std::pair<int64_t, int64_t> For(int64_t b0, int64_t nb) const {
    const int64_t n = k_.numel();
    if (!sorted_) return {0, n};
    const int64_t* qp = q_.data_ptr<int64_t>() + b0;
    const int64_t* kp = k_.data_ptr<int64_t>();
    const auto [first, last] = std::minmax_element(qp, qp + nb);
    return {std::upper_bound(kp, kp + n, *first) - kp, std::upper_bound(kp, kp + n, *last) - kp};
  }

 private:
  at::Tensor q_, k_;
  bool sorted_ = false;
};

}  // namespace

PartialAttention AttendPiece(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& q_pos, const at::Tensor& k_pos) {
  const int64_t n_heads = q.size(0), n_q = q.size(1), hd = q.size(2);
  const int64_t n_kv = k.size(0), nk = k.size(1), group = n_heads / n_kv;
  const auto f32 = q.options().dtype(at::kFloat);
  PartialAttention r;
  if (nk == 0 || n_q == 0) {
    r.out = at::zeros({n_heads, n_q, hd}, f32);
    r.lse = at::full({n_heads, n_q}, kNegInf, f32);
    return r;
  }
  // Long pieces on the CPU in f32 (ring attention's passes): the blocked
  // kernel, by Model::Attention's rule, which also gives each row's lse.
  if (Model::BlockedAttentionPays(n_q, nk) && BlockedAttentionCpuSupports(q, k, v, q_pos, k_pos)) {
    r.out = BlockedAttentionCpuPartial(q, k, v, q_pos, k_pos, &r.lse, MathThreads());
    return r;
  }
  std::vector<at::Tensor> outs, lses;
  const int64_t block = QueryBlock(n_heads, nk);
  const KeyRange range(q_pos, k_pos);
  for (int64_t b0 = 0; b0 < n_q; b0 += block) {
    const int64_t nb = std::min(block, n_q - b0);
    const auto [lo, nk_b] = range.For(b0, nb);
    if (nk_b == 0) {  // every key of the piece lies after the whole block
      outs.push_back(at::zeros({n_kv, group, nb, hd}, f32));
      lses.push_back(at::full({n_kv, group, nb}, kNegInf, f32));
      continue;
    }
    at::Tensor s = Scores(q, k, q_pos, k_pos, b0, nb, lo, nk_b);
    at::Tensor m = std::get<0>(s.max(3, /*keepdim=*/true));  // [Hkv, g, nb, 1]
    at::Tensor m_safe = at::where(at::isinf(m), at::zeros_like(m), m);
    at::Tensor p = at::exp(s - m_safe);
    at::Tensor l = p.sum(3, /*keepdim=*/true);
    at::Tensor o =
        at::bmm(p.to(v.scalar_type()).view({n_kv, group * nb, nk_b}), v.narrow(1, 0, nk_b))
            .view({n_kv, group, nb, hd})
            .to(at::kFloat);
    at::Tensor l_safe = at::where(l > 0, l, at::ones_like(l));
    outs.push_back(o / l_safe);
    lses.push_back((m_safe + at::log(l)).squeeze(3));  // log(0) = -inf: nothing visible
  }
  r.out = (outs.size() == 1 ? outs[0] : at::cat(outs, 2)).reshape({n_heads, n_q, hd});
  r.lse = (lses.size() == 1 ? lses[0] : at::cat(lses, 2)).reshape({n_heads, n_q});
  return r;
}

void MergePartial(PartialAttention* acc, const PartialAttention& part) {
  if (!acc->out.defined()) {
    *acc = part;
    return;
  }
  at::Tensor m = at::maximum(acc->lse, part.lse);
  at::Tensor m_safe = at::where(at::isinf(m), at::zeros_like(m), m);
  at::Tensor ea = at::exp(acc->lse - m_safe), eb = at::exp(part.lse - m_safe);
  at::Tensor s = ea + eb;
  at::Tensor s_safe = at::where(s > 0, s, at::ones_like(s));
  acc->out = (acc->out * ea.unsqueeze(2) + part.out * eb.unsqueeze(2)) / s_safe.unsqueeze(2);
  acc->lse = m_safe + at::log(s);
}

std::pair<at::Tensor, at::Tensor> ColumnStats(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& q_pos, const at::Tensor& k_pos,
                                              const at::Tensor& lse) {
  const int64_t n_heads = q.size(0), n_q = q.size(1);
  const int64_t n_kv = k.size(0), nk = k.size(1), group = n_heads / n_kv;
  const auto f64 = at::TensorOptions().dtype(at::kDouble);
  at::Tensor sum = at::zeros({nk}, f64), sum_sq = at::zeros({nk}, f64);
  if (nk == 0 || n_q == 0) return {sum, sum_sq};
  at::Tensor lse4 = lse.reshape({n_kv, group, n_q, 1});
  const int64_t block = QueryBlock(n_heads, nk);
  const KeyRange range(q_pos, k_pos);
  for (int64_t b0 = 0; b0 < n_q; b0 += block) {
    const int64_t nb = std::min(block, n_q - b0);
    const auto [lo, nk_b] = range.For(b0, nb);
    if (nk_b == 0) continue;  // probability 0 for every key of the piece
    at::Tensor p = at::exp(Scores(q, k, q_pos, k_pos, b0, nb, lo, nk_b) - lse4.narrow(2, b0, nb));
    at::Tensor a = p.view({n_heads, nb, nk_b}).mean(0).to(at::kDouble).cpu();  // [nb, nk_b]
    sum.narrow(0, 0, nk_b) += a.sum(0);
    sum_sq.narrow(0, 0, nk_b) += a.pow(2).sum(0);
  }
  return {sum, sum_sq};
}

absl::StatusOr<at::Tensor> RingAttention(SequenceParallelGroup* group, const at::Tensor& q,
                                         const at::Tensor& q_pos, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& k_pos,
                                         const std::vector<int64_t>& rows) {
  const int n = group->world_size(), me = group->rank();
  const int64_t n_q = q.size(1);
  const int64_t n_kv = k.size(0), hd = k.size(2);
  int64_t q_max = -1;
  if (n_q > 0) q_max = q_pos.max().item<int64_t>();
  // One message per block: K and V packed [2, Hkv, n, hd], positions beside.
  at::Tensor cur_kv = at::stack({k, v}).contiguous();
  at::Tensor cur_pos = k_pos.to(at::kLong).contiguous();
  PartialAttention acc;
  for (int step = 0; step < n; ++step) {
    const int origin = (me - step + n) % n;  // whose block cur_* is
    std::unique_ptr<PendingExchange> ex;
    at::Tensor next_kv, next_pos;
    if (step + 1 < n) {
      const int64_t m = rows[(me - step - 1 + n) % n];
      next_kv = at::empty({2, n_kv, m, hd}, cur_kv.options());
      next_pos = at::empty({m}, cur_pos.options());
      ex = group->StartRingExchange({cur_kv, cur_pos}, {next_kv, next_pos});
    }
    if (n_q > 0 && rows[origin] > 0 && cur_pos.min().item<int64_t>() <= q_max) {
      MergePartial(&acc, AttendPiece(q, cur_kv[0], cur_kv[1], q_pos, cur_pos));
    }
    if (ex) {
      if (absl::Status s = group->Wait(std::move(ex)); !s.ok()) return s;
      cur_kv = next_kv;
      cur_pos = next_pos;
    }
  }
  if (!acc.out.defined()) return at::zeros({q.size(0), n_q, q.size(2)}, q.options());
  return acc.out.to(q.scalar_type());
}

}  // namespace infoflow
