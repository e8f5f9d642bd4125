// Response bodies of the HTTP front end in OpenAI's shapes: completion and
// chat completion objects, their streamed chunks (SSE "data:" payloads),
// usage, and the "infoflow" extension field carrying the gRPC Report.
//
// Pure functions; thread-safe.
#ifndef INFOFLOW_SERVER_HTTP_OPENAI_RESPONSE_H_
#define INFOFLOW_SERVER_HTTP_OPENAI_RESPONSE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "infoflow/v1/infoflow.pb.h"
#include "server/http/openai_request.h"
#include "server/query_runner.h"

namespace infoflow::server::http {

// Identity of one response: the same in every streamed chunk.
struct ResponseId {
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  int64_t created = 0;  // Unix seconds
  std::string model;
  Endpoint endpoint = Endpoint::kCompletions;
};

// A fresh id for `endpoint`, created now.
ResponseId NewResponseId(Endpoint endpoint, const std::string& model);

// usage: prompt_tokens (prefix + context + prompt), completion_tokens,
// total_tokens, prompt_tokens_details.cached_tokens = prompt tokens whose KV
// came from the store (a stored prefix, and the chunks found stored; the
// recomputed share of them is in the report, not subtracted here).
nlohmann::json Usage(const QuerySpec& spec, const QueryOutcome& out);

// The Report as JSON (proto field names; method as "INFOFLOW" etc.).
nlohmann::json ReportJson(const infoflow::v1::Report& report);

// OpenAI's finish_reason for a QueryOutcome::stop_reason: "length" for
// max_tokens and context_full, else "stop".
const char* FinishReason(const std::string& stop_reason);

// The whole non-streamed response; `report` null = no "infoflow" field.
nlohmann::json CompletionResponse(const ResponseId& rid, const QuerySpec& spec,
                                  const QueryOutcome& out, const nlohmann::json& report);

// A streamed chunk: one piece of text (`finish_reason` null while running),
// the opening chat chunk (role "assistant", empty content: `role_only`), or
// the closing one. `extra` fields (usage, infoflow) are merged in.
nlohmann::json StreamChunk(const ResponseId& rid, std::string_view text, const char* finish_reason,
                           bool role_only = false);

// The usage chunk of stream_options.include_usage: empty choices + usage.
nlohmann::json StreamUsageChunk(const ResponseId& rid, const nlohmann::json& usage);

// "data: <json>\n\n" (invalid UTF-8 replaced, never thrown).
std::string SseEvent(const nlohmann::json& payload);
inline constexpr char kSseDone[] = "data: [DONE]\n\n";

// JSON text of a body (invalid UTF-8 replaced).
std::string Dump(const nlohmann::json& j);

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_OPENAI_RESPONSE_H_
