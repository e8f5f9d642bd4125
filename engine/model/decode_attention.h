// Decode attention on the CPU: one query row per request, each over its own
// cache, in plain C++ (what Model::DecodeStep runs on the CPU).
//
// Why it exists: Model::Attention is a dozen torch ops (narrow, matmul,
// masked_fill, softmax, bmm, cat...) per call, each microseconds of
// dispatch, and a decode step called it, plus an index_copy_ of the new
// K/V, once per request per layer for a single query row. This does the
// same math as one loop over (request, kv head) with no torch call inside,
// reading each K and V row once for all the query heads that share it
// (GQA), split over the math cores, the softmax's exp vectorized. Measured,
// 6 layers of the bench model (8/4 heads, hd 64) at batch 16 on a shared
// 2-core VM: 200-token caches ~5.8 -> ~2.8 ms, 5376-token caches ~85 ->
// ~59 ms. (The rest of a batch-16 step is mostly the o/QKV/MLP matmuls:
// OpenBLAS sgemm packs the weights per call, ~1.4x the batch-1 gemv.)
//
// The math is Model::Attention's for one query row: query heads
// h = g*group .. g*group+group-1 use kv head g; scores q.k * (1/sqrt(hd))
// over the keys with position <= the query's position (any slot order),
// softmax with the max subtracted, then the probability-weighted sum of V.
// f32 throughout with f32 accumulation; it differs from Model::Attention
// only by summation order (within 1e-5, pinned by tests/engine/
// batch_decode_test.cc).
#ifndef INFOFLOW_ENGINE_MODEL_DECODE_ATTENTION_H_
#define INFOFLOW_ENGINE_MODEL_DECODE_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <vector>

namespace infoflow {

// True when DecodeAttentionCpu takes these inputs: q [H, B, hd] and every
// keys[b] / values[b] [Hkv, N_b, hd] f32 on the CPU, unit stride along hd
// (any stride between heads and rows: KvCache views qualify), hd a multiple
// of 8, one Hkv for all b with H a multiple of it, q_pos and every k_pos[b]
// int64 on the CPU.
// Otherwise callers use Model::Attention per row.
bool DecodeAttentionCpuSupports(const at::Tensor& q, const at::Tensor& q_pos,
                                const std::vector<at::Tensor>& keys,
                                const std::vector<at::Tensor>& values,
                                const std::vector<at::Tensor>& k_pos);

// Query row b of q ([H, B, hd]) at position q_pos[b] attends over keys[b],
// values[b] ([Hkv, N_b, hd]), seeing key j iff k_pos[b][j] <= q_pos[b].
// Returns [H, B, hd] f32, row b equal to Model::Attention(q.narrow(1, b, 1),
// keys[b], values[b], q_pos.narrow(0, b, 1), k_pos[b], nullptr) up to
// summation order. A row with no visible key is NaN, as there. Requires
// DecodeAttentionCpuSupports. With `threads` > 1 and enough keys the
// (request, kv head) pairs are split over that many threads (the caller's
// and threads - 1 started for the call); the result is the same bit for bit.
at::Tensor DecodeAttentionCpu(const at::Tensor& q, const at::Tensor& q_pos,
                              const std::vector<at::Tensor>& keys,
                              const std::vector<at::Tensor>& values,
                              const std::vector<at::Tensor>& k_pos, int threads = 1);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_DECODE_ATTENTION_H_
