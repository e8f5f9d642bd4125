// KV state of the engine, in the two forms the pipeline needs.
//
// ChunkKv is what ingest produces and the store keeps: per layer K *before*
// RoPE and V for the tokens of one chunk, computed with that chunk alone.
// Because K is pre-RoPE, placing the chunk at any global offset later is exact.
//
// KvCache is run state: per layer K *with* RoPE applied at `positions`, and V,
// for every token a forward pass may attend to. Attention masks by position
// (a query at position p sees keys with position <= p), so the cache may hold
// tokens in any order and any subset can be recomputed in place.
//
// Neither type is thread-safe; one request owns one KvCache.
#ifndef INFOFLOW_ENGINE_MODEL_KV_CACHE_H_
#define INFOFLOW_ENGINE_MODEL_KV_CACHE_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace infoflow {

struct ChunkKv {
  std::vector<int32_t> token_ids;
  std::vector<at::Tensor> k;  // per layer [n_kv_heads, n_tokens, head_dim], pre-RoPE
  std::vector<at::Tensor> v;  // per layer [n_kv_heads, n_tokens, head_dim]
  // True when K/V went through a lossy codec (a quantized record): then even
  // the first chunk's cached KV is not exact, and the selection may not skip it.
  bool lossy = false;
  int64_t size() const { return static_cast<int64_t>(token_ids.size()); }
};

class KvCache {
 public:
  // An empty cache for `n_layers` layers; tensors are allocated on first use
  // with the dtype/device of the first K written.
  explicit KvCache(int n_layers);

  int n_layers() const { return static_cast<int>(k_.size()); }
  int64_t size() const { return length_; }

  // Views of the first size() entries: K [n_kv, N, hd] (RoPE applied), V, and
  // positions [N] int64. Valid until the next Append/Reserve.
  at::Tensor keys(int layer) const;
  at::Tensor values(int layer) const;
  at::Tensor positions() const;

  // Grows the logical size by positions.size(0) and records their positions;
  // the new K/V rows of each layer are then written with WriteAt(layer,
  // old_size + i ...). Returns the index of the first new slot.
  int64_t AppendPositions(const at::Tensor& positions);

  // Replaces the positions of existing slots ([m] int64 each < size()).
  void SetPositions(const at::Tensor& slots, const at::Tensor& positions);

  // Writes k, v ([n_kv, m, hd]) into the slots `slots` ([m] int64, each
  // < size()) of `layer`.
  void WriteAt(int layer, const at::Tensor& slots, const at::Tensor& k, const at::Tensor& v);
  // Same for a contiguous slot range [first, first + m).
  void WriteRange(int layer, int64_t first, const at::Tensor& k, const at::Tensor& v);
  // DecodeStep's write: row b of k, v ([n_kv, B, hd]) into slot slots[b]
  // (< that cache's size()) of caches[b]'s `layer`, for B distinct caches.
  // On the CPU with the cache's dtype it is a plain copy per head: B
  // WriteAt calls cost more in dispatch than in copying at batch 16.
  static void WriteRows(int layer, const std::vector<KvCache*>& caches,
                        const std::vector<int64_t>& slots, const at::Tensor& k,
                        const at::Tensor& v);
  // Views of the K and V slots [first, first + m) of `layer` ([n_kv, m, hd]
  // each) for the caller to write in place, e.g. rotated keys straight into
  // the cache (Model::RotateInto) instead of through a temporary. `like_k`
  // and `like_v` give head count, head dim, dtype and device when the cache
  // has no storage yet. Slots must be < size() (after AppendPositions).
  std::pair<at::Tensor, at::Tensor> SlotsForWrite(int layer, int64_t first, int64_t m,
                                                  const at::Tensor& like_k,
                                                  const at::Tensor& like_v);

  // True when positions never decrease with slot index (e.g. after a plain
  // prefill or reposition). Attention then skips keys past each query
  // block's last position instead of masking them.
  bool positions_sorted() const { return sorted_; }

  // Makes room for `n` slots in every layer without changing size(), so
  // appends up to n never reallocate (each growth copies the whole cache).
  // The first K/V written must then have n_kv_heads, head_dim, dtype and
  // device of `options` as given here.
  void Reserve(int64_t n, int64_t n_kv_heads, int64_t head_dim, const at::TensorOptions& options);

  // Drops every slot at index >= n (e.g. question tokens after scoring).
  void Truncate(int64_t n);

  // Deep copy (for running several methods on one merged context).
  KvCache Clone() const;

  // Total bytes of K and V in use.
  int64_t bytes() const;

 private:
  void EnsureCapacity(int64_t n, const at::Tensor& like_k, const at::Tensor& like_v);

  std::vector<at::Tensor> k_;  // [n_kv, capacity, hd]
  std::vector<at::Tensor> v_;
  at::Tensor positions_;  // [capacity] int64
  int64_t length_ = 0;
  bool sorted_ = true;
  void RecheckSorted();
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_KV_CACHE_H_
