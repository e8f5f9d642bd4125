// A LLaMA-family decoder (LLaMA 2/3, Mistral, Qwen2, Qwen3, GLM, GLM-4) in
// libtorch. GLM's differences are config fields (partial interleaved RoPE,
// QKV bias, GLM-4's sandwich norms; docs/DESIGN.md "GLM and GLM-4").
//
// Config, weights and run state are kept apart (llama2.c style): ModelConfig
// is plain data, ModelWeights holds tensors, and all per-request state lives in
// the caller's KvCache. A Model is immutable after Load and safe to use from
// several threads at once, each with its own KvCache.
//
// The one primitive is Forward(tokens, positions, slots, cache): the tokens'
// K/V are written into `cache` at `slots`, then each token attends to every
// cache entry whose position <= its own position. Prefill, decode, scoring and
// selective recompute are all this call with different slots and positions.
// DecodeStep is its batched form for serving: one new token for each of B
// requests, each with its own cache. Long work calls YieldPoint()
// (engine/model/yield_point.h) between bounded pieces so a serving loop can
// interleave it with decode steps.
#ifndef INFOFLOW_ENGINE_MODEL_MODEL_H_
#define INFOFLOW_ENGINE_MODEL_MODEL_H_

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/kv_cache.h"
#include "engine/checkpoint/model_config.h"

namespace infoflow {

struct LayerWeights {
  at::Tensor attn_norm;  // [d]
  at::Tensor wqkv;       // [(H + 2*Hkv) * hd, d]: q, k, v projections fused
  at::Tensor bqkv;       // [(H + 2*Hkv) * hd] or undefined (no attention bias)
  at::Tensor q_norm;     // [hd] or undefined (Qwen3 per-head RMSNorm)
  at::Tensor k_norm;     // [hd] or undefined
  at::Tensor wo;         // [d, H * hd]
  at::Tensor bo;         // [d] or undefined (Llama attention_bias; never Qwen2, GLM)
  at::Tensor post_attn_norm;  // [d] or undefined: GLM-4 norm of the attention output
  at::Tensor mlp_norm;   // [d]
  at::Tensor w_gate_up;  // [2 * intermediate, d]: gate and up fused (GLM stores it so)
  at::Tensor w_down;     // [d, intermediate]
  at::Tensor post_mlp_norm;   // [d] or undefined: GLM-4 norm of the MLP output
};

struct ModelWeights {
  at::Tensor embed;  // [vocab, d]
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [d]
  at::Tensor lm_head;     // [vocab, d]; the embedding when tied
};

struct LoadOptions {
  std::string device = "auto";  // "auto" (CUDA when available), "cpu", "cuda", "cuda:N"
  // Compute dtype: "auto" = f32 on CPU (bf16 matmuls are slow on many CPUs),
  // the checkpoint's dtype on CUDA. Or "f32", "bf16", "f16".
  std::string dtype = "auto";
};

// What a Forward call should return besides writing K/V into the cache.
struct ForwardOptions {
  enum class Logits { kNone, kLast, kAll };
  Logits logits = Logits::kLast;
  // Stop after this layer (inclusive); -1 runs every layer. Layers after it
  // write nothing into the cache. Scoring stops after its last scoring layer.
  int last_layer = -1;
  // Layers whose head-mean attention column statistics to return (what
  // InfoFlow scoring needs). Reduced block by block inside the attention, so
  // the memory is O(N) per layer, never O(H * q * N).
  std::vector<int> capture_attention;
  // Also return each layer's K before RoPE ([Hkv, q, hd]) for the new tokens:
  // what ingest stores.
  bool return_unrotated_keys = false;
};

// Column statistics of head-mean attention probabilities A[q, N] (softmax
// over all N cache entries visible to each query, then the mean over query
// heads), summed over the query rows: sum[t] = sum_q A[q, t] and
// sum_sq[t] = sum_q A[q, t]^2, both [N] f64 on the CPU.
struct AttentionColumnStats {
  at::Tensor sum;
  at::Tensor sum_sq;
};

struct ForwardResult {
  at::Tensor logits;  // [1, vocab] (kLast), [q, vocab] (kAll) or undefined
  at::Tensor hidden;  // [q, d] output of the last layer run (before final norm)
  std::map<int, AttentionColumnStats> attention;  // per capture_attention layer
  std::vector<at::Tensor> unrotated_keys;  // per layer run, if requested
};

// Optional extra outputs of one decoder layer.
struct LayerTrace {
  AttentionColumnStats* attention = nullptr;  // head-mean column stats
  at::Tensor* unrotated_keys = nullptr;  // [Hkv, q, hd] K before RoPE
};

class Model {
 public:
  // Loads config.json, generation_config.json when present (its eos ids are
  // stop ids too: ModelConfig::generation_eos_token_ids) and
  // model.safetensors (or a sharded index) from `dir`.
  static absl::StatusOr<std::unique_ptr<Model>> Load(const std::string& dir,
                                                     const LoadOptions& options = {});
  // Wraps weights already in memory (tests, training export).
  Model(ModelConfig config, ModelWeights weights, c10::Device device, c10::ScalarType dtype);

  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  c10::Device device() const { return device_; }
  c10::ScalarType dtype() const { return dtype_; }
  int n_layers() const { return static_cast<int>(config_.num_hidden_layers); }
  // Stable identity of this checkpoint (config + tensor names/shapes/dtypes +
  // a weight sample); set by Load, empty for in-memory models unless set.
  const std::string& fingerprint() const { return fingerprint_; }
  void set_fingerprint(std::string f) { fingerprint_ = std::move(f); }

