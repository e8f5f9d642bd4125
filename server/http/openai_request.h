// OpenAI request bodies (POST /v1/completions, /v1/chat/completions) to the
// gRPC QueryRequest that the Query path runs (server/services.h
// PrepareQuery / ExecuteQuery): the HTTP front end has no query logic of its
// own. Every field's type and range is checked here, before any work; what
// the Query path checks itself (chunk count and length, prompt and prefix
// tokens, positions) it checks for both transports.
//
// Body fields (OpenAI's names): model (required; must be the served model),
// prompt (a string, or an array of one) or messages, max_tokens (chat also
// max_completion_tokens), temperature [0, 2] (default 1, as OpenAI),
// top_p (0, 1], seed, stop (a string or up to 4), n (only 1), stream,
// min_tokens (vLLM's: no stop id is sampled before that many tokens),
// stream_options.include_usage; user is ignored; echo, logprobs, best_of > 1,
// suffix, logit_bias, penalties, tools are refused when set. The extension
// object "infoflow" gives the rest of QueryRequest:
//   {"method": "INFOFLOW", "ratio": 0.15, "reorder": false,
//    "chunks": [{"key": "<64 hex>"} | {"text": "..."}], "report": true,
//    "prefix_mode": "bos"|"none", "scoring_layers": [..], "lego_k": 4,
//    "deviation": "V"|"K", "stop_ids": [..], "parse_special": false}
//
// Pure functions; thread-safe.
#ifndef INFOFLOW_SERVER_HTTP_OPENAI_REQUEST_H_
#define INFOFLOW_SERVER_HTTP_OPENAI_REQUEST_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "infoflow/v1/infoflow.pb.h"
#include "server/http/blend_prompt.h"

namespace infoflow::server::http {

enum class Endpoint { kCompletions, kChatCompletions };

// What the parser needs to know about the server.
struct RequestContext {
  std::string model_name;       // the only model served (GET /v1/models)
  std::string separator;        // --blend-separator
  ChatFormat chat_format;       // renders messages
  int max_new_tokens = 512;     // --max-new-tokens: the largest max_tokens
};

struct OpenAiRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;
  infoflow::v1::QueryRequest query;  // ready for PrepareQuery
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool report = false;         // infoflow.report: the response carries the Report
  // Where query fields came from, for errors that name the body's field
  // (QueryError in http_errors.h).
  bool chunks_listed = false;                   // infoflow.chunks, not prompt pieces
  std::string max_tokens_field = "max_tokens";  // or max_completion_tokens
  // A chat request without max_tokens: the query's max_new_tokens is
  // --max-new-tokens, to be fitted to the positions left (QuerySpec::fit_new_tokens).
  bool max_tokens_default = false;
};

// max_tokens of a /v1/completions request that sends none: OpenAI's default.
inline constexpr int kCompletionsDefaultMaxTokens = 16;

// Nesting depth of JSON arrays and objects a body may have; deeper bodies
// are refused before they are parsed (no request drives a deep recursion).
inline constexpr int kMaxJsonDepth = 32;

// Parses and checks `body`. InvalidArgument whose message begins with the
// field at fault ("temperature: ..."), for malformed JSON ("body: ..."),
// wrong types, values out of range, unsupported options and prompts that do
// not follow the blend convention (blend_prompt.h); NotFound naming `model`
// when it is not the served model.
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(std::string_view body, Endpoint endpoint,
                                                 const RequestContext& ctx);

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_OPENAI_REQUEST_H_
