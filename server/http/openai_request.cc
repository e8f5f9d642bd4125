#include "server/http/openai_request.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "engine/blend/method.h"
#include "server/quoted_value.h"

namespace infoflow::server::http {
namespace {

using nlohmann::json;
namespace v1 = ::infoflow::v1;

absl::Status Bad(const std::string& field, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat(field, ": ", what));
}

// Depth of nested arrays/objects outside strings, stopping once past `limit`.
int JsonDepth(std::string_view body, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : body) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '[' || c == '{') max_depth = std::max(max_depth, ++depth);
    else if (c == ']' || c == '}') --depth;
    if (max_depth > limit) break;
  }
  return max_depth;
}

// Null counts as absent, as OpenAI's API treats it.
const json* Field(const json& obj, const char* name) {
  auto it = obj.find(name);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status GetBool(const json& obj, const char* name, bool* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return Bad(name, "expected true or false");
  *out = v->get<bool>();
  return absl::OkStatus();
}

absl::Status GetInt(const json& obj, const std::string& name, int64_t min, int64_t max,
                    std::optional<int64_t>* out) {
  const json* v = Field(obj, name.c_str());
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number_integer()) return Bad(name, "expected an integer");
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > INT64_MAX
                        ? INT64_MAX
                        : v->get<int64_t>();
  if (x < min || x > max) return Bad(name, absl::StrCat(x, " outside [", min, ", ", max, "]"));
  *out = x;
  return absl::OkStatus();
}

absl::Status GetNumber(const json& obj, const char* name, double min, double max,
                       std::optional<double>* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return Bad(name, "expected a number");
  const double x = v->get<double>();
  if (!(x >= min && x <= max)) return Bad(name, absl::StrCat(x, " outside [", min, ", ", max, "]"));
  *out = x;
  return absl::OkStatus();
}

absl::Status GetString(const json& obj, const char* name, std::string* out) {
  const json* v = Field(obj, name);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return Bad(name, "expected a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

// Options this server cannot honour: refused when set to anything but their default.
absl::Status RefuseUnsupported(const json& body) {
  auto set = [&](const char* name) {
    const json* v = Field(body, name);
    if (v == nullptr) return false;
    if (v->is_boolean()) return v->get<bool>();
    if (v->is_number()) return v->get<double>() != 0.0;
    if (v->is_string()) return !v->get<std::string>().empty();
    return !v->empty();
  };
  for (const char* name : {"echo", "logprobs", "top_logprobs", "suffix", "logit_bias",
                           "presence_penalty", "frequency_penalty", "tools", "functions"}) {
    if (set(name)) return Bad(name, "not supported by this server");
  }
  // "none" never calls a tool, and with no tools given "auto" cannot either:
  // both are what this server does (clients send them by default).
  for (const char* name : {"tool_choice", "function_call"}) {
    const json* v = Field(body, name);
    if (v == nullptr || (v->is_string() && (*v == "none" || *v == "auto"))) continue;
    return Bad(name, "not supported by this server (only \"none\", or \"auto\" without tools)");
  }
  if (const json* b = Field(body, "best_of"); b && !(b->is_number_integer() && b->get<int64_t>() == 1)) {
    return Bad("best_of", "only 1 is supported");
  }
  if (const json* n = Field(body, "n"); n && !(n->is_number_integer() && n->get<int64_t>() == 1)) {
    return Bad("n", "only n = 1 is supported (one choice per request)");
  }
  if (const json* rf = Field(body, "response_format"); rf) {
    if (!rf->is_object() || rf->value("type", "text") != "text") {
      return Bad("response_format", "only {\"type\": \"text\"} is supported");
    }
  }
  return absl::OkStatus();
}

absl::Status ParseStop(const json& body, v1::QueryRequest* q) {
  const json* stop = Field(body, "stop");
  if (stop == nullptr) return absl::OkStatus();
  std::vector<std::string> stops;
  if (stop->is_string()) {
    stops.push_back(stop->get<std::string>());
  } else if (stop->is_array()) {
    if (stop->size() > 4) return Bad("stop", "at most 4 stop strings");
    for (const json& s : *stop) {
      if (!s.is_string()) return Bad("stop", "expected a string or an array of strings");
      stops.push_back(s.get<std::string>());
    }
  } else {
    return Bad("stop", "expected a string or an array of strings");
  }
  for (const std::string& s : stops) {
    if (s.empty()) return Bad("stop", "empty stop string");
    q->add_stop(s);
  }
  return absl::OkStatus();
}

absl::Status ParseMessages(const json& body, std::vector<ChatMessage>* out) {
  const json* msgs = Field(body, "messages");
  if (msgs == nullptr) return Bad("messages", "required");
  if (!msgs->is_array() || msgs->empty()) return Bad("messages", "expected a non-empty array");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string field = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return Bad(field, "expected an object");
    ChatMessage cm;
    const json* role = Field(m, "role");
    if (role == nullptr || !role->is_string()) return Bad(field + ".role", "expected a string");
    cm.role = role->get<std::string>();
    const json* content = Field(m, "content");
    if (content == nullptr) {
      if (cm.role != "assistant") return Bad(field + ".content", "required");
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Content parts: only text parts, concatenated.
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string()) {
          return Bad(field + ".content", "only text parts ({\"type\": \"text\", \"text\": ...})");
        }
        cm.content += part["text"].get<std::string>();
      }
    } else {
      return Bad(field + ".content", "expected a string or an array of text parts");
    }
    out->push_back(std::move(cm));
  }
  return absl::OkStatus();
}

