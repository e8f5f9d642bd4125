// libFuzzer target for the chat template renderer (engine/text/
// chat_template.h): arbitrary bytes are a template, optionally followed by
// "\n@@vars@@\n" and a JSON object of variables; whatever parses is rendered
// (with a fixed conversation when no variables are given) and framed around
// the last message as the blend split does. Nothing may crash, leak, hang
// or exceed the limits it was given (the limits are small here so each run
// is quick; an over-limit template must fail with a Status, never run on).
//
// Not part of any library (engine/fuzz/ is outside the engine glob); built
// only with INFOFLOW_FUZZ=ON and clang (tests/fuzz/CMakeLists.txt).
//
//   ./chat_template_fuzz -max_len=8192 corpus_dir

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "engine/text/chat_template.h"
#include "engine/text/model_chat_template.h"
#include "nlohmann/json.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  constexpr std::string_view kVarsMark = "\n@@vars@@\n";
  const size_t mark = input.find(kVarsMark);
  const std::string_view source = input.substr(0, mark);
  infoflow::ChatTemplateLimits limits;
  limits.max_steps = 200000;
  limits.max_output_bytes = 1 << 20;
  limits.max_built_bytes = 8 << 20;
  absl::StatusOr<infoflow::ChatTemplate> t = infoflow::ChatTemplate::Parse(source, limits);
  if (!t.ok()) return 0;
  nlohmann::json vars = {{"messages",
                          {{{"role", "system"}, {"content", "S"}},
                           {{"role", "user"}, {"content", " u1 "}},
                           {{"role", "assistant"}, {"content", "<think>r</think>a1"}},
                           {{"role", "user"}, {"content", "h # # c # # q"}}}},
                         {"add_generation_prompt", true},
                         {"bos_token", "<s>"},
                         {"eos_token", "</s>"}};
  if (mark != std::string_view::npos) {
    nlohmann::json parsed = nlohmann::json::parse(input.substr(mark + kVarsMark.size()), nullptr,
                                                  /*allow_exceptions=*/false);
    if (!parsed.is_discarded() && parsed.is_object()) vars = std::move(parsed);
  }
  absl::StatusOr<std::string> out = t->Render(vars);
  if (out.ok() && out->size() > limits.max_output_bytes) std::abort();

  infoflow::ModelChatTemplate m;
  m.source = std::string(source);
  m.compiled = *t;
  m.bos_token = "<s>";
  m.add_bos_token = size % 2 == 0;
  absl::StatusOr<infoflow::FramedConversation> f =
      infoflow::FrameLastTurn(m, {{"system", "S"}, {"user", "h # # c # # q"}});
  if (f.ok() && f->head.size() + f->tail.size() > 2 * limits.max_output_bytes + 8) std::abort();
  return 0;
}
