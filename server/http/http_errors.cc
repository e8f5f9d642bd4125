#include "server/http/http_errors.h"

#include <cctype>

#include <nlohmann/json.hpp>

namespace infoflow::server::http {
namespace {

struct StatusRow {
  grpc::StatusCode code;
  int http_status;
  const char* type;
  const char* code_name;  // HttpError::code
};

// The one mapping; ErrorFromStatus's comment lists it for readers.
constexpr StatusRow kStatusTable[] = {
    {grpc::StatusCode::INVALID_ARGUMENT, 400, "invalid_request_error", "invalid_argument"},
    {grpc::StatusCode::FAILED_PRECONDITION, 400, "invalid_request_error", "failed_precondition"},
    {grpc::StatusCode::OUT_OF_RANGE, 400, "invalid_request_error", "out_of_range"},
    {grpc::StatusCode::UNAUTHENTICATED, 401, "authentication_error", "invalid_api_key"},
    {grpc::StatusCode::PERMISSION_DENIED, 403, "permission_error", "permission_denied"},
    {grpc::StatusCode::NOT_FOUND, 404, "invalid_request_error", "not_found"},
    {grpc::StatusCode::RESOURCE_EXHAUSTED, 429, "rate_limit_error", "resource_exhausted"},
    {grpc::StatusCode::CANCELLED, 499, "client_closed_request", "cancelled"},
    {grpc::StatusCode::UNIMPLEMENTED, 501, "server_error", "unimplemented"},
    {grpc::StatusCode::UNAVAILABLE, 503, "service_unavailable", "unavailable"},
    {grpc::StatusCode::DEADLINE_EXCEEDED, 504, "server_error", "deadline_exceeded"},
};

// Messages name the field first ("max_tokens: ...", "chunks[2]: ..."), as
// the gRPC side's do; that name is OpenAI's `param`.
std::string ParamOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0 || colon > 64) return "";
  for (size_t i = 0; i < colon; ++i) {
    const unsigned char c = static_cast<unsigned char>(message[i]);
    if (!std::isalnum(c) && c != '_' && c != '.' && c != '[' && c != ']') return "";
  }
  return message.substr(0, colon);
}

}  // namespace

HttpError ErrorFromStatus(grpc::StatusCode code, const std::string& message) {
  HttpError e;
  e.message = message;
  e.param = ParamOf(message);
  e.type = "server_error";
  e.code = "internal";
  for (const StatusRow& row : kStatusTable) {
    if (row.code == code) {
      e.http_status = row.http_status;
      e.type = row.type;
      e.code = row.code_name;
      return e;
    }
  }
  return e;  // 500
}

HttpError ErrorFromStatus(const grpc::Status& status) {
  return ErrorFromStatus(status.error_code(), status.error_message());
}

HttpError ErrorFromStatus(const absl::Status& status) {
  // absl and gRPC share the canonical code numbers.
  return ErrorFromStatus(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

std::string ErrorBody(const HttpError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  // Messages may quote request bytes that are not UTF-8: replace, never throw.
  return nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace infoflow::server::http
