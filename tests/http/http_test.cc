// The OpenAI-compatible HTTP front end (server/http/): its pure parts
// (blend convention, chat formats, request checks, the status table), and
// the real infoflow-server binary on 127.0.0.1 fed bad input over HTTP --
// malformed JSON, huge bodies, wrong types, an unknown model, streams cut by
// the client, a reader that stops reading -- after which it still serves,
// still answers as gRPC does, and still has every chunk it stored.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_replace.h"
#include "client/chat_presets.h"
#include "infoflow/v1/infoflow.grpc.pb.h"
#include "server/http/blend_prompt.h"
#include "server/http/http_errors.h"
#include "server/http/http_listener.h"
#include "server/http/openai_request.h"
#include "tests/reliability/server_process.h"

namespace infoflow::server::http {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;
using nlohmann::json;

// ------------------------------------------------------------ pure parts

TEST(BlendPrompt, SplitsOnTheSeparator) {
  EXPECT_EQ(SplitOnSeparator("a # # b # # c", " # # "),
            (std::vector<std::string_view>{"a", "b", "c"}));
  EXPECT_EQ(SplitOnSeparator(" # # b # # ", " # # "),
            (std::vector<std::string_view>{"", "b", ""}));
  EXPECT_EQ(SplitOnSeparator("no separator", " # # "),
            (std::vector<std::string_view>{"no separator"}));
  absl::StatusOr<BlendPrompt> p = SplitCompletionPrompt("sys # # c1 # # c2 # # q?", " # # ", false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prefix, "sys");
  EXPECT_EQ(p->chunks, (std::vector<std::string>{"c1", "c2"}));
  EXPECT_EQ(p->question, "q?");
  EXPECT_EQ(p->prompt_template, "{question}");
}

TEST(BlendPrompt, APromptWithoutChunksIsPlainAndEmptyPiecesAreRefused) {
  // No separator: the question alone. One: prefix and question. Neither has
  // chunks; the query prefills them whole.
  absl::StatusOr<BlendPrompt> plain = SplitCompletionPrompt("just a question", " # # ", false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->prefix, "");
  EXPECT_TRUE(plain->chunks.empty());
  EXPECT_EQ(plain->question, "just a question");
  absl::StatusOr<BlendPrompt> two = SplitCompletionPrompt("prefix # # question", " # # ", false);
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->prefix, "prefix");
  EXPECT_TRUE(two->chunks.empty());
  EXPECT_EQ(two->question, "question");
  for (const char* prompt : {"", "p # # c # # ", "p # #  # # q", "p # # "}) {
    absl::StatusOr<BlendPrompt> p = SplitCompletionPrompt(prompt, " # # ", false);
    EXPECT_TRUE(absl::IsInvalidArgument(p.status())) << prompt;
  }
  // The request lists its chunks: the prompt is "question" or "prefix # # question".
  EXPECT_TRUE(SplitCompletionPrompt("q", " # # ", true).ok());
  EXPECT_EQ(SplitCompletionPrompt("p # # q", " # # ", true)->prefix, "p");
  EXPECT_FALSE(SplitCompletionPrompt("p # # c # # q", " # # ", true).ok());
}

// The chat formats render exactly the markup of the CLI's --chat presets
// (client/chat_presets.h), which add only "\n\nQuestion: " before the question.
TEST(BlendPrompt, ChatFormatsMatchTheClientPresets) {
  for (const std::string name : {"qwen", "llama3", "mistral", "glm4"}) {
    SCOPED_TRACE(name);
    const std::string system = "Answer from the documents.";
    absl::StatusOr<ChatFormat> f = FindChatFormat(name);
    ASSERT_TRUE(f.ok());
    absl::StatusOr<BlendPrompt> p = RenderChat(
        {{"system", system}, {"user", " # # chunk one # # What is it?"}}, *f, " # # ", false);
    ASSERT_TRUE(p.ok()) << p.status();
    const std::optional<cli::ChatPreset> preset = cli::FindChatPreset(name, system);
    ASSERT_TRUE(preset.has_value());
    EXPECT_EQ(p->prefix, preset->prefix);
    EXPECT_EQ(p->chunks, (std::vector<std::string>{"chunk one"}));
    EXPECT_EQ(p->question, "What is it?");
    EXPECT_EQ(p->prompt_template,
              absl::StrReplaceAll(preset->prompt_template, {{"\n\nQuestion: ", ""}}));
  }
}

TEST(BlendPrompt, ChatHistoryGoesIntoThePrefix) {
  absl::StatusOr<BlendPrompt> p =
      RenderChat({{"system", "S"}, {"user", "u1"}, {"assistant", "a1"}, {"user", "h # # c # # q"}},
                 *FindChatFormat("qwen"), " # # ", false);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->prefix,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nu1<|im_end|>\n"
            "<|im_start|>assistant\na1<|im_end|>\n<|im_start|>user\nh");
  EXPECT_FALSE(RenderChat({{"user", "h # # c # # q"}, {"assistant", "a"}}, *FindChatFormat("qwen"),
                          " # # ", false)
                   .ok());
  EXPECT_FALSE(RenderChat({{"tool", "x"}, {"user", "h # # c # # q"}}, *FindChatFormat("qwen"),
                          " # # ", false)
                   .ok());
}

std::shared_ptr<const ModelChatTemplate> RealTemplate(const std::string& file,
                                                      const std::string& bos = "") {
  std::ifstream in(std::string(INFOFLOW_SOURCE_DIR) + "/tests/data/chat_templates/" + file,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  absl::StatusOr<std::optional<ModelChatTemplate>> t =
      ModelChatTemplateFromFiles(json{{"bos_token", bos}}.dump(), ss.str());
  EXPECT_TRUE(t.ok() && t->has_value()) << file;
  return std::make_shared<const ModelChatTemplate>(**t);
}

// The models' own templates (real files, tests/data/chat_templates) give the
// same blend split as the named formats, history and all.
TEST(BlendPrompt, ModelTemplatesSplitAsTheNamedFormats) {
  struct Case {
    const char* file;
    const char* bos;
    const char* format;
  } cases[] = {{"qwen3.jinja", "", "qwen"},
               {"llama3.jinja", "<|begin_of_text|>", "llama3"},
               {"llama3_1.jinja", "<|begin_of_text|>", "llama3"},
               {"chatglm4.jinja", "", "glm4"}};
  const std::vector<std::vector<ChatMessage>> conversations = {
      {{"system", "Answer from the documents."},
       {"user", "Docs: # # chunk one # # chunk two # # What is it?"}},
      {{"user", "Docs: # # chunk one # # What is it?"}},
      {{"system", "S"}, {"user", "u1"}, {"assistant", "a1"}, {"user", "h # # c # # q"}},
      {{"developer", "S"}, {"user", "h # # c # # q"}}};
  for (const Case& c : cases) {
    const ChatFormat t = TemplateChatFormat(RealTemplate(c.file, c.bos));
    EXPECT_EQ(t.name, "template");
    for (size_t i = 0; i < conversations.size(); ++i) {
      SCOPED_TRACE(std::string(c.file) + " conversation " + std::to_string(i));
      absl::StatusOr<BlendPrompt> got = RenderChat(conversations[i], t, " # # ", false);
      absl::StatusOr<BlendPrompt> want =
          RenderChat(conversations[i], *FindChatFormat(c.format), " # # ", false);
      ASSERT_TRUE(got.ok()) << got.status();
      ASSERT_TRUE(want.ok()) << want.status();
      EXPECT_EQ(got->prefix, want->prefix);
      EXPECT_EQ(got->chunks, want->chunks);
      EXPECT_EQ(got->question, want->question);
      EXPECT_EQ(got->prompt_template, want->prompt_template);
    }
  }
  // GLM-4.6 (zai-org's template): [gMASK]<sop> from the template, once; the
  // generation prompt ends at <|assistant|>.
  absl::StatusOr<BlendPrompt> glm =
      RenderChat({{"user", "h # # c # # q"}}, TemplateChatFormat(RealTemplate("glm4_6.jinja")),
                 " # # ", false);
  ASSERT_TRUE(glm.ok()) << glm.status();
  EXPECT_EQ(glm->prefix, "[gMASK]<sop><|user|>\nh");
  EXPECT_EQ(glm->chunks, (std::vector<std::string>{"c"}));
  EXPECT_EQ(glm->prompt_template, "{question}<|assistant|>");
}

TEST(BlendPrompt, ModelTemplateErrorsNameMessages) {
  const ChatFormat gemma = TemplateChatFormat(RealTemplate("gemma3.jinja", "<bos>"));
  absl::StatusOr<BlendPrompt> p =
      RenderChat({{"user", "a"}, {"user", "h # # c # # q"}}, gemma, " # # ", false);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(p.status().message().find("messages: chat template "), std::string::npos) << p.status();
  EXPECT_NE(p.status().message().find("raised: Conversation roles must alternate"),
            std::string::npos);
  // The blend convention's own checks still apply.
  EXPECT_FALSE(RenderChat({{"user", "h # #  # # q"}}, gemma, " # # ", false).ok());
  // A message without chunks is a plain chat turn: the whole content is the question.
  absl::StatusOr<BlendPrompt> plain =
      RenderChat({{"user", "no chunks here"}}, gemma, " # # ", false);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_TRUE(plain->chunks.empty());
  EXPECT_EQ(plain->question, "no chunks here");
  EXPECT_FALSE(
      RenderChat({{"user", "h # # c # # q"}, {"system", "late"}}, gemma, " # # ", false).ok());
}

TEST(BlendPrompt, DetectsTheChatFormat) {
  EXPECT_EQ(DetectChatFormat(R"({"chat_template": "{% for m in messages %}<|im_start|>..."})", "llama")
                .name,
            "qwen");
  EXPECT_EQ(DetectChatFormat(R"({"chat_template": "<|start_header_id|>"})", "llama").name, "llama3");
  EXPECT_EQ(DetectChatFormat(R"({"chat_template": "[INST]"})", "llama").name, "mistral");
  EXPECT_EQ(DetectChatFormat("", "qwen3").name, "qwen");
  EXPECT_EQ(DetectChatFormat("", "mistral").name, "mistral");
  EXPECT_EQ(DetectChatFormat(R"({"chat_template": "[gMASK]<sop>{% for"})", "llama").name, "glm4");
  EXPECT_EQ(DetectChatFormat("", "glm4").name, "glm4");
  EXPECT_EQ(DetectChatFormat("", "llama").name, "plain");
}

RequestContext Ctx() {
  RequestContext c;
  c.model_name = "m";
  c.separator = " # # ";
  c.chat_format = *FindChatFormat("plain");
  c.max_new_tokens = 64;
  return c;
}

TEST(OpenAiRequest, TranslatesTheBlendConventionIntoAQueryRequest) {
  absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "P # # C1 # # C2 # # Q", "max_tokens": 7, "temperature": 0,
          "top_p": 0.5, "seed": 3, "stop": ["\n"], "n": 1, "stream": true,
          "stream_options": {"include_usage": true},
          "infoflow": {"method": "infoflow", "ratio": 0.3, "report": true, "reorder": true}})",
      Endpoint::kCompletions, Ctx());
  ASSERT_TRUE(r.ok()) << r.status();
  const v1::QueryRequest& q = r->query;
  EXPECT_EQ(q.prefix(), "P");
  ASSERT_EQ(q.chunks_size(), 2);
  EXPECT_EQ(q.chunks(0).text(), "C1");
  EXPECT_EQ(q.chunks(1).text(), "C2");
  EXPECT_EQ(q.question(), "Q");
  EXPECT_EQ(q.prompt_template(), "{question}");
  EXPECT_EQ(q.max_new_tokens(), 7);
  EXPECT_EQ(q.sampling().temperature(), 0.0f);
  EXPECT_EQ(q.sampling().top_p(), 0.5f);
  EXPECT_EQ(q.sampling().seed(), 3u);
  EXPECT_EQ(q.stop(0), "\n");
  EXPECT_EQ(q.method(), v1::METHOD_INFOFLOW);
  EXPECT_DOUBLE_EQ(q.ratio().value(), 0.3);
  EXPECT_TRUE(q.reorder());
  EXPECT_TRUE(r->stream && r->include_usage && r->report);

  r = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "Q", "infoflow": {"chunks": [{"key": "ab"}, {"text": "T"}]}})",
      Endpoint::kCompletions, Ctx());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->query.chunks(0).key(), "ab");
  EXPECT_EQ(r->query.chunks(1).text(), "T");
  EXPECT_FALSE(r->query.ignore_eos());
  // A completion's prefix is the user's to reuse: the gRPC default.
  EXPECT_EQ(r->query.prefix_store(), v1::PREFIX_STORE_UNSPECIFIED);

  r = ParseOpenAiRequest(R"({"model": "m", "prompt": "Q", "ignore_eos": true})",
                         Endpoint::kCompletions, Ctx());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->query.ignore_eos());
}

