#include "client/chat_presets.h"

#include "absl/strings/str_cat.h"
#include "engine/text/model_chat_template.h"

namespace infoflow::cli {

std::vector<std::string> ChatPresetNames() { return {"qwen", "llama3", "mistral", "glm4"}; }

std::optional<ChatPreset> FindChatPreset(const std::string& name, const std::string& system) {
  if (name == "qwen") {
    return ChatPreset{"<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n",
                      "\n\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"};
  }
  if (name == "llama3") {
    return ChatPreset{
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + system +
            "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n",
        "\n\nQuestion: {question}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"};
  }
  if (name == "mistral") {
    return ChatPreset{"<s>[INST] " + system + "\n\n", "\n\nQuestion: {question} [/INST]"};
  }
  if (name == "glm4") {
    // No BOS: [gMASK]<sop> open every GLM-4 prompt; each turn is a role
    // token, a newline, the content, with no end-of-turn token.
    return ChatPreset{"[gMASK]<sop><|system|>\n" + system + "<|user|>\n",
                      "\n\nQuestion: {question}<|assistant|>\n"};
  }
  return std::nullopt;
}

absl::StatusOr<ChatPreset> ChatPresetForModel(const ModelChatInfo& model,
                                              const std::string& system) {
  constexpr char kQuestion[] = "\n\nQuestion: {question}";
  if (!model.chat_template.empty()) {
    absl::StatusOr<ChatTemplate> compiled = ChatTemplate::Parse(model.chat_template);
    if (!compiled.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the model's chat template: ", compiled.status().message()));
    }
    ModelChatTemplate t;
    t.source = model.chat_template;
    t.origin = "the server's model";
    t.compiled = *std::move(compiled);
    t.bos_token = model.bos_token;
    t.eos_token = model.eos_token;
    t.add_bos_token = model.add_bos_token;
    // The user's content is the chunks, then "Question: ..."; any non-empty
    // text stands in for it when checking where the template puts it.
    absl::StatusOr<FramedConversation> f =
        FrameLastTurn(t, {{"system", system}, {"user", "context\n\nQuestion: ?"}});
    if (!f.ok()) return f.status();
    return ChatPreset{f->head, kQuestion + f->tail};
  }
  const std::string& m = model.model_type;
  const char* name = m == "qwen2" || m == "qwen3"       ? "qwen"
                     : m == "llama"                     ? "llama3"
                     : m == "mistral" || m == "mixtral" ? "mistral"
                     : m == "glm" || m == "glm4"        ? "glm4"
                                                        : nullptr;
  if (name == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--chat auto: the server's model has no chat template and model_type '", m,
        "' has no preset; name one (--chat qwen|llama3|mistral|glm4) or give --prefix/--template"));
  }
  return *FindChatPreset(name, system);
}

}  // namespace infoflow::cli
