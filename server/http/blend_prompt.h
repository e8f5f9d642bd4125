// LMCache's blend convention for OpenAI-style prompts (docs/DESIGN.md §14):
// a prompt "P # # C1 # # ... # # Cn # # Q", split on a separator string,
// becomes a Query with prefix P, chunks C1..Cn (stored and looked up by
// content hash, as gRPC text chunks are) and question Q under the prompt
// template "{question}". For chat requests the messages are first rendered
// with the model's chat format, and only the last user message is split.
//
// Pure functions over strings; thread-safe.
#ifndef INFOFLOW_SERVER_HTTP_BLEND_PROMPT_H_
#define INFOFLOW_SERVER_HTTP_BLEND_PROMPT_H_

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/text/model_chat_template.h"

namespace infoflow::server::http {

// The pieces of `text` between occurrences of `separator` (non-empty), in
// order; n separators give n + 1 pieces, some possibly empty.
std::vector<std::string_view> SplitOnSeparator(std::string_view text, std::string_view separator);

// A chat format: the text around each message of a conversation. The
// strings are those of the model families' own chat templates (and of the
// client's --chat presets, client/chat_presets.h, which also add
// "Question: " before the question).
struct ChatFormat {
  std::string name;        // "qwen", "llama3", "mistral", "glm4", "plain", "template"
  std::string bos;         // once, before the first message
  bool system_in_first_user = false;  // no system role: "{system}\n\n" opens the first user turn
  std::string system_open, system_close;
  std::string user_open, user_close;
  std::string assistant_open, assistant_close;
  // After the last user message: closes its turn and opens the answer.
  std::string answer_open;
  // Set for "template": the model's own chat template renders the messages
  // (engine/text/model_chat_template.h) and the strings above are unused.
  std::shared_ptr<const ModelChatTemplate> model_template;
};

// The format that renders with the model's own chat template.
ChatFormat TemplateChatFormat(std::shared_ptr<const ModelChatTemplate> t);

// Format names in --help order: qwen, llama3, mistral, glm4, plain.
std::vector<std::string> ChatFormatNames();

// The named format; NotFound for an unknown name.
//   qwen    ChatML (Qwen2, Qwen2.5, Qwen3): <|im_start|>ROLE\n ... <|im_end|>\n
//   llama3  <|begin_of_text|> then <|start_header_id|>ROLE<|end_header_id|>\n\n ... <|eot_id|>
//   mistral <s>[INST] {system}\n\n{user} [/INST]{assistant}</s>
//   glm4    [gMASK]<sop> then <|ROLE|>\n ... (GLM-4; no end-of-turn token)
//   plain   no markup: each earlier message's content then "\n"; the last
//           user message ends the prompt (models without a chat format,
//           such as the shipped infoflow-tiny)
absl::StatusOr<ChatFormat> FindChatFormat(const std::string& name);

// The format for a model: the chat_template of `tokenizer_config_json` (the
// file's contents, may be "") is recognised by its markers (<|im_start|>,
// <|start_header_id|>, [INST]); without one, `model_type` decides (qwen2,
// qwen3 -> qwen; mistral, mixtral -> mistral); otherwise plain. The Jinja
// template itself is not executed.
ChatFormat DetectChatFormat(std::string_view tokenizer_config_json, std::string_view model_type);

struct ChatMessage {
  std::string role;  // "system" ("developer" is read as it), "user", "assistant"
  std::string content;
};

// What a prompt becomes under the blend convention (QueryRequest fields).
struct BlendPrompt {
  std::string prefix;
  std::vector<std::string> chunks;
  std::string question;
  std::string prompt_template = "{question}";
};

// Splits a completion prompt: first piece prefix, middle pieces chunks, last
// piece question. A prompt without a separator is the question alone and one
// separator splits prefix from question: no chunks, a plain prompt that the
// query prefills whole. With `chunks_listed` (the request lists its chunks
// in infoflow.chunks) the prompt may not contain more pieces than that.
// InvalidArgument naming `prompt` (also for an empty chunk or question).
absl::StatusOr<BlendPrompt> SplitCompletionPrompt(std::string_view prompt,
                                                  std::string_view separator, bool chunks_listed);

// Renders a conversation: every message before the last, and the last
// (user) message's header, go into the prefix ahead of the first piece of
// the last message; its middle pieces are the chunks and its last piece the
// question; the template closes the user turn and opens the assistant's.
// InvalidArgument naming `messages` (empty, unknown role, last message not
// from the user, a system message after the first turn, pieces as in
// SplitCompletionPrompt).
absl::StatusOr<BlendPrompt> RenderChat(const std::vector<ChatMessage>& messages,
                                       const ChatFormat& format, std::string_view separator,
                                       bool chunks_listed);

}  // namespace infoflow::server::http

#endif  // INFOFLOW_SERVER_HTTP_BLEND_PROMPT_H_