// A chat's history is in its prefix, and the next turn's prefix extends it:
// by default a prefix with history is stored only when it comes again; a
// system prompt alone at once (the gRPC default); infoflow.store_prefix says
// otherwise either way.
TEST(OpenAiRequest, AChatWithHistoryStoresItsPrefixWhenRepeated) {
  struct Case {
    const char* messages;
    const char* extension;
    v1::PrefixStore want;
  };
  const Case cases[] = {
      {R"([{"role": "user", "content": "Q"}])", "", v1::PREFIX_STORE_UNSPECIFIED},
      {R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])", "",
       v1::PREFIX_STORE_UNSPECIFIED},
      {R"([{"role": "developer", "content": "S"}, {"role": "user", "content": "Q"}])", "",
       v1::PREFIX_STORE_UNSPECIFIED},
      {R"([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
           {"role": "user", "content": "Q"}])",
       "", v1::PREFIX_STORE_REPEATED},
      {R"([{"role": "system", "content": "S"}, {"role": "user", "content": "u"},
           {"role": "assistant", "content": "a"}, {"role": "user", "content": "P # # C # # Q"}])",
       "", v1::PREFIX_STORE_REPEATED},
      {R"([{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"},
           {"role": "user", "content": "Q"}])",
       R"(, "infoflow": {"store_prefix": "always"})", v1::PREFIX_STORE_ALWAYS},
      {R"([{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}])",
       R"(, "infoflow": {"store_prefix": "Never"})", v1::PREFIX_STORE_NEVER},
  };
  for (const Case& c : cases) {
    const std::string body =
        absl::StrCat(R"({"model": "m", "messages": )", c.messages, c.extension, "}");
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(body, Endpoint::kChatCompletions, Ctx());
    ASSERT_TRUE(r.ok()) << body << " -> " << r.status();
    EXPECT_EQ(r->query.prefix_store(), c.want) << body;
  }
  for (const char* bad_value : {R"("sometimes")", "true"}) {
    const std::string body = absl::StrCat(
        R"({"model": "m", "prompt": "Q", "infoflow": {"store_prefix": )", bad_value, "}}");
    absl::StatusOr<OpenAiRequest> bad = ParseOpenAiRequest(body, Endpoint::kCompletions, Ctx());
    EXPECT_EQ(ErrorFromStatus(bad.status()).param, "infoflow.store_prefix") << bad.status();
  }
  absl::StatusOr<OpenAiRequest> bad = ParseOpenAiRequest(
      R"({"model": "m", "prompt": "Q", "ignore_eos": 1})", Endpoint::kCompletions, Ctx());
  EXPECT_EQ(ErrorFromStatus(bad.status()).param, "ignore_eos") << bad.status();
}

TEST(OpenAiRequest, RefusesBadBodiesNamingTheField) {
  struct Case {
    const char* body;
    absl::StatusCode code;
    const char* param;
  };
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  const Case cases[] = {
      {"{\"model\": ", absl::StatusCode::kInvalidArgument, "body"},
      {"[1, 2]", absl::StatusCode::kInvalidArgument, "body"},
      {deep.c_str(), absl::StatusCode::kInvalidArgument, "body"},
      {R"({"prompt": "P # # C # # Q"})", absl::StatusCode::kInvalidArgument, "model"},
      {R"({"model": 7, "prompt": "P # # C # # Q"})", absl::StatusCode::kInvalidArgument, "model"},
      {R"({"model": "other", "prompt": "P # # C # # Q"})", absl::StatusCode::kNotFound, "model"},
      {R"({"model": "m", "prompt": 5})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"model": "m", "prompt": [1, 2, 3]})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"model": "m", "prompt": "P # # C # # "})", absl::StatusCode::kInvalidArgument, "prompt"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "temperature": "hot"})",
       absl::StatusCode::kInvalidArgument, "temperature"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "temperature": 3})",
       absl::StatusCode::kInvalidArgument, "temperature"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "top_p": 0})",
       absl::StatusCode::kInvalidArgument, "top_p"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "max_tokens": 65})",
       absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "max_tokens": 1.5})",
       absl::StatusCode::kInvalidArgument, "max_tokens"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "n": 2})", absl::StatusCode::kInvalidArgument,
       "n"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "stream": "yes"})",
       absl::StatusCode::kInvalidArgument, "stream"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "stream_options": {"include_usage": true}})",
       absl::StatusCode::kInvalidArgument, "stream_options"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "stop": [1]})",
       absl::StatusCode::kInvalidArgument, "stop"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "logprobs": 2})",
       absl::StatusCode::kInvalidArgument, "logprobs"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "seed": "x"})",
       absl::StatusCode::kInvalidArgument, "seed"},
      {R"({"model": "m", "prompt": "Q", "tool_choice": "required"})",
       absl::StatusCode::kInvalidArgument, "tool_choice"},
      {R"({"model": "m", "prompt": "Q", "tool_choice": {"type": "function"}})",
       absl::StatusCode::kInvalidArgument, "tool_choice"},
      {R"({"model": "m", "prompt": "Q", "tools": [{"type": "function"}], "tool_choice": "auto"})",
       absl::StatusCode::kInvalidArgument, "tools"},
      {R"({"model": "m", "prompt": "Q", "function_call": {"name": "f"}})",
       absl::StatusCode::kInvalidArgument, "function_call"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "infoflow": {"method": "BEST"}})",
       absl::StatusCode::kInvalidArgument, "infoflow.method"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "infoflow": {"ratio": 2}})",
       absl::StatusCode::kInvalidArgument, "infoflow.ratio"},
      {R"({"model": "m", "prompt": "P # # C # # Q", "infoflow": {"colour": 1}})",
       absl::StatusCode::kInvalidArgument, "infoflow"},
      {R"({"model": "m", "prompt": "Q", "infoflow": {"chunks": [{"key": "a", "text": "b"}]}})",
       absl::StatusCode::kInvalidArgument, "infoflow.chunks[0]"},
      {"{\"model\": \"m\", \"prompt\": \"\xff # # C # # Q\"}", absl::StatusCode::kInvalidArgument,
       "body"},
  };
  for (const Case& c : cases) {
    absl::StatusOr<OpenAiRequest> r = ParseOpenAiRequest(c.body, Endpoint::kCompletions, Ctx());
    ASSERT_FALSE(r.ok()) << c.body;
    EXPECT_EQ(r.status().code(), c.code) << c.body << " -> " << r.status();
    EXPECT_EQ(ErrorFromStatus(r.status()).param, c.param) << c.body << " -> " << r.status();
  }
  absl::StatusOr<OpenAiRequest> chat = ParseOpenAiRequest(
      R"({"model": "m", "messages": [{"role": "user", "content": 3}]})",
      Endpoint::kChatCompletions, Ctx());
  EXPECT_EQ(ErrorFromStatus(chat.status()).param, "messages[0].content") << chat.status();
  // Their off values, as clients send them by default, are accepted.
  for (const char* off : {R"("tool_choice": "none")", R"("tool_choice": "auto", "tools": [])",
                          R"("function_call": "none")", R"("function_call": "auto")"}) {
    const std::string body = absl::StrCat(
        R"({"model": "m", "messages": [{"role": "user", "content": "Q"}], )", off, "}");
    EXPECT_TRUE(ParseOpenAiRequest(body, Endpoint::kChatCompletions, Ctx()).ok()) << body;
  }
}

