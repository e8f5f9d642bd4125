// infoflow ingest: chunk files and store their KV on a server.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "client/cli_common.h"
#include "client/commands.h"
#include "client/flags.h"

namespace infoflow::cli {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;

constexpr char kUsage[] =
    "usage: infoflow ingest [--server ADDR] [--chunk-tokens N] [--batch N] PATH...\n"
    "\n"
    "Stores the KV of every chunk of PATH (files, directories walked recursively).\n"
    "*.jsonl files: one chunk per line, the line's \"text\" field. Other files are\n"
    "split into paragraphs (blank-line separated), or, with --chunk-tokens N, into\n"
    "pieces of about N tokens (counted as whitespace-separated words).\n"
    "  --batch N            chunks per request (default 16)\n"
    "  --prefix-mode bos|none  (default: the server's, BOS when the model has a bos_token_id)\n"
    "  --parse-special      special-token spellings in chunk texts (e.g. <|im_end|>) are\n"
    "                       special tokens (default: plain text; queries must match)\n"
    "  --retries N          after a refusal the server calls retryable (RESOURCE_EXHAUSTED:\n"
    "                       queue full or disk low; UNAVAILABLE once a batch was answered:\n"
    "                       a restart), resend the batches not yet answered, up to N times,\n"
    "                       waiting 0.5 s, then twice as long each time up to 8 s\n"
    "                       (default 8; 0 = none)\n"
    "  --quiet              no progress bar\n";

struct Chunk {
  std::string text;
  std::string id;  // file#n
};

void SplitText(const std::string& text, const std::string& source, int chunk_tokens,
               std::vector<Chunk>* out) {
  int n = 0;
  auto emit = [&](std::string s) {
    s = std::string(absl::StripAsciiWhitespace(s));
    if (!s.empty()) out->push_back({std::move(s), source + "#" + std::to_string(n++)});
  };
  if (chunk_tokens > 0) {
    std::vector<std::string> words = absl::StrSplit(text, absl::ByAnyChar(" \t\r\n"), absl::SkipEmpty());
    std::string cur;
    int count = 0;
    for (const std::string& w : words) {
      if (!cur.empty()) cur += ' ';
      cur += w;
      if (++count == chunk_tokens) {
        emit(cur);
        cur.clear();
        count = 0;
      }
    }
    emit(cur);
    return;
  }
  std::string para;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StripAsciiWhitespace(line).empty()) {
      emit(para);
      para.clear();
    } else {
      para += line + "\n";
    }
  }
  emit(para);
}

bool CollectFile(const fs::path& p, int chunk_tokens, std::vector<Chunk>* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "infoflow ingest: cannot read %s\n", p.c_str());
    return false;
  }
  if (p.extension() == ".jsonl") {
    std::string line;
    int n = 0;
    while (std::getline(in, line)) {
      ++n;
      if (absl::StripAsciiWhitespace(line).empty()) continue;
      nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
        std::fprintf(stderr, "infoflow ingest: %s:%d: expected {\"text\": ...}\n", p.c_str(), n);
        return false;
      }
      out->push_back({j["text"].get<std::string>(), p.string() + ":" + std::to_string(n)});
    }
    return true;
  }
  std::stringstream ss;
  ss << in.rdbuf();
  SplitText(ss.str(), p.string(), chunk_tokens, out);
  return true;
}

std::string FormatEta(double secs) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%d:%02d", static_cast<int>(secs) / 60, static_cast<int>(secs) % 60);
  return buf;
}

}  // namespace

