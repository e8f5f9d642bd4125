// serve_bench: end-to-end benchmark of infoflow-server through gRPC. Starts
// the real server binary on 127.0.0.1:0 (RocksDB in a temp dir) and measures
//
//  1. TTFT vs context length for FULL, NONE, INFOFLOW r=0.15 (+ reorder),
//     INFOFLOW_BLEND r=0.15 and r=0.05 (the server default), CACHEBLEND and
//     CACHEBLEND_PARTIAL r=0.15 and EPIC k=4: median of --reps runs (after one
//     warm-up), ratio to FULL from the same run, per-stage medians from the
//     server's report, client-observed TTFT alongside;
//  2. ingest throughput (tokens/s): gRPC Ingest vs in-process PrefillChunk on
//     the same token lists;
//  and, for 1., the service overhead: client-observed TTFT through gRPC vs the
//  engine's RunQuery called in this process on the same chunk KVs, prompt and
//  method (interleaved run by run, before and after the server's queries in
//  turn); the per-stage times of both, and the median of the per-run ratios;
//  3. concurrency, closed loop, INFOFLOW r=0.15 at --conc-context, at each
//     of --streams, for two mixes in the same run: prefill-heavy
//     (max_new_tokens 1) and decode-heavy (max_new_tokens --decode-tokens):
//     QPS, generated tokens/s, p50/p95/p99 client TTFT, inter-token p50/p99;
//  4. decode under a long prefill: one stream decoding (--decode-tokens per
//     query) alone, then while another client runs FULL prefills of
//     --prefill-context tokens back to back: inter-token p50/p99 of each;
//  5. decode-bound batching: at each of --streams, every stream asks
//     --bound-tokens new tokens (temperature 1) over one short stored chunk
//     (~--bound-chunk-tokens tokens, METHOD_NONE): tokens/s, ratio to one
//     stream, mean requests per decode step; --bound-rounds R runs the levels
//     in turn R times and adds their pooled table and the per-round spread
//     of each ratio (the VM's speed drifts over seconds: alternating puts the
//     drift on every level alike);
//  6. (with --rss-queries N) memory: N back-to-back queries with the server
//     default at --rss-context: RSS after warm-up and after N, then after an
//     idle spell longer than the trim period.
//
// In 1. each run sends the query twice back to back and reports the second
// (warm: no pause before it), runs the engine in-process on the same inputs
// (after the pair in even runs, before it in odd ones), then sends the same
// query once more after the server has been idle for --idle-wait-ms (default
// 2500: the server's idle trimmer wakes once per 1 s period and trims after
// a whole quiet period, so by 2 s the heap has certainly been trimmed; the
// bench leaves the period at its default): the "idle" columns. The
// server's minor page faults during the warm and the after-idle query are
// printed under each row (pages touched afresh). ttft_runs.csv also keeps
// the first query's client TTFT of each pair, to tell a back-to-back
// slowdown from run-to-run noise.
//
//   serve_bench [--out DIR] [--contexts 1024,2048,4096,8192] [--reps 5]
//               [--threads N] [--model DIR] [--chunk-tokens 512]
//               [--streams 1,4,16] [--seconds 10] [--conc-context 1024]
//               [--decode-tokens 64] [--prefill-context 8192] [--ttft true]
//               [--workers 16] [--max-batch-tokens N] [--server BIN]
//               [--idle-wait-ms 2500] [--bound-tokens 128]
//               [--bound-chunk-tokens 80] [--bound-rounds 1] [--rss-queries 0]
//               [--rss-context 8192]
//               [--rss-idle-ms 2500]
//               [--sections ttft,concurrency,interference,bound,rss]
//               [--server-arg --FLAG=VALUE ...] [--methods FULL,NONE,...]
//               [--baseline inprocess|server]
//
// --baseline server replaces the in-process engine in 1. by a second server
// started with the same binary, flags and model (an A/A run): its
// "overhead" columns then say how far two identical processes differ on
// this machine, the floor below which an in-process gap is noise.
// --workers is passed to the server (--max-running on today's server; the
// number of requests computing side by side on servers before the
// scheduler). --ttft false skips 1. (and the in-process side of 2.).
// Without --model it writes the generated 6-layer, 512-wide LLaMA of
// engine_bench (GQA 8/4, SwiGLU 1408, vocab 2048). Writes ttft_runs.csv,
// ttft_summary.csv, ingest.csv, concurrency.csv, interference.csv and
// ttft.svg into --out; tests/bench/plot_concurrency.sh plots concurrency.csv
// files (PNG + SVG).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <iterator>
#include <thread>
#include <vector>

#include "absl/strings/str_split.h"
#include "client/client.h"
#include "engine/model/model.h"
#include "engine/blend/pipeline.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/runtime.h"
#include "engine/model/test_model.h"
#include "engine/text/tokenizer.h"
#include "tests/bench/bench_util.h"
#include "tests/reliability/server_process.h"