  // Runs `tokens` ([q] int64) at `positions` ([q] int64). If `slots` is
  // undefined the tokens are appended to `cache`; else `slots` ([q] int64)
  // names existing cache entries to overwrite (their positions are replaced
  // by `positions`). Each query attends to cache entries with position <= its
  // own. Work is O(q * N) attention + O(q) MLP per layer.
  ForwardResult Forward(const at::Tensor& tokens, const at::Tensor& positions,
                        const at::Tensor& slots, KvCache* cache,
                        const ForwardOptions& options = {}) const;

  // The pieces Forward is made of, for callers that act between layers
  // (CacheBlend selects its tokens after layer 1).
  at::Tensor Embed(const at::Tensor& tokens) const;  // [q, d]
  // cos/sin tables [q, RotaryDim(config)] for `positions`, laid out for the
  // config's pairing (rotate-half: the frequencies twice, cat; interleaved:
  // each frequency twice in a row). Use them only with this model's Rotate.
  std::pair<at::Tensor, at::Tensor> RopeTables(const at::Tensor& positions) const;
  // One decoder layer for hidden states `h` [q, d] whose K/V go to `slots`.
  at::Tensor Layer(int layer, const at::Tensor& h, const at::Tensor& positions,
                   const std::pair<at::Tensor, at::Tensor>& rope, const at::Tensor& slots,
                   KvCache* cache, const LayerTrace& trace = {}) const;
  // The K (RoPE applied) and V that Layer(layer, h, ...) would write, each
  // [Hkv, q, hd], without touching a cache or attending: the projection
  // only (INFOFLOW_BLEND measures layer-1 staleness with it).
  std::pair<at::Tensor, at::Tensor> LayerKv(int layer, const at::Tensor& h,
                                            const std::pair<at::Tensor, at::Tensor>& rope) const;
  at::Tensor Logits(const at::Tensor& hidden) const;  // final norm + LM head

  // Layer(layer, h, ...) split at its attention, for callers that attend
  // elsewhere (engine/dist/: ring attention across processes). LayerQkv is
  // the layer's q [H, q, hd], k (RoPE applied) and v [Hkv, q, hd]; LayerOutput
  // is the rest of the layer for attention output attn [H, q, hd]. Layer ==
  // LayerOutput(h, Attention(LayerQkv(h) against the cache)).
  std::tuple<at::Tensor, at::Tensor, at::Tensor> LayerQkv(
      int layer, const at::Tensor& h, const std::pair<at::Tensor, at::Tensor>& rope) const {
    Qkv p = ProjectQkv(layer, h, rope, nullptr);
    return {p.q, p.k, p.v};
  }
  at::Tensor LayerOutput(int layer, const at::Tensor& h, const at::Tensor& attn) const {
    return OutputAndMlp(layer, h, attn);
  }

  // One decode step for B independent requests (continuous batching): token
  // b (tokens [B] int64) at positions[b] is appended to caches[b] (B
  // distinct caches). The norms, QKV projection, o_proj, MLP and LM head run
  // as one matmul over the B rows; RoPE uses each row's own position; K/V go
  // to each request's own cache and each row attends over its own cache
  // only. Returns logits [B, vocab] f32. On the CPU in f32 (with AVX2 and
  // FMA) the matmuls run SmallBatchLinearCpu, whose rows do not depend on
  // each other: row b is bit-identical whichever requests share the step.
  // Row b equals Forward of that token alone on caches[b] up to summation
  // order (the kernel and BLAS sum in other orders): within 1e-4, pinned by
  // a test.
  // Same thread-safety as Forward: the caches must not be used elsewhere.
  at::Tensor DecodeStep(const at::Tensor& tokens, const at::Tensor& positions,
                        const std::vector<KvCache*>& caches) const;

  // Applies RoPE at `positions` to k ([n_heads, T, hd]) exactly as the
  // forward does to q and k (the first RotaryDim dims, the config's
  // pairing; the rest unchanged); used to place pre-RoPE stored keys at
  // global positions.
  at::Tensor Rotate(const at::Tensor& k, const at::Tensor& positions) const;
  // Same with tables from RopeTables (reuse them across layers).
  at::Tensor Rotate(const at::Tensor& k, const std::pair<at::Tensor, at::Tensor>& rope) const;
  // Rotate(k, rope) written into `out` (same shape as k, any strides, e.g.
  // a slot range of a KvCache), bit-identical to it. Rotate-half pairing
  // does it with no temporary of k's size; `scratch` (may be undefined; then
  // allocated) holds one half-head product and is reused when it fits.
  void RotateInto(const at::Tensor& k, const std::pair<at::Tensor, at::Tensor>& rope,
                  at::Tensor out, at::Tensor* scratch) const;

