#include "client/chat_presets.h"

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

}  // namespace infoflow::cli
