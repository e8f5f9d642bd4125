// Errors of the HTTP front end in OpenAI's shape,
//   {"error": {"message": "...", "type": "...", "param": "..."|null, "code": "..."|null}},
// and the one table from status codes (gRPC's, which the Query path and
// absl::Status share) to HTTP statuses.
//
// Pure functions; thread-safe.
#ifndef INFOFLOW_SERVER_HTTP_HTTP_ERRORS_H_
#define INFOFLOW_SERVER_HTTP_HTTP_ERRORS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"
#include "server/http/openai_request.h"

namespace infoflow::server::http {

struct HttpError {
  int http_status = 500;
  std::string message;
  std::string type;   // OpenAI's error type: invalid_request_error, authentication_error, ...
  std::string param;  // the request field at fault; "" = null
  std::string code;   // a stable machine-readable code; "" = null
};

// The HTTP status and OpenAI error type for a status code (the table):
//   INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE -> 400 invalid_request_error
//   UNAUTHENTICATED -> 401 authentication_error;  PERMISSION_DENIED -> 403
//   NOT_FOUND -> 404 invalid_request_error;  RESOURCE_EXHAUSTED -> 429 rate_limit_error
//   CANCELLED -> 499 (client closed);  UNAVAILABLE -> 503 service_unavailable
//   DEADLINE_EXCEEDED -> 504;  UNIMPLEMENTED -> 501;  others -> 500 server_error
HttpError ErrorFromStatus(grpc::StatusCode code, const std::string& message);
HttpError ErrorFromStatus(const grpc::Status& status);
HttpError ErrorFromStatus(const absl::Status& status);

// The body field of `r` that a Query-path error's field stands for. The
// Query path (PrepareQuery, ExecuteQuery) names QueryRequest's fields, which
// an HTTP client never sent:
//   question, prefix, prompt_template, chunks[i]... -> "prompt" (completions)
//     or "messages" (chat), the pieces they were split from; chunks[i]... ->
//     "infoflow.chunks[i]..." when the body listed its chunks there
//   max_new_tokens -> max_tokens (or max_completion_tokens, as sent);
//   min_new_tokens -> min_tokens; sampling.temperature -> temperature;
//   sampling.top_p -> top_p; prefix_store -> infoflow.store_prefix;
//   method, ratio, reorder, lego_k, deviation, prefix_mode, scoring_layers,
//     stop_ids[i] -> infoflow.<same>
// Anything else ("stop[1]", "model", "") is returned as is.
std::string BodyField(const OpenAiRequest& r, const std::string& query_field);

// A Query-path status as `r`'s client reads it: ErrorFromStatus, with
// `param` the body's field (BodyField) and the message naming it first, the
// Query field kept where it says which piece ("prompt (question): ...").
// `token_limit` says the status is a length refusal (PrepareQuery's
// token_limit; IsTokenLimitError of QueryRun::outcome): then the code is OpenAI's
// "context_length_exceeded" (its answer to a prompt past the context window,
// which clients act on), and a refusal of the whole prompt (OUT_OF_RANGE:
// past the model's positions or --max-kv-bytes) names the prompt and
// max_tokens together.
HttpError QueryError(const OpenAiRequest& r, const grpc::Status& status, bool token_limit);

// The OpenAI error JSON of `e` (one line, no trailing newline).
std::string ErrorBody(const HttpError& e);

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_HTTP_ERRORS_H_
