// peer_bench: the engine beside llama.cpp on the same weights and the same
// token ids (issue 30). The model (the generated bench model of
// bench_util.h unless --model) is exported to GGUF with ExportGguf; the
// prebuilt llama.cpp of the npm package node-llama-cpp (pinned in
// tests/bench/peer/install-llama-cpp.sh, installed into --llama-dir when
// missing) is driven by tests/bench/peer/llama_peer.mjs under node.
//
//   peer_bench [--contexts 2048,8192,16384] [--threads 2] [--reps 3]
//              [--decode-tokens 32] [--chunks 8] [--model DIR] [--out DIR]
//              [--llama-dir DIR] [--gpu] [--flash-attention auto|on|off]
//              [--llama-kv-type f16|f32]
//
// Per context: [BOS] + `chunks` chunks of random ids + a 24-id question.
// llama.cpp evaluates the whole sequence (its FULL prefill); ours runs FULL,
// INFOFLOW r=0.15 and the default INFOFLOW_BLEND r=0.05 over chunk KVs
// prefilled alone (ingest, not timed). TTFT = prefill + the first greedy
// token, median of --reps, each from an empty cache. Decode tok/s = the
// next --decode-tokens - 1 greedy tokens one at a time after the FULL
// prefill. First-token logits: our FULL vs llama.cpp's (top-1, max |diff|).
// GFLOP/s = matmul FLOPs of the prefill (engine_bench's count) / TTFT, as a
// fraction of torch::mm's 1024^3 peak measured in the same run.
// --gpu: our engine on CUDA (needs a -DINFOFLOW_CUDA=ON build) and llama.cpp's
// CUDA prebuilt (@node-llama-cpp/linux-x64-cuda), all layers offloaded.
// llama.cpp runs with its defaults (KV cache f16) unless --llama-kv-type f32.
// Writes peer_table.md, peer.csv and llama_result.json to --out.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "engine/blend/pipeline.h"
#include "engine/checkpoint/gguf_export.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/forward.h"
#include "engine/model/runtime.h"
#include "nlohmann/json.hpp"
#include "tests/bench/bench_util.h"

