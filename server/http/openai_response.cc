#include "server/http/openai_response.h"

#include <chrono>
#include <random>

#include "absl/strings/str_format.h"

namespace infoflow::server::http {

using nlohmann::json;
namespace v1 = ::infoflow::v1;

ResponseId NewResponseId(Endpoint endpoint, const std::string& model) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  ResponseId r;
  r.endpoint = endpoint;
  r.model = model;
  r.id = absl::StrFormat("%s-%016x%08x", endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl",
                         rng(), static_cast<uint32_t>(rng()));
  r.created = std::chrono::duration_cast<std::chrono::seconds>(
                  std::chrono::system_clock::now().time_since_epoch())
                  .count();
  return r;
}

json Usage(const QuerySpec& spec, const QueryOutcome& out) {
  const int64_t prompt = out.prefix_tokens + out.context_tokens +
                         static_cast<int64_t>(spec.prompt_ids.size());
  const int64_t cached = (out.prefix_cached ? out.prefix_tokens : 0) +
                         std::max<int64_t>(0, out.context_tokens - out.prefilled_tokens);
  return {{"prompt_tokens", prompt},
          {"completion_tokens", out.generated_tokens},
          {"total_tokens", prompt + out.generated_tokens},
          {"prompt_tokens_details", {{"cached_tokens", cached}}}};
}

json ReportJson(const v1::Report& r) {
  const v1::StageTimings& t = r.stages();
  std::string method = v1::Method_Name(r.method());
  if (method.rfind("METHOD_", 0) == 0) method = method.substr(7);
  return {{"method", method},
          {"ratio", r.ratio()},
          {"ttft_ms", r.ttft_ms()},
          {"stages",
           {{"fetch_ms", t.fetch_ms()},
            {"reposition_ms", t.reposition_ms()},
            {"score_ms", t.score_ms()},
            {"select_ms", t.select_ms()},
            {"reorder_ms", t.reorder_ms()},
            {"recompute_ms", t.recompute_ms()},
            {"prompt_ms", t.prompt_ms()},
            {"first_token_ms", t.first_token_ms()},
            {"decode_ms", t.decode_ms()}}},
          {"context_tokens", r.context_tokens()},
          {"recomputed_tokens", r.recomputed_tokens()},
          {"chunk_hits", r.chunk_hits()},
          {"chunk_misses", r.chunk_misses()},
          {"chunk_remote_hits", r.chunk_remote_hits()},
          {"chunk_order", json(std::vector<int>(r.chunk_order().begin(), r.chunk_order().end()))},
          {"chunk_keys",
           json(std::vector<std::string>(r.chunk_keys().begin(), r.chunk_keys().end()))},
          {"stop_reason", r.stop_reason()},
          {"generated_tokens", r.generated_tokens()},
          {"positions", r.positions()},
          {"beyond_model_positions", r.beyond_model_positions()},
          {"prefix_tokens", r.prefix_tokens()},
          {"prefix_cached", r.prefix_cached()},
          {"prefix_key", r.prefix_key()}};
}

const char* FinishReason(const std::string& stop_reason) {
  return stop_reason == "max_tokens" || stop_reason == "context_full" ? "length" : "stop";
}

namespace {

json Envelope(const ResponseId& rid, const char* object) {
  return {{"id", rid.id}, {"object", object}, {"created", rid.created}, {"model", rid.model}};
}

}  // namespace

json CompletionResponse(const ResponseId& rid, const QuerySpec& spec, const QueryOutcome& out,
                        const json& report) {
  const bool chat = rid.endpoint == Endpoint::kChatCompletions;
  json body = Envelope(rid, chat ? "chat.completion" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", nullptr}, {"finish_reason", FinishReason(out.stop_reason)}};
  if (chat) choice["message"] = {{"role", "assistant"}, {"content", out.text}};
  else choice["text"] = out.text;
  body["choices"] = json::array({choice});
  body["usage"] = Usage(spec, out);
  if (!report.is_null()) body["infoflow"] = report;
  return body;
}

json StreamChunk(const ResponseId& rid, std::string_view text, const char* finish_reason,
                 bool role_only) {
  const bool chat = rid.endpoint == Endpoint::kChatCompletions;
  json body = Envelope(rid, chat ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish_reason ? json(finish_reason) : json(nullptr);
  if (chat) {
    json delta = json::object();
    if (role_only) delta = {{"role", "assistant"}, {"content", ""}};
    else if (!text.empty() || finish_reason == nullptr) delta["content"] = std::string(text);
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(text);
  }
  body["choices"] = json::array({choice});
  return body;
}

json StreamUsageChunk(const ResponseId& rid, const json& usage) {
  json body = Envelope(rid, rid.endpoint == Endpoint::kChatCompletions ? "chat.completion.chunk"
                                                                       : "text_completion");
  body["choices"] = json::array();
  body["usage"] = usage;
  return body;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string SseEvent(const json& payload) { return "data: " + Dump(payload) + "\n\n"; }

}  // namespace infoflow::server::http
