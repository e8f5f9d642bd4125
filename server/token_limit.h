// A query refused because it is too long: a piece of it (a chunk, the
// prefix, the question, the rendered prompt) has more tokens than a
// --max-*-tokens flag allows, the context is over --max-context-tokens, or
// the whole does not fit the model's positions or --max-kv-bytes.
//
// Such a refusal carries a status payload, so that a front end can tell it
// from the other INVALID_ARGUMENT / OUT_OF_RANGE refusals without reading its
// message (the HTTP front end answers it with OpenAI's
// "context_length_exceeded", the code clients check before they shorten a
// prompt). The payload stays inside the process: the gRPC status a client
// gets has the code and message only, as before.

#ifndef INFOFLOW_SERVER_TOKEN_LIMIT_H_
#define INFOFLOW_SERVER_TOKEN_LIMIT_H_

#include <string>

#include "absl/status/status.h"
#include "absl/strings/cord.h"

namespace infoflow::server {

inline constexpr char kTokenLimitPayload[] = "type.infoflow-kv/token_limit";

// absl::Status(code, message) marked as a token-limit refusal.
inline absl::Status TokenLimitError(absl::StatusCode code, const std::string& message) {
  absl::Status s(code, message);
  s.SetPayload(kTokenLimitPayload, absl::Cord());
  return s;
}

// Whether `status` was made by TokenLimitError (OK is not).
inline bool IsTokenLimitError(const absl::Status& status) {
  return !status.ok() && status.GetPayload(kTokenLimitPayload).has_value();
}

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_TOKEN_LIMIT_H_
