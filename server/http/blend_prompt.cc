#include "server/http/blend_prompt.h"

#include "absl/strings/str_cat.h"
#include "server/quoted_value.h"

namespace infoflow::server::http {
namespace {

// Pieces -> prefix / chunks / question, the checks of SplitCompletionPrompt.
absl::StatusOr<BlendPrompt> FromPieces(const std::vector<std::string_view>& pieces,
                                       std::string_view separator, bool chunks_listed,
                                       const char* field) {
  BlendPrompt p;
  const std::string sep(separator);  // absl::StrCat takes absl::string_view
  if (chunks_listed && pieces.size() > 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": with infoflow.chunks the prompt is \"question\" or \"prefix", sep,
        "question\", but it has ", pieces.size() - 1, " separators"));
  }
  if (pieces.size() >= 2) p.prefix = std::string(pieces.front());
  for (size_t i = 1; i + 1 < pieces.size(); ++i) {
    if (pieces[i].empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(field, ": chunk ", i - 1, " (between separators ", i, " and ", i + 1,
                       ") is empty"));
    }
    p.chunks.emplace_back(pieces[i]);
  }
  p.question = std::string(pieces.back());
  if (p.question.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(field, ": the question (the text after the last separator) is empty"));
  }
  return p;
}

bool Contains(std::string_view text, std::string_view what) {
  return text.find(what) != std::string_view::npos;
}

}  // namespace

std::vector<std::string_view> SplitOnSeparator(std::string_view text, std::string_view separator) {
  std::vector<std::string_view> pieces;
  size_t from = 0;
  for (size_t at = text.find(separator); !separator.empty() && at != std::string_view::npos;
       at = text.find(separator, from)) {
    pieces.push_back(text.substr(from, at - from));
    from = at + separator.size();
  }
  pieces.push_back(text.substr(from));
  return pieces;
}

std::vector<std::string> ChatFormatNames() {
  return {"qwen", "llama3", "mistral", "glm4", "plain"};
}

absl::StatusOr<ChatFormat> FindChatFormat(const std::string& name) {
  ChatFormat f;
  f.name = name;
  if (name == "qwen") {
    f.system_open = "<|im_start|>system\n";
    f.system_close = "<|im_end|>\n";
    f.user_open = "<|im_start|>user\n";
    f.user_close = "<|im_end|>\n";
    f.assistant_open = "<|im_start|>assistant\n";
    f.assistant_close = "<|im_end|>\n";
    f.answer_open = f.user_close + f.assistant_open;
  } else if (name == "llama3") {
    f.bos = "<|begin_of_text|>";
    f.system_open = "<|start_header_id|>system<|end_header_id|>\n\n";
    f.system_close = "<|eot_id|>";
    f.user_open = "<|start_header_id|>user<|end_header_id|>\n\n";
    f.user_close = "<|eot_id|>";
    f.assistant_open = "<|start_header_id|>assistant<|end_header_id|>\n\n";
    f.assistant_close = "<|eot_id|>";
    f.answer_open = f.user_close + f.assistant_open;
  } else if (name == "mistral") {
    f.bos = "<s>";
    f.system_in_first_user = true;
    f.user_open = "[INST] ";
    f.user_close = " [/INST]";
    f.assistant_close = "</s>";
    f.answer_open = f.user_close;
  } else if (name == "glm4") {
    // [gMASK]<sop> open the prompt (no BOS); each turn is a role token and a
    // newline, with no end-of-turn token (client/chat_presets.cc's glm4).
    f.bos = "[gMASK]<sop>";
    f.system_open = "<|system|>\n";
    f.user_open = "<|user|>\n";
    f.assistant_open = "<|assistant|>\n";
    f.answer_open = f.assistant_open;
  } else if (name == "plain") {
    f.system_close = "\n";
    f.user_close = "\n";
    f.assistant_close = "\n";
  } else {
    return absl::NotFoundError(absl::StrCat("unknown chat format '", name, "'"));
  }
  return f;
}

