// QueryRunner: one Query request end to end over the engine -- resolve the
// chunks (ChunkResolver), build the prompt from the template, run the
// pipeline (engine/pipeline.h RunQuery) streaming tokens, and summarise the
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
  float temperature = 0, top_p = 1;
  uint64_t seed = 0;
  int max_new_tokens = 64;
  std::vector<std::string> stop;
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
};

// Receives each generated token; return false to cancel.
using TokenSink = std::function<bool(int32_t id, std::string_view text)>;

// Prompt = template with every "{question}" replaced by `question`, or
// template + question when it has no placeholder; empty template = "\n{question}\n".
std::string RenderPrompt(const std::string& prompt_template, const std::string& question);

class QueryRunner {
 public:
  // Pointers must outlive the runner.
  QueryRunner(const Model* model, const Tokenizer* tokenizer, const ChunkResolver* resolver,
              int64_t max_context_tokens);

  // InvalidArgument when the context is over max_context_tokens or the
  // pipeline refuses the options; the resolver's errors as they are.
  absl::StatusOr<QueryOutcome> Run(const QuerySpec& spec, const TokenSink& sink) const;

 private:
  const Model* model_;
  const Tokenizer* tokenizer_;
  const ChunkResolver* resolver_;
  int64_t max_context_tokens_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_QUERY_RUNNER_H_
