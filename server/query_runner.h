// QueryRunner: one Query request end to end over the engine -- resolve the
// chunks (ChunkResolver), build the prompt from the template, run the
// pipeline (engine/blend/pipeline.h RunQuery) streaming tokens, and summarise the
// run as a report. The gRPC service only translates to and from this.
//
// Thread-safe; one Run per request thread.
#ifndef INFOFLOW_SERVER_QUERY_RUNNER_H_
#define INFOFLOW_SERVER_QUERY_RUNNER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/chunk_resolver.h"

namespace infoflow {
enum class Method;
enum class Deviation;
}

namespace infoflow::server {

struct QuerySpec {
  std::vector<ChunkRef> chunks;
  PrefixMode prefix_mode;
  std::string prompt_template;  // contains "{question}" (or the question is appended)
  std::string question;
  Method method;
  double ratio = 0.15;
  bool reorder = false;
  std::vector<int> scoring_layers;
  int lego_k = 4;
  Deviation deviation{};  // value 0 = Deviation::kV (engine/blend/method.h)
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
  int max_new_tokens = 64;
  std::vector<std::string> stop;
  // Filled by QueryRunner::Prepare.
  std::vector<int32_t> question_ids;
  std::vector<int32_t> prompt_ids;  // rendered template + question
};

// The server's per-query limits (ServerOptions) and the model's positions.
struct QueryLimits {
  int64_t max_context_tokens = 8192;
  int64_t max_prompt_tokens = 2048;
  int64_t max_positions = 0;  // the model's max_position_embeddings; 0 = unknown
  bool allow_beyond_model_positions = false;
};

struct QueryOutcome {
  double ttft_ms = 0;  // from Run's start to the first token
  double fetch_ms = 0;
  double reposition_ms = 0, score_ms = 0, select_ms = 0, reorder_ms = 0, recompute_ms = 0,
         prompt_ms = 0, first_token_ms = 0, decode_ms = 0;
  int64_t context_tokens = 0;
  int64_t recomputed_tokens = 0;
  int64_t prefilled_tokens = 0;  // chunk tokens prefilled now (write-through)
  int chunk_hits = 0, chunk_misses = 0;
  std::vector<int> chunk_order;
  std::vector<std::string> chunk_keys;
  std::string stop_reason;  // StopReasonName
  bool cancelled = false;
  int64_t generated_tokens = 0;
  std::string text;
  // Positions the query may use: prefix + context + prompt + max_new_tokens.
  int64_t positions = 0;
  bool beyond_model_positions = false;  // positions > max_position_embeddings
};

// Receives each generated token; return false to cancel.
using TokenSink = std::function<bool(int32_t id, std::string_view text)>;

// Prompt = template with every "{question}" replaced by `question`, or
// template + question when it has no placeholder; empty template = "\n{question}\n".
std::string RenderPrompt(const std::string& prompt_template, const std::string& question);

// Bytes RenderPrompt would return, computed without building the string (a
// small template that repeats the placeholder can expand a lot).
uint64_t RenderedPromptBytes(const std::string& prompt_template, const std::string& question);

class QueryRunner {
 public:
  // Pointers must outlive the runner.
  QueryRunner(const Model* model, const Tokenizer* tokenizer, const ChunkResolver* resolver,
              const QueryLimits& limits);

  // Checks the prompt and the question against the limits and tokenizes
  // them into spec->prompt_ids / question_ids. Cheap and bounded (the byte
  // length is checked before tokenizing); call before queueing the request.
  // InvalidArgument naming `question` or `prompt_template` and the limit.
  absl::Status Prepare(QuerySpec* spec) const;

  // Runs a Prepare'd spec. Before any prefill: InvalidArgument when the
  // context is over max_context_tokens, OutOfRange when prefix + context +
  // prompt + max_new_tokens exceed the model's positions (unless allowed);
  // the resolver's and the pipeline's errors as they are.
  absl::StatusOr<QueryOutcome> Run(const QuerySpec& spec, const TokenSink& sink) const;

 private:
  const Model* model_;
  const Tokenizer* tokenizer_;
  const ChunkResolver* resolver_;
  QueryLimits limits_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_QUERY_RUNNER_H_
