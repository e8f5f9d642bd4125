// Export of a Hugging Face LLaMA-architecture model directory (config.json,
// safetensors, tokenizer.json) as a GGUF file that llama.cpp loads as
// `general.architecture = llama` and evaluates to the same function as the
// engine (docs/DESIGN.md, "GGUF export"). Torch-free.
//
// What is written:
//   - llama.* hyper-parameters from config.json (context_length,
//     embedding_length, block_count, feed_forward_length, head counts,
//     key/value_length, rope.dimension_count, rope.freq_base,
//     layer_norm_rms_epsilon, vocab_size; linear rope scaling as
//     rope.scaling.type/factor; Llama-3 rope scaling as the rope_freqs.weight
//     tensor of per-frequency divisors, as llama.cpp expects);
//   - tensors token_embd, output_norm, output (left out when the embeddings
//     are tied: llama.cpp then reuses token_embd), blk.N.attn_norm, attn_q,
//     attn_k, attn_v, attn_output, ffn_norm, ffn_gate, ffn_up, ffn_down.
//     Shapes are the HF shapes reversed (ggml lists the contiguous dim first).
//     1-D tensors are always F32; matrices are F32 or F16 (`dtype`).
//   - attn_q / attn_k rows permuted per head: the engine (like HF) rotates
//     dim i with dim i + head_dim/2 ("rotate half"), llama.cpp's llama
//     architecture rotates dim 2i with 2i+1; GGUF row 2i + j of a head is HF
//     row j * head_dim/2 + i (j = 0, 1), so q.k products are unchanged.
//   - the tokenizer: byte-level BPE only (tokenizer.ggml.model "gpt2"):
//     tokens by id (ids the file lacks up to vocab_size become "[PAD<id>]",
//     type UNUSED), token_type (NORMAL, CONTROL for special added tokens,
//     USER_DEFINED for other added tokens), merges as "a b", bos/eos/padding
//     ids from config.json, add_bos_token from the post_processor, and
//     tokenizer.ggml.pre naming llama.cpp's pre-tokenizer regex.
//
// Refused (InvalidArgument naming the reason): model types other than llama
// and mistral (qwen2/qwen3/glm/glm4 differ: QKV bias, q/k norms, partial or
// interleaved RoPE, sandwich norms), attention_bias, a tokenizer that is not
// byte-level BPE, and a pre-tokenizer whose split rule llama.cpp does not
// have (e.g. models/infoflow-tiny's 1-2 digit split) unless `tokenizer_pre`
// names one explicitly (then digit runs may tokenize differently; token ids
// fed directly are unaffected).
#ifndef INFOFLOW_ENGINE_CHECKPOINT_GGUF_EXPORT_H_
#define INFOFLOW_ENGINE_CHECKPOINT_GGUF_EXPORT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/checkpoint/gguf_writer.h"

namespace infoflow {

struct GgufExportOptions {
  gguf::TensorType dtype = gguf::TensorType::kF32;  // Of the matrices.
  // llama.cpp pre-tokenizer name ("gpt-2", "llama-bpe", "qwen2", ...);
  // "" = detect it from tokenizer.json (refused when not recognised).
  std::string tokenizer_pre;
  std::string name;  // general.name; "" = the directory's base name.
};

struct GgufExportSummary {
  size_t num_tensors = 0;
  size_t num_kvs = 0;
  std::string tokenizer_pre;       // The name written.
  std::vector<std::string> notes;  // Things a user should know (printed by the CLI).
};

// The llama.cpp pre-tokenizer name for the text of a tokenizer.json, or
// NotFound (message: what the split rule is) when llama.cpp has no
// equivalent. Recognised: ByteLevel with its built-in GPT-2 regex -> "gpt-2";
// a Split with Llama-3's regex followed by ByteLevel without regex ->
// "llama-bpe"; the same with Qwen2's regex -> "qwen2".
absl::StatusOr<std::string> DetectLlamaCppPreTokenizer(const std::string& tokenizer_json);

// Permutes the rows of a [n_heads * head_dim, cols] row-major matrix from
// the rotate-half layout to llama.cpp's adjacent-pair layout (see above).
std::vector<float> PermuteRowsForAdjacentRope(const std::vector<float>& w, int64_t n_heads,
                                              int64_t head_dim, int64_t cols);

// Exports `model_dir` to `out_path`. Errors: those of the config, safetensors
// and tokenizer readers, the refusals above, and I/O errors naming the path.
absl::StatusOr<GgufExportSummary> ExportGguf(const std::string& model_dir,
                                             const std::string& out_path,
                                             const GgufExportOptions& options);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_CHECKPOINT_GGUF_EXPORT_H_