// A small in-process fuzz of the parser: byte flips, truncations and
// splices of valid bodies never crash or throw, and every refusal names a
// field. (Deterministic seed, so a failure reproduces.)
TEST(OpenAiRequest, SurvivesMutatedBodies) {
  const std::vector<std::string> seeds = {
      R"({"model": "m", "prompt": "P # # C # # Q", "max_tokens": 7, "temperature": 0, "stop": ["x"],
          "stream": true, "stream_options": {"include_usage": true}, "n": 1, "seed": -1,
          "infoflow": {"method": "INFOFLOW", "ratio": 0.15, "report": true, "scoring_layers": [1],
                       "chunks": [{"key": "00"}, {"text": "t"}]}})",
      R"({"model": "m", "messages": [{"role": "system", "content": "s"},
          {"role": "user", "content": [{"type": "text", "text": "a # # b # # c"}]},
          {"role": "assistant", "content": null}, {"role": "user", "content": "x # # y # # z"}]})",
  };
  std::mt19937 rng(29);
  const char kBytes[] = "{}[]\",:0123456789.-eE truefalsnul\\u#\xff\x00";
  int ok = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string body = seeds[rng() % seeds.size()];
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !body.empty(); ++e) {
      const size_t at = rng() % body.size();
      switch (rng() % 4) {
        case 0: body[at] = kBytes[rng() % (sizeof kBytes - 1)]; break;
        case 1: body.erase(at, 1 + rng() % 8); break;
        case 2: body.insert(at, 1, kBytes[rng() % (sizeof kBytes - 1)]); break;
        case 3: body.resize(at); break;
      }
    }
    const Endpoint ep = rng() % 2 ? Endpoint::kCompletions : Endpoint::kChatCompletions;
    absl::StatusOr<OpenAiRequest> r;
    ASSERT_NO_THROW(r = ParseOpenAiRequest(body, ep, Ctx())) << body;
    if (r.ok()) {
      ++ok;
    } else {
      EXPECT_FALSE(ErrorFromStatus(r.status()).param.empty()) << body << " -> " << r.status();
    }
  }
  std::printf("%d of 20000 mutated bodies were still valid requests\n", ok);
}

TEST(HttpErrors, OneTableFromStatusToHttp) {
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::INVALID_ARGUMENT, "x: y").http_status, 400);
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::INVALID_ARGUMENT, "x: y").param, "x");
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::UNAUTHENTICATED, "a").http_status, 401);
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::UNAUTHENTICATED, "a").type, "authentication_error");
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::NOT_FOUND, "a").http_status, 404);
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::RESOURCE_EXHAUSTED, "a").http_status, 429);
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::UNAVAILABLE, "a").http_status, 503);
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::OUT_OF_RANGE, "a").http_status, 400);
  EXPECT_EQ(ErrorFromStatus(grpc::StatusCode::INTERNAL, "a").http_status, 500);
  const json body = json::parse(ErrorBody(ErrorFromStatus(grpc::StatusCode::NOT_FOUND, "m: gone")));
  EXPECT_EQ(body["error"]["message"], "m: gone");
  EXPECT_EQ(body["error"]["param"], "m");
  EXPECT_TRUE(body["error"].contains("type") && body["error"].contains("code"));
  // Request bytes that are not UTF-8 are replaced, not thrown on.
  EXPECT_NE(ErrorBody(ErrorFromStatus(grpc::StatusCode::NOT_FOUND, "model: '\xff'")), "");
}

// The Query path names QueryRequest's fields; an HTTP client reads the
// fields of the body it sent.
TEST(HttpErrors, QueryErrorsNameTheBodysField) {
  OpenAiRequest completion;
  completion.endpoint = Endpoint::kCompletions;
  OpenAiRequest chat;
  chat.endpoint = Endpoint::kChatCompletions;
  chat.max_tokens_field = "max_completion_tokens";
  OpenAiRequest listed = completion;
  listed.chunks_listed = true;
  struct Case {
    const OpenAiRequest* request;
    const char* query_field;
    const char* body_field;
  };
  const Case cases[] = {
      {&completion, "question", "prompt"},
      {&chat, "question", "messages"},
      {&chat, "prefix", "messages"},
      {&completion, "prompt_template", "prompt"},
      {&completion, "chunks", "prompt"},
      {&chat, "chunks[3].text", "messages"},
      {&listed, "chunks[3].key", "infoflow.chunks[3].key"},
      {&listed, "chunks", "infoflow.chunks"},
      {&completion, "max_new_tokens", "max_tokens"},
      {&chat, "max_new_tokens", "max_completion_tokens"},
      {&completion, "min_new_tokens", "min_tokens"},
      {&completion, "sampling.temperature", "temperature"},
      {&completion, "sampling.top_p", "top_p"},
      {&completion, "prefix_store", "infoflow.store_prefix"},
      {&completion, "scoring_layers", "infoflow.scoring_layers"},
      {&completion, "stop_ids[2]", "infoflow.stop_ids[2]"},
      {&completion, "ratio", "infoflow.ratio"},
      {&completion, "lego_k", "infoflow.lego_k"},
      {&completion, "prefix_mode", "infoflow.prefix_mode"},
      {&completion, "stop[1]", "stop[1]"},
      {&completion, "model", "model"},
      {&completion, "server", "server"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(BodyField(*c.request, c.query_field), c.body_field) << c.query_field;
  }

  const HttpError long_question =
      QueryError(chat,
                 grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "question: 3000 tokens, limit is 2048 (--max-prompt-tokens 2048)"),
                 /*token_limit=*/true);
  EXPECT_EQ(long_question.http_status, 400);
  EXPECT_EQ(long_question.param, "messages");
  EXPECT_EQ(long_question.code, "context_length_exceeded");
  EXPECT_EQ(long_question.message,
            "messages (question): 3000 tokens, limit is 2048 (--max-prompt-tokens 2048)");
  const HttpError past_positions =
      QueryError(completion,
                 grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                              "chunks + prompt + max_new_tokens: 9000 positions, over 4096"),
                 /*token_limit=*/true);
  EXPECT_EQ(past_positions.param, "prompt");
  EXPECT_EQ(past_positions.code, "context_length_exceeded");
  EXPECT_EQ(past_positions.message, "prompt + max_tokens: 9000 positions, over 4096");
  // The code comes from the mark, not the words: a refusal that mentions
  // tokens but is no length limit, and an OUT_OF_RANGE without the mark,
  // keep their status's code.
  const HttpError no_tokens = QueryError(
      listed,
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "chunks[0].text: chunk has no tokens"),
      /*token_limit=*/false);
  EXPECT_EQ(no_tokens.param, "infoflow.chunks[0].text");
  EXPECT_EQ(no_tokens.code, "invalid_argument");
  const HttpError other_range =
      QueryError(completion, grpc::Status(grpc::StatusCode::OUT_OF_RANGE, "seed: out of range"),
                 /*token_limit=*/false);
  EXPECT_EQ(other_range.param, "seed");
  EXPECT_EQ(other_range.code, "out_of_range");
  EXPECT_EQ(other_range.message, "seed: out of range");
  const HttpError layer = QueryError(
      completion,
      grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "scoring_layers: layer 9 outside [0, 6)"),
      /*token_limit=*/false);
  EXPECT_EQ(layer.param, "infoflow.scoring_layers");
  EXPECT_EQ(layer.code, "invalid_argument");
  EXPECT_EQ(layer.message, "infoflow.scoring_layers: layer 9 outside [0, 6)");
  // Not a length: the code stays the status's own. (Keys come only from a
  // listed chunk.)
  const HttpError unstored = QueryError(
      listed, grpc::Status(grpc::StatusCode::NOT_FOUND, "chunks: 1 key(s) not stored: ab"),
      /*token_limit=*/false);
  EXPECT_EQ(unstored.param, "infoflow.chunks");
  EXPECT_EQ(unstored.message, "infoflow.chunks: 1 key(s) not stored: ab");
  EXPECT_EQ(unstored.code, "not_found");
  const HttpError busy =
      QueryError(completion, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "server: busy"),
                 /*token_limit=*/false);
  EXPECT_EQ(busy.param, "server");
  EXPECT_EQ(busy.message, "server: busy");
  EXPECT_EQ(busy.http_status, 429);
}

// ------------------------------------------------ the real server binary

std::string TinyModel() { return std::string(INFOFLOW_SOURCE_DIR) + "/models/infoflow-tiny"; }

