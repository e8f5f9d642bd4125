// Attention whose keys are spread over the ranks of a SequenceParallelGroup,
// merged exactly: each piece of keys gives a partial output normalized over
// its own keys plus its log-sum-exp per (head, query row); partials combine
// by online softmax (docs/DESIGN.md "Sequence parallelism"). Masking is by
// position, as Model::Attention: query i sees key j iff k_pos[j] <= q_pos[i].
#ifndef INFOFLOW_ENGINE_DIST_RING_ATTENTION_H_
#define INFOFLOW_ENGINE_DIST_RING_ATTENTION_H_

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/dist/sp_group.h"

namespace infoflow {

struct PartialAttention {
  at::Tensor out;  // [H, q, hd] f32, normalized over this piece's visible keys (0 if none)
  at::Tensor lse;  // [H, q] f32 log-sum-exp of the scaled scores (-inf if none visible)
};

// q [H, q, hd] over k, v [Hkv, n, hd] (GQA: kv head j serves query heads
// j*H/Hkv..). Scale 1/sqrt(hd), as Model::Attention.
PartialAttention AttendPiece(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             const at::Tensor& q_pos, const at::Tensor& k_pos);

// Combines `part` into `acc` (an undefined acc takes part as is). Exact up
// to rounding: softmax over the union of both pieces' keys.
void MergePartial(PartialAttention* acc, const PartialAttention& part);

// Head-mean attention probabilities of q over k (the keys of one piece) under
// the *global* normalization `lse` [H, q], summed over query rows: what
// Model::Attention's AttentionColumnStats give when k is part of all keys.
// Returns {sum, sum_sq}, each [n] f64 on the CPU.
std::pair<at::Tensor, at::Tensor> ColumnStats(const at::Tensor& q, const at::Tensor& k,
                                              const at::Tensor& q_pos, const at::Tensor& k_pos,
                                              const at::Tensor& lse);

// Ring attention: this rank's query rows q [H, q, hd] (q may have 0 rows:
// the rank then only passes keys on) attend to the keys of every rank. Rank
// r holds k, v [Hkv, n_r, hd] at k_pos [n_r]; rows[r] = n_r for every rank
// (all ranks know them). The blocks travel N-1 steps around the ring; the
// next block is in flight while the current one is attended. A block whose
// keys all lie after every query is passed on without being attended.
// Returns [H, q, hd] in q's dtype. UNAVAILABLE naming the rank on a
// failed exchange.
absl::StatusOr<at::Tensor> RingAttention(SequenceParallelGroup* group, const at::Tensor& q,
                                         const at::Tensor& q_pos, const at::Tensor& k,
                                         const at::Tensor& v, const at::Tensor& k_pos,
                                         const std::vector<int64_t>& rows);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DIST_RING_ATTENTION_H_
