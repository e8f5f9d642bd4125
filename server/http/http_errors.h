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

// The OpenAI error JSON of `e` (one line, no trailing newline).
std::string ErrorBody(const HttpError& e);

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_HTTP_ERRORS_H_