struct TempDir {
  std::string path;
  TempDir() {
    path = (fs::temp_directory_path() /
            ("infoflow_http_" + std::to_string(getpid()) + "_" + std::to_string(counter++)))
               .string();
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static inline int counter = 0;
};

// ------------------------------------------------------------ listener parts

TEST(ElasticThreadPool, RunsEveryTaskOnAtMostMaxThreads) {
  std::atomic<int> ran{0}, now{0}, most{0};
  {
    ElasticThreadPool pool(4, 100);
    for (int i = 0; i < 50; ++i) {
      pool.enqueue([&] {
        const int n = ++now;
        int m = most.load();
        while (n > m && !most.compare_exchange_weak(m, n)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        --now;
        ++ran;
      });
      EXPECT_LE(pool.threads(), 4u);
    }
    pool.shutdown();  // runs what is still queued, then joins
  }
  EXPECT_EQ(ran.load(), 50);
  EXPECT_LE(most.load(), 4);
  EXPECT_GE(most.load(), 2);  // it did run tasks side by side
}

TEST(ElasticThreadPool, StartsThreadsOnDemandAndIdleOnesExit) {
  ElasticThreadPool pool(64, 64, std::chrono::milliseconds(100));
  EXPECT_EQ(pool.threads(), 0u);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> started{0};
  for (int i = 0; i < 8; ++i) {
    pool.enqueue([&] {
      ++started;
      std::unique_lock<std::mutex> l(mu);
      cv.wait(l, [&] { return release; });
    });
  }
  // Eight tasks that block together need eight threads.
  for (int i = 0; i < 500 && started.load() < 8; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(started.load(), 8);
  EXPECT_EQ(pool.threads(), 8u);
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  for (int i = 0; i < 500 && pool.threads() > 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(pool.threads(), 0u);
  // And it starts again after they all left (the exited ones are joined).
  std::atomic<bool> again{false};
  pool.enqueue([&] { again = true; });
  pool.shutdown();
  EXPECT_TRUE(again.load());
}

TEST(ElasticThreadPool, RunsATaskItHasNoRoomForAtOnceInOverflow) {
  ElasticThreadPool pool(2, 3);
  std::mutex mu;
  std::condition_variable cv;
  bool release = false;
  std::atomic<int> ran{0}, overflowed{0};
  auto task = [&] {
    if (ElasticThreadPool::InOverflow()) {
      ++overflowed;
      return;  // what the listener does: refuse at once
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return release; });
    ++ran;
  };
  for (int i = 0; i < 5; ++i) pool.enqueue(task);  // 2 running, 3 waiting
  EXPECT_EQ(overflowed.load(), 0);
  pool.enqueue(task);  // no room: runs here, now
  pool.enqueue(task);
  EXPECT_EQ(overflowed.load(), 2);
  EXPECT_FALSE(ElasticThreadPool::InOverflow());
  {
    std::lock_guard<std::mutex> l(mu);
    release = true;
  }
  cv.notify_all();
  pool.shutdown();
  EXPECT_EQ(ran.load(), 5);
}

// TCP_NODELAY of this process's socket whose peer is 127.0.0.1:`peer_port`
// ("1" / "0"), found through /proc/self/fd; "none" if there is none.
std::string NoDelayOfSocketWithPeerPort(int peer_port) {
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    const int fd = std::stoi(e.path().filename().string());
    sockaddr_in peer{};
    socklen_t len = sizeof peer;
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0 ||
        peer.sin_family != AF_INET || ntohs(peer.sin_port) != peer_port) {
      continue;
    }
    int on = -1;
    len = sizeof on;
    if (getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &on, &len) != 0) return "error";
    return on != 0 ? "1" : "0";
  }
  return "none";
}

// Each connection is served with Nagle off: an SSE event (a token) is a
// small write, and with Nagle each waits for the client's (delayed)
// acknowledgement of the one before. Read back from the server's own socket.
TEST(RequestDeadlineServer, ServesEachConnectionWithNagleOff) {
  RequestDeadlineServer server(RequestLimits{}, "busy", nullptr);
  server.Get("/nodelay", [](const httplib::Request& req, httplib::Response& res) {
    res.set_content(NoDelayOfSocketWithPeerPort(req.remote_port), "text/plain");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&server] { server.listen_after_bind(); });
  httplib::Client client("127.0.0.1", port);
  httplib::Result r = client.Get("/nodelay");
  server.stop();
  serving.join();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->body, "1");
}

int HttpPort(const testing::ServerProcess& srv) {
  std::smatch m;
  const std::string log = srv.log();
  if (!std::regex_search(log, m, std::regex("http on http://127\\.0\\.0\\.1:(\\d+)"))) return 0;
  return std::stoi(m[1]);
}

// A raw connection, for what a well-behaved client never does.
class RawConnection {
 public:
  explicit RawConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    timeval tv{10, 0};
    setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    if (connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) Close();
  }
  ~RawConnection() { Close(); }
  bool ok() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  bool Send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // Reads until `until` appears or the peer closes; what was read.
  std::string ReadUntil(const std::string& until) {
    std::string got;
    char buf[4096];
    while (got.find(until) == std::string::npos) {
      const ssize_t n = recv(fd_, buf, sizeof buf, 0);
      if (n <= 0) break;
      got.append(buf, static_cast<size_t>(n));
    }
    return got;
  }
  // Reads until the peer closes.
  std::string ReadToClose() { return ReadUntil(std::string(1, '\0') + "never sent"); }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
};

std::string PostRequest(const std::string& path, const std::string& body) {
  return "POST " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
         "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
}

// Chunks the shipped model can answer from (its synthetic world).
const char kPrompt[] =
    " # # Arthur Tanaka lives in Paris. His secret code is 4417. # # Maria Lopez owns a red boat "
    "and her secret code is 9021. # # \nQuestion: What is the secret code of Arthur Tanaka?\nAnswer:";

json CompletionBody(bool stream, int max_tokens = 12) {
  return {{"model", "infoflow-tiny"}, {"prompt", kPrompt},   {"max_tokens", max_tokens},
          {"temperature", 0},         {"stream", stream},    {"infoflow", {{"report", true}}}};
}

class HttpServerTest : public ::testing::Test {
 protected:
  void StartServer(std::vector<std::string> extra = {}) {
    extra.push_back("--http-listen=127.0.0.1:0");
    extra.push_back("--threads=2");
    extra.push_back("--store-sync=false");
    srv_ = std::make_unique<testing::ServerProcess>(INFOFLOW_SERVER_BIN, TinyModel(), dir_.path + "/kv",
                                                    dir_.path + "/server.log", extra);
    std::string error;
    ASSERT_TRUE(srv_->Start(&error)) << error;
    port_ = HttpPort(*srv_);
    ASSERT_GT(port_, 0) << srv_->log();
  }
  httplib::Result Post(const std::string& path, const std::string& body,
                       const httplib::Headers& headers = {}) {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(60);
    return c.Post(path.c_str(), headers, body, "application/json");
  }
  // Posts `body` expecting a 200: its JSON, or null (with a failure) otherwise.
  json PostOk(const std::string& path, const json& body) {
    httplib::Result r = Post(path, body.dump());
    EXPECT_TRUE(r) << path << ": no response";
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return r->status == 200 ? json::parse(r->body) : json();
  }
  // The server answers /health and a real query correctly.
  void ExpectServing(const std::string& expected_text) {
    httplib::Client c("127.0.0.1", port_);
    httplib::Result h = c.Get("/health");
    ASSERT_TRUE(h) << "no answer on /health";
    EXPECT_EQ(h->status, 200);
    httplib::Result r = Post("/v1/completions", CompletionBody(false).dump());
    ASSERT_TRUE(r);
    ASSERT_EQ(r->status, 200) << r->body;
    EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], expected_text);
  }

  // infoflow_http_requests_dropped_total{reason=`reason`} (-1 if absent).
  double Dropped(const std::string& reason) {
    std::smatch m;
    const std::string text = srv_->Metrics();
    const std::regex re("infoflow_http_requests_dropped_total\\{reason=\"" + reason +
                        "\"\\} ([0-9.e+]+)");
    return std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
  }
  // The count of `reason` once it is at least `n`, or after 5 s.
  double DroppedAtLeast(const std::string& reason, double n) {
    double got = Dropped(reason);
    for (int i = 0; i < 50 && got < n; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      got = Dropped(reason);
    }
    return got;
  }

  TempDir dir_;
  std::unique_ptr<testing::ServerProcess> srv_;
  int port_ = 0;
};

// The text a gRPC Query streams, and its status.
std::string GrpcText(const testing::ServerProcess& srv, const v1::QueryRequest& req,
                     grpc::Status* status) {
  auto stub = v1::Query::NewStub(srv.channel());
  grpc::ClientContext ctx;
  auto reader = stub->Query(&ctx, req);
  std::string text;
  v1::QueryResponse msg;
  while (reader->Read(&msg)) {
    if (msg.has_token()) text += msg.token().text();
  }
  *status = reader->Finish();
  return text;
}

// The same greedy answer as the gRPC Query with prefix = first piece, chunks =
// the middle pieces, question = the last, prompt_template = "{question}".
std::string GrpcAnswer(const testing::ServerProcess& srv, const std::string& prompt) {
  const std::vector<std::string_view> pieces = SplitOnSeparator(prompt, " # # ");
  v1::QueryRequest req;
  req.set_prefix(std::string(pieces.front()));
  for (size_t i = 1; i + 1 < pieces.size(); ++i) req.add_chunks()->set_text(std::string(pieces[i]));
  req.set_question(std::string(pieces.back()));
  req.set_prompt_template("{question}");
  req.set_max_new_tokens(12);
  grpc::Status status;
  std::string text = GrpcText(srv, req, &status);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return text;
}

