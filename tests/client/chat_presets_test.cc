// The --chat presets (client/chat_presets.h): their spelling, and that the
// GLM-4 one tokenizes to GLM-4's special-token ids with a tokenizer that has
// GLM-4's special tokens.
#include "client/chat_presets.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
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

}  // namespace
}  // namespace infoflow::cli
