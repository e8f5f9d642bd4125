#include "engine/text/model_chat_template.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace infoflow {
namespace {

using nlohmann::json;

// Stands in for the last message's content to find where the template puts
// it; no whitespace at its ends, so trimming templates leave it alone.
constexpr std::string_view kSentinel = "<infoflow:last-content:5b1e7c>";

std::optional<std::string> ReadFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A special token field: a string, null, or an AddedToken object.
absl::Status TokenField(const json& cfg, const char* name, std::string* out) {
  auto it = cfg.find(name);
  if (it == cfg.end() || it->is_null()) return absl::OkStatus();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return absl::OkStatus();
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    *out = (*it)["content"].get<std::string>();
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("tokenizer_config.json: ", name,
                                                 " must be a string, null or {\"content\": ...}"));
}

}  // namespace

absl::StatusOr<std::optional<ModelChatTemplate>> ModelChatTemplateFromFiles(
    std::string_view tokenizer_config_json, std::optional<std::string_view> chat_template_jinja) {
  ModelChatTemplate t;
  std::optional<std::string> source;
  if (chat_template_jinja.has_value()) {
    source = std::string(*chat_template_jinja);
    t.origin = "chat_template.jinja";
  }
  if (!tokenizer_config_json.empty()) {
    const json cfg = json::parse(tokenizer_config_json, nullptr, /*allow_exceptions=*/false);
    if (cfg.is_discarded() || !cfg.is_object()) {
      return absl::InvalidArgumentError("tokenizer_config.json: not a JSON object");
    }
    if (absl::Status s = TokenField(cfg, "bos_token", &t.bos_token); !s.ok()) return s;
    if (absl::Status s = TokenField(cfg, "eos_token", &t.eos_token); !s.ok()) return s;
    if (auto it = cfg.find("add_bos_token"); it != cfg.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        return absl::InvalidArgumentError("tokenizer_config.json: add_bos_token must be a boolean");
      }
      t.add_bos_token = it->get<bool>();
    }
    auto ct = cfg.find("chat_template");
    if (!source.has_value() && ct != cfg.end() && !ct->is_null()) {
      t.origin = "tokenizer_config.json";
      if (ct->is_string()) {
        source = ct->get<std::string>();
      } else if (ct->is_array()) {
        for (const json& named : *ct) {
          if (named.is_object() && named.value("name", "") == "default" &&
              named.contains("template") && named["template"].is_string()) {
            source = named["template"].get<std::string>();
          }
        }
        if (!source.has_value()) {
          return absl::InvalidArgumentError(
              "tokenizer_config.json: chat_template is a list without a {\"name\": \"default\", "
              "\"template\": ...} entry");
        }
      } else {
        return absl::InvalidArgumentError(
            "tokenizer_config.json: chat_template must be a string or a list of {name, template}");
      }
    }
  }
  if (!source.has_value() || source->empty()) return std::optional<ModelChatTemplate>();
  absl::StatusOr<ChatTemplate> compiled = ChatTemplate::Parse(*source);
  if (!compiled.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(t.origin, ": ", compiled.status().message()));
  }
  t.source = *std::move(source);
  t.compiled = *std::move(compiled);
  return std::optional<ModelChatTemplate>(std::move(t));
}

absl::StatusOr<std::optional<ModelChatTemplate>> LoadModelChatTemplate(
    const std::string& model_dir) {
  const std::filesystem::path dir(model_dir);
  const std::optional<std::string> cfg = ReadFile(dir / "tokenizer_config.json");
  const std::optional<std::string> jinja = ReadFile(dir / "chat_template.jinja");
  std::optional<std::string_view> jinja_view;
  if (jinja.has_value()) jinja_view = *jinja;
  return ModelChatTemplateFromFiles(cfg.value_or(""), jinja_view);
}

absl::StatusOr<FramedConversation> FrameLastTurn(const ModelChatTemplate& t,
                                                 const std::vector<ChatTurn>& turns) {
  if (turns.empty()) return absl::InvalidArgumentError("messages: at least one message");
  auto render = [&](std::string_view last_content) -> absl::StatusOr<std::string> {
    json vars = json::object();
    json messages = json::array();
    for (size_t i = 0; i < turns.size(); ++i) {
      messages.push_back(
          {{"role", turns[i].role},
           {"content", i + 1 == turns.size() ? std::string(last_content) : turns[i].content}});
    }
    vars["messages"] = std::move(messages);
    vars["add_generation_prompt"] = true;
    // As transformers: a special token the model lacks is not defined.
    if (!t.bos_token.empty()) vars["bos_token"] = t.bos_token;
    if (!t.eos_token.empty()) vars["eos_token"] = t.eos_token;
    return t.compiled.Render(vars);
  };
  absl::StatusOr<std::string> real = render(turns.back().content);
  if (!real.ok()) return real.status();
  absl::StatusOr<std::string> marked = render(kSentinel);
  if (!marked.ok()) return marked.status();
  const size_t at = marked->find(kSentinel);
  if (at == std::string::npos || marked->find(kSentinel, at + 1) != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's chat template (", t.origin,
        ") does not print the last message's content exactly once, unchanged; use a named chat "
        "format instead"));
  }
  FramedConversation f;
  f.head = marked->substr(0, at);
  f.tail = marked->substr(at + kSentinel.size());
  if (real->size() < f.head.size() + f.tail.size() || !absl::StartsWith(*real, f.head) ||
      !absl::EndsWith(*real, f.tail)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model's chat template (", t.origin,
        ") renders the conversation differently around the last message's content than it does "
        "for other contents; use a named chat format instead"));
  }
  f.content = real->substr(f.head.size(), real->size() - f.head.size() - f.tail.size());
  if (t.add_bos_token && !t.bos_token.empty() && !absl::StartsWith(f.head, t.bos_token)) {
    f.head = t.bos_token + f.head;
  }
  return f;
}

}  // namespace infoflow
