// infoflow query: ask a question over stored (or given) chunks; streams the
// answer to stdout and prints the report to stderr.
#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "client/chat_presets.h"
#include "client/cli_common.h"
#include "client/commands.h"
#include "client/flags.h"

namespace infoflow::cli {
namespace {

namespace v1 = ::infoflow::v1;

constexpr char kUsage[] =
    "usage: infoflow query [--server ADDR] --question Q (--key K | --chunk-text T | --chunk-file F)...\n"
    "                      [--method infoflow|full|none|cacheblend|cacheblend_partial|\n"
    "                                infoflow_blend|epic|random] [--ratio R] [--deviation v|k]\n"
    "                      [--reorder] [--report] [--max-new-tokens N]\n"
    "                      [--chat auto|qwen|llama3|mistral|glm4] [--system TEXT|@FILE]\n"
    "                      [--prefix TEXT|@FILE] [--template TEXT|@FILE] [--parse-special]\n"
    "                      [--prefix-mode bos|none] [--temperature T] [--top-p P] [--seed S]\n"
    "                      [--stop S]... [--stop-id ID]...\n"
    "Chunks are used in the order given.\n"
    "  --prefix        text prefilled before the chunks (system prompt + chat header; the model's\n"
    "                  special tokens in it, e.g. <|im_start|>, are special tokens). Cached by the\n"
    "                  server: a shared prefix is prefilled once. @FILE reads it from FILE.\n"
    "  --template      text after the chunks; {question} is replaced by the question\n"
    "                  (special tokens parsed as in --prefix). Default \"\\n{question}\\n\".\n"
    "  --chat NAME     set --prefix and --template to the chat format of qwen (ChatML), llama3,\n"
    "                  mistral or glm4 (exact strings: README.md, Instruct models), or with auto\n"
    "                  to the server's model's own chat template (tokenizer_config.json), else\n"
    "                  the preset of its model_type; an explicit --prefix or --template wins\n"
    "  --system TEXT   the system prompt --chat puts in its prefix (default \"You are a helpful\n"
    "                  assistant.\")\n"
    "  --parse-special special-token spellings in the question and --chunk-text/--chunk-file\n"
    "                  are special tokens (default: plain text)\n"
    "  --prefix-mode   how the chunks were ingested (default: the server's, BOS when the model\n"
    "                  has one)\n"
    "  --stop-id ID    a token id that also ends the answer (the model's stop ids always do)\n"
    "  --method        default: the server's (INFOFLOW_BLEND); --ratio default: 0.05 for\n"
    "                  infoflow_blend, 0.15 for the others. --reorder applies to infoflow only\n";

// "@FILE" reads FILE; anything else is the text itself.
bool TextOrFile(const std::string& flag, const std::string& value, std::string* out) {
  if (value.empty() || value[0] != '@') {
    *out = value;
    return true;
  }
  std::ifstream in(value.substr(1), std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "infoflow query: --%s: cannot read %s\n", flag.c_str(),
                 value.substr(1).c_str());
    return false;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  *out = ss.str();
  return true;
}

bool ParseMethodFlag(std::string name, v1::Method* out) {
  name = absl::AsciiStrToUpper(name);
  return v1::Method_Parse("METHOD_" + name, out) && *out != v1::METHOD_UNSPECIFIED;
}

}  // namespace

int RunQuery(int argc, char** argv) {
  Flags flags;
  std::set<std::string> value_flags = kConnectFlags;
  value_flags.insert({"question", "key", "chunk-text", "chunk-file", "method", "ratio", "deviation",
                      "max-new-tokens", "template", "temperature", "top-p", "seed", "stop",
                      "prefix-mode", "prefix", "chat", "system", "stop-id"});
  if (!flags.Parse(argc, argv, value_flags, {"help", "reorder", "report", "parse-special"})) {
    std::fprintf(stderr, "infoflow query: %s\n\n%s%s", flags.error().c_str(), kUsage, kConnectUsage);
    return 2;
  }
  if (flags.Has("help")) {
    std::printf("%s%s", kUsage, kConnectUsage);
    return 0;
  }
  v1::QueryRequest req;
  if (!flags.Has("question")) {
    std::fprintf(stderr, "infoflow query: --question is required\n\n%s", kUsage);
    return 2;
  }
  req.set_question(flags.Get("question"));
  // Chunks keep the command-line order across the three chunk flags.
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i], name, value;
    if (a.rfind("--", 0) != 0) continue;
    size_t eq = a.find('=');
    if (eq != std::string::npos) {
      name = a.substr(2, eq - 2);
      value = a.substr(eq + 1);
    } else {
      name = a.substr(2);
      if (value_flags.count(name) && i + 1 < argc) value = argv[++i];
    }
    if (name == "key") {
      req.add_chunks()->set_key(value);
    } else if (name == "chunk-text") {
      req.add_chunks()->set_text(value);
    } else if (name == "chunk-file") {
      std::ifstream in(value, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "infoflow query: cannot read %s\n", value.c_str());
        return 1;
      }
      std::stringstream ss;
      ss << in.rdbuf();
      req.add_chunks()->set_text(ss.str());
    }
  }
  v1::Method method = v1::METHOD_UNSPECIFIED;  // the server's default
  if (flags.Has("method") && !ParseMethodFlag(flags.Get("method"), &method)) {
    std::fprintf(stderr, "infoflow query: unknown --method %s\n", flags.Get("method").c_str());
    return 2;
  }
  req.set_method(method);
  if (flags.Has("deviation")) {
    const std::string d = absl::AsciiStrToLower(flags.Get("deviation"));
    if (d != "v" && d != "k") {
      std::fprintf(stderr, "infoflow query: --deviation must be v or k\n");
      return 2;
    }
    req.set_deviation(d == "k" ? v1::DEVIATION_K : v1::DEVIATION_V);
  }
  double ratio;
  if (flags.Has("ratio")) {
    if (!absl::SimpleAtod(flags.Get("ratio"), &ratio)) {
      std::fprintf(stderr, "infoflow query: bad --ratio\n");
      return 2;
    }
    req.mutable_ratio()->set_value(ratio);
  }
  int max_new = 0;
  float temperature = 0, top_p = 0;
  uint64_t seed = 0;
  if (!absl::SimpleAtoi(flags.Get("max-new-tokens", "0"), &max_new) ||
      !absl::SimpleAtof(flags.Get("temperature", "0"), &temperature) ||
      !absl::SimpleAtof(flags.Get("top-p", "0"), &top_p) ||
      !absl::SimpleAtoi(flags.Get("seed", "0"), &seed)) {
    std::fprintf(stderr, "infoflow query: bad numeric flag\n");
    return 2;
  }
  req.set_max_new_tokens(max_new);
  req.mutable_sampling()->set_temperature(temperature);
  req.mutable_sampling()->set_top_p(top_p);
  req.mutable_sampling()->set_seed(seed);
  req.set_reorder(flags.Has("reorder"));
  std::string prefix, prompt_template;
  std::string system = kDefaultSystemPrompt;
  const bool chat_auto = flags.Get("chat") == "auto";  // resolved once connected
  if (flags.Has("chat") && !chat_auto) {
    if (flags.Has("system") && !TextOrFile("system", flags.Get("system"), &system)) return 1;
    std::optional<ChatPreset> preset = FindChatPreset(flags.Get("chat"), system);
    if (!preset) {
      std::fprintf(stderr, "infoflow query: unknown --chat %s (one of: auto, %s)\n",
                   flags.Get("chat").c_str(), absl::StrJoin(ChatPresetNames(), ", ").c_str());
      return 2;
    }
    prefix = preset->prefix;
    prompt_template = preset->prompt_template;
  } else if (chat_auto) {
    if (flags.Has("system") && !TextOrFile("system", flags.Get("system"), &system)) return 1;
  } else if (flags.Has("system")) {
    std::fprintf(stderr, "infoflow query: --system needs --chat (or write it into --prefix)\n");
    return 2;
  }
  if (flags.Has("prefix") && !TextOrFile("prefix", flags.Get("prefix"), &prefix)) return 1;
  if (flags.Has("template") && !TextOrFile("template", flags.Get("template"), &prompt_template)) {
    return 1;
  }
  req.set_prefix(prefix);
  req.set_prompt_template(prompt_template);
  req.set_parse_special(flags.Has("parse-special"));
  if (flags.Has("prefix-mode")) {
    const std::string mode = flags.Get("prefix-mode");
    if (mode != "bos" && mode != "none") {
      std::fprintf(stderr, "infoflow query: --prefix-mode must be bos or none\n");
      return 2;
    }
    req.set_prefix_mode(mode == "bos" ? v1::PREFIX_MODE_BOS : v1::PREFIX_MODE_NONE);
  }
  for (const std::string& s : flags.GetAll("stop")) req.add_stop(s);
  for (const std::string& s : flags.GetAll("stop-id")) {
    int32_t id;
    if (!absl::SimpleAtoi(s, &id)) {
      std::fprintf(stderr, "infoflow query: bad --stop-id %s\n", s.c_str());
      return 2;
    }
    req.add_stop_ids(id);
  }
  const bool want_report = flags.Has("report");
  req.set_return_report(true);

  auto options = MakeClientOptions(flags.Get("server"), flags.Get("token-file"), flags.Get("tls-ca"),
                                   flags.Get("timeout-ms"));
  if (!options.ok()) {
    std::fprintf(stderr, "infoflow query: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  client::Client c(*options);
  if (chat_auto) {
    absl::StatusOr<v1::ModelInfoResponse> info = c.ModelInfo();
    if (!info.ok()) {
      std::fprintf(stderr, "infoflow query: --chat auto: %s\n", info.status().ToString().c_str());
      return 1;
    }
    absl::StatusOr<ChatPreset> preset =
        ChatPresetForModel({info->model_type(), info->chat_template(), info->bos_token(),
                            info->eos_token(), info->add_bos_token()},
                           system);
    if (!preset.ok()) {
      std::fprintf(stderr, "infoflow query: --chat auto: %s\n",
                   std::string(preset.status().message()).c_str());
      return 2;
    }
    if (!flags.Has("prefix")) req.set_prefix(preset->prefix);
    if (!flags.Has("template")) req.set_prompt_template(preset->prompt_template);
  }
  auto report = c.Query(req, [](const v1::TokenEvent& t) {
    std::fwrite(t.text().data(), 1, t.text().size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  if (!report.ok()) {
    std::fprintf(stderr, "infoflow query: %s\n", report.status().ToString().c_str());
    return 1;
  }
  if (want_report) {
    const v1::StageTimings& t = report->stages();
    std::fprintf(stderr,
                 "method %s r %.2f  ttft %.2f ms  prefix %lld tokens (%s)  context %lld tokens  "
                 "recomputed %lld  chunks hit %d miss %d (shared tier %d)  order [%s]  "
                 "generated %d  stop %s\n"
                 "stages ms: fetch %.2f reposition %.2f score %.2f select %.2f reorder %.2f "
                 "recompute %.2f prompt %.2f first_token %.2f decode %.2f\n",
                 v1::Method_Name(report->method()).c_str() + 7, report->ratio(), report->ttft_ms(),
                 static_cast<long long>(report->prefix_tokens()),
                 report->prefix_key().empty() ? "bos/none"
                 : report->prefix_cached()    ? "from store"
                                              : "prefilled",
                 static_cast<long long>(report->context_tokens()),
                 static_cast<long long>(report->recomputed_tokens()), report->chunk_hits(),
                 report->chunk_misses(), report->chunk_remote_hits(), absl::StrJoin(report->chunk_order(), ",").c_str(),
                 report->generated_tokens(), report->stop_reason().c_str(), t.fetch_ms(),
                 t.reposition_ms(), t.score_ms(), t.select_ms(), t.reorder_ms(), t.recompute_ms(),
                 t.prompt_ms(), t.first_token_ms(), t.decode_ms());
  }
  return 0;
}

}  // namespace infoflow::cli
