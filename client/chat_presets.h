// Named chat formats for `infoflow query --chat NAME`: the prefix (system
// prompt + user-turn header, before the chunks) and the prompt template
// (question + assistant header, after them) the model families' own chat
// templates produce for one system and one user message whose content is
// the retrieved context followed by the question. The strings are spelled
// out in README.md ("Instruct models") and in client/python/example_client.py.
//
// Pure functions; thread-safe.
#ifndef INFOFLOW_CLIENT_CHAT_PRESETS_H_
#define INFOFLOW_CLIENT_CHAT_PRESETS_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace infoflow::cli {

struct ChatPreset {
  std::string prefix;           // QueryRequest.prefix
  std::string prompt_template;  // QueryRequest.prompt_template ("{question}")
};

// The system prompt used when none is given.
inline constexpr char kDefaultSystemPrompt[] = "You are a helpful assistant.";

// Preset names, in the order --help lists them: qwen, llama3, mistral, glm4.
std::vector<std::string> ChatPresetNames();

// The preset `name` with `system` as the system prompt, or nullopt for an
// unknown name.
//   qwen    (ChatML: Qwen2.5, Qwen3 with thinking on)
//     prefix   "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n"
//     template "\n\nQuestion: {question}<|im_end|>\n<|im_start|>assistant\n"
//   llama3  (Llama-3, 3.1, 3.2, 3.3 Instruct)
//     prefix   "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n{system}"
//              "<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n"
//     template "\n\nQuestion: {question}<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
//   mistral (Mistral/Mixtral Instruct: no system role, so the system prompt
//            opens the user turn)
//     prefix   "<s>[INST] {system}\n\n"
//     template "\n\nQuestion: {question} [/INST]"
//   glm4    (GLM-4 chat, GLM-4-0414: transformers model_type glm / glm4; no
//            BOS, [gMASK]<sop> open the prompt, turns end at the next role
//            token, so <|user|> / <|observation|> are the stop ids)
//     prefix   "[gMASK]<sop><|system|>\n{system}<|user|>\n"
//     template "\n\nQuestion: {question}<|assistant|>\n"
//            (the trailing "\n" after <|assistant|> follows the GLM-4-0414
//            template's generation prompt; GLM-4-9B-chat's ends at
//            <|assistant|> and the model writes the newline itself)
std::optional<ChatPreset> FindChatPreset(const std::string& name, const std::string& system);

// What the server reports about its model (ModelInfoResponse fields).
struct ModelChatInfo {
  std::string model_type;
  std::string chat_template;  // "" = none
  std::string bos_token, eos_token;
  bool add_bos_token = false;
};

// `--chat auto`: with a chat template, the conversation [system, user] is
// rendered by it (engine/text/model_chat_template.h, add_generation_prompt
// true) and cut around the user's content: prefix = what precedes it (BOS as
// the model's config says), template = "\n\nQuestion: {question}" + what
// follows it, the same layout as the presets. Without one, the preset of
// `model_type` (qwen2, qwen3 -> qwen; llama -> llama3; mistral, mixtral ->
// mistral; glm, glm4 -> glm4). InvalidArgument when the template fails or
// neither applies.
absl::StatusOr<ChatPreset> ChatPresetForModel(const ModelChatInfo& model,
                                              const std::string& system);

}  // namespace infoflow::cli

#endif  // INFOFLOW_CLIENT_CHAT_PRESETS_H_