TEST_F(HttpServerTest, AnswersAsTheGrpcQueryDoesAndReportsCachedTokens) {
  StartServer();
  httplib::Result first = Post("/v1/completions", CompletionBody(false).dump());
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  const json a = json::parse(first->body);
  const std::string text = a["choices"][0]["text"];
  EXPECT_EQ(text, GrpcAnswer(*srv_, kPrompt));
  EXPECT_EQ(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(a["infoflow"]["chunk_misses"], 2);
  httplib::Result second = Post("/v1/chat/completions",
                                json{{"model", "infoflow-tiny"},
                                     {"messages", {{{"role", "user"}, {"content", kPrompt}}}},
                                     {"max_tokens", 12},
                                     {"temperature", 0},
                                     {"infoflow", {{"report", true}}}}
                                    .dump());
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  const json b = json::parse(second->body);
  // The plain chat format adds nothing around one user message.
  EXPECT_EQ(b["choices"][0]["message"]["content"], text);
  EXPECT_GT(b["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(b["infoflow"]["chunk_hits"], 2);
  std::printf("TTFT first (chunks prefilled) %.2f ms, second (chunks from the store) %.2f ms\n",
              a["infoflow"]["ttft_ms"].get<double>(), b["infoflow"]["ttft_ms"].get<double>());
}

// A prompt without the blend separator is a plain prompt, as any completion
// endpoint serves it: prefix + question prefilled whole, the same answer for
// every method. "P # # Q" answers as gRPC's FULL over the same tokens given
// as one chunk prefilled at 0 (the prefix is prefilled at 0 with no BOS, as
// a PREFIX_MODE_NONE chunk is). gRPC's own Query still requires a chunk.
TEST_F(HttpServerTest, APromptWithoutChunksIsAPlainPrompt) {
  StartServer();
  const std::string prefix = "Arthur Tanaka lives in Paris. His secret code is 4417.";
  const std::string question = "\nQuestion: What is the secret code of Arthur Tanaka?\nAnswer:";
  v1::QueryRequest as_chunk;
  as_chunk.add_chunks()->set_text(prefix);
  as_chunk.set_prefix_mode(v1::PREFIX_MODE_NONE);
  as_chunk.set_question(question);
  as_chunk.set_prompt_template("{question}");
  as_chunk.set_method(v1::METHOD_FULL);
  as_chunk.set_max_new_tokens(12);
  grpc::Status status;
  const std::string want = GrpcText(*srv_, as_chunk, &status);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_FALSE(want.empty());
  for (const char* method :
       {"", "FULL", "NONE", "INFOFLOW", "INFOFLOW_BLEND", "CACHEBLEND", "EPIC", "RANDOM"}) {
    SCOPED_TRACE(method);
    json body = {{"model", "infoflow-tiny"},
                 {"prompt", prefix + " # # " + question},
                 {"max_tokens", 12},
                 {"temperature", 0},
                 {"infoflow", {{"report", true}}}};
    if (*method != '\0') body["infoflow"]["method"] = method;
    const json a = PostOk("/v1/completions", body);
    ASSERT_TRUE(a.is_object());
    EXPECT_EQ(a["choices"][0]["text"], want);
    EXPECT_EQ(a["infoflow"]["context_tokens"], 0);
    EXPECT_EQ(a["infoflow"]["recomputed_tokens"], 0);
  }
  // No separator at all: the question after BOS, as a completion or as the
  // one message of a chat (the plain format adds nothing around it).
  const json bare = PostOk(
      "/v1/completions",
      {{"model", "infoflow-tiny"}, {"prompt", question}, {"max_tokens", 12}, {"temperature", 0}});
  const json chat =
      PostOk("/v1/chat/completions", {{"model", "infoflow-tiny"},
                                      {"messages", {{{"role", "user"}, {"content", question}}}},
                                      {"max_tokens", 12},
                                      {"temperature", 0}});
  ASSERT_TRUE(bare.is_object() && chat.is_object());
  EXPECT_EQ(bare["choices"][0]["text"], chat["choices"][0]["message"]["content"]);
  v1::QueryRequest none = as_chunk;
  none.clear_chunks();
  GrpcText(*srv_, none, &status);
  EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("chunks: at least one chunk"), std::string::npos);
}

// A multi-turn chat's prefix (its history) is stored only the second time
// it comes: a conversation's turns each leave nothing behind, few-shot turns
// repeated as is are stored once seen twice. The answer is the same whether
// the prefix was prefilled now or read from the store. "never" and "always"
// do what they say; a system prompt alone is stored at once.
TEST_F(HttpServerTest, AChatsHistoryIsStoredOnlyWhenItComesAgain) {
  StartServer();
  auto history = [](const std::string& first_turn) {
    return json{{{"role", "user"}, {"content", first_turn}},
                {{"role", "assistant"}, {"content", "Noted."}},
                {{"role", "user"}, {"content", "Where does Arthur Tanaka live?"}}};
  };
  auto ask = [&](const json& messages, const json& extension) {
    json body = {{"model", "infoflow-tiny"},
                 {"messages", messages},
                 {"max_tokens", 8},
                 {"temperature", 0},
                 {"infoflow", extension}};
    body["infoflow"]["report"] = true;
    return PostOk("/v1/chat/completions", body);
  };
  auto cached = [](const json& a) {  // a failed ask has already failed the test
    return a.is_object() && a["infoflow"]["prefix_cached"].get<bool>();
  };

  const json turns = history("Arthur Tanaka lives in Paris.");
  const json first = ask(turns, json::object());   // prefilled, remembered
  const json second = ask(turns, json::object());  // prefilled, stored
  const json third = ask(turns, json::object());   // read
  ASSERT_TRUE(first.is_object() && second.is_object() && third.is_object());
  EXPECT_FALSE(cached(first));
  EXPECT_FALSE(cached(second));
  EXPECT_TRUE(cached(third));
  EXPECT_EQ(first["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_GT(third["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  const std::string answer = first["choices"][0]["message"]["content"];
  EXPECT_EQ(second["choices"][0]["message"]["content"], answer);
  EXPECT_EQ(third["choices"][0]["message"]["content"], answer);

  const json other = history("Maria Lopez owns a red boat.");
  for (int i = 0; i < 3; ++i) EXPECT_FALSE(cached(ask(other, {{"store_prefix", "never"}})));
  const json kept = history("Li Wei plays the cello.");
  EXPECT_FALSE(cached(ask(kept, {{"store_prefix", "always"}})));
  EXPECT_TRUE(cached(ask(kept, json::object())));

  const json system = {{{"role", "system"}, {"content", "You answer briefly."}},
                       {{"role", "user"}, {"content", "Where does Arthur Tanaka live?"}}};
  EXPECT_FALSE(cached(ask(system, json::object())));
  EXPECT_TRUE(cached(ask(system, json::object())));
}

// ignore_eos (vLLM's): the stop ids are masked until max_tokens. With the
// greedy first token as a stop id the answer is empty; with ignore_eos it
// runs to max_tokens.
TEST_F(HttpServerTest, IgnoreEosRunsToMaxTokens) {
  StartServer();
  v1::QueryRequest req;
  req.add_chunks()->set_text("Arthur Tanaka lives in Paris.");
  req.set_question("Where does Arthur Tanaka live?");
  req.set_prompt_template("{question}");  // as the HTTP API's
  req.set_prefix_mode(v1::PREFIX_MODE_BOS);
  req.set_max_new_tokens(1);
  auto stub = v1::Query::NewStub(srv_->channel());
  grpc::ClientContext ctx;
  auto reader = stub->Query(&ctx, req);
  int32_t first = -1;
  for (v1::QueryResponse msg; reader->Read(&msg);) {
    if (msg.has_token()) first = msg.token().id();
  }
  ASSERT_TRUE(reader->Finish().ok());
  ASSERT_GE(first, 0);
  for (bool ignore : {false, true}) {
    SCOPED_TRACE(ignore);
    json body = {
        {"model", "infoflow-tiny"},
        {"prompt", " # # Arthur Tanaka lives in Paris. # # Where does Arthur Tanaka live?"},
        {"max_tokens", 5},
        {"temperature", 0},
        {"ignore_eos", ignore},
        {"infoflow", {{"stop_ids", {first}}, {"prefix_mode", "bos"}}}};
    const json a = PostOk("/v1/completions", body);
    ASSERT_TRUE(a.is_object());
    EXPECT_EQ(a["usage"]["completion_tokens"], ignore ? 5 : 0);
    EXPECT_EQ(a["choices"][0]["finish_reason"], ignore ? "length" : "stop");
  }
}

// A prompt without chunks has no context, so the context's budget goes to
// its prefix and then to its prompt. With --max-prompt-tokens 64,
// --max-prefix-tokens 64 and --max-context-tokens 200: a plain prompt of
// ~200 tokens is served (prefilled whole) while the same text as a blend
// question is refused; past 264 tokens it is refused naming both flags. A
// chat whose history is ~200 tokens is served; its prefix leaves the
// prompt less than 264, so a long last message is then refused.
TEST_F(HttpServerTest, APlainPromptHasTheContextsBudget) {
  StartServer({"--max-prompt-tokens=64", "--max-prefix-tokens=64", "--max-context-tokens=200"});
  auto words = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += i % 2 == 0 ? " lamp" : " river";
    return text;
  };
  auto complete = [&](const std::string& prompt) {
    return Post(
        "/v1/completions",
        json{{"model", "infoflow-tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}}
            .dump());
  };
  httplib::Result served = complete(words(100));  // two tokens a word
  ASSERT_TRUE(served);
  ASSERT_EQ(served->status, 200) << served->body;
  const int prompt_tokens = json::parse(served->body)["usage"]["prompt_tokens"];
  EXPECT_GT(prompt_tokens, 64);
  EXPECT_LE(prompt_tokens, 264);

  httplib::Result blend = complete(" # # a chunk # # " + words(100));
  ASSERT_TRUE(blend);
  EXPECT_EQ(blend->status, 400) << blend->body;
  EXPECT_NE(blend->body.find("(--max-prompt-tokens 64)"), std::string::npos) << blend->body;

  httplib::Result over = complete(words(400));
  ASSERT_TRUE(over);
  EXPECT_EQ(over->status, 400) << over->body;
  EXPECT_NE(over->body.find("--max-prompt-tokens 64 + --max-context-tokens 200"), std::string::npos)
      << over->body;
  const json over_error = json::parse(over->body)["error"];
  EXPECT_EQ(over_error["param"], "prompt");
  EXPECT_EQ(over_error["code"], "context_length_exceeded");
  EXPECT_EQ(over_error["message"].get<std::string>().rfind("prompt (question): ", 0), 0u)
      << over->body;

  auto chat = [&](const std::string& last) {
    const json messages = {{{"role", "user"}, {"content", words(100)}},
                           {{"role", "assistant"}, {"content", "Noted."}},
                           {{"role", "user"}, {"content", last}}};
    return Post("/v1/chat/completions",
                json{{"model", "infoflow-tiny"}, {"messages", messages}, {"max_tokens", 4}}.dump());
  };
  httplib::Result long_history = chat("Which word came first?");
  ASSERT_TRUE(long_history);
  EXPECT_EQ(long_history->status, 200) << long_history->body;
  httplib::Result both_long = chat(words(100));  // fits 264 alone, not beside the history
  ASSERT_TRUE(both_long);
  EXPECT_EQ(both_long->status, 400) << both_long->body;
  EXPECT_NE(both_long->body.find("of --max-context-tokens 200 that the prefix left"),
            std::string::npos)
      << both_long->body;
  EXPECT_EQ(json::parse(both_long->body)["error"]["param"], "messages");
}

// Without max_tokens, as OpenAI: a completion gets 16 tokens, and a chat
// answers until done: up to --max-new-tokens, fitted to the model's
// positions left (infoflow-tiny has 4096) instead of refused for want of
// them. A max_tokens the client sent is kept, and refused when it does not fit.
TEST_F(HttpServerTest, MaxTokensDefaultsAsOpenAIsDo) {
  StartServer();
  auto words = [](int n) {
    std::string text;
    for (int i = 0; i < n; ++i) text += i % 2 == 0 ? " lamp" : " river";
    return text;
  };
  auto post_json = [&](const std::string& path, const json& body) {
    httplib::Result r = Post(path, body.dump());
    EXPECT_TRUE(r) << path;
    if (!r) return json();
    EXPECT_EQ(r->status, 200) << r->body;
    return json::parse(r->body);
  };
  const json completion = post_json(
      "/v1/completions",
      {{"model", "infoflow-tiny"}, {"prompt", "Question: hi\nAnswer:"}, {"ignore_eos", true}});
  EXPECT_EQ(completion["usage"]["completion_tokens"], 16) << completion;

  auto chat = [](const std::string& content) {
    return json{{"model", "infoflow-tiny"},
                {"messages", {{{"role", "user"}, {"content", content}}}},
                {"ignore_eos", true}};
  };
  const json short_chat = post_json("/v1/chat/completions", chat("Question: hi\nAnswer:"));
  EXPECT_EQ(short_chat["usage"]["completion_tokens"], 512) << short_chat;  // --max-new-tokens

  const json long_chat = post_json("/v1/chat/completions", chat(words(2000)));
  const int prompt_tokens = long_chat["usage"]["prompt_tokens"];
  ASSERT_GT(prompt_tokens, 4096 - 512) << long_chat;  // so the default had to shrink
  ASSERT_LT(prompt_tokens, 4096) << long_chat;
  EXPECT_EQ(long_chat["usage"]["completion_tokens"], 4096 - prompt_tokens) << long_chat["usage"];
  EXPECT_EQ(long_chat["choices"][0]["finish_reason"], "length");

  json asked = chat(words(2000));
  asked["max_tokens"] = 512;
  httplib::Result refused = Post("/v1/chat/completions", asked.dump());
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_EQ(json::parse(refused->body)["error"]["code"], "context_length_exceeded")
      << refused->body;
}

// A model directory with a chat template in tokenizer_config.json: auto
// picks it, chat requests are rendered by it (here it prints the user's
// content, so the answer equals the completion's), its raise_exception is a
// 400 naming messages, and ModelInfo hands the template to `--chat auto`.
const char kTinyTemplate[] =
    "{%- if messages|length > 1 %}{{ raise_exception('one message only') }}{% endif -%}"
    "{%- for m in messages %}{{ m.content }}{% endfor %}";

// infoflow-tiny's files (linked) in `dir`, with a tokenizer_config.json
// holding kTinyTemplate.
std::string TinyModelWithTemplate(const std::string& dir) {
  const std::string model = dir + "/infoflow-tiny";  // the served model's name
  fs::create_directories(model);
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json"}) {
    fs::create_symlink(TinyModel() + "/" + f, model + "/" + f);
  }
  std::ofstream(model + "/tokenizer_config.json")
      << json{{"chat_template", kTinyTemplate}, {"eos_token", "</s>"}}.dump();
  return model;
}

TEST_F(HttpServerTest, RendersChatWithTheModelsOwnTemplate) {
  const std::string model = TinyModelWithTemplate(dir_.path);
  const std::string tmpl = kTinyTemplate;
  srv_ = std::make_unique<testing::ServerProcess>(
      INFOFLOW_SERVER_BIN, model, dir_.path + "/kv", dir_.path + "/server.log",
      std::vector<std::string>{"--http-listen=127.0.0.1:0", "--threads=2", "--store-sync=false"});
  std::string error;
  ASSERT_TRUE(srv_->Start(&error)) << error;
  port_ = HttpPort(*srv_);
  ASSERT_GT(port_, 0) << srv_->log();
  EXPECT_NE(srv_->log().find("chat format template"), std::string::npos) << srv_->log();

  httplib::Result first = Post("/v1/completions", CompletionBody(false).dump());
  ASSERT_TRUE(first);
  ASSERT_EQ(first->status, 200) << first->body;
  json chat = {{"model", "infoflow-tiny"},
               {"messages", {{{"role", "user"}, {"content", kPrompt}}}},
               {"max_tokens", 12},
               {"temperature", 0}};
  httplib::Result second = Post("/v1/chat/completions", chat.dump());
  ASSERT_TRUE(second);
  ASSERT_EQ(second->status, 200) << second->body;
  EXPECT_EQ(json::parse(second->body)["choices"][0]["message"]["content"],
            json::parse(first->body)["choices"][0]["text"]);

  chat["messages"] = {{{"role", "system"}, {"content", "S"}},
                      {{"role", "user"}, {"content", kPrompt}}};
  httplib::Result refused = Post("/v1/chat/completions", chat.dump());
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 400) << refused->body;
  EXPECT_NE(refused->body.find("raised: one message only"), std::string::npos) << refused->body;
  EXPECT_NE(refused->body.find("messages"), std::string::npos) << refused->body;

  auto admin = v1::Admin::NewStub(srv_->channel());
  grpc::ClientContext ctx;
  v1::ModelInfoResponse info;
  ASSERT_TRUE(admin->ModelInfo(&ctx, v1::ModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.chat_template(), tmpl);
  EXPECT_EQ(info.eos_token(), "</s>");
  EXPECT_FALSE(info.add_bos_token());
}

// An explicit named format wins over the model's template; "template" with
// no template refuses to start.
TEST_F(HttpServerTest, ExplicitChatFormatWinsAndTemplateNeedsOne) {
  srv_ = std::make_unique<testing::ServerProcess>(
      INFOFLOW_SERVER_BIN, TinyModelWithTemplate(dir_.path), dir_.path + "/kv",
      dir_.path + "/server.log",
      std::vector<std::string>{"--http-listen=127.0.0.1:0", "--http-chat-format=qwen"});
  std::string error;
  ASSERT_TRUE(srv_->Start(&error)) << error;
  EXPECT_NE(srv_->log().find("chat format qwen"), std::string::npos) << srv_->log();
  srv_ = std::make_unique<testing::ServerProcess>(
      INFOFLOW_SERVER_BIN, TinyModel(), dir_.path + "/kv2", dir_.path + "/server2.log",
      std::vector<std::string>{"--http-listen=127.0.0.1:0", "--http-chat-format=template"});
  EXPECT_FALSE(srv_->Start(&error));
  EXPECT_NE(error.find("--http-chat-format template"), std::string::npos) << error;
}

TEST_F(HttpServerTest, BadInputGetsAClearErrorAndTheServerStaysUp) {
  StartServer({"--http-max-body-bytes=1048576"});
  httplib::Result warm = Post("/v1/completions", CompletionBody(false).dump());
  ASSERT_TRUE(warm);
  ASSERT_EQ(warm->status, 200) << warm->body;
  const std::string expected = json::parse(warm->body)["choices"][0]["text"];

  struct Case {
    std::string path, body;
    int status;
    std::string param;
    std::string code;  // "" = not checked
  };
  json wrong_type = CompletionBody(false);
  wrong_type["max_tokens"] = "many";
  json unknown_model = CompletionBody(false);
  unknown_model["model"] = "gpt-4";
  json too_many_tokens = CompletionBody(false);
  too_many_tokens["max_tokens"] = 100000;
  json long_question = CompletionBody(false);
  long_question["prompt"] = std::string(kPrompt) + std::string(200000, 'x');
  json long_stop = CompletionBody(false);  // gRPC's bound (kMaxStopStringBytes) holds here too
  long_stop["stop"] = {"ok", std::string(300, 's')};
  json layer_twice = CompletionBody(false);
  layer_twice["infoflow"] = {{"scoring_layers", {0, 0}}};
  // Client text in an error reaches the log line too: one line, bounded.
  json forged_model = CompletionBody(false);
  forged_model["model"] = "gpt-4\nhttp=POST path=/forged status=200";
  json long_field = CompletionBody(false);
  long_field["infoflow"] = {{std::string(100000, 'f'), 1}};
  // Inside every token limit, past infoflow-tiny's 4096 positions.
  std::string long_plain;  // ~6000 tokens, two a word
  for (int i = 0; i < 1500; ++i) long_plain += " lamp river";
  json past_positions = CompletionBody(false);
  past_positions["prompt"] = long_plain;
  // A listed chunk over --max-chunk-tokens is refused while the query runs
  // (the resolver), not in PrepareQuery: the mark crosses the scheduler.
  json long_chunk = CompletionBody(false);
  long_chunk["prompt"] = "What is in it?";
  long_chunk["infoflow"] = {{"chunks", {{{"text", std::string(200000, 'x')}}}}};
  json bad_key = CompletionBody(false);
  bad_key["prompt"] = "What is in it?";
  bad_key["infoflow"] = {{"chunks", {{{"key", "not-hex"}}}}};
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"model\": \"infoflow-tiny\", \"prompt\": ", 400, "body", ""},
      {"/v1/completions", "not json at all", 400, "body", ""},
      {"/v1/completions", std::string(2 << 20, ' '), 413, "body", ""},
      {"/v1/completions", std::string(5000, '[') + std::string(5000, ']'), 400, "body", ""},
      {"/v1/completions", wrong_type.dump(), 400, "max_tokens", ""},
      {"/v1/completions", unknown_model.dump(), 404, "model", "model_not_found"},
      {"/v1/completions", too_many_tokens.dump(), 400, "max_tokens", "invalid_argument"},
      {"/v1/completions", long_question.dump(), 400, "prompt", "context_length_exceeded"},
      {"/v1/completions", past_positions.dump(), 400, "prompt", "context_length_exceeded"},
      {"/v1/completions", long_chunk.dump(), 400, "infoflow.chunks[0].text",
       "context_length_exceeded"},
      {"/v1/completions", bad_key.dump(), 400, "infoflow.chunks[0].key", "invalid_argument"},
      {"/v1/completions", long_stop.dump(), 400, "stop[1]", "invalid_argument"},
      {"/v1/completions", layer_twice.dump(), 400, "infoflow.scoring_layers", "invalid_argument"},
      {"/v1/completions", forged_model.dump(), 404, "model", ""},
      {"/v1/completions", long_field.dump(), 400, "infoflow", ""},
      {"/v1/chat/completions", R"({"model": "infoflow-tiny", "messages": "hi"})", 400, "messages",
       ""},
      {"/v1/nowhere", "{}", 404, "", ""},
  };
  for (const Case& c : cases) {
    httplib::Result r = Post(c.path, c.body);
    ASSERT_TRUE(r) << c.path << " " << c.body.substr(0, 80) << ": no response";
    EXPECT_EQ(r->status, c.status) << c.body.substr(0, 80) << " -> " << r->body;
    const json e = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r->body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    if (!c.param.empty()) {
      EXPECT_EQ(e["error"]["param"], c.param) << r->body;
      // The message names the client's field first, as param does.
      EXPECT_EQ(e["error"]["message"].get<std::string>().rfind(c.param, 0), 0u) << r->body;
    }
    if (!c.code.empty()) {
      EXPECT_EQ(e["error"]["code"], c.code) << r->body;
    }
  }
  {
    std::istringstream log(srv_->log());
    for (std::string line; std::getline(log, line);) {
      EXPECT_NE(line.rfind("http=POST path=/forged", 0), 0u) << "a request wrote its own log line";
      EXPECT_LT(line.size(), 2048u) << line.substr(0, 200);
    }
  }

  // Streams cut by the client, before and after the first token.
  for (int i = 0; i < 4; ++i) {
    RawConnection conn(port_);
    ASSERT_TRUE(conn.ok());
    ASSERT_TRUE(conn.Send(PostRequest("/v1/completions", CompletionBody(true, 128).dump())));
    if (i % 2 == 1) conn.ReadUntil("data: ");
    conn.Close();
  }
  // A request whose body never arrives in full.
  {
    RawConnection conn(port_);
    const std::string req = PostRequest("/v1/completions", CompletionBody(false).dump());
    ASSERT_TRUE(conn.Send(req.substr(0, req.size() - 20)));
    conn.Close();
  }
  // A reader that stops reading for a while: the stream waits in the socket
  // buffers, other clients are served meanwhile, and it ends with [DONE].
  {
    RawConnection slow(port_);
    ASSERT_TRUE(slow.Send(PostRequest("/v1/completions", CompletionBody(true, 64).dump())));
    const auto t0 = std::chrono::steady_clock::now();
    ExpectServing(expected);
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const std::string got = slow.ReadUntil("data: [DONE]");
    EXPECT_NE(got.find("data: [DONE]"), std::string::npos) << got.substr(0, 300);
  }
  ASSERT_TRUE(srv_->Alive()) << srv_->log();
  ExpectServing(expected);

  // Nothing stored is lost: after a graceful restart the chunks are hits.
  EXPECT_EQ(srv_->Stop(), 0) << srv_->log();
  std::string error;
  ASSERT_TRUE(srv_->Start(&error)) << error;
  port_ = HttpPort(*srv_);
  httplib::Result again = Post("/v1/completions", CompletionBody(false).dump());
  ASSERT_TRUE(again);
  ASSERT_EQ(again->status, 200) << again->body;
  const json j = json::parse(again->body);
  EXPECT_EQ(j["choices"][0]["text"], expected);
  EXPECT_EQ(j["infoflow"]["chunk_hits"], 2);
  EXPECT_EQ(j["infoflow"]["chunk_misses"], 0);
}

TEST_F(HttpServerTest, SharesTheAuthTokenWithGrpc) {
  const std::string token_file = dir_.path + "/token";
  std::ofstream(token_file) << "s3cret\n";
  StartServer({"--auth-token-file=" + token_file});
  const std::string body = CompletionBody(false).dump();
  httplib::Result none = Post("/v1/completions", body);
  ASSERT_TRUE(none);
  EXPECT_EQ(none->status, 401);
  EXPECT_EQ(json::parse(none->body)["error"]["type"], "authentication_error");
  httplib::Result wrong = Post("/v1/completions", body, {{"Authorization", "Bearer nope"}});
  ASSERT_TRUE(wrong);
  EXPECT_EQ(wrong->status, 401);
  httplib::Result right = Post("/v1/completions", body, {{"Authorization", "Bearer s3cret"}});
  ASSERT_TRUE(right);
  EXPECT_EQ(right->status, 200) << right->body;
  httplib::Client c("127.0.0.1", port_);
  EXPECT_EQ(c.Get("/v1/models")->status, 401);
  EXPECT_EQ(c.Get("/health")->status, 200);  // probes need no token
}

// A slowloris client: a request line, then a header line now and then, never
// the blank line. Each held one of the library's 40 pool threads for as long
// as it trickled (its read timeout is per read), so 45 of them stopped the
// HTTP API (server/http/http_listener.h). Now each request has a deadline
// from its first byte, and connections get threads as they come.
TEST_F(HttpServerTest, SlowSendersDoNotStopTheApiAndAreClosedAtTheDeadline) {
  StartServer({"--http-request-timeout-ms=60000"});
  std::vector<std::unique_ptr<RawConnection>> slow;
  for (int i = 0; i < 64; ++i) {
    slow.push_back(std::make_unique<RawConnection>(port_));
    ASSERT_TRUE(slow.back()->ok());
    ASSERT_TRUE(slow.back()->Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  }
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    while (!stop.load()) {
      for (auto& c : slow) c->Send("X-Slow: 1\r\n");
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
    }
  });
  // Served while all 64 are held (the client gives up after 10 s).
  httplib::Client c("127.0.0.1", port_);
  c.set_read_timeout(10);
  httplib::Result h = c.Get("/health");
  stop = true;
  trickle.join();
  ASSERT_TRUE(h) << "no answer on /health while 64 clients trickle headers";
  EXPECT_EQ(h->status, 200);
  slow.clear();

  // With a short deadline, one trickling client is closed soon after it.
  ASSERT_EQ(srv_->Stop(), 0) << srv_->log();
  StartServer({"--http-request-timeout-ms=1500"});
  RawConnection one(port_);
  ASSERT_TRUE(one.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  const auto t0 = std::chrono::steady_clock::now();
  std::string answer;
  bool closed = false;
  while (!closed && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(20)) {
    if (!one.Send("X-Slow: 1\r\n")) break;
    pollfd p{one.fd(), POLLIN, 0};
    if (poll(&p, 1, 300) > 0) {
      answer = one.ReadUntil("\r\n\r\n");
      closed = true;
    }
  }
  EXPECT_TRUE(closed) << "a client trickling headers for 20 s was not closed";
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
  if (!answer.empty()) {
    EXPECT_EQ(answer.rfind("HTTP/1.1 408", 0), 0u) << answer;
  }
  EXPECT_EQ(DroppedAtLeast("deadline", 1), 1) << srv_->Metrics();
  EXPECT_NE(srv_->log().find("closed: request not received whole within 1500 ms"),
            std::string::npos)
      << srv_->log();
  // A request that arrives whole in time on the same server is served.
  ExpectServing(GrpcAnswer(*srv_, kPrompt));
}

// 200 clients connecting at once are all served: the library listens with a
// backlog of 5, and such a burst got connection resets or waited seconds in
// TCP's retransmission backoff (http_listener.h, WidenListenBacklog).
TEST_F(HttpServerTest, ABurstOfConnectionsIsServed) {
  StartServer();
  constexpr int kClients = 200;
  std::atomic<int> ok{0};
  std::atomic<bool> go{false};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      while (!go.load()) std::this_thread::yield();
      httplib::Client c("127.0.0.1", port_);
      c.set_connection_timeout(30);
      c.set_read_timeout(30);
      httplib::Result h = c.Get("/health");
      if (h && h->status == 200) ++ok;
    });
  }
  go = true;
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), kClients);
}

