// infoflow query: ask a question over stored (or given) chunks; streams the
// answer to stdout and prints the report to stderr.
#include <cstdio>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
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
    "                      [--reorder] [--report] [--max-new-tokens N] [--template T]\n"
    "                      [--temperature T] [--top-p P] [--seed S] [--stop S]...\n"
    "Chunks are used in the order given. --template uses {question} as placeholder.\n";

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
                      "prefix-mode"});
  if (!flags.Parse(argc, argv, value_flags, {"help", "reorder", "report"})) {
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
  v1::Method method = v1::METHOD_INFOFLOW;
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
  req.set_prompt_template(flags.Get("template"));
  if (flags.Get("prefix-mode", "bos") == "none") req.set_prefix_mode(v1::PREFIX_MODE_NONE);
  for (const std::string& s : flags.GetAll("stop")) req.add_stop(s);
  const bool want_report = flags.Has("report");
  req.set_return_report(true);

  auto options = MakeClientOptions(flags.Get("server"), flags.Get("token-file"), flags.Get("tls-ca"),
                                   flags.Get("timeout-ms"));
  if (!options.ok()) {
    std::fprintf(stderr, "infoflow query: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  client::Client c(*options);
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
                 "method %s  ttft %.2f ms  context %lld tokens  recomputed %lld  chunks hit %d "
                 "miss %d  order [%s]  generated %d  stop %s\n"
                 "stages ms: fetch %.2f reposition %.2f score %.2f select %.2f reorder %.2f "
                 "recompute %.2f prompt %.2f first_token %.2f decode %.2f\n",
                 v1::Method_Name(report->method()).c_str() + 7, report->ttft_ms(),
                 static_cast<long long>(report->context_tokens()),
                 static_cast<long long>(report->recomputed_tokens()), report->chunk_hits(),
                 report->chunk_misses(), absl::StrJoin(report->chunk_order(), ",").c_str(),
                 report->generated_tokens(), report->stop_reason().c_str(), t.fetch_ms(),
                 t.reposition_ms(), t.score_ms(), t.select_ms(), t.reorder_ms(), t.recompute_ms(),
                 t.prompt_ms(), t.first_token_ms(), t.decode_ms());
  }
  return 0;
}

}  // namespace infoflow::cli