  // Softmax attention of q [H, q, hd] over k, v [Hkv, N, hd] where query i
  // sees key j iff k_pos[j] <= q_pos[i]. With `keys_sorted` (k_pos
  // non-decreasing) each block of queries reads only the keys up to its last
  // position: causal prefill then does about half the work of a full mask.
  // Returns [H, q, hd]; `stats_out` (if non-null) gets the head-mean
  // probabilities' column statistics, accumulated per block of query rows.
  // Without `stats_out`, on the CPU in f32 and from a size on
  // (SetBlockedAttentionMinPairs) it runs the blocked, flash-style kernel
  // of engine/model/blocked_attention.h instead (no score matrix, threads
  // over MathThreads() cores; equal up to summation order, within 1e-5).
  static at::Tensor Attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const at::Tensor& q_pos, const at::Tensor& k_pos,
                              AttentionColumnStats* stats_out, bool keys_sorted = false);
  // Query x key pairs (q rows x N) from which Attention uses the blocked
  // kernel; process-wide, default 4096. Benchmarks set it past every call
  // to time the materialising path.
  static void SetBlockedAttentionMinPairs(int64_t pairs);
  // Whether Attention would run the blocked kernel for n_q query rows over
  // n_keys keys (size only; the caller checks BlockedAttentionCpuSupports):
  // ring attention's pieces (engine/dist/) follow the same rule.
  static bool BlockedAttentionPays(int64_t n_q, int64_t n_keys);

  // DecodeStep's attention: query row b of q [H, B, hd] at q_pos[b] ([B]
  // int64) attends over caches[b]'s `layer` only. Returns [H, B, hd]; row b
  // equals Attention(q.narrow(1, b, 1), caches[b]->keys(layer), ...) within
  // 1e-5 (summation order; pinned by a test). On the CPU in f32 it is one
  // plain C++ loop split over MathThreads() cores (engine/model/
  // decode_attention.h: per-row Attention cost dispatches per request and
  // ran on one core); otherwise Attention per row.
  static at::Tensor DecodeAttention(const at::Tensor& q, const at::Tensor& q_pos,
                                    const std::vector<KvCache*>& caches, int layer);

 private:
  // Which matmul runs the projections, where SmallBatchLinearCpu supports
  // the operands (engine/model/small_batch_linear.h: it reads the weights in
  // place, and a row's result does not depend on the other rows):
  //  - kByRows: SmallBatchLinearCpu for at most kInPlaceMaxRows rows (a
  //    question, a short chunk), BLAS (at::linear) above: OpenBLAS copies
  //    every weight matrix into its tile layout on each call, which a few
  //    dozen rows do not repay (a whole prefill of the bench model, 2
  //    threads: 8 tokens 5 ms against 11, 16 tokens 7 against 10, 32 tokens
  //    11.5 against 14, level from about 48: DESIGN §12);
  //  - kInPlace: SmallBatchLinearCpu at any row count, for decode steps,
  //    whose rows must not depend on which requests share the step.
  enum class Matmul { kByRows, kInPlace };
  static constexpr int64_t kInPlaceMaxRows = 48;
  static at::Tensor Linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                           Matmul matmul);
  // A layer's attention inputs for hidden states h [q, d]: RMSNorm, fused
  // QKV projection, Qwen3 q/k norms, RoPE. q [H, q, hd]; k (rotated), v
  // [Hkv, q, hd]. `unrotated_keys` (if non-null) gets K before RoPE.
  struct Qkv {
    at::Tensor q, k, v;
  };
  Qkv ProjectQkv(int layer, const at::Tensor& h, const std::pair<at::Tensor, at::Tensor>& rope,
                 at::Tensor* unrotated_keys, Matmul matmul = Matmul::kByRows) const;
  // The rest of a layer after attention: h + o_proj(attn), then the SwiGLU
  // MLP block (GLM-4: each block's output RMSNormed before its residual
  // add). attn [H, q, hd]; returns [q, d].
  at::Tensor OutputAndMlp(int layer, const at::Tensor& h, const at::Tensor& attn,
                          Matmul matmul = Matmul::kByRows) const;
  // Logits() with the given matmul for the LM head.
  at::Tensor LogitsWith(const at::Tensor& hidden, Matmul matmul) const;

  ModelConfig config_;
  ModelWeights weights_;
  c10::Device device_;
  c10::ScalarType dtype_;
  at::Tensor inv_freq_;  // [RotaryDim/2] f64
  std::string fingerprint_;
};

// Query rows processed by Model::Attention since process start, summed over
// layers: lets tests prove recompute work is proportional to k.
int64_t AttentionQueryRows();

// Resolves "auto" / "cpu" / "cuda[:N]" against what this libtorch supports.
absl::StatusOr<c10::Device> ResolveDevice(const std::string& name);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_MODEL_H_