// A client that sends a non-streamed request and closes its connection
// cancels the query: nobody will read the answer, so it should not hold a
// running slot to max_tokens (before, it ran to the end).
TEST_F(HttpServerTest, AClosedConnectionCancelsANonStreamedQuery) {
  StartServer({"--max-new-tokens=3000"});
  json body = CompletionBody(false, 3000);
  body["min_tokens"] = 3000;  // no early stop: only a cancel ends it sooner
  {
    RawConnection conn(port_);
    ASSERT_TRUE(conn.Send(PostRequest("/v1/completions", body.dump())));
  }  // closed
  std::smatch m;
  const std::regex line("http=/v1/completions [^\n]* generated=(\\d+) [^\n]*status=(\\w+)");
  std::string log;
  for (int i = 0; i < 600 && !std::regex_search(log = srv_->log(), m, line); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_FALSE(m.empty()) << log;
  EXPECT_EQ(m[2].str(), "CANCELLED") << m[0].str();
  EXPECT_LT(std::stoi(m[1].str()), 3000) << m[0].str();
  ExpectServing(GrpcAnswer(*srv_, kPrompt));
}

// The library caps each header line (8 KiB) but not their number: a client
// sent 136 MB of headers in 8 s and the server's RSS grew by 190 MB. The
// request line and headers together are now capped at 64 KiB.
TEST_F(HttpServerTest, RequestHeadsAreCapped) {
  StartServer();
  const std::string big_line = "X-Big: " + std::string(8000, 'b') + "\r\n";
  {  // 40 KB of headers: served.
    RawConnection conn(port_);
    std::string req = "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n";
    for (int i = 0; i < 5; ++i) req += big_line;
    ASSERT_TRUE(conn.Send(req + "\r\n"));
    EXPECT_EQ(conn.ReadUntil("\r\n").rfind("HTTP/1.1 200", 0), 0u);
  }
  {  // 160 KB: refused, and the connection closed.
    RawConnection conn(port_);
    std::string req = "GET /health HTTP/1.1\r\nHost: x\r\n";
    for (int i = 0; i < 20; ++i) req += big_line;
    conn.Send(req + "\r\n");  // the server may close before it has all of it
    const std::string got = conn.ReadToClose();
    EXPECT_EQ(got.rfind("HTTP/1.1 431", 0), 0u) << got.substr(0, 200);
    EXPECT_NE(got.find("\"code\":\"headers_too_large\""), std::string::npos) << got;
  }
  EXPECT_EQ(DroppedAtLeast("head_too_large", 1), 1) << srv_->Metrics();
  EXPECT_NE(srv_->log().find("request line and headers over 65536 bytes"), std::string::npos);
  ExpectServing(GrpcAnswer(*srv_, kPrompt));
}

// The library refuses a Content-Length over --http-max-body-bytes before
// reading it, but read a chunked body of any size into memory (200 MB: RSS
// +250 MB). Now a chunked body is cut off past the limit (and its framing).
TEST_F(HttpServerTest, ChunkedBodiesAreHeldToTheBodyLimit) {
  StartServer({"--http-max-body-bytes=65536"});
  auto chunked = [](const std::string& body, size_t piece) {
    std::string out =
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Transfer-Encoding: chunked\r\n\r\n";
    for (size_t i = 0; i < body.size(); i += piece) {
      const std::string part = body.substr(i, piece);
      char size[32];
      std::snprintf(size, sizeof(size), "%zx\r\n", part.size());
      out += size + part + "\r\n";
    }
    return out + "0\r\n\r\n";
  };
  {  // Within the limit: served like any other body.
    RawConnection conn(port_);
    ASSERT_TRUE(conn.Send(chunked(CompletionBody(false).dump(), 100)));
    const std::string got = conn.ReadUntil("\"choices\"");
    EXPECT_EQ(got.rfind("HTTP/1.1 200", 0), 0u) << got.substr(0, 300);
  }
  {  // 1 MiB: refused with 413, and the connection closed.
    RawConnection conn(port_);
    conn.Send(chunked(std::string(1 << 20, 'a'), 4096));  // may be cut off
    const std::string got = conn.ReadToClose();
    EXPECT_EQ(got.rfind("HTTP/1.1 413", 0), 0u) << got.substr(0, 300);
    EXPECT_NE(got.find("\"param\":\"body\""), std::string::npos) << got;
  }
  EXPECT_EQ(DroppedAtLeast("body_too_large", 1), 1) << srv_->Metrics();
  ExpectServing(GrpcAnswer(*srv_, kPrompt));
}

// Each body is bounded, but 512 connections each sending a 16 MiB body would
// hold 8 GiB: the bodies in flight together get 16 x --http-max-body-bytes,
// and a request past that gets 429 (retry later).
TEST_F(HttpServerTest, RequestBodiesInFlightShareABudget) {
  StartServer({"--http-max-body-bytes=65536"});  // budget: 1 MiB
  std::vector<std::unique_ptr<RawConnection>> uploads;
  for (int i = 0; i < 24; ++i) {  // 24 x 60000 bytes, each short of its 65536
    uploads.push_back(std::make_unique<RawConnection>(port_));
    ASSERT_TRUE(uploads.back()->Send(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: 65536\r\n\r\n" +
        std::string(60000, ' ')));
  }
  int busy = 0;
  for (int i = 0; i < 50 && busy == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    for (auto& c : uploads) {
      pollfd p{c->fd(), POLLIN, 0};
      if (poll(&p, 1, 0) <= 0) continue;
      const std::string got = c->ReadToClose();
      EXPECT_EQ(got.rfind("HTTP/1.1 429", 0), 0u) << got.substr(0, 300);
      EXPECT_NE(got.find("\"code\":\"server_busy\""), std::string::npos) << got;
      ++busy;
      c->Close();
    }
  }
  EXPECT_GE(busy, 1);
  EXPECT_LE(busy, 8);  // 17 of them fit in 1 MiB
  uploads.clear();     // their bytes leave the budget with them
  EXPECT_GE(DroppedAtLeast("bodies_budget", busy), busy) << srv_->Metrics();
  ExpectServing(GrpcAnswer(*srv_, kPrompt));
}

// Every accepted connection holds a descriptor. With threads busy, the queue
// of connections waiting for one is bounded too (as long as the threads);
// past it a connection gets 503 at once, so a flood of idle connections
// cannot take every descriptor the process has (RocksDB and gRPC need them).
TEST_F(HttpServerTest, ConnectionsPastTheWaitQueueGet503AtOnce) {
  StartServer({"--http-max-connections=2"});  // 2 served, 2 waiting
  std::vector<std::unique_ptr<RawConnection>> idle;
  for (int i = 0; i < 10; ++i) {
    idle.push_back(std::make_unique<RawConnection>(port_));
    ASSERT_TRUE(idle.back()->ok());
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int refused = 0;
  for (auto& c : idle) {
    pollfd p{c->fd(), POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) continue;  // served or waiting: nothing to read yet
    const std::string got = c->ReadToClose();
    if (got.empty()) continue;  // a served one closed after its 2 s keep-alive wait
    EXPECT_EQ(got.rfind("HTTP/1.1 503", 0), 0u) << got.substr(0, 300);
    EXPECT_NE(got.find("\"code\":\"server_busy\""), std::string::npos) << got;
    ++refused;
  }
  EXPECT_GE(refused, 6);
  idle.clear();
  EXPECT_GE(DroppedAtLeast("listener_full", refused), refused) << srv_->Metrics();
  ExpectServing(GrpcAnswer(*srv_, kPrompt));
}

// A full queue is a 429 with Retry-After for a streamed request too: the
// place in the queue is taken before the 200 goes out, since after it the
// refusal could only be an error event, which the openai SDKs do not retry
// as they retry a 429.
TEST_F(HttpServerTest, AStreamRefusedForAFullQueueGets429BeforeAnyEvent) {
  StartServer({"--max-running=1", "--queue-depth=0", "--max-new-tokens=3000"});
  const std::string expected = GrpcAnswer(*srv_, kPrompt);  // stores the chunks
  // Hold the only slot: a long sampled gRPC query whose client reads slowly.
  v1::QueryRequest longq;
  for (const char* c : {"Arthur Tanaka lives in Paris.", "Maria Lopez owns a red boat."}) {
    longq.add_chunks()->set_text(c);
  }
  longq.set_question("Who lives in Paris?");
  longq.set_max_new_tokens(3000);
  longq.set_min_new_tokens(3000);
  longq.mutable_sampling()->set_temperature(1.0);
  auto stub = v1::Query::NewStub(srv_->channel());
  grpc::ClientContext ctx;
  auto reader = stub->Query(&ctx, longq);
  v1::QueryResponse msg;
  ASSERT_TRUE(reader->Read(&msg));  // running now

  RawConnection streamed(port_);
  ASSERT_TRUE(streamed.Send(PostRequest("/v1/completions", CompletionBody(true).dump())));
  const std::string got = streamed.ReadUntil("}}");
  httplib::Result plain = Post("/v1/completions", CompletionBody(false).dump());
  ctx.TryCancel();
  while (reader->Read(&msg)) {
  }
  const grpc::Status long_status = reader->Finish();
  if (long_status.ok()) GTEST_SKIP() << "the long query ran all 3000 tokens first";
  EXPECT_EQ(got.rfind("HTTP/1.1 429", 0), 0u) << got.substr(0, 400);
  EXPECT_NE(got.find("Retry-After: 1"), std::string::npos) << got.substr(0, 400);
  EXPECT_EQ(got.find("text/event-stream"), std::string::npos) << got.substr(0, 400);
  EXPECT_NE(got.find("\"code\":\"resource_exhausted\""), std::string::npos) << got;
  ASSERT_TRUE(plain);
  EXPECT_EQ(plain->status, 429) << plain->body;
  EXPECT_EQ(plain->get_header_value("Retry-After"), "1");

  // The refused stream gave its place back: once the slot is free, a stream runs.
  std::string answered;
  for (int i = 0; i < 100 && answered.find("data: [DONE]") == std::string::npos; ++i) {
    RawConnection again(port_);
    ASSERT_TRUE(again.Send(PostRequest("/v1/completions", CompletionBody(true).dump())));
    answered = again.ReadUntil("data: [DONE]");
    if (answered.rfind("HTTP/1.1 429", 0) == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  EXPECT_EQ(answered.rfind("HTTP/1.1 200", 0), 0u) << answered.substr(0, 400);
  EXPECT_NE(answered.find("data: [DONE]"), std::string::npos) << answered.substr(0, 400);
  ExpectServing(expected);
  // Both refusals and the answers are counted by route and status.
  const std::string metrics = srv_->Metrics();
  EXPECT_GE(testing::PromValue(
                metrics, "infoflow_http_responses_total{path=\"/v1/completions\",status=\"429\"}"),
            2)
      << metrics;
  EXPECT_GE(testing::PromValue(
                metrics, "infoflow_http_responses_total{path=\"/v1/completions\",status=\"200\"}"),
            2)
      << metrics;
  EXPECT_EQ(
      testing::PromValue(metrics, "infoflow_grpc_requests_total{code=\"OK\",method=\"Query\"}"),
      1)  // GrpcAnswer; the long query was cancelled
      << metrics;
}

TEST_F(HttpServerTest, StreamsServerSentEventsWithUsage) {
  StartServer();
  json body = CompletionBody(true);
  body["stream_options"] = {{"include_usage", true}};
  RawConnection conn(port_);
  ASSERT_TRUE(conn.Send(PostRequest("/v1/completions", body.dump())));
  const std::string got = conn.ReadUntil("data: [DONE]");
  EXPECT_NE(got.find("text/event-stream"), std::string::npos) << got.substr(0, 300);
  EXPECT_NE(got.find("\"finish_reason\":\"stop\""), std::string::npos);
  EXPECT_NE(got.find("\"prompt_tokens_details\""), std::string::npos);
  EXPECT_NE(got.find("\"infoflow\""), std::string::npos);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace infoflow::server::http