int RunIngest(int argc, char** argv) {
  Flags flags;
  std::set<std::string> value_flags = kConnectFlags;
  value_flags.insert({"chunk-tokens", "batch", "prefix-mode", "retries"});
  if (!flags.Parse(argc, argv, value_flags, {"help", "quiet", "parse-special"})) {
    std::fprintf(stderr, "infoflow ingest: %s\n\n%s%s", flags.error().c_str(), kUsage, kConnectUsage);
    return 2;
  }
  if (flags.Has("help")) {
    std::printf("%s%s", kUsage, kConnectUsage);
    return 0;
  }
  int chunk_tokens = 0, batch = 16, retries = 8;
  if (!absl::SimpleAtoi(flags.Get("chunk-tokens", "0"), &chunk_tokens) || chunk_tokens < 0 ||
      !absl::SimpleAtoi(flags.Get("batch", "16"), &batch) || batch < 1 ||
      !absl::SimpleAtoi(flags.Get("retries", "8"), &retries) || retries < 0) {
    std::fprintf(stderr, "infoflow ingest: bad --chunk-tokens, --batch or --retries\n");
    return 2;
  }
  const std::string mode = flags.Get("prefix-mode", "");
  if (!mode.empty() && mode != "bos" && mode != "none") {
    std::fprintf(stderr, "infoflow ingest: --prefix-mode must be bos or none\n");
    return 2;
  }
  if (flags.positional().empty()) {
    std::fprintf(stderr, "infoflow ingest: no PATH given\n\n%s", kUsage);
    return 2;
  }
  std::vector<Chunk> chunks;
  for (const std::string& path : flags.positional()) {
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(path, ec)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        if (!CollectFile(f, chunk_tokens, &chunks)) return 1;
      }
    } else if (!CollectFile(path, chunk_tokens, &chunks)) {
      return 1;
    }
  }
  if (chunks.empty()) {
    std::fprintf(stderr, "infoflow ingest: no text found\n");
    return 1;
  }
  auto options = MakeClientOptions(flags.Get("server"), flags.Get("token-file"), flags.Get("tls-ca"),
                                   flags.Get("timeout-ms"));
  if (!options.ok()) {
    std::fprintf(stderr, "infoflow ingest: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  std::vector<v1::IngestRequest> batches;
  for (size_t i = 0; i < chunks.size(); i += batch) {
    v1::IngestRequest req;
    if (!mode.empty()) {
      req.set_prefix_mode(mode == "bos" ? v1::PREFIX_MODE_BOS : v1::PREFIX_MODE_NONE);
    }
    req.set_parse_special(flags.Has("parse-special"));
    for (size_t j = i; j < std::min(chunks.size(), i + batch); ++j) {
      v1::IngestChunk* c = req.add_chunks();
      c->set_text(chunks[j].text);
      c->set_client_id(chunks[j].id);
    }
    batches.push_back(std::move(req));
  }
  client::Client c(*options);
  const auto start = std::chrono::steady_clock::now();
  size_t done = 0, stored = 0, skipped = 0, errors = 0;
  size_t answered = 0;  // batches with a response, in order
  int64_t tokens = 0;
  const bool quiet = flags.Has("quiet");
  auto on_response = [&](const v1::IngestResponse& resp) {
    ++answered;
    for (const v1::IngestResult& r : resp.results()) {
      ++done;
      tokens += r.n_tokens();
      switch (r.status()) {
        case v1::CHUNK_STATUS_STORED: ++stored; break;
        case v1::CHUNK_STATUS_ALREADY_PRESENT: ++skipped; break;
        default:
          ++errors;
          std::fprintf(stderr, "\n%s: %s\n", r.client_id().c_str(), r.error().c_str());
      }
      std::printf("%s\t%s\t%d\t%s\n", r.chunk_key().c_str(), r.client_id().c_str(), r.n_tokens(),
                  r.status() == v1::CHUNK_STATUS_STORED            ? "stored"
                  : r.status() == v1::CHUNK_STATUS_ALREADY_PRESENT ? "skipped"
                                                                   : "error");
    }
    if (quiet) return;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double frac = static_cast<double>(done) / chunks.size();
    const int width = 30, filled = static_cast<int>(frac * width);
    std::fprintf(stderr, "\r[%s%s] %zu/%zu chunks  %.0f tok/s  ETA %s  ",
                 std::string(filled, '#').c_str(), std::string(width - filled, '.').c_str(), done,
                 chunks.size(), tokens / std::max(secs, 1e-9),
                 FormatEta(frac > 0 ? secs * (1 - frac) / frac : 0).c_str());
  };
  // A refused batch did no work (admission comes first), and one cut off by
  // a lost connection is resent whole: what it stored answers "skipped".
  absl::Status s;
  double wait_s = 0.5;
  for (int attempt = 1;; ++attempt) {
    s = c.IngestStream(absl::MakeConstSpan(batches).subspan(answered), on_response);
    // UNAVAILABLE before any answer is a wrong address or a server that is
    // down: say so at once rather than after a minute of retries.
    const bool retryable =
        absl::IsResourceExhausted(s) || (absl::IsUnavailable(s) && answered > 0);
    if (s.ok() || !retryable || attempt > retries) break;
    std::fprintf(stderr, "\ninfoflow ingest: %s; %zu of %zu batches left, retry %d/%d in %.1f s\n",
                 s.ToString().c_str(), batches.size() - answered, batches.size(), attempt, retries,
                 wait_s);
    std::this_thread::sleep_for(std::chrono::duration<double>(wait_s));
    wait_s = std::min(2 * wait_s, 8.0);
  }
  if (!quiet) std::fprintf(stderr, "\n");
  std::fprintf(stderr, "%zu chunks: %zu stored, %zu skipped (already present), %zu errors\n", done,
               stored, skipped, errors);
  if (auto info = c.ModelInfo(); info.ok() && info->kv_bytes_per_token() > 0) {
    const double ratio = info->raw_kv_bytes_per_token() / info->kv_bytes_per_token();
    std::fprintf(stderr, "kv codec %s: %lld tokens x %.0f bytes/token = %.1f MiB of K/V",
                 info->kv_codec().c_str(), static_cast<long long>(tokens),
                 info->kv_bytes_per_token(), tokens * info->kv_bytes_per_token() / (1 << 20));
    if (info->kv_codec() == "raw") {
      std::fprintf(stderr, " (%s, uncompressed)\n", info->dtype().c_str());
    } else {
      std::fprintf(stderr, " (%.2fx smaller than %s)\n", ratio, info->dtype().c_str());
    }
  }
  if (!s.ok()) {
    std::fprintf(stderr, "infoflow ingest: %s\n", s.ToString().c_str());
    return 1;
  }
  return errors ? 1 : 0;
}

}  // namespace infoflow::cli
