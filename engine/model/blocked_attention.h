// Blocked (flash-style) attention on the CPU for long prefill and recompute.
//
// Why it exists: Model::Attention materialises, per block of query rows, the
// full row of scores over every visible key, masks it, runs softmax over it
// and multiplies by V: three passes over a score block of megabytes, torch
// dispatch per op, and OpenBLAS matmuls whose shapes (64 query rows, or 64
// head dims) are far from its best. This computes the same function in
// tiles: a tile of query rows against blocks of keys, S = Q K^T in
// registers, an online softmax (running max and sum per row, the partial
// output rescaled when the max grows) and O += P V, so no score matrix
// larger than one tile exists and every pass stays in L1/L2. Tiles of
// (kv head, query rows) are spread over the math cores.
//
// Masking is by position, as in Model::Attention: query i sees key j iff
// k_pos[j] <= q_pos[i], whatever the slot order. Keys are gathered into
// position order (a stable sort; none when already sorted) and queries too,
// so the keys a query sees are a prefix of the sorted keys: every tile reads
// only the keys up to its last query's position (causal prefill does about
// half of the full-mask work) and masks only its trailing key block(s).
// Repositioned, unsorted and duplicate positions are handled exactly.
//
// Numerics: f32 with f32 accumulation; q is multiplied by 1/sqrt(hd) first,
// as Model::Attention does; exp is a polynomial within 2 ulp. It differs
// from Model::Attention only in summation order and exp rounding (within
// 1e-5 on unit-scale inputs, pinned by tests/engine/blocked_attention_test.cc).
// A query row that sees no key is NaN, as there.
#ifndef INFOFLOW_ENGINE_MODEL_BLOCKED_ATTENTION_H_
#define INFOFLOW_ENGINE_MODEL_BLOCKED_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace infoflow {

// Which vector code BlockedAttentionCpu runs. kAuto picks the widest the CPU
// has; the others exist so tests can check every path on one machine (a
// path the CPU lacks falls back to the next narrower one).
enum class BlockedAttentionIsa { kAuto, kAvx512, kAvx2, kBaseline };

// True when BlockedAttentionCpu takes these inputs: q [H, nq, hd], k and v
// [Hkv, N, hd], all f32 on the CPU with unit stride along hd (KvCache views
// qualify), H a multiple of Hkv, hd a multiple of 16 and at most 512,
// q_pos [nq] and k_pos [N] int64 on the CPU.
bool BlockedAttentionCpuSupports(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                 const at::Tensor& q_pos, const at::Tensor& k_pos);

// Softmax attention of q over k, v where query i sees key j iff
// k_pos[j] <= q_pos[i]; query heads g*group .. g*group + group - 1 use kv
// head g (group = H / Hkv). Returns [H, nq, hd] f32 equal to
// Model::Attention(q, k, v, q_pos, k_pos, nullptr) up to summation order.
// Requires BlockedAttentionCpuSupports. Runs on `threads` threads (the
// caller's and threads - 1 started for the call; one for small calls); the
// result does not depend on the thread count. Under a YieldPolicy with
// max_rows > 0 it works in rounds of about max_rows query rows' worth of
// full-length work and calls YieldPoint() on the calling thread between them
// (bit-identical results either way).
at::Tensor BlockedAttentionCpu(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& q_pos, const at::Tensor& k_pos, int threads = 1,
                               BlockedAttentionIsa isa = BlockedAttentionIsa::kAuto);

// As BlockedAttentionCpu, for one piece of the keys (ring attention,
// engine/dist/): also returns in *lse each (head, query) row's log-sum-exp
// of its scaled visible scores, [H, nq] f32, and a row that sees no key gets
// output 0 and lse -inf instead of NaN, so pieces merge by online softmax.
at::Tensor BlockedAttentionCpuPartial(const at::Tensor& q, const at::Tensor& k,
                                      const at::Tensor& v, const at::Tensor& q_pos,
                                      const at::Tensor& k_pos, at::Tensor* lse, int threads = 1,
                                      BlockedAttentionIsa isa = BlockedAttentionIsa::kAuto);

// The path kAuto resolves to on this CPU (kAvx512, kAvx2 or kBaseline).
BlockedAttentionIsa BlockedAttentionBestIsa();

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_BLOCKED_ATTENTION_H_