namespace infoflow {
namespace {

using bench::Ids;
using bench::MedianMs;
using bench::NowMs;
using bench::PrefillFlops;
using bench::TokenLayerFlops;

namespace fs = std::filesystem;
using nlohmann::json;

double MatmulPeakGflops(int reps, c10::Device device) {
  at::Tensor a = at::randn({1024, 1024}).to(device), b = at::randn({1024, 1024}).to(device);
  at::mm(a, b).sum().item<float>();
  const double ms = MedianMs(reps * 3, [&] { at::mm(a, b).sum().item<float>(); });
  return 2.0 * 1024 * 1024 * 1024 / (ms * 1e6);
}

int Argmax(const std::vector<float>& v) {
  return static_cast<int>(std::max_element(v.begin(), v.end()) - v.begin());
}

struct Ours {
  double full_ms = 0, infoflow_ms = 0, default_ms = 0, decode_tok_s = 0;
  std::vector<float> logits;
  std::vector<int32_t> greedy;
};

int Main(int argc, char** argv) {
  std::string contexts_flag = "2048,8192,16384", model_dir, out_dir = "bench_out/peer", llama_dir;
  std::string flash = "auto", kv_type = "f16";
  int threads = 2, reps = 3, decode_tokens = 32, chunks = 8;
  bool gpu = false;
  for (int i = 1; i < argc; ++i) {
    const std::string f = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", f.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (f == "--contexts")
      contexts_flag = value();
    else if (f == "--threads")
      threads = std::atoi(value().c_str());
    else if (f == "--reps")
      reps = std::atoi(value().c_str());
    else if (f == "--decode-tokens")
      decode_tokens = std::atoi(value().c_str());
    else if (f == "--chunks")
      chunks = std::atoi(value().c_str());
    else if (f == "--model")
      model_dir = value();
    else if (f == "--out")
      out_dir = value();
    else if (f == "--llama-dir")
      llama_dir = value();
    else if (f == "--flash-attention")
      flash = value();
    else if (f == "--llama-kv-type")
      kv_type = value();
    else if (f == "--gpu")
      gpu = true;
    else {
      std::fprintf(stderr,
                   "usage: peer_bench [--contexts 2048,8192,16384] [--threads 2] [--reps 3]\n"
                   "  [--decode-tokens 32] [--chunks 8] [--model DIR] [--out DIR]\n"
                   "  [--llama-dir DIR] [--gpu] [--flash-attention auto|on|off]\n"
                   "  [--llama-kv-type f16|f32]\n");
      return 2;
    }
  }
  const std::vector<int64_t> contexts = bench::ParseList(contexts_flag);
  if (contexts.empty() || reps < 1 || decode_tokens < 2 || chunks < 1 || threads < 1 ||
      (flash != "auto" && flash != "on" && flash != "off") ||
      (kv_type != "f16" && kv_type != "f32")) {
    std::fprintf(stderr,
                 "peer_bench: bad --contexts/--reps/--decode-tokens/--chunks/--threads/"
                 "--flash-attention/--llama-kv-type\n");
    return 2;
  }
  fs::create_directories(out_dir);
  if (llama_dir.empty()) {
    const char* env = std::getenv("INFOFLOW_LLAMA_CPP_DIR");
    llama_dir = env != nullptr ? env : (fs::temp_directory_path() / "infoflow-llama-cpp").string();
  }
  const std::string src = INFOFLOW_SOURCE_DIR;
  if (!fs::exists(llama_dir + "/node_modules/node-llama-cpp/package.json") ||
      (gpu && !fs::exists(llama_dir + "/node_modules/@node-llama-cpp/linux-x64-cuda"))) {
    const std::string cmd = "bash '" + src + "/tests/bench/peer/install-llama-cpp.sh' '" +
                            llama_dir + "'" + (gpu ? " --cuda" : "");
    std::fprintf(stderr, "installing llama.cpp: %s\n", cmd.c_str());
    if (std::system(cmd.c_str()) != 0) {
      std::fprintf(stderr, "peer_bench: install-llama-cpp.sh failed (npm registry reachable?)\n");
      return 1;
    }
  }
  fs::copy_file(src + "/tests/bench/peer/llama_peer.mjs", llama_dir + "/llama_peer.mjs",
                fs::copy_options::overwrite_existing);

  InitTorchRuntime(threads);
  if (model_dir.empty()) {
    model_dir = (fs::temp_directory_path() / "infoflow-bench-model").string();
    if (absl::Status s = bench::EnsureBenchModel(model_dir); !s.ok()) {
      std::fprintf(stderr, "writing bench model: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const std::string gguf_path = out_dir + "/model.gguf";
  GgufExportOptions eo;
  // Ids are fed directly, so a split rule llama.cpp lacks does not matter here.
  {
    std::ifstream tj(model_dir + "/tokenizer.json");
    std::stringstream ss;
    ss << tj.rdbuf();
    absl::StatusOr<std::string> pre = DetectLlamaCppPreTokenizer(ss.str());
    eo.tokenizer_pre = pre.ok() ? *pre : "gpt-2";
  }
  absl::StatusOr<GgufExportSummary> exported = ExportGguf(model_dir, gguf_path, eo);
  if (!exported.ok()) {
    std::fprintf(stderr, "export: %s\n", exported.status().ToString().c_str());
    return 1;
  }
  LoadOptions lo;
  lo.device = gpu ? "cuda" : "cpu";
  lo.dtype = "f32";
  auto loaded = Model::Load(model_dir, lo);
  if (!loaded.ok()) {
    std::fprintf(stderr, "%s\n", loaded.status().ToString().c_str());
    return 1;
  }
  const Model& m = **loaded;
  const ModelConfig& c = m.config();
  const int vocab = static_cast<int>(c.vocab_size);
  const int32_t bos = static_cast<int32_t>(c.bos_token_id.value_or(0));
  std::printf("model %s: %lld layers, d=%lld, heads %lld/%lld, ff %lld, vocab %d; %s, %d threads\n",
              model_dir.c_str(), (long long)c.num_hidden_layers, (long long)c.hidden_size,
              (long long)c.num_attention_heads, (long long)c.num_key_value_heads,
              (long long)c.intermediate_size, vocab, gpu ? "CUDA" : "CPU", threads);
  std::fflush(stdout);
  const double peak = MatmulPeakGflops(reps, m.device());

  // Ours first, then llama.cpp in one node process: they never run at once.
  std::vector<Ours> ours;
  json request = {{"model", fs::absolute(gguf_path).string()},
                  {"gpu", gpu},
                  {"threads", threads},
                  {"flash_attention", flash},
                  {"kv_cache_type", kv_type == "f32" ? "F32" : "F16"},
                  {"runs", json::array()}};
  for (int64_t n : contexts) {
    QueryInput in;
    in.prefix_ids = {bos};
    in.chunk_prefix_mode = PrefixMode::kBos;
    for (int ch = 0; ch < chunks; ++ch) {
      auto kv = PrefillChunk(m, Ids(n / chunks, 100 + ch, vocab), PrefixMode::kBos);
      if (!kv.ok()) return 1;
      in.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
    }
    in.question_ids = Ids(24, 7, vocab);
    in.prompt_ids = in.question_ids;
    std::vector<int32_t> full_ids = in.prefix_ids;
    for (const auto& kv : in.chunks) {
      full_ids.insert(full_ids.end(), kv->token_ids.begin(), kv->token_ids.end());
    }
    full_ids.insert(full_ids.end(), in.prompt_ids.begin(), in.prompt_ids.end());

    Ours o;
    {
      KvCache cache(m.n_layers());
      ForwardResult r = PrefillTokens(m, full_ids, 0, &cache);
      at::Tensor l = r.logits.reshape({-1}).to(at::kCPU, at::kFloat).contiguous();
      o.logits.assign(l.data_ptr<float>(), l.data_ptr<float>() + l.numel());
    }
    DecodeOptions one;
    one.max_new_tokens = 1;
    auto ttft = [&](Method method, double ratio) {
      MethodOptions mo;
      mo.method = method;
      mo.ratio = ratio;
      std::vector<double> t;
      for (int r = 0; r < reps; ++r) {
        auto q = RunQuery(m, nullptr, in, mo, one, nullptr);
        if (!q.ok()) {
          std::fprintf(stderr, "%s\n", q.status().ToString().c_str());
          std::exit(1);
        }
        t.push_back(q->ttft_ms);
      }
      return bench::Median(t);
    };
    o.full_ms = ttft(Method::kFull, 1.0);
    o.infoflow_ms = ttft(Method::kInfoFlow, 0.15);
    o.default_ms = ttft(Method::kInfoFlowBlend, 0.05);
    {
      MethodOptions mo;
      mo.method = Method::kFull;
      DecodeOptions d;
      d.max_new_tokens = decode_tokens;
      in.decode_reserve = decode_tokens;
      const double s = NowMs();
      auto q = RunQuery(m, nullptr, in, mo, d, nullptr);
      const double wall = NowMs() - s;
      if (!q.ok()) return 1;
      o.greedy = q->decode.ids;
      o.decode_tok_s = (decode_tokens - 1) / ((wall - q->ttft_ms) / 1e3);
    }
    std::fprintf(stderr,
                 "ours %lld: FULL %.1f ms, INFOFLOW %.1f ms, default %.1f ms, decode %.1f tok/s\n",
                 (long long)n, o.full_ms, o.infoflow_ms, o.default_ms, o.decode_tok_s);
    ours.push_back(std::move(o));
    request["runs"].push_back({{"name", std::to_string(n)},
                               {"ids", full_ids},
                               {"reps", reps},
                               {"decode_tokens", decode_tokens},
                               {"logits", true}});
  }

  const std::string req_path = fs::absolute(out_dir + "/llama_request.json").string();
  const std::string res_path = fs::absolute(out_dir + "/llama_result.json").string();
  std::ofstream(req_path) << request.dump();
  const std::string cmd =
      "cd '" + llama_dir + "' && node llama_peer.mjs '" + req_path + "' > '" + res_path + "'";
  if (std::system(cmd.c_str()) != 0) {
    std::fprintf(stderr, "peer_bench: llama.cpp run failed: %s\n", cmd.c_str());
    return 1;
  }
  std::ifstream res_in(res_path);
  const json res = json::parse(res_in, nullptr, /*allow_exceptions=*/false);
  if (res.is_discarded() || !res.contains("runs") || res["runs"].size() != contexts.size()) {
    std::fprintf(stderr, "peer_bench: bad llama.cpp result %s\n", res_path.c_str());
    return 1;
  }
  const json& build = res["llama_cpp"];
  std::ostringstream table;
  table << "llama.cpp " << build.value("release", "?") << " (" << build.value("repo", "?")
        << ", node-llama-cpp " << build.value("binding_version", "?") << " "
        << build.value("build_type", "?") << ", " << (gpu ? "CUDA" : "CPU") << "), flash attention "
        << flash << ", KV cache " << kv_type << "; ours " << (gpu ? "CUDA" : "CPU") << " f32; "
        << threads << " threads; "
        << "torch::mm 1024^3 peak " << static_cast<int>(std::lround(peak)) << " GFLOP/s; median of "
        << reps << "\n\n";
  table << "| context | llama.cpp FULL ms | ours FULL ms (x) | ours INFOFLOW r=0.15 ms (x) | "
           "ours default INFOFLOW_BLEND r=0.05 ms (x) | FULL GFLOP/s / peak: llama.cpp, ours | "
           "decode tok/s llama.cpp, ours | top-1 equal | max abs logit diff | greedy equal |\n"
        << "|---|---|---|---|---|---|---|---|---|---|\n";
  std::ostringstream csv;
  csv << "context,llama_full_ms,ours_full_ms,ours_infoflow_ms,ours_default_ms,llama_peak_frac,"
         "ours_peak_frac,llama_decode_tok_s,ours_decode_tok_s,top1_equal,max_abs_diff,"
         "greedy_equal_prefix\n";
  bool all_top1 = true;
  char buf[1024];
  for (size_t i = 0; i < contexts.size(); ++i) {
    const json& r = res["runs"][i];
    const Ours& o = ours[i];
    const double l_ms = r.value("ttft_ms", 0.0), l_dec = r.value("decode_tok_s", 0.0);
    std::vector<float> ll;
    for (const json& x : r["logits"]) ll.push_back(x.is_number() ? x.get<float>() : NAN);
    double max_diff = ll.size() == o.logits.size() ? 0 : INFINITY;
    for (size_t k = 0; k < ll.size() && k < o.logits.size(); ++k) {
      max_diff = std::max(max_diff, static_cast<double>(std::fabs(ll[k] - o.logits[k])));
    }
    const bool top1 = ll.size() == o.logits.size() && Argmax(ll) == Argmax(o.logits);
    all_top1 = all_top1 && top1;
    std::vector<int32_t> lg = r.value("greedy", std::vector<int32_t>{});
    size_t same = 0;
    while (same < lg.size() && same < o.greedy.size() && lg[same] == o.greedy[same]) ++same;
    const double flops = PrefillFlops(c, static_cast<int64_t>(r.value("n_tokens", 0)));
    const double l_frac = flops / (l_ms * 1e6) / peak, o_frac = flops / (o.full_ms * 1e6) / peak;
    std::snprintf(
        buf, sizeof buf,
        "| %lld | %.0f | %.0f (%.2f) | %.0f (%.2f) | %.0f (%.2f) | %.2f, %.2f | %.1f, %.1f | "
        "%s | %.2e | %zu/%d |\n",
        (long long)contexts[i], l_ms, o.full_ms, o.full_ms / l_ms, o.infoflow_ms,
        o.infoflow_ms / l_ms, o.default_ms, o.default_ms / l_ms, l_frac, o_frac, l_dec,
        o.decode_tok_s, top1 ? "yes" : "NO", max_diff, same, decode_tokens);
    table << buf;
    std::snprintf(buf, sizeof buf, "%lld,%.2f,%.2f,%.2f,%.2f,%.4f,%.4f,%.2f,%.2f,%d,%.3e,%zu\n",
                  (long long)contexts[i], l_ms, o.full_ms, o.infoflow_ms, o.default_ms, l_frac,
                  o_frac, l_dec, o.decode_tok_s, top1 ? 1 : 0, max_diff, same);
    csv << buf;
  }
  table << "\n(x) = our TTFT / llama.cpp FULL TTFT. GFLOP/s from the prefill's matmul FLOPs.\n";
  std::printf("\n%s", table.str().c_str());
  std::ofstream(out_dir + "/peer_table.md") << table.str();
  std::ofstream(out_dir + "/peer.csv") << csv.str();
  std::printf("wrote %s/peer_table.md, peer.csv, llama_result.json\n", out_dir.c_str());
  return all_top1 ? 0 : 3;
}

}  // namespace
}  // namespace infoflow

int main(int argc, char** argv) { return infoflow::Main(argc, argv); }