absl::Status ParseExtension(const json& ext, v1::QueryRequest* q, bool* report, bool* has_chunks) {
  if (!ext.is_object()) return Bad("infoflow", "expected an object");
  static const char* const kKeys[] = {"method",    "ratio",       "reorder",        "chunks",
                                      "report",    "prefix_mode", "scoring_layers", "lego_k",
                                      "deviation", "stop_ids",    "parse_special",  "store_prefix"};
  for (const auto& [key, value] : ext.items()) {
    bool known = false;
    for (const char* k : kKeys) known = known || key == k;
    if (!known) return Bad("infoflow", absl::StrCat("unknown field ", QuotedValue(key)));
  }
  std::string method;
  if (absl::Status s = GetString(ext, "method", &method); !s.ok()) return Bad("infoflow.method", "expected a string");
  if (!method.empty()) {
    std::string name = absl::AsciiStrToUpper(method);
    if (name.rfind("METHOD_", 0) == 0) name = name.substr(7);
    Method m;
    v1::Method pm;
    if (!ParseMethod(name, &m) || !v1::Method_Parse("METHOD_" + name, &pm)) {
      return Bad("infoflow.method", absl::StrCat("unknown method ", QuotedValue(method),
                                                 " (FULL, NONE, INFOFLOW, INFOFLOW_BLEND, "
                                                 "CACHEBLEND, CACHEBLEND_PARTIAL, EPIC, RANDOM)"));
    }
    q->set_method(pm);
  }
  std::optional<double> ratio;
  if (absl::Status s = GetNumber(ext, "ratio", 0.0, 1.0, &ratio); !s.ok()) {
    return Bad("infoflow.ratio", "expected a number in [0, 1]");
  }
  if (ratio) q->mutable_ratio()->set_value(*ratio);
  bool flag = false;
  if (!GetBool(ext, "reorder", &flag).ok()) return Bad("infoflow.reorder", "expected true or false");
  q->set_reorder(flag);
  flag = false;
  if (!GetBool(ext, "parse_special", &flag).ok()) {
    return Bad("infoflow.parse_special", "expected true or false");
  }
  q->set_parse_special(flag);
  if (!GetBool(ext, "report", report).ok()) return Bad("infoflow.report", "expected true or false");
  std::string store;
  if (!GetString(ext, "store_prefix", &store).ok()) {
    return Bad("infoflow.store_prefix", "expected \"always\", \"repeated\" or \"never\"");
  }
  store = absl::AsciiStrToLower(store);
  if (store == "always") {
    q->set_prefix_store(v1::PREFIX_STORE_ALWAYS);
  } else if (store == "repeated") {
    q->set_prefix_store(v1::PREFIX_STORE_REPEATED);
  } else if (store == "never") {
    q->set_prefix_store(v1::PREFIX_STORE_NEVER);
  } else if (!store.empty()) {
    return Bad("infoflow.store_prefix", "expected \"always\", \"repeated\" or \"never\"");
  }
  std::string mode;
  if (!GetString(ext, "prefix_mode", &mode).ok()) return Bad("infoflow.prefix_mode", "expected a string");
  mode = absl::AsciiStrToLower(mode);
  if (mode == "bos") q->set_prefix_mode(v1::PREFIX_MODE_BOS);
  else if (mode == "none") q->set_prefix_mode(v1::PREFIX_MODE_NONE);
  else if (!mode.empty()) return Bad("infoflow.prefix_mode", "expected \"bos\" or \"none\"");
  std::string dev;
  if (!GetString(ext, "deviation", &dev).ok()) return Bad("infoflow.deviation", "expected a string");
  dev = absl::AsciiStrToUpper(dev);
  if (dev == "V") q->set_deviation(v1::DEVIATION_V);
  else if (dev == "K") q->set_deviation(v1::DEVIATION_K);
  else if (!dev.empty()) return Bad("infoflow.deviation", "expected \"V\" or \"K\"");
  std::optional<int64_t> lego_k;
  if (absl::Status s = GetInt(ext, "lego_k", 0, 1 << 20, &lego_k); !s.ok()) {
    return Bad("infoflow.lego_k", "expected an integer >= 0");
  }
  if (lego_k) q->set_lego_k(static_cast<int32_t>(*lego_k));
  for (const char* name : {"scoring_layers", "stop_ids"}) {
    const json* arr = Field(ext, name);
    if (arr == nullptr) continue;
    if (!arr->is_array() || arr->size() > 1024) {
      return Bad(absl::StrCat("infoflow.", name), "expected an array of at most 1024 integers");
    }
    for (const json& v : *arr) {
      if (!v.is_number_integer() || v.get<int64_t>() < INT32_MIN || v.get<int64_t>() > INT32_MAX) {
        return Bad(absl::StrCat("infoflow.", name), "expected integers");
      }
      const int32_t x = static_cast<int32_t>(v.get<int64_t>());
      if (std::string_view(name) == "scoring_layers") q->add_scoring_layers(x);
      else q->add_stop_ids(x);
    }
  }
  if (const json* chunks = Field(ext, "chunks")) {
    if (!chunks->is_array() || chunks->empty()) {
      return Bad("infoflow.chunks", "expected a non-empty array of {\"key\"} or {\"text\"}");
    }
    for (size_t i = 0; i < chunks->size(); ++i) {
      const json& c = (*chunks)[i];
      const std::string field = absl::StrCat("infoflow.chunks[", i, "]");
      const json* key = c.is_object() ? Field(c, "key") : nullptr;
      const json* text = c.is_object() ? Field(c, "text") : nullptr;
      if (!c.is_object() || c.size() != 1 || (key == nullptr) == (text == nullptr)) {
        return Bad(field, "expected {\"key\": \"<64 hex digits>\"} or {\"text\": \"...\"}");
      }
      const json* v = key ? key : text;
      if (!v->is_string()) return Bad(field, "expected a string value");
      if (key) q->add_chunks()->set_key(v->get<std::string>());
      else q->add_chunks()->set_text(v->get<std::string>());
    }
    *has_chunks = true;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(std::string_view body, Endpoint endpoint,
                                                 const RequestContext& ctx) {
  if (JsonDepth(body, kMaxJsonDepth) > kMaxJsonDepth) {
    return Bad("body", absl::StrCat("JSON nested deeper than ", kMaxJsonDepth, " levels"));
  }
  json doc;
  try {
    doc = json::parse(body.begin(), body.end());
  } catch (const json::exception& e) {
    return Bad("body", absl::StrCat("malformed JSON (", e.what(), ")"));
  }
  if (!doc.is_object()) return Bad("body", "expected a JSON object");

  OpenAiRequest r;
  r.endpoint = endpoint;
  v1::QueryRequest& q = r.query;
  const json* model = Field(doc, "model");
  if (model == nullptr) return Bad("model", "required");
  if (!model->is_string()) return Bad("model", "expected a string");
  r.model = model->get<std::string>();
  if (r.model != ctx.model_name) {
    return absl::NotFoundError(absl::StrCat("model: the model ", QuotedValue(r.model),
                                            " does not exist; this server serves '", ctx.model_name,
                                            "' (GET /v1/models)"));
  }
  q.mutable_model()->set_name(r.model);
  if (absl::Status s = RefuseUnsupported(doc); !s.ok()) return s;

  if (absl::Status s = GetBool(doc, "stream", &r.stream); !s.ok()) return s;
  if (const json* so = Field(doc, "stream_options")) {
    if (!so->is_object()) return Bad("stream_options", "expected an object");
    if (!r.stream) return Bad("stream_options", "only allowed with \"stream\": true");
    if (!GetBool(*so, "include_usage", &r.include_usage).ok()) {
      return Bad("stream_options.include_usage", "expected true or false");
    }
  }
  std::optional<int64_t> max_tokens;
  const char* max_name = "max_tokens";
  if (endpoint == Endpoint::kChatCompletions && Field(doc, "max_completion_tokens")) {
    max_name = "max_completion_tokens";
  }
  if (absl::Status s = GetInt(doc, max_name, 1, ctx.max_new_tokens, &max_tokens); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(s.message(), " (--max-new-tokens)"));
  }
  if (max_tokens) {
    q.set_max_new_tokens(static_cast<int32_t>(*max_tokens));
  } else if (endpoint == Endpoint::kChatCompletions) {
    // OpenAI's chat answers until done: the most this server allows, fitted
    // to the model's positions left once the context is known
    // (QuerySpec::fit_new_tokens). LangChain's and LlamaIndex's chat
    // clients send no max_tokens by default.
    q.set_max_new_tokens(ctx.max_new_tokens);
    r.max_tokens_default = true;
  } else {
    q.set_max_new_tokens(std::min(kCompletionsDefaultMaxTokens, ctx.max_new_tokens));
  }
  r.max_tokens_field = max_name;
  // vLLM's extension: no stop id before this many tokens (<= max_tokens,
  // checked by the Query path for both transports).
  std::optional<int64_t> min_tokens;
  if (absl::Status s = GetInt(doc, "min_tokens", 0, ctx.max_new_tokens, &min_tokens); !s.ok()) {
    return s;
  }
  if (min_tokens) q.set_min_new_tokens(static_cast<int32_t>(*min_tokens));
  std::optional<double> temperature, top_p;
  if (absl::Status s = GetNumber(doc, "temperature", 0.0, 2.0, &temperature); !s.ok()) return s;
  if (absl::Status s = GetNumber(doc, "top_p", 0.0, 1.0, &top_p); !s.ok()) return s;
  if (top_p && *top_p == 0.0) return Bad("top_p", "must be > 0");
  // OpenAI's defaults: temperature 1, top_p 1, a fresh seed per request.
  q.mutable_sampling()->set_temperature(static_cast<float>(temperature.value_or(1.0)));
  q.mutable_sampling()->set_top_p(static_cast<float>(top_p.value_or(1.0)));
  std::optional<int64_t> seed;
  if (absl::Status s = GetInt(doc, "seed", INT64_MIN, INT64_MAX, &seed); !s.ok()) return s;
  q.mutable_sampling()->set_seed(seed ? static_cast<uint64_t>(*seed)
                                      : (uint64_t{std::random_device{}()} << 32) |
                                            std::random_device{}());
  if (absl::Status s = ParseStop(doc, &q); !s.ok()) return s;

  bool ignore_eos = false;  // vLLM's extension
  if (absl::Status s = GetBool(doc, "ignore_eos", &ignore_eos); !s.ok()) return s;
  q.set_ignore_eos(ignore_eos);

  bool has_chunks = false;
  if (const json* ext = Field(doc, "infoflow")) {
    if (absl::Status s = ParseExtension(*ext, &q, &r.report, &has_chunks); !s.ok()) return s;
  }
  r.chunks_listed = has_chunks;
  // A chat's history is in its prefix, and the next turn's prefix extends
  // it: unless told, such a prefix is stored only when it comes again (few-shot
  // turns); a system prompt alone, or a completion's prefix, at once.
  bool history = false;
  absl::StatusOr<BlendPrompt> prompt = absl::UnknownError("");
  if (endpoint == Endpoint::kCompletions) {
    if (Field(doc, "messages")) return Bad("messages", "use POST /v1/chat/completions for messages");
    const json* p = Field(doc, "prompt");
    if (p == nullptr) return Bad("prompt", "required");
    if (p->is_array() && p->size() == 1 && (*p)[0].is_string()) p = &(*p)[0];
    if (!p->is_string()) {
      return Bad("prompt", "expected a string (token-id prompts and batches are not supported)");
    }
    prompt = SplitCompletionPrompt(p->get_ref<const std::string&>(), ctx.separator, has_chunks);
  } else {
    if (Field(doc, "prompt")) return Bad("prompt", "use POST /v1/completions for a prompt");
    std::vector<ChatMessage> messages;
    if (absl::Status s = ParseMessages(doc, &messages); !s.ok()) return s;
    prompt = RenderChat(messages, ctx.chat_format, ctx.separator, has_chunks);
    const bool leading_system = messages[0].role == "system" || messages[0].role == "developer";
    history = messages.size() > (leading_system ? 2u : 1u);
  }
  if (!prompt.ok()) return prompt.status();
  q.set_prefix(prompt->prefix);
  for (const std::string& c : prompt->chunks) q.add_chunks()->set_text(c);
  q.set_question(prompt->question);
  q.set_prompt_template(prompt->prompt_template);
  if (history && q.prefix_store() == v1::PREFIX_STORE_UNSPECIFIED) {
    q.set_prefix_store(v1::PREFIX_STORE_REPEATED);
  }
  q.set_return_report(true);  // the outcome feeds usage; `report` decides what is shown
  return r;
}

}  // namespace infoflow::server::http
