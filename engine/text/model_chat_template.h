// A model's own chat template (transformers' layout of a model directory)
// and the blend convention's view of a conversation rendered with it.
//
// The template comes from chat_template.jinja when the directory has one
// (newer transformers save it there), else from tokenizer_config.json's
// "chat_template": a string, or a list of {"name", "template"} of which the
// one named "default" is used. bos_token / eos_token (strings or AddedToken
// objects {"content": ...}) and add_bos_token come from tokenizer_config.json.
//
// BOS and GLM's [gMASK]<sop>: the rendered text is the prompt, as
// transformers' apply_chat_template makes it (templates write bos_token, or
// "[gMASK]<sop>", themselves). Only when tokenizer_config.json says
// add_bos_token: true and the rendering does not already begin with
// bos_token is bos_token put in front, as the tokenizer would; a BOS is
// never doubled.
//
// Pure functions and an immutable struct; thread-safe.
#ifndef INFOFLOW_ENGINE_TEXT_MODEL_CHAT_TEMPLATE_H_
#define INFOFLOW_ENGINE_TEXT_MODEL_CHAT_TEMPLATE_H_

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/text/chat_template.h"

namespace infoflow {

struct ModelChatTemplate {
  std::string source;     // the Jinja text
  std::string origin;     // "chat_template.jinja" or "tokenizer_config.json"
  ChatTemplate compiled;  // source, parsed
  std::string bos_token;  // "" when the model has none
  std::string eos_token;
  bool add_bos_token = false;
};

// From the contents of tokenizer_config.json (may be "" when there is none)
// and of chat_template.jinja (nullopt when there is none). nullopt when
// neither holds a template; InvalidArgument naming the file when the JSON
// is malformed, a field has the wrong type, or the template does not parse.
absl::StatusOr<std::optional<ModelChatTemplate>> ModelChatTemplateFromFiles(
    std::string_view tokenizer_config_json, std::optional<std::string_view> chat_template_jinja);

// Reads those two files from `model_dir` (missing files are "none").
absl::StatusOr<std::optional<ModelChatTemplate>> LoadModelChatTemplate(
    const std::string& model_dir);

struct ChatTurn {
  std::string role;  // "system", "user", "assistant" (as the template expects)
  std::string content;
};

// A conversation rendered with add_generation_prompt, cut around the last
// message's content: head + content + tail is exactly the rendering (with
// the BOS rule above applied to head).
struct FramedConversation {
  std::string head;     // everything before the last message's content
  std::string content;  // that content as the template wrote it (e.g. trimmed)
  std::string tail;     // after it: the end of the turn, the assistant header
};

// Renders `turns` (the last one is the message to frame) twice: as given,
// and with the last content replaced by a sentinel, which locates head and
// tail. InvalidArgument when the template fails (raise_exception, limits) or
// does not print the last content exactly once as one piece.
absl::StatusOr<FramedConversation> FrameLastTurn(const ModelChatTemplate& t,
                                                 const std::vector<ChatTurn>& turns);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_TEXT_MODEL_CHAT_TEMPLATE_H_