ChatFormat TemplateChatFormat(std::shared_ptr<const ModelChatTemplate> t) {
  ChatFormat f;
  f.name = "template";
  f.model_template = std::move(t);
  return f;
}

ChatFormat DetectChatFormat(std::string_view tokenizer_config_json, std::string_view model_type) {
  // Markers in the Jinja source are enough to tell the families apart; a
  // JSON-escaped template still contains them verbatim.
  std::string name = "plain";
  if (Contains(tokenizer_config_json, "<|im_start|>")) {
    name = "qwen";
  } else if (Contains(tokenizer_config_json, "<|start_header_id|>")) {
    name = "llama3";
  } else if (Contains(tokenizer_config_json, "[INST]")) {
    name = "mistral";
  } else if (Contains(tokenizer_config_json, "[gMASK]") || model_type == "glm" ||
             model_type == "glm4") {
    name = "glm4";
  } else if (model_type == "qwen2" || model_type == "qwen3") {
    name = "qwen";
  } else if (model_type == "mistral" || model_type == "mixtral") {
    name = "mistral";
  }
  return *FindChatFormat(name);
}

absl::StatusOr<BlendPrompt> SplitCompletionPrompt(std::string_view prompt,
                                                  std::string_view separator, bool chunks_listed) {
  return FromPieces(SplitOnSeparator(prompt, separator), separator, chunks_listed, "prompt");
}

absl::StatusOr<BlendPrompt> RenderChat(const std::vector<ChatMessage>& messages,
                                       const ChatFormat& format, std::string_view separator,
                                       bool chunks_listed) {
  if (messages.empty()) return absl::InvalidArgumentError("messages: at least one message");
  if (messages.back().role != "user") {
    return absl::InvalidArgumentError("messages: the last message must have role 'user'");
  }
  if (format.model_template != nullptr) {
    std::vector<ChatTurn> turns;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      const bool system = m.role == "system" || m.role == "developer";
      if (system && i != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages[", i, "]: a system message must come first"));
      }
      if (!system && m.role != "user" && m.role != "assistant") {
        return absl::InvalidArgumentError(absl::StrCat("messages[", i,
                                                       "].role: ", QuotedValue(m.role),
                                                       " (expected system, user or assistant)"));
      }
      turns.push_back({system ? "system" : m.role, m.content});
    }
    absl::StatusOr<FramedConversation> framed = FrameLastTurn(*format.model_template, turns);
    if (!framed.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("messages: ", framed.status().message()));
    }
    absl::StatusOr<BlendPrompt> p = FromPieces(SplitOnSeparator(framed->content, separator),
                                               separator, chunks_listed, "messages");
    if (!p.ok()) return p.status();
    p->prefix = framed->head + p->prefix;
    p->prompt_template = absl::StrCat("{question}", framed->tail);
    return p;
  }
  std::string head = format.bos;
  std::string pending_system;  // system_in_first_user: waits for the first user turn
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool last = i + 1 == messages.size();
    if (m.role == "system" || m.role == "developer") {
      if (i != 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("messages[", i, "]: a system message must come first"));
      }
      if (format.system_in_first_user) {
        pending_system = m.content + "\n\n";
      } else {
        absl::StrAppend(&head, format.system_open, m.content, format.system_close);
      }
    } else if (m.role == "user") {
      absl::StrAppend(&head, format.user_open, pending_system);
      pending_system.clear();
      if (!last) absl::StrAppend(&head, m.content, format.user_close);
    } else if (m.role == "assistant") {
      absl::StrAppend(&head, format.assistant_open, m.content, format.assistant_close);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("messages[", i,
                                                     "].role: ", QuotedValue(m.role),
                                                     " (expected system, user or assistant)"));
    }
  }
  absl::StatusOr<BlendPrompt> p = FromPieces(SplitOnSeparator(messages.back().content, separator),
                                             separator, chunks_listed, "messages");
  if (!p.ok()) return p.status();
  p->prefix = head + p->prefix;
  p->prompt_template = absl::StrCat("{question}", format.answer_open);
  return p;
}

}  // namespace infoflow::server::http
