#include "engine/model/kv_cache.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace infoflow {

KvCache::KvCache(int n_layers) : k_(n_layers), v_(n_layers) {}

at::Tensor KvCache::keys(int layer) const { return k_[layer].narrow(1, 0, length_); }
at::Tensor KvCache::values(int layer) const { return v_[layer].narrow(1, 0, length_); }
at::Tensor KvCache::positions() const {
  if (!positions_.defined()) return at::empty({0}, at::kLong);
  return positions_.narrow(0, 0, length_);
}

int64_t KvCache::AppendPositions(const at::Tensor& positions) {
  const int64_t first = length_;
  const int64_t m = positions.size(0);
  const int64_t need = length_ + m;
  if (!positions_.defined() || positions_.size(0) < need) {
    const int64_t cap = std::max<int64_t>(need, positions_.defined() ? 2 * positions_.size(0) : need);
    at::Tensor grown = at::empty({cap}, positions.options().dtype(at::kLong));
    if (length_ > 0) grown.narrow(0, 0, length_).copy_(positions_.narrow(0, 0, length_));
    positions_ = grown;
  }
  positions_.narrow(0, length_, m).copy_(positions);
  if (sorted_ && m > 0) {
    // Only the new entries and the one before them need checking.
    const int64_t from = std::max<int64_t>(0, length_ - 1);
    at::Tensor tail = positions_.narrow(0, from, need - from).cpu();
    const int64_t* p = tail.data_ptr<int64_t>();
    for (int64_t i = 1; i < tail.size(0) && sorted_; ++i) sorted_ = p[i - 1] <= p[i];
  }
  length_ = need;
  return first;
}

void KvCache::SetPositions(const at::Tensor& slots, const at::Tensor& positions) {
  positions_.index_copy_(0, slots, positions);
  RecheckSorted();
}

void KvCache::RecheckSorted() {
  sorted_ = true;
  if (length_ < 2) return;
  at::Tensor pos = positions().cpu().contiguous();
  const int64_t* p = pos.data_ptr<int64_t>();
  for (int64_t i = 1; i < length_ && sorted_; ++i) sorted_ = p[i - 1] <= p[i];
}

void KvCache::EnsureCapacity(int64_t n, const at::Tensor& like_k, const at::Tensor& like_v) {
  for (int l = 0; l < n_layers(); ++l) {
    if (k_[l].defined() && k_[l].size(1) >= n) continue;
    const int64_t old_cap = k_[l].defined() ? k_[l].size(1) : 0;
    const int64_t cap = std::max<int64_t>(n, 2 * old_cap);
    at::Tensor nk = at::empty({like_k.size(0), cap, like_k.size(2)}, like_k.options());
    at::Tensor nv = at::empty({like_v.size(0), cap, like_v.size(2)}, like_v.options());
    if (old_cap > 0) {
      nk.narrow(1, 0, old_cap).copy_(k_[l]);
      nv.narrow(1, 0, old_cap).copy_(v_[l]);
    }
    k_[l] = nk;
    v_[l] = nv;
  }
}

void KvCache::Reserve(int64_t n, int64_t n_kv_heads, int64_t head_dim,
                      const at::TensorOptions& options) {
  const at::Tensor like = at::empty({n_kv_heads, 0, head_dim}, options);
  EnsureCapacity(n, like, like);
  if (!positions_.defined() || positions_.size(0) < n) {
    at::Tensor grown = at::empty({n}, options.dtype(at::kLong));
    if (length_ > 0) grown.narrow(0, 0, length_).copy_(positions_.narrow(0, 0, length_));
    positions_ = grown;
  }
}

void KvCache::WriteAt(int layer, const at::Tensor& slots, const at::Tensor& k,
                      const at::Tensor& v) {
  EnsureCapacity(length_, k, v);
  k_[layer].index_copy_(1, slots, k.to(k_[layer].dtype()));
  v_[layer].index_copy_(1, slots, v.to(v_[layer].dtype()));
}

void KvCache::WriteRange(int layer, int64_t first, const at::Tensor& k, const at::Tensor& v) {
  EnsureCapacity(length_, k, v);
  k_[layer].narrow(1, first, k.size(1)).copy_(k);
  v_[layer].narrow(1, first, v.size(1)).copy_(v);
}

void KvCache::WriteRows(int layer, const std::vector<KvCache*>& caches,
                        const std::vector<int64_t>& slots, const at::Tensor& k,
                        const at::Tensor& v) {
  const int64_t n_kv = k.size(0), hd = k.size(2);
  for (size_t b = 0; b < caches.size(); ++b) {
    KvCache& c = *caches[b];
    c.EnsureCapacity(c.length_, k, v);
    const at::Tensor &ck = c.k_[layer], &cv = c.v_[layer];
    const bool direct = k.device().is_cpu() && ck.device().is_cpu() &&
                        k.scalar_type() == ck.scalar_type() &&
                        v.scalar_type() == cv.scalar_type() && k.stride(2) == 1 &&
                        v.stride(2) == 1 && ck.is_contiguous() && cv.is_contiguous() &&
                        ck.size(0) == n_kv && ck.size(2) == hd;
    const int64_t bi = static_cast<int64_t>(b);
    if (!direct) {
      c.WriteRange(layer, slots[b], k.narrow(1, bi, 1), v.narrow(1, bi, 1));
      continue;
    }
    // [n_kv, capacity, hd] contiguous: head g's slot s is row g * capacity + s.
    const int64_t cap = ck.size(1), row = hd * k.element_size();
    const char* kp = static_cast<const char*>(k.data_ptr());
    const char* vp = static_cast<const char*>(v.data_ptr());
    char* ckp = static_cast<char*>(ck.data_ptr());
    char* cvp = static_cast<char*>(cv.data_ptr());
    for (int64_t g = 0; g < n_kv; ++g) {
      const int64_t dst = (g * cap + slots[b]) * row;
      std::memcpy(ckp + dst, kp + (g * k.stride(0) + bi * k.stride(1)) * k.element_size(), row);
      std::memcpy(cvp + dst, vp + (g * v.stride(0) + bi * v.stride(1)) * v.element_size(), row);
    }
  }
}

std::pair<at::Tensor, at::Tensor> KvCache::SlotsForWrite(int layer, int64_t first, int64_t m,
                                                           const at::Tensor& like_k,
                                                           const at::Tensor& like_v) {
  EnsureCapacity(length_, like_k, like_v);
  return {k_[layer].narrow(1, first, m), v_[layer].narrow(1, first, m)};
}

void KvCache::Truncate(int64_t n) {
  length_ = std::min(length_, std::max<int64_t>(n, 0));
  if (!sorted_) RecheckSorted();
}

KvCache KvCache::Clone() const {
  KvCache c(n_layers());
  c.length_ = length_;
  c.sorted_ = sorted_;
  if (positions_.defined()) c.positions_ = positions_.narrow(0, 0, length_).clone();
  for (int l = 0; l < n_layers(); ++l) {
    if (!k_[l].defined()) continue;
    c.k_[l] = keys(l).clone();
    c.v_[l] = values(l).clone();
  }
  return c;
}

int64_t KvCache::bytes() const {
  int64_t total = 0;
  for (int l = 0; l < n_layers(); ++l) {
    if (!k_[l].defined()) continue;
    total += length_ * (k_[l].size(0) * k_[l].size(2) * k_[l].element_size() +
                        v_[l].size(0) * v_[l].size(2) * v_[l].element_size());
  }
  return total;
}

}  // namespace infoflow
