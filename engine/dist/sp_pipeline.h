// One query over a SequenceParallelGroup (docs/DESIGN.md "Sequence
// parallelism"). The chunks are split across the ranks contiguously, in
// request order; rank r holds the K/V of its share only (rank 0 also the
// prefix and, later, the question and prompt rows), at global positions.
//   FULL         every token prefilled with ring attention (the baseline).
//   NONE         reposition only.
//   INFOFLOW     each rank scores its share: the question's rows live on
//                rank 0, their q is broadcast per layer, every rank attends
//                them over its keys, the partials (out, log-sum-exp) are
//                gathered and merged, and each rank takes the column
//                statistics of its own keys under the global normalization.
//                The scores are gathered, every rank runs the same SelectTopK
//                on the same numbers (so the selection is one process's),
//                and the selected rows are recomputed with ring attention.
//   INFOFLOW_BLEND  the same plus the layer-1 deviation of the probed rows
//                (layer 0 by ring attention), recomputed from layer 1 on.
// The prompt's rows (rank 0) run with ring attention too: in the same pass
// as FULL's and INFOFLOW's context rows (exact: the prompt's layer l reads
// only the context's layer-l K/V), in a pass of their own for NONE and
// INFOFLOW_BLEND. Rank 0 samples the first token from the last prompt row. Decode: the other ranks send their cache to rank 0, which
// decodes alone (Decode of engine/decode/); see DESIGN for why.
// Reordering is not supported here (InvalidArgument).
#ifndef INFOFLOW_ENGINE_DIST_SP_PIPELINE_H_
#define INFOFLOW_ENGINE_DIST_SP_PIPELINE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/blend/method.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/decode/decode.h"
#include "engine/dist/sp_group.h"
#include "engine/model/model.h"

namespace infoflow {

// Which chunks and context indices each rank holds.
struct ShardLayout {
  int world_size = 1;
  int64_t n_prefix = 0, n_ctx = 0;
  std::vector<int> chunk_begin, chunk_end;  // per rank, [begin, end) in request order
  std::vector<int64_t> ctx_begin, ctx_end;  // per rank, context indices
};

// Chunk i goes to the rank whose equal share of the tokens holds the chunk's
// middle token: contiguous, monotone, about n_ctx / N tokens each (a rank may
// get none when there are fewer chunks than ranks).
ShardLayout SplitChunks(const std::vector<int64_t>& chunk_lengths, int64_t n_prefix,
                        int world_size);

// What every rank is given: the query's ids and chunk lengths (small), and
// the K/V of its own chunks only.
struct ShardedQueryInput {
  std::vector<int32_t> prefix_ids;
  std::shared_ptr<const ChunkKv> prefix_kv;  // rank 0 only; optional, as QueryInput's
  std::vector<int64_t> chunk_lengths;        // every chunk, request order
  // This rank's chunks, SplitChunks order (chunk_begin..chunk_end of this rank).
  std::vector<std::shared_ptr<const ChunkKv>> local_chunks;
  PrefixMode chunk_prefix_mode = PrefixMode::kBos;
  bool first_chunk_lossy = false;  // whether chunk 0's record is lossy (all ranks)
  std::vector<int32_t> question_ids;
  std::vector<int32_t> prompt_ids;
};

struct ShardedQueryResult {
  RecomputePlan plan;       // same on every rank (scores: empty)
  at::Tensor first_logits;  // rank 0: [1, vocab] f32 after the prompt
  DecodeResult decode;      // rank 0
  double ttft_ms = 0;       // rank 0: start to first sampled token
  int64_t bytes_sent = 0;   // by this rank during the query
  int64_t kv_bytes = 0;     // this rank's context cache before the gather
};

// The methods a group runs: FULL (as ring attention), NONE, INFOFLOW and
// INFOFLOW_BLEND.
bool ShardedMethodSupported(Method m);

// Runs the query on this rank; every rank of `group` must call it with the
// same method, options and metadata. Methods: FULL, NONE, INFOFLOW,
// INFOFLOW_BLEND (others: Unimplemented). UNAVAILABLE naming the rank when a
// peer dies or stalls past the group's timeout.
absl::StatusOr<ShardedQueryResult> RunShardedQuery(const Model& model, SequenceParallelGroup* group,
                                                   const ShardedQueryInput& input,
                                                   const MethodOptions& options,
                                                   const DecodeOptions& decode,
                                                   const Tokenizer* tokenizer,
                                                   const TokenCallback& on_token);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_DIST_SP_PIPELINE_H_
