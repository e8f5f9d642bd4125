#include "server/http/http_errors.h"

#include <cctype>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"

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

// The body field a request's blend pieces were split from.
std::string PiecesField(const OpenAiRequest& r) {
  return r.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
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

std::string BodyField(const OpenAiRequest& r, const std::string& query_field) {
  const std::string pieces = PiecesField(r);
  // The field's name up to its first index or member: "chunks" of "chunks[2].text".
  const std::string name = query_field.substr(0, query_field.find_first_of("[."));
  const std::string rest = query_field.substr(name.size());
  if (name == "question" || name == "prefix" || name == "prompt_template") return pieces;
  if (name == "chunks") return r.chunks_listed ? absl::StrCat("infoflow.", query_field) : pieces;
  if (name == "max_new_tokens") return r.max_tokens_field;
  if (name == "min_new_tokens") return "min_tokens";
  if (query_field == "sampling.temperature") return "temperature";
  if (query_field == "sampling.top_p") return "top_p";
  if (name == "prefix_store") return absl::StrCat("infoflow.store_prefix", rest);
  for (const char* ext : {"method", "ratio", "reorder", "lego_k", "deviation", "prefix_mode",
                          "scoring_layers", "stop_ids"}) {
    if (name == ext) return absl::StrCat("infoflow.", query_field);
  }
  return query_field;
}

HttpError QueryError(const OpenAiRequest& r, const grpc::Status& status, bool token_limit) {
  HttpError e = ErrorFromStatus(status);
  if (token_limit) e.code = "context_length_exceeded";
  const std::string pieces = PiecesField(r);
  if (token_limit && status.error_code() == grpc::StatusCode::OUT_OF_RANGE) {
    // "chunks + prompt + max_new_tokens: <sum>": the prompt and the answer's
    // room are too long together.
    const size_t colon = e.message.find(": ");
    if (colon != std::string::npos) {
      e.message = absl::StrCat(pieces, " + ", r.max_tokens_field, e.message.substr(colon));
    }
    e.param = pieces;
    return e;
  }
  if (e.param.empty()) return e;
  const std::string field = BodyField(r, e.param);
  if (field == e.param) return e;
  // The rest of the message, after "<query field>: ".
  const std::string what = e.message.substr(e.param.size() + 2);
  const bool piece = field == pieces;
  e.message =
      piece ? absl::StrCat(field, " (", e.param, "): ", what) : absl::StrCat(field, ": ", what);
  e.param = field;
  return e;
}

std::string ErrorBody(const HttpError& e) {
  nlohmann::json err = {{"message", e.message}, {"type", e.type}};
  err["param"] = e.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.param);
  err["code"] = e.code.empty() ? nlohmann::json(nullptr) : nlohmann::json(e.code);
  // Messages may quote request bytes that are not UTF-8: replace, never throw.
  return nlohmann::json{{"error", err}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace infoflow::server::http