namespace infoflow {
namespace {

namespace fs = std::filesystem;
namespace v1 = ::infoflow::v1;
using Clock = std::chrono::steady_clock;

using bench::Median;
using bench::MinorFaults;
using bench::Ms;
using bench::ParseList;
using bench::Quantile;


std::string Words(int n, uint32_t seed) {
  std::string t;
  uint32_t x = seed * 2654435761u + 99u;
  for (int i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    if (i) t += (i % 17 == 16) ? ". " : " ";
    t += bench::kWords[x % bench::kNumWords];
  }
  return t + ".";
}

struct MethodRow {
  std::string name;
  v1::Method method;
  bool reorder;
  Method engine_method;
  double ratio = 0.15;
};

struct Run {
  double ttft_ms = 0, client_ms = 0;
  v1::Report report;
  std::vector<double> gaps_ms;                 // client-observed time between consecutive tokens
  std::vector<Clock::time_point> token_times;  // when each token arrived
  int tokens = 0;
};

absl::StatusOr<Run> QueryOnce(client::Client& c, const std::vector<std::string>& keys,
                              const MethodRow& m, const std::string& question,
                              int max_new_tokens = 1, float temperature = 0,
                              uint64_t seed = 0) {
  v1::QueryRequest req;
  for (const auto& k : keys) req.add_chunks()->set_key(k);
  req.set_question(question);
  req.set_prompt_template("\nQuestion: {question}\nAnswer:");
  req.set_method(m.method);
  req.mutable_ratio()->set_value(m.ratio);
  req.set_reorder(m.reorder);
  req.set_lego_k(4);
  req.set_max_new_tokens(max_new_tokens);
  if (temperature > 0) {
    req.mutable_sampling()->set_temperature(temperature);
    req.mutable_sampling()->set_seed(seed);
  }
  req.set_return_report(true);
  Run run;
  const auto t0 = Clock::now();
  Clock::time_point last;
  auto rep = c.Query(req, [&](const v1::TokenEvent& e) {
    const auto now = Clock::now();
    if (e.id() < 0) return;  // held-back text flushed at the end, not a token
    if (run.tokens == 0) {
      run.client_ms = Ms(now - t0);
    } else {
      run.gaps_ms.push_back(Ms(now - last));
    }
    last = now;
    run.token_times.push_back(now);
    ++run.tokens;
  });
  if (!rep.ok()) return rep.status();
  run.report = *rep;
  run.ttft_ms = rep->ttft_ms();
  return run;
}

// The engine called in this process on the same inputs the server gets for
// QueryOnce: [BOS] prefix, the chunk KVs, the rendered template, one token.
// Returns ms from the call to the first token (what the server's TTFT covers,
// minus fetching the chunks from the store and gRPC).
struct InProcessRun {
  double ttft_ms = 0;
  StageTimings stages;  // the engine's own stage times, to set against the server's report
};

// `bos_kv`: the BOS token prefilled alone, which the server keeps and places
// instead of prefilling BOS per query (server/query_runner.h, BosKv); the
// engine here is given the same, so both sides do the same work.
absl::StatusOr<InProcessRun> InProcessTtft(
    const Model& model, const Tokenizer& tok, const std::shared_ptr<const ChunkKv>& bos_kv,
    const std::vector<std::shared_ptr<const ChunkKv>>& chunks, const MethodRow& m,
    const std::string& question) {
  QueryInput input;
  input.prefix_ids = {static_cast<int32_t>(model.config().bos_token_id.value_or(1))};
  input.prefix_kv = bos_kv;
  input.chunks = chunks;
  input.chunk_prefix_mode = PrefixMode::kBos;
  input.question_ids = tok.Encode(question);
  input.prompt_ids = tok.Encode("\nQuestion: " + question + "\nAnswer:");
  MethodOptions options;
  options.method = m.engine_method;
  options.ratio = m.ratio;
  options.reorder = m.reorder;
  options.lego_k = 4;
  DecodeOptions decode;
  decode.max_new_tokens = 1;
  double ttft = -1;
  const auto t0 = Clock::now();
  auto r = RunQuery(model, &tok, input, options, decode, [&](int32_t, std::string_view) {
    if (ttft < 0) ttft = Ms(Clock::now() - t0);
    return true;
  });
  if (!r.ok()) return r.status();
  return InProcessRun{ttft, r->plan.timings};
}

// Line chart of median TTFT vs context, one line per method, log-scale y.
void WriteSvg(const std::string& path, const std::vector<int64_t>& contexts,
              const std::vector<MethodRow>& methods,
              const std::map<std::pair<int64_t, std::string>, double>& ttft) {
  const double W = 860, H = 460, L = 70, R = 300, T = 40, B = 60;
  double lo = 1e18, hi = 0;
  for (const auto& [k, v] : ttft) {
    if (v > 0) lo = std::min(lo, v), hi = std::max(hi, v);
  }
  if (hi <= 0) return;
  const double ylo = std::pow(10, std::floor(std::log10(lo))), yhi = std::pow(10, std::ceil(std::log10(hi)));
  const double xlo = std::log2(static_cast<double>(contexts.front()));
  const double xhi = std::log2(static_cast<double>(contexts.back()));
  auto X = [&](double c) {
    return xhi > xlo ? L + (std::log2(c) - xlo) / (xhi - xlo) * (W - L - R) : L + (W - L - R) / 2;
  };
  auto Y = [&](double v) {
    return T + (1 - (std::log10(v) - std::log10(ylo)) / (std::log10(yhi) - std::log10(ylo))) * (H - T - B);
  };
  const char* colors[] = {"#000000", "#999999", "#d62728", "#ff7f0e", "#1f77b4",
                          "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf"};
  std::ofstream f(path);
  f << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H
    << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << L << "\" y=\"24\" font-size=\"15\">infoflow-server TTFT vs context "
       "(median, gRPC, server report)</text>\n";
  for (double v = ylo; v <= yhi * 1.0001; v *= 10) {
    for (int m = 1; m < 10; ++m) {
      const double y = Y(v * m);
      if (v * m > yhi * 1.0001) break;
      f << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << y << "\" y2=\"" << y
        << "\" stroke=\"" << (m == 1 ? "#ccc" : "#eee") << "\"/>\n";
      if (m == 1) {
        f << "<text x=\"" << L - 6 << "\" y=\"" << y + 4 << "\" text-anchor=\"end\">" << v
          << "</text>\n";
      }
    }
  }
  for (int64_t c : contexts) {
    f << "<line x1=\"" << X(c) << "\" x2=\"" << X(c) << "\" y1=\"" << T << "\" y2=\"" << H - B
      << "\" stroke=\"#eee\"/>\n<text x=\"" << X(c) << "\" y=\"" << H - B + 18
      << "\" text-anchor=\"middle\">" << c << "</text>\n";
  }
  f << "<text x=\"" << (L + W - R) / 2 << "\" y=\"" << H - 18
    << "\" text-anchor=\"middle\">context tokens</text>\n"
    << "<text transform=\"translate(18," << (T + H - B) / 2
    << ") rotate(-90)\" text-anchor=\"middle\">TTFT ms (log)</text>\n"
    << "<rect x=\"" << L << "\" y=\"" << T << "\" width=\"" << W - L - R << "\" height=\""
    << H - T - B << "\" fill=\"none\" stroke=\"#333\"/>\n";
  for (size_t i = 0; i < methods.size(); ++i) {
    const char* col = colors[i % 10];
    std::string pts;
    for (int64_t c : contexts) {
      auto it = ttft.find({c, methods[i].name});
      if (it == ttft.end() || !(it->second > 0)) continue;
      pts += std::to_string(X(c)) + "," + std::to_string(Y(it->second)) + " ";
      f << "<circle cx=\"" << X(c) << "\" cy=\"" << Y(it->second) << "\" r=\"3\" fill=\"" << col
        << "\"/>\n";
    }
    f << "<polyline points=\"" << pts << "\" fill=\"none\" stroke=\"" << col
      << "\" stroke-width=\"2\"" << (methods[i].reorder ? " stroke-dasharray=\"6,3\"" : "")
      << "/>\n";
    const double ly = T + 10 + 20 * i;
    f << "<line x1=\"" << W - R + 12 << "\" x2=\"" << W - R + 40 << "\" y1=\"" << ly << "\" y2=\""
      << ly << "\" stroke=\"" << col << "\" stroke-width=\"2\""
      << (methods[i].reorder ? " stroke-dasharray=\"6,3\"" : "") << "/>\n<text x=\""
      << W - R + 46 << "\" y=\"" << ly + 4 << "\">" << methods[i].name << "</text>\n";
  }
  f << "</svg>\n";
}

int Main(int argc, char** argv) {
  std::string out_dir = "serve_bench_out", model_dir, server_bin = INFOFLOW_SERVER_BIN;
  std::vector<int64_t> contexts = {1024, 2048, 4096, 8192}, streams = {1, 4, 16};
  int reps = 5, threads = 0, workers = 16, decode_tokens = 64;
  int64_t chunk_tokens = 512, conc_context = 1024, prefill_context = 8192;
  bool ttft_section = true;
  int64_t max_batch_tokens = 0;  // 0: the server's default
  double seconds = 10;
  int idle_wait_ms = 2500, bound_tokens = 128, bound_rounds = 1, rss_queries = 0,
      rss_idle_ms = 2500;
  int64_t bound_chunk_tokens = 80, rss_context = 8192;
  std::string sections = "ttft,concurrency,interference,bound,rss";
  std::vector<std::string> extra_server_args;  // --server-arg, repeatable
  std::string method_filter;                    // --methods: empty = every row
  bool baseline_server = false;                 // --baseline server: A/A against a second server
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    if (f == "--help" || f == "-h" || i + 1 >= argc) {
      std::printf("usage: serve_bench [--out DIR] [--contexts 1024,2048,4096,8192] [--reps 5]\n"
                  "  [--threads N] [--model DIR] [--chunk-tokens 512] [--streams 1,4,16]\n"
                  "  [--seconds 10] [--conc-context 1024] [--decode-tokens 64]\n"
                  "  [--prefill-context 8192] [--ttft true|false] [--workers 16]\n"
                  "  [--max-batch-tokens N (passed to the server)] [--server BIN]\n"
                  "  [--idle-wait-ms 2500 (0 = no idle column)] [--bound-tokens 128]\n"
                  "  [--bound-chunk-tokens 80] [--bound-rounds 1] [--rss-queries 0]\n"
                  "  [--rss-context 8192]\n"
                  "  [--rss-idle-ms 2500 (idle time before the last RSS reading)]\n"
                  "  [--sections ttft,concurrency,interference,bound,rss (a subset)]\n"
                  "  [--server-arg --FLAG=V (repeatable; passed to the server)]\n"
                  "  [--methods FULL,NONE,INFOFLOW,... (TTFT rows by name or first word)]\n"
                  "  [--baseline inprocess|server (what the TTFT overhead is measured against;\n"
                  "   server: a second identical server, the bench's own noise floor)]\n"
                  "--workers is passed to the server (--max-running; before the scheduler:\n"
                  "requests computing side by side). See the file comment for the sections.\n");
      return f == "--help" || f == "-h" ? 0 : 2;
    }
    const std::string v = argv[++i];
    if (f == "--out") out_dir = v;
    else if (f == "--contexts") contexts = ParseList(v);
    else if (f == "--reps") reps = std::max(1, std::atoi(v.c_str()));
    else if (f == "--threads") threads = std::atoi(v.c_str());
    else if (f == "--model") model_dir = v;
    else if (f == "--chunk-tokens") chunk_tokens = std::atoll(v.c_str());
    else if (f == "--streams") streams = ParseList(v);
    else if (f == "--seconds") seconds = std::atof(v.c_str());
    else if (f == "--conc-context") conc_context = std::atoll(v.c_str());
    else if (f == "--workers") workers = std::atoi(v.c_str());
    else if (f == "--decode-tokens") decode_tokens = std::max(2, std::atoi(v.c_str()));
    else if (f == "--prefill-context") prefill_context = std::atoll(v.c_str());
    else if (f == "--ttft") ttft_section = v == "true";
    else if (f == "--max-batch-tokens") max_batch_tokens = std::atoll(v.c_str());
    else if (f == "--server") server_bin = v;
    else if (f == "--idle-wait-ms") idle_wait_ms = std::max(0, std::atoi(v.c_str()));
    else if (f == "--bound-tokens") bound_tokens = std::max(2, std::atoi(v.c_str()));
    else if (f == "--bound-rounds") bound_rounds = std::max(1, std::atoi(v.c_str()));
    else if (f == "--bound-chunk-tokens") bound_chunk_tokens = std::max<int64_t>(8, std::atoll(v.c_str()));
    else if (f == "--rss-queries") rss_queries = std::max(0, std::atoi(v.c_str()));
    else if (f == "--rss-context") rss_context = std::atoll(v.c_str());
    else if (f == "--rss-idle-ms") rss_idle_ms = std::max(0, std::atoi(v.c_str()));
    else if (f == "--sections") sections = v;
    else if (f == "--server-arg") extra_server_args.push_back(v);
    else if (f == "--methods") method_filter = v;
    else if (f == "--baseline") {
      if (v != "inprocess" && v != "server") {
        std::fprintf(stderr, "serve_bench: --baseline is inprocess or server, not %s\n", v.c_str());
        return 2;
      }
      baseline_server = v == "server";
    } else {
      std::fprintf(stderr, "serve_bench: unknown flag %s (see --help)\n", f.c_str());
      return 2;
    }
  }
  if (contexts.empty() || streams.empty()) return 2;
  auto section = [&](const char* name) {
    for (absl::string_view one : absl::StrSplit(sections, ',')) {
      if (one == name) return true;
    }
    return false;
  };
  ttft_section = ttft_section && section("ttft");
  std::sort(contexts.begin(), contexts.end());
  if (threads <= 0) threads = static_cast<int>(std::thread::hardware_concurrency());
  InitTorchRuntime(threads);
  fs::create_directories(out_dir);
  if (model_dir.empty()) {
    model_dir = (fs::temp_directory_path() / "infoflow-serve-bench-model").string();
    if (absl::Status s = bench::EnsureBenchModel(model_dir); !s.ok()) {
      std::fprintf(stderr, "writing bench model: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const std::string data_dir = (fs::temp_directory_path() /
                                ("infoflow-serve-bench-" + std::to_string(getpid()))).string();
  fs::remove_all(data_dir);
  fs::create_directories(data_dir);
  const int64_t max_stream = *std::max_element(streams.begin(), streams.end());
  std::vector<std::string> server_args = {"--threads=" + std::to_string(threads), "--workers=" + std::to_string(workers),
       "--queue-depth=" + std::to_string(std::max<int64_t>(16, max_stream + 4)),
       "--store-sync=false", "--max-chunks=1024", "--ram-bytes=" + std::to_string(2ull << 30),
       "--max-chunk-tokens=" + std::to_string(std::max<int64_t>(2048, 2 * chunk_tokens)),
       "--max-new-tokens=" + std::to_string(std::max(512, decode_tokens)),
       "--max-context-tokens=" +
           std::to_string(std::max(contexts.back(), prefill_context) + 2 * chunk_tokens + 512)};
  if (max_batch_tokens > 0) {
    server_args.push_back("--max-batch-tokens=" + std::to_string(max_batch_tokens));
  }
  server_args.insert(server_args.end(), extra_server_args.begin(), extra_server_args.end());
  testing::ServerProcess srv(server_bin, model_dir, data_dir + "/kv", out_dir + "/server.log",
                             server_args);
  std::string err;
  const auto start_t0 = Clock::now();
  if (!srv.Start(&err, std::chrono::seconds(300))) {
    std::fprintf(stderr, "serve_bench: %s\n", err.c_str());
    return 1;
  }
  client::ClientOptions co;
  co.address = srv.address();
  client::Client c(co);
  auto info = c.ModelInfo();
  if (!info.ok()) {
    std::fprintf(stderr, "serve_bench: %s\n", info.status().ToString().c_str());
    return 1;
  }
  std::printf("server %s (pid %d, started in %.0f ms): model %s, %d layers, %s on %s; "
              "torch threads %d, workers %d\n",
              srv.address().c_str(), srv.pid(), Ms(Clock::now() - start_t0),
              info->name().c_str(), info->n_layers(), info->dtype().c_str(),
              info->device().c_str(), threads, workers);
  // --baseline server: a second server of the same binary, flags and model
  // stands where the in-process engine would. Its "overhead" is what two
  // identical processes differ by on this machine: the floor under which an
  // in-process gap cannot be told from noise.
  std::unique_ptr<testing::ServerProcess> srv_b;
  std::unique_ptr<client::Client> c_b;
  if (baseline_server && ttft_section) {
    fs::create_directories(data_dir + "/b");
    srv_b = std::make_unique<testing::ServerProcess>(server_bin, model_dir, data_dir + "/b/kv",
                                                     out_dir + "/server_b.log", server_args);
    if (!srv_b->Start(&err, std::chrono::seconds(300))) {
      std::fprintf(stderr, "serve_bench: baseline server: %s\n", err.c_str());
      return 1;
    }
    client::ClientOptions cob;
    cob.address = srv_b->address();
    c_b = std::make_unique<client::Client>(cob);
    std::printf("baseline: a second server %s (pid %d) with the same flags; the in-process "
                "columns below are its client TTFT and report\n",
                srv_b->address().c_str(), srv_b->pid());
  }

  // ---- chunks: about chunk_tokens tokens each, enough for the largest context.
  auto tok = Tokenizer::FromFile(model_dir + "/tokenizer.json");
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  const double tokens_per_word =
      static_cast<double>((*tok)->Encode(Words(400, 7)).size()) / 400.0;
  const int words = std::max(8, static_cast<int>(chunk_tokens / tokens_per_word));
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> ids;
  int64_t pool_tokens = 0;
  const int64_t need =
      std::max({contexts.back(), conc_context, prefill_context, rss_queries > 0 ? rss_context : 0}) +
      chunk_tokens;
  for (uint32_t i = 0; pool_tokens < need; ++i) {
    texts.push_back(Words(words, 1000 + i));
    ids.push_back((*tok)->Encode(texts.back()));
    pool_tokens += static_cast<int64_t>(ids.back().size());
  }

  // ---- 2. ingest throughput: gRPC (tokenize + prefill + store) vs in-process PrefillChunk.
  {
    v1::IngestRequest warm;
    warm.add_chunks()->set_text(Words(words, 1));
    if (auto r = c.Ingest(warm); !r.ok()) {
      std::fprintf(stderr, "warm-up ingest: %s\n", r.status().ToString().c_str());
      return 1;
    }
  }
  // Every text into one server, in batches of 4: the chunk keys and tokens.
  auto ingest_all = [&](client::Client& to, std::vector<std::string>* keys_out,
                        int64_t* tokens_out) -> absl::Status {
    for (size_t i = 0; i < texts.size(); i += 4) {
      v1::IngestRequest req;
      for (size_t j = i; j < std::min(texts.size(), i + 4); ++j) req.add_chunks()->set_text(texts[j]);
      auto r = to.Ingest(req);
      if (!r.ok()) return r.status();
      for (const auto& res : r->results()) {
        if (res.status() == v1::CHUNK_STATUS_ERROR) return absl::InternalError(res.error());
        keys_out->push_back(res.chunk_key());
        *tokens_out += res.n_tokens();
      }
    }
    return absl::OkStatus();
  };
  std::vector<std::string> keys;
  int64_t grpc_tokens = 0;
  const auto ig0 = Clock::now();
  if (absl::Status st = ingest_all(c, &keys, &grpc_tokens); !st.ok()) {
    std::fprintf(stderr, "ingest: %s\n", st.ToString().c_str());
    return 1;
  }
  const double grpc_ms = Ms(Clock::now() - ig0);
  if (c_b != nullptr) {  // the same chunks, so the same keys: queries name them for both
    std::vector<std::string> keys_b;
    int64_t tokens_b = 0;
    if (absl::Status st = ingest_all(*c_b, &keys_b, &tokens_b); !st.ok()) {
      std::fprintf(stderr, "baseline ingest: %s\n", st.ToString().c_str());
      return 1;
    }
    if (keys_b != keys) {
      std::fprintf(stderr, "baseline ingest: the second server keyed the chunks differently\n");
      return 1;
    }
  }
  double inproc_ms = 0;
  int64_t inproc_tokens = 0;
  // The same model in this process, and the chunk KVs it prefills, for the
  // in-process side of the ingest and TTFT comparisons.
  LoadOptions lo;
  lo.device = info->device().rfind("cuda", 0) == 0 ? info->device() : "cpu";
  auto loaded = Model::Load(model_dir, lo);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<Model> model = *std::move(loaded);
  std::vector<std::shared_ptr<const ChunkKv>> kvs;
  // The engine's side of the TTFT comparison, unless a second server is it.
  const bool inprocess_baseline = ttft_section && c_b == nullptr;
  if (inprocess_baseline) {
    (void)PrefillChunk(*model, ids[0], PrefixMode::kBos);  // warm-up
    const auto t0 = Clock::now();
    for (const auto& one : ids) {
      auto kv = PrefillChunk(*model, one, PrefixMode::kBos);
      if (!kv.ok()) return 1;
      kvs.push_back(std::make_shared<const ChunkKv>(*std::move(kv)));
      inproc_tokens += static_cast<int64_t>(one.size());
    }
    inproc_ms = Ms(Clock::now() - t0);
  }
  std::printf("\ningest %zu chunks, %lld tokens (~%lld tokens/chunk):\n", texts.size(),
              static_cast<long long>(grpc_tokens), static_cast<long long>(grpc_tokens / texts.size()));
  std::printf("  gRPC Ingest (batches of 4, tokenize+prefill+store): %8.0f tokens/s (%.0f ms)\n",
              grpc_tokens / (grpc_ms / 1e3), grpc_ms);
  if (inprocess_baseline) {
    std::printf("  in-process PrefillChunk:                            %8.0f tokens/s (%.0f ms)\n",
                inproc_tokens / (inproc_ms / 1e3), inproc_ms);
    std::printf("  gRPC / in-process: %.2f\n", (grpc_tokens / grpc_ms) / (inproc_tokens / inproc_ms));
  }
  {
    std::ofstream f(out_dir + "/ingest.csv");
    f << "path,chunks,tokens,ms,tokens_per_s\n"
      << "grpc," << texts.size() << "," << grpc_tokens << "," << grpc_ms << ","
      << grpc_tokens / (grpc_ms / 1e3) << "\n"
      << "inprocess," << ids.size() << "," << inproc_tokens << "," << inproc_ms << ","
      << inproc_tokens / (inproc_ms / 1e3) << "\n";
  }

  // ---- 1. TTFT vs context.
  const std::vector<MethodRow> methods = {
      {"FULL", v1::METHOD_FULL, false, Method::kFull},
      {"NONE", v1::METHOD_NONE, false, Method::kNone},
      {"INFOFLOW r=0.15", v1::METHOD_INFOFLOW, false, Method::kInfoFlow},
      {"INFOFLOW+reorder", v1::METHOD_INFOFLOW, true, Method::kInfoFlow},
      {"INFOFLOW_BLEND r=0.15", v1::METHOD_INFOFLOW_BLEND, false, Method::kInfoFlowBlend},
      {"INFOFLOW_BLEND r=0.05 (default)", v1::METHOD_INFOFLOW_BLEND, false,
       Method::kInfoFlowBlend, 0.05},
      {"CACHEBLEND r=0.15", v1::METHOD_CACHEBLEND, false, Method::kCacheBlend},
      {"CACHEBLEND_PARTIAL r=0.15", v1::METHOD_CACHEBLEND_PARTIAL, false,
       Method::kCacheBlendPartial},
      {"EPIC k=4", v1::METHOD_EPIC, false, Method::kEpic},
  };
  const std::string question = "Which village is north of the copper bridge?";
  auto keys_for = [&](int64_t context) {
    std::vector<std::string> k;
    int64_t n = 0;
    for (size_t i = 0; i < keys.size() && n < context; ++i) {
      k.push_back(keys[i]);
      n += static_cast<int64_t>(ids[i].size());
    }
    return k;
  };
  auto kvs_for = [&](int64_t context) {  // empty when a second server is the baseline
    const size_t n = std::min(kvs.size(), keys_for(context).size());
    return std::vector<std::shared_ptr<const ChunkKv>>(kvs.begin(), kvs.begin() + n);
  };
  std::ofstream runs_csv(out_dir + "/ttft_runs.csv");
  runs_csv << "context_target,context_tokens,method,run,ttft_ms,client_ttft_ms,fetch_ms,"
              "reposition_ms,score_ms,select_ms,reorder_ms,recompute_ms,prompt_ms,"
              "first_token_ms,recomputed_tokens,inprocess_ttft_ms,idle_client_ttft_ms,"
              "first_client_ttft_ms,inprocess_reposition_ms,inprocess_score_ms,"
              "inprocess_recompute_ms,inprocess_prompt_ms\n";
  std::ofstream sum_csv(out_dir + "/ttft_summary.csv");
  sum_csv << "context_target,context_tokens,method,reps,ttft_ms_median,ratio_to_full,"
             "client_ttft_ms_median,fetch_ms,reposition_ms,score_ms,select_ms,reorder_ms,"
             "recompute_ms,prompt_ms,first_token_ms,recomputed_tokens,inprocess_ttft_ms_median,"
             "grpc_overhead,idle_client_ttft_ms_median,idle_grpc_overhead,"
             "idle_inprocess_ttft_ms_median,warm_page_faults,idle_page_faults,"
             "paired_grpc_overhead,baseline\n";
  std::map<std::pair<int64_t, std::string>, double> ttft_median;
  std::shared_ptr<const ChunkKv> bos_kv;
  if (ttft_section) {
    const int32_t bos = static_cast<int32_t>(model->config().bos_token_id.value_or(1));
    absl::StatusOr<ChunkKv> kv = PrefillChunk(*model, {bos}, PrefixMode::kNone);
    if (!kv.ok()) {
      std::fprintf(stderr, "BOS prefill: %s\n", kv.status().ToString().c_str());
      return 1;
    }
    bos_kv = std::make_shared<const ChunkKv>(*std::move(kv));
  }
  for (int64_t context : ttft_section ? contexts : std::vector<int64_t>{}) {
    const std::vector<std::string> k = keys_for(context);
    const std::vector<std::shared_ptr<const ChunkKv>> kv_in = kvs_for(context);
    std::printf("\ncontext %lld (target) in %zu chunks, median of %d (+1 warm-up), max_new_tokens 1\n",
                static_cast<long long>(context), k.size(), reps);
    std::printf("%-26s %7s %9s %8s %9s | %7s %7s %7s %7s %7s %9s %7s %7s | %6s | %8s %8s | %9s %8s %7s %7s\n",
                "method", "ctx", "TTFT ms", "vs FULL", "client", "fetch", "repos", "score",
                "select", "reordr", "recompute", "prompt", "1st tok", "recomp", "in-proc",
                "overhead", "idle cl.", "idle ovh", "i.fetch", "i.repos");
    double full = NAN;
    // The run the server is measured against: the engine in this process,
    // or (--baseline server) the same query through the second server.
    auto baseline = [&](const MethodRow& m) -> absl::StatusOr<InProcessRun> {
      if (c_b == nullptr) return InProcessTtft(*model, **tok, bos_kv, kv_in, m, question);
      auto b = QueryOnce(*c_b, k, m, question);
      if (!b.ok()) return b.status();
      const v1::StageTimings& st = b->report.stages();
      InProcessRun r;
      r.ttft_ms = b->client_ms;
      r.stages.reposition_ms = st.reposition_ms();
      r.stages.score_ms = st.score_ms();
      r.stages.recompute_ms = st.recompute_ms();
      r.stages.prompt_ms = st.prompt_ms();
      return r;
    };
    for (const MethodRow& m : methods) {
      if (!method_filter.empty()) {
        const std::string first_word = m.name.substr(0, m.name.find(' '));
        bool wanted = false;
        for (absl::string_view f : absl::StrSplit(method_filter, ',')) {
          wanted = wanted || f == m.name || f == first_word;
        }
        if (!wanted) continue;
      }
      std::vector<double> ttft, client_ms, inproc, idle_client, idle_fetch, idle_repos,
          warm_faults, idle_faults, idle_inproc;
      std::vector<std::vector<double>> stages(9), in_stages(4);
      int64_t ctx_tokens = 0, recomputed = 0;
      for (int r = -1; r < reps; ++r) {
        // The engine in-process on the same inputs, right before or right
        // after the server's pair, alternating run by run: whichever runs
        // second shares the machine for a moment with what the first left
        // behind (caches; OpenBLAS threads spinning, where
        // OPENBLAS_THREAD_TIMEOUT is set long), so neither side always gets
        // that.
        const bool inproc_first = r % 2 != 0;
        absl::StatusOr<InProcessRun> in = absl::UnknownError("not run");
        if (inproc_first) in = baseline(m);
        // Twice back to back: the second is the warm query (the first may
        // follow the in-process run or the previous rep's, a longer pause
        // than the server's trim period for every slow method).
        auto run = QueryOnce(c, k, m, question);
        const double first_client_ms = run.ok() ? run->client_ms : NAN;
        const int64_t faults0 = MinorFaults(srv.pid());
        if (run.ok()) run = QueryOnce(c, k, m, question);
        const int64_t faults1 = MinorFaults(srv.pid());
        if (!run.ok()) {
          std::fprintf(stderr, "%s at %lld: %s\n", m.name.c_str(), static_cast<long long>(context),
                       run.status().ToString().c_str());
          return 1;
        }
        if (!inproc_first) in = baseline(m);
        if (!in.ok()) {
          std::fprintf(stderr, "in-process %s: %s\n", m.name.c_str(), in.status().ToString().c_str());
          return 1;
        }
        if (r < 0) continue;  // warm-up
        inproc.push_back(in->ttft_ms);
        warm_faults.push_back(static_cast<double>(faults1 - faults0));
        if (idle_wait_ms > 0) {
          // The same query after an idle spell longer than the trim period.
          std::this_thread::sleep_for(std::chrono::milliseconds(idle_wait_ms));
          const int64_t idle0 = MinorFaults(srv.pid());
          auto idle = QueryOnce(c, k, m, question);
          idle_faults.push_back(static_cast<double>(MinorFaults(srv.pid()) - idle0));
          if (!idle.ok()) {
            std::fprintf(stderr, "%s after idle: %s\n", m.name.c_str(),
                         idle.status().ToString().c_str());
            return 1;
          }
          idle_client.push_back(idle->client_ms);
          idle_fetch.push_back(idle->report.stages().fetch_ms());
          idle_repos.push_back(idle->report.stages().reposition_ms());
          // The engine in-process after the same pause: what the machine
          // itself costs after idling (caches, clocks), with no server and
          // no heap trim involved.
          std::this_thread::sleep_for(std::chrono::milliseconds(idle_wait_ms));
          auto in_idle = baseline(m);
          if (!in_idle.ok()) {
            std::fprintf(stderr, "in-process %s after idle: %s\n", m.name.c_str(),
                         in_idle.status().ToString().c_str());
            return 1;
          }
          idle_inproc.push_back(in_idle->ttft_ms);
        }
        const v1::StageTimings& s = run->report.stages();
        const double st[9] = {s.fetch_ms(),  s.reposition_ms(), s.score_ms(),
                              s.select_ms(), s.reorder_ms(),    s.recompute_ms(),
                              s.prompt_ms(), s.first_token_ms(), 0};
        for (int i = 0; i < 8; ++i) stages[i].push_back(st[i]);
        ttft.push_back(run->ttft_ms);
        client_ms.push_back(run->client_ms);
        const double in_st[4] = {in->stages.reposition_ms, in->stages.score_ms,
                                 in->stages.recompute_ms, in->stages.prompt_ms};
        for (int i = 0; i < 4; ++i) in_stages[i].push_back(in_st[i]);
        ctx_tokens = run->report.context_tokens();
        recomputed = run->report.recomputed_tokens();
        runs_csv << context << "," << ctx_tokens << "," << m.name << "," << r << ","
                 << run->ttft_ms << "," << run->client_ms;
        for (int i = 0; i < 8; ++i) runs_csv << "," << st[i];
        runs_csv << "," << recomputed << "," << in->ttft_ms << ","
                 << (idle_client.empty() ? NAN : idle_client.back()) << "," << first_client_ms;
        for (int i = 0; i < 4; ++i) runs_csv << "," << in_st[i];
        runs_csv << "\n";
      }
      const double med = Median(ttft);
      if (m.method == v1::METHOD_FULL) full = med;
      ttft_median[{context, m.name}] = med;
      // gRPC overhead: client-observed TTFT (request sent -> first token
      // event received; includes the store fetch, tokenizing, gRPC) over the
      // in-process engine's TTFT on the same chunk KVs.
      const double overhead = Median(client_ms) / Median(inproc) - 1.0;
      // The same ratio run by run (each pair measured seconds apart), then
      // its median: slow drift of the machine cancels.
      std::vector<double> paired(client_ms.size());
      for (size_t i = 0; i < paired.size(); ++i) paired[i] = client_ms[i] / inproc[i];
      const double idle_overhead =
          idle_client.empty() ? NAN : Median(idle_client) / Median(inproc) - 1.0;
      std::printf("%-26s %7lld %9.1f %8.3f %9.1f | %7.1f %7.1f %7.1f %7.1f %7.1f %9.1f %7.1f %7.1f | %6lld | %8.1f %7.1f%% | %9.1f %7.1f%% %7.1f %7.1f\n",
                  m.name.c_str(), static_cast<long long>(ctx_tokens), med, med / full,
                  Median(client_ms), Median(stages[0]), Median(stages[1]), Median(stages[2]),
                  Median(stages[3]), Median(stages[4]), Median(stages[5]), Median(stages[6]),
                  Median(stages[7]), static_cast<long long>(recomputed), Median(inproc),
                  100.0 * overhead, idle_client.empty() ? NAN : Median(idle_client),
                  100.0 * idle_overhead, idle_fetch.empty() ? NAN : Median(idle_fetch),
                  idle_repos.empty() ? NAN : Median(idle_repos));
      const double idle_in = idle_inproc.empty() ? NAN : Median(idle_inproc);
      std::printf("%-26s server page faults per query: warm %.0f (%.1f MiB), after idle %.0f "
                  "(%.1f MiB); in-process after the same idle %.1f ms, gRPC after idle / that "
                  "%.3f\n",
                  "", Median(warm_faults), Median(warm_faults) * 4096 / (1 << 20),
                  idle_faults.empty() ? NAN : Median(idle_faults),
                  idle_faults.empty() ? NAN : Median(idle_faults) * 4096 / (1 << 20), idle_in,
                  idle_client.empty() ? NAN : Median(idle_client) / idle_in);
      // The same stages timed inside the in-process engine: where a gap
      // between the server and the engine comes from, stage by stage.
      std::printf("%-26s in-process stages: repos %.1f score %.1f recompute %.1f prompt %.1f; "
                  "median of per-run gRPC / in-process %.3f\n",
                  "", Median(in_stages[0]), Median(in_stages[1]), Median(in_stages[2]),
                  Median(in_stages[3]), Median(paired));
      std::fflush(stdout);
      if (m.method == v1::METHOD_INFOFLOW && !m.reorder) {
        std::printf("%-26s scoring pass = %.1f%% of TTFT\n", "", 100.0 * Median(stages[2]) / med);
      }
      sum_csv << context << "," << ctx_tokens << "," << m.name << "," << reps << "," << med << ","
              << med / full << "," << Median(client_ms);
      for (int i = 0; i < 8; ++i) sum_csv << "," << Median(stages[i]);
      sum_csv << "," << recomputed << "," << Median(inproc) << "," << overhead << ","
              << (idle_client.empty() ? NAN : Median(idle_client)) << "," << idle_overhead
              << "," << idle_in << "," << Median(warm_faults) << ","
              << (idle_faults.empty() ? NAN : Median(idle_faults)) << ","
              << Median(paired) - 1.0 << "," << (c_b != nullptr ? "server" : "inprocess") << "\n";
    }
  }
  if (ttft_section) WriteSvg(out_dir + "/ttft.svg", contexts, methods, ttft_median);

  // ---- 3. concurrency: INFOFLOW r=0.15 at conc_context, closed loop, two mixes.
  std::ofstream conc_csv(out_dir + "/concurrency.csv");
  conc_csv << "mix,max_new_tokens,streams,seconds,completed,resource_exhausted,errors,qps,"
              "tokens_per_s,p50_ms,p95_ms,p99_ms,server_ttft_p50_ms,itl_p50_ms,itl_p99_ms,"
              "mean_batch\n";
  const std::vector<std::string> ck = keys_for(conc_context);
  int64_t ck_tokens = 0;
  for (size_t i = 0; i < ck.size(); ++i) ck_tokens += static_cast<int64_t>(ids[i].size());
  struct Mix {
    const char* name;
    int max_new_tokens;
  };
  const std::vector<Mix> mixes =
      section("concurrency")
          ? std::vector<Mix>{Mix{"prefill-heavy", 1}, Mix{"decode-heavy", decode_tokens}}
          : std::vector<Mix>{};
  for (const Mix& mix : mixes) {
    std::printf("\nconcurrency, %s: INFOFLOW r=0.15, %zu chunks (%lld context tokens), "
                "max_new_tokens %d, %.0f s per level, server --workers %d\n",
                mix.name, ck.size(), static_cast<long long>(ck_tokens), mix.max_new_tokens,
                seconds, workers);
    std::printf("%8s %9s %8s %6s %8s %9s %9s %9s %9s %11s %9s %9s %6s\n", "streams", "completed",
                "exhausted", "errors", "QPS", "tokens/s", "p50 ms", "p95 ms", "p99 ms",
                "server p50", "ITL p50", "ITL p99", "batch");
    for (int64_t n : streams) {
      // Mean requests per batched decode step in this level, from the
      // server's infoflow_batch_size histogram (absent before the scheduler).
      const std::string m0 = srv.Metrics();
      const double steps0 = testing::PromValue(m0, "infoflow_batch_size_count");
      const double rows0 = testing::PromValue(m0, "infoflow_batch_size_sum");
      std::mutex mu;
      std::vector<double> lat, server_ttft, gaps;
      int64_t tokens = 0;
      std::atomic<int64_t> exhausted{0}, errors{0};
      const auto t0 = Clock::now();
      const auto until = t0 + std::chrono::duration_cast<Clock::duration>(
                                  std::chrono::duration<double>(seconds));
      std::vector<std::thread> th;
      for (int64_t s = 0; s < n; ++s) {
        th.emplace_back([&] {
          client::ClientOptions o = co;
          o.timeout_ms = 300000;
          client::Client cc(o);
          while (Clock::now() < until) {
            auto r = QueryOnce(cc, ck, methods[2], question, mix.max_new_tokens);
            if (r.ok()) {
              std::lock_guard<std::mutex> l(mu);
              lat.push_back(r->client_ms);
              server_ttft.push_back(r->ttft_ms);
              gaps.insert(gaps.end(), r->gaps_ms.begin(), r->gaps_ms.end());
              tokens += r->tokens;
            } else if (absl::IsResourceExhausted(r.status())) {
              ++exhausted;
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
            } else {
              ++errors;
            }
          }
        });
      }
      for (auto& t : th) t.join();
      const double secs = Ms(Clock::now() - t0) / 1e3;
      const double qps = lat.size() / secs;
      const std::string m1 = srv.Metrics();
      const double steps = testing::PromValue(m1, "infoflow_batch_size_count") - steps0;
      const double mean_batch =
          steps > 0 ? (testing::PromValue(m1, "infoflow_batch_size_sum") - rows0) / steps : NAN;
      std::printf("%8lld %9zu %8lld %6lld %8.2f %9.1f %9.1f %9.1f %9.1f %11.1f %9.1f %9.1f %6.2f\n",
                  static_cast<long long>(n), lat.size(), static_cast<long long>(exhausted.load()),
                  static_cast<long long>(errors.load()), qps, tokens / secs, Quantile(lat, 0.5),
                  Quantile(lat, 0.95), Quantile(lat, 0.99), Quantile(server_ttft, 0.5),
                  Quantile(gaps, 0.5), Quantile(gaps, 0.99), mean_batch);
      std::fflush(stdout);
      conc_csv << mix.name << "," << mix.max_new_tokens << "," << n << "," << secs << ","
               << lat.size() << "," << exhausted.load() << "," << errors.load() << "," << qps
               << "," << tokens / secs << "," << Quantile(lat, 0.5) << ","
               << Quantile(lat, 0.95) << "," << Quantile(lat, 0.99) << ","
               << Quantile(server_ttft, 0.5) << "," << Quantile(gaps, 0.5) << ","
               << Quantile(gaps, 0.99) << "," << mean_batch << std::endl;
    }
  }

  // ---- 4. inter-token time of one decoding stream, idle vs under long prefills.
  if (section("interference")) {
    const std::vector<std::string> pk = keys_for(prefill_context);
    int64_t pk_tokens = 0;
    for (size_t i = 0; i < pk.size(); ++i) pk_tokens += static_cast<int64_t>(ids[i].size());
    std::ofstream icsv(out_dir + "/interference.csv");
    icsv << "condition,prefill_context_tokens,prefills,decode_tokens,itl_p50_ms,itl_p99_ms,"
            "itl_max_ms\n";
    std::printf("\ndecode under prefill: 1 stream INFOFLOW max_new_tokens %d over %lld context "
                "tokens; concurrent FULL prefills of %lld tokens\n",
                decode_tokens, static_cast<long long>(ck_tokens),
                static_cast<long long>(pk_tokens));
    std::printf("%-22s %9s %9s %9s %9s %9s\n", "condition", "prefills", "tokens", "ITL p50",
                "ITL p99", "ITL max");
    const MethodRow full = methods[0];
    for (bool with_prefill : {false, true}) {
      std::atomic<bool> stop{false};
      std::atomic<int> prefills{0};
      std::thread prefiller;
      if (with_prefill) {
        prefiller = std::thread([&] {
          client::ClientOptions o = co;
          o.timeout_ms = 300000;
          client::Client pc(o);
          while (!stop.load()) {
            if (QueryOnce(pc, pk, full, question, 1).ok()) ++prefills;
          }
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it is prefilling
      }
      std::vector<double> gaps;
      int64_t tokens = 0;
      const auto until = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                            std::chrono::duration<double>(seconds));
      client::ClientOptions o = co;
      o.timeout_ms = 300000;
      client::Client dc(o);
      while (Clock::now() < until || gaps.empty()) {
        auto r = QueryOnce(dc, ck, methods[2], question, decode_tokens);
        if (!r.ok()) break;
        gaps.insert(gaps.end(), r->gaps_ms.begin(), r->gaps_ms.end());
        tokens += r->tokens;
      }
      stop = true;
      if (prefiller.joinable()) prefiller.join();
      const char* name = with_prefill ? "under 8K prefills" : "idle";
      std::printf("%-22s %9d %9lld %9.1f %9.1f %9.1f\n", name, prefills.load(),
                  static_cast<long long>(tokens), Quantile(gaps, 0.5), Quantile(gaps, 0.99),
                  Quantile(gaps, 1.0));
      std::fflush(stdout);
      icsv << (with_prefill ? "prefill" : "idle") << "," << pk_tokens << "," << prefills.load()
           << "," << tokens << "," << Quantile(gaps, 0.5) << "," << Quantile(gaps, 0.99) << ","
           << Quantile(gaps, 1.0) << std::endl;
    }
  }
  // ---- 5. decode-bound batching: many streams, short context, long answers.
  if (section("bound")) {
    // One short chunk of about bound_chunk_tokens tokens, stored once.
    v1::IngestRequest req;
    req.add_chunks()->set_text(
        Words(std::max(4, static_cast<int>(bound_chunk_tokens / tokens_per_word)), 77));
    auto r = c.Ingest(req);
    if (!r.ok() || r->results_size() != 1 || r->results(0).status() == v1::CHUNK_STATUS_ERROR) {
      std::fprintf(stderr, "bound: ingest failed\n");
      return 1;
    }
    const std::vector<std::string> bk = {r->results(0).chunk_key()};
    const MethodRow none = methods[1];
    std::ofstream bcsv(out_dir + "/decode_bound.csv");
    bcsv << "round,streams,chunk_tokens,max_new_tokens,seconds,drain_seconds,queries,tokens,"
            "tokens_per_s,ratio_to_1,mean_batch,itl_p50_ms,ttft_p50_ms\n";
    std::printf(
        "\ndecode-bound: METHOD_NONE over one stored chunk of %d tokens, %d new tokens "
        "per query (temperature 1), %.0f s per level, %d round(s) of every level in turn\n",
        r->results(0).n_tokens(), bound_tokens, seconds, bound_rounds);
    auto print_header = [] {
      std::printf("%8s %8s %9s %10s %9s %8s %9s %9s %8s\n", "streams", "queries", "tokens",
                  "tokens/s", "vs 1", "batch", "ITL p50", "TTFT p50", "drain s");
    };
    const char* row = "%8lld %8lld %9lld %10.1f %9.2f %8.2f %9.2f %9.1f %8.2f%s\n";
    // One level's totals; a round's rows, then every round's pooled.
    // tokens/s counts the tokens that arrived within the level's window of
    // --seconds over the window; queries still running at its end finish
    // (their later tokens, the "drain", are not counted: fewer streams are
    // left running then, which would charge a shrinking batch to the level).
    struct Level {
      double secs = 0, drain_secs = 0, steps = 0, rows = 0;
      int64_t tokens = 0, queries = 0, errors = 0;
      std::vector<double> gaps, ttfts;
      double TokensPerS() const { return tokens / secs; }
      double MeanBatch() const { return steps > 0 ? rows / steps : NAN; }
      void Add(const Level& o) {
        secs += o.secs, drain_secs += o.drain_secs, steps += o.steps, rows += o.rows;
        tokens += o.tokens, queries += o.queries, errors += o.errors;
        gaps.insert(gaps.end(), o.gaps.begin(), o.gaps.end());
        ttfts.insert(ttfts.end(), o.ttfts.begin(), o.ttfts.end());
      }
    };
    // One table row and one decode_bound.csv line; `round` is the round or "all".
    auto report = [&](const std::string& round, int64_t n, const Level& lv, double solo) {
      const double tps = lv.TokensPerS();
      std::printf(row, static_cast<long long>(n), static_cast<long long>(lv.queries),
                  static_cast<long long>(lv.tokens), tps, tps / solo, lv.MeanBatch(),
                  Quantile(lv.gaps, 0.5), Quantile(lv.ttfts, 0.5), lv.drain_secs,
                  lv.errors ? "  (errors)" : "");
      std::fflush(stdout);
      bcsv << round << "," << n << "," << r->results(0).n_tokens() << "," << bound_tokens << ","
           << lv.secs << "," << lv.drain_secs << "," << lv.queries << "," << lv.tokens << "," << tps
           << "," << tps / solo << "," << lv.MeanBatch() << "," << Quantile(lv.gaps, 0.5) << ","
           << Quantile(lv.ttfts, 0.5) << std::endl;
    };
    std::map<int64_t, Level> pooled;
    std::map<int64_t, std::vector<double>> round_ratios;
    for (int round = 1; round <= bound_rounds; ++round) {
      if (bound_rounds > 1) std::printf("round %d\n", round);
      print_header();
      double solo = NAN;
      for (int64_t n : streams) {
        const std::string m0 = srv.Metrics();
        const double steps0 = testing::PromValue(m0, "infoflow_batch_size_count");
        const double rows0 = testing::PromValue(m0, "infoflow_batch_size_sum");
        std::mutex mu;
        Level lv;
        std::atomic<int64_t> errors{0};
        const auto t0 = Clock::now();
        const auto until = t0 + std::chrono::duration_cast<Clock::duration>(
                                    std::chrono::duration<double>(seconds));
        std::vector<std::thread> th;
        for (int64_t s = 0; s < n; ++s) {
          th.emplace_back([&, s] {
            client::ClientOptions o = co;
            o.timeout_ms = 300000;
            client::Client cc(o);
            for (uint64_t q = 0; Clock::now() < until; ++q) {
              const uint64_t seed = 1000000 * round + 1000 * s + q + 1;
              auto one = QueryOnce(cc, bk, none, question, bound_tokens, 1.0f, seed);
              if (!one.ok()) {
                ++errors;
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
                continue;
              }
              std::lock_guard<std::mutex> l(mu);
              lv.gaps.insert(lv.gaps.end(), one->gaps_ms.begin(), one->gaps_ms.end());
              lv.ttfts.push_back(one->client_ms);
              for (const Clock::time_point& at : one->token_times) lv.tokens += at <= until;
              ++lv.queries;
            }
          });
        }
        std::this_thread::sleep_until(until);
        const std::string m1 = srv.Metrics();  // the window's decode steps, not the drain's
        for (auto& t : th) t.join();
        lv.secs = Ms(until - t0) / 1e3;
        lv.drain_secs = Ms(Clock::now() - until) / 1e3;
        lv.errors = errors.load();
        lv.steps = testing::PromValue(m1, "infoflow_batch_size_count") - steps0;
        lv.rows = testing::PromValue(m1, "infoflow_batch_size_sum") - rows0;
        if (n == 1) solo = lv.TokensPerS();
        round_ratios[n].push_back(lv.TokensPerS() / solo);
        report(std::to_string(round), n, lv, solo);
        pooled[n].Add(lv);
      }
    }
    if (bound_rounds > 1) {
      // The levels alternate, so drift of the machine over the run falls on
      // every level alike; tokens/s pools each level's tokens over its time.
      std::printf("all %d rounds pooled\n", bound_rounds);
      print_header();
      const double solo = pooled.count(1) ? pooled[1].TokensPerS() : NAN;
      for (int64_t n : streams) report("all", n, pooled[n], solo);
      for (int64_t n : streams) {
        if (n == 1) continue;
        std::vector<double> v = round_ratios[n];
        std::sort(v.begin(), v.end());
        std::printf("%lld streams vs 1, per round: min %.2f, median %.2f, max %.2f\n",
                    static_cast<long long>(n), v.front(), Quantile(v, 0.5), v.back());
      }
    }
  }

  // ---- 6. memory over back-to-back queries, then after idle.
  if (section("rss") && rss_queries > 0) {
    const std::vector<std::string> rk = keys_for(rss_context);
    const MethodRow def = methods[5];  // the server default
    auto rss_mib = [&] { return static_cast<double>(srv.RssKiB()) / 1024.0; };
    std::printf("\nmemory: %d back-to-back queries, %s over %zu chunks (%lld target tokens)\n",
                rss_queries, def.name.c_str(), rk.size(), static_cast<long long>(rss_context));
    const int warm = std::max(5, rss_queries / 20);
    double after_warm = 0, peak = 0;
    std::ofstream rcsv(out_dir + "/rss.csv");
    rcsv << "query,rss_mib\n";
    for (int q = 0; q < warm + rss_queries; ++q) {
      if (!QueryOnce(c, rk, def, question).ok()) {
        std::fprintf(stderr, "rss: query %d failed\n", q);
        return 1;
      }
      const double now = rss_mib();
      rcsv << q << "," << now << "\n";
      if (q == warm - 1) after_warm = now;
      if (q >= warm) peak = std::max(peak, now);
      if ((q + 1) % 50 == 0) {
        std::printf("  %d queries: RSS %.0f MiB\n", q + 1, now);
        std::fflush(stdout);
      }
    }
    const double end = rss_mib();
    std::this_thread::sleep_for(std::chrono::milliseconds(rss_idle_ms));
    const double idle = rss_mib();
    const double pool_cached =
        testing::PromValue(srv.Metrics(), "infoflow_buffer_pool_bytes{state=\"cached\"}");
    std::printf("  RSS after %d warm-up queries %.0f MiB, max over the next %d %.0f MiB "
                "(%+.1f%%), at the end %.0f MiB; after %d ms idle %.0f MiB (%.0f MiB given back; "
                "buffer pool still caching %.0f MiB)\n",
                warm, after_warm, rss_queries, peak, 100.0 * (peak / after_warm - 1), end,
                rss_idle_ms, idle, end - idle, pool_cached / (1 << 20));
    rcsv << "idle," << idle << "\n";
  }

  const int rc = srv.Stop();
  fs::remove_all(data_dir);
  std::printf("\nwrote %s/{ttft_runs.csv,ttft_summary.csv,ingest.csv,concurrency.csv,"
              "interference.csv,decode_bound.csv,rss.csv,ttft.svg}\n",
              out_dir.c_str());
  return rc == 0 ? 0 : 1;
}

}  // namespace
}  // namespace infoflow

int main(int argc, char** argv) { return infoflow::Main(argc, argv); }
