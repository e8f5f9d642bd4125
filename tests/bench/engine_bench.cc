// engine_bench: prefill throughput vs the machine's matmul peak (issue 2) and
// the cost of each query-time method vs FULL prefill (issue 4), and stored KV
// per codec: bytes per token, decode GB/s, INFOFLOW TTFT (issue 19), and
// the batched decode step (Model::DecodeStep) at B = 1..16 requests over
// `context`-token caches: what continuous batching can gain (issue 15).
//
//   engine_bench [--threads N] [--tokens 2048] [--context 4096] [--chunks 8]
//                [--model DIR] [--reps 3] [--sections attention,prefill,methods,codecs,decode]
//                (also: prefill_thread, prefill_child, not in the default)
//                [--child-env NAME=VALUE ...] (prefill_child: set for the child only)
//                [--methods FULL,INFOFLOW,...] [--attention blocked|materialised]
//                [--device cpu|cuda[:N]] [--dtype auto|f32|bf16|f16]
//
// --sections picks what runs (default: all), --methods which method rows
// (first word of the row name; default: all), --attention which prefill /
// recompute attention kernel Model::Attention uses (issue 30: blocked is the
// default, materialised the path before it, for before/after runs).
//
// FLOP counts (matmul FLOPs, 2 per multiply-add): per token per layer the
// projections 2 d (H + 2 Hkv) hd + 2 H hd d and the MLP 3 * 2 d ff; per
// layer attention 2 * 2 H hd per visible (query, key) pair (QK^T and PV):
// n(n+1)/2 pairs for causal prefill, sum over recomputed rows of the keys at
// or before their position for recompute; the LM head 2 d vocab for the last
// row only. The matmul peak is at::mm in this run, the best of 1024^3 and
// the model's projection shapes at 2048 rows.
//
// Without --model it writes a generated 6-layer, 512-wide LLaMA (GQA 8/4,
// SwiGLU 1408) to a temp dir. Prints one table; ratios are from this run.
//
// --device cuda (a CUDA libtorch; deploy/gpu-engine-check.sh) runs the
// matmul peak, prefill and methods sections on the GPU; chunk KVs then stay
// in GPU memory (a GPU-resident cache tier: no host-to-device copy in TTFT).
// The attention, codecs and decode sections are CPU measurements and are
// skipped there. Each timed call ends in a device-to-host read (the sampled
// token, or one element of the output), so GPU work is inside the time.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/blend/pipeline.h"
#include "cache_store/kv_record.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "engine/model/runtime.h"
#include "engine/model/small_batch_linear.h"
#include "engine/model/test_model.h"
#include "tests/bench/bench_util.h"

namespace infoflow {
namespace {

using bench::Ids;
using bench::MedianMs;
using bench::NowMs;
using bench::PrefillFlops;
using bench::TokenLayerFlops;

// at::mm GFLOP/s of [m, k] x [k, n], median of `reps` runs.
// Waits for the work that produces `t` (a no-op on the CPU, where ops are
// synchronous): reads one element back to the host.
void WaitFor(const at::Tensor& t) {
  if (!t.device().is_cpu()) (void)t.reshape({-1})[0].item();
}

double MatmulGflops(int64_t m, int64_t k, int64_t n, int reps, const at::TensorOptions& opts) {
  at::Tensor a = at::randn({m, k}, opts), b = at::randn({k, n}, opts);
  WaitFor(at::mm(a, b));  // warm up
  const double ms = MedianMs(reps, [&] { WaitFor(at::mm(a, b)); });
  return 2.0 * m * k * n / (ms * 1e6);
}

// The best at::mm rate of this run: 1024^3 and the model's projection shapes
// (fused QKV, o_proj, gate/up, down) over 2048 rows. Prints each.
double MatmulPeakGflops(const ModelConfig& c, int reps, const at::TensorOptions& opts) {
  const int64_t d = c.hidden_size, q_width = c.num_attention_heads * c.head_dim,
                qkv = (c.num_attention_heads + 2 * c.num_key_value_heads) * c.head_dim,
                ff = c.intermediate_size, rows = 2048;
  struct Shape {
    const char* name;
    int64_t m, k, n;
  };
  const Shape shapes[] = {{"1024^3", 1024, 1024, 1024}, {"qkv", rows, d, qkv},
                          {"o_proj", rows, q_width, d}, {"gate_up", rows, d, 2 * ff},
                          {"down", rows, ff, d}};
  double best = 0;
  std::printf("at::mm GFLOP/s:");
  for (const Shape& s : shapes) {
    const double g = MatmulGflops(s.m, s.k, s.n, reps * 3, opts);
    std::printf(" %s [%lld,%lld]x[%lld,%lld] %.1f;", s.name, (long long)s.m, (long long)s.k,
                (long long)s.k, (long long)s.n, g);
    best = std::max(best, g);
  }
  std::printf(" peak %.1f\n", best);
  return best;
}

// Matmul FLOPs of recomputing `selected` context tokens (context index i at
// position n_prefix + i, keys at positions 0..N-1) through every layer: the
// projections and MLP per row, attention over the keys at or before it. No
// LM head (the prompt's forward produces the first token).
double RecomputeFlops(const ModelConfig& c, const std::vector<int64_t>& selected,
                      int64_t n_prefix) {
  double pairs = 0;
  for (int64_t i : selected) pairs += static_cast<double>(n_prefix + i + 1);
  return c.num_hidden_layers *
         (selected.size() * TokenLayerFlops(c) +
          2 * 2 * pairs * c.num_attention_heads * c.head_dim);
}

// Model::Attention on prefill-shaped inputs (n queries at positions 0..n-1
// over the n keys), ms per call: the kernel crossover.
double AttentionMs(const ModelConfig& c, int64_t n, int reps) {
  at::Tensor q = at::randn({c.num_attention_heads, n, c.head_dim});
  at::Tensor k = at::randn({c.num_key_value_heads, n, c.head_dim});
  at::Tensor v = at::randn({c.num_key_value_heads, n, c.head_dim});
  at::Tensor pos = at::arange(n, at::kLong);
  Model::Attention(q, k, v, pos, pos, nullptr, true);  // warm up
  return MedianMs(reps, [&] { Model::Attention(q, k, v, pos, pos, nullptr, true); });
}

// A copy of this binary in --prefill-child mode (section 1c), driven over
// two pipes: Run() asks for one prefill and returns its ms (NaN if the child
// died).
struct ChildPrefill {
  pid_t pid = -1;
  FILE* to = nullptr;
  FILE* from = nullptr;

  double Run() {
    std::fputs("go\n", to);
    std::fflush(to);
    char line[256];
    while (std::fgets(line, sizeof line, from) != nullptr) {
      if (std::strncmp(line, "ms ", 3) == 0) return std::atof(line + 3);
    }
    return NAN;
  }
  void Stop() {
    std::fclose(to);  // EOF: the child returns
    std::fclose(from);
    int status = 0;
    waitpid(pid, &status, 0);
  }
};

// `flags` are the child's engine_bench flags (model, threads, tokens, and the
// kernel, device and dtype the parent runs with); --prefill-child is added.
ChildPrefill StartChildPrefill(std::vector<std::string> flags) {
  ChildPrefill c;
  int in[2], out[2];
  if (pipe(in) != 0) return c;
  if (pipe(out) != 0) {
    close(in[0]);
    close(in[1]);
    return c;
  }
  std::vector<std::string> args = {"/proc/self/exe"};
  args.insert(args.end(), flags.begin(), flags.end());
  args.insert(args.end(), {"--prefill-child", "true"});
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_addclose(&fa, in[1]);
  posix_spawn_file_actions_addclose(&fa, out[0]);
  const int rc = posix_spawn(&c.pid, "/proc/self/exe", &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    c.pid = -1;
    return c;
  }
  c.to = fdopen(in[1], "w");
  c.from = fdopen(out[0], "r");
  return c;
}

int Main(int argc, char** argv) {
  int threads = 0, reps = 3, chunks = 8;
  int64_t tokens = 2048, context = 4096, decode_context = -1;
  bool decode_only = false, prefill_child = false;
  std::vector<std::string> child_env;  // NAME=VALUE set for section 1c's child only
  std::string dir, sections = "attention,prefill,methods,codecs,decode", methods, attention;
  std::string device = "cpu", dtype = "auto";
  auto usage = [](FILE* to) {
    std::fprintf(to, "usage: engine_bench [--threads N] [--tokens N] [--context N] "
                     "[--chunks N] [--model DIR] [--reps N] [--decode-context N (default "
                     "--context)] [--decode-only true|false] [--sections LIST] "
                     "[--methods LIST] [--attention blocked|materialised] "
                     "[--device cpu|cuda[:N]] [--dtype auto|f32|bf16|f16] "
                     "[--child-env NAME=VALUE]...\n"
                     "sections: attention,prefill,methods,codecs,decode (default), and "
                     "prefill_thread, prefill_child\n");
  };
  for (int i = 1; i < argc; i += 2) {
    std::string f = argv[i];
    if (f == "--help" || f == "-h") {
      usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {  // a flag without its value
      std::fprintf(stderr, "%s needs a value\n", f.c_str());
      usage(stderr);
      return 2;
    }
    if (f == "--threads") threads = std::atoi(argv[i + 1]);
    else if (f == "--tokens") tokens = std::atoll(argv[i + 1]);
    else if (f == "--context") context = std::atoll(argv[i + 1]);
    else if (f == "--chunks") chunks = std::atoi(argv[i + 1]);
    else if (f == "--model") dir = argv[i + 1];
    else if (f == "--reps") reps = std::atoi(argv[i + 1]);
    else if (f == "--decode-context") decode_context = std::atoll(argv[i + 1]);
    else if (f == "--decode-only") decode_only = std::string(argv[i + 1]) == "true";
    else if (f == "--sections") sections = argv[i + 1];
    else if (f == "--methods") methods = argv[i + 1];
    else if (f == "--attention") attention = argv[i + 1];
    else if (f == "--device") device = argv[i + 1];
    else if (f == "--dtype") dtype = argv[i + 1];
    else if (f == "--prefill-child") prefill_child = std::string(argv[i + 1]) == "true";
    else if (f == "--child-env") child_env.push_back(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown flag %s\n", f.c_str());
      usage(stderr);
      return 2;
    }
  }
  InitTorchRuntime(threads);
  if (attention == "materialised") {
    Model::SetBlockedAttentionMinPairs(std::numeric_limits<int64_t>::max());
  } else if (!attention.empty() && attention != "blocked") {
    std::fprintf(stderr, "--attention must be blocked or materialised\n");
    return 2;
  }
  if (decode_only) sections = "decode";
  if (prefill_child) sections = "none";  // the child only answers prefill requests
  auto listed = [](const std::string& list, const std::string& name) {
    if (list.empty()) return true;
    size_t start = 0;
    while (start <= list.size()) {
      const size_t end = std::min(list.find(',', start), list.size());
      if (list.compare(start, end - start, name) == 0) return true;
      start = end + 1;
    }
    return false;
  };
  if (device != "cpu" && !prefill_child) {
    // Only prefill and methods run on a GPU (the file comment says why).
    std::string kept;
    for (const char* s : {"prefill", "methods"}) {
      if (listed(sections, s)) kept += std::string(kept.empty() ? "" : ",") + s;
    }
    std::printf("--device %s: sections %s (attention, codecs and decode run only on cpu)\n",
                device.c_str(), kept.c_str());
    if (kept.empty()) return 0;
    sections = kept;
  }
  const bool run_methods = listed(sections, "methods"), run_codecs = listed(sections, "codecs");
  if (dir.empty()) {
    dir = (std::filesystem::temp_directory_path() / "infoflow-bench-model").string();
    if (absl::Status s = bench::EnsureBenchModel(dir); !s.ok()) {
      std::fprintf(stderr, "writing bench model: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  LoadOptions lo;
  lo.device = device;
  lo.dtype = dtype;
  auto model = Model::Load(dir, lo);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  const Model& m = **model;
  const int vocab = static_cast<int>(m.config().vocab_size);
  std::printf("model %s: %lld layers, d=%lld, heads %lld/%lld, ff %lld; torch threads %d; BLAS %s\n",
              dir.c_str(), (long long)m.config().num_hidden_layers,
              (long long)m.config().hidden_size, (long long)m.config().num_attention_heads,
              (long long)m.config().num_key_value_heads,
              (long long)m.config().intermediate_size, at::get_num_threads(),
              LoadedBlasLibrary().c_str());

  std::printf("device %s, dtype %s; threads: math %d; attention kernel: %s\n",
              m.device().str().c_str(), std::string(c10::toString(m.dtype())).c_str(),
              MathThreads(),
              !m.device().is_cpu()          ? "materialised in row blocks"
              : attention == "materialised" ? "materialised"
                                            : "blocked from 4096 pairs");
  const double peak =
      prefill_child
          ? 0.0
          : MatmulPeakGflops(m.config(), reps,
                             at::TensorOptions().dtype(m.dtype()).device(m.device()));

  if (listed(sections, "attention")) {
    // 0. Attention alone, prefill-shaped: materialised vs blocked.
    std::printf("\nModel::Attention, n queries over n keys, causal (median of %d)\n", reps);
    std::printf("%7s %16s %12s %9s %12s\n", "n", "materialised ms", "blocked ms", "speedup",
                "blocked GF/s");
    for (int64_t n : {64, 128, 256, 512, 1024, 2048, 4096}) {
      Model::SetBlockedAttentionMinPairs(std::numeric_limits<int64_t>::max());
      const double old_ms = AttentionMs(m.config(), n, reps);
      Model::SetBlockedAttentionMinPairs(0);
      const double new_ms = AttentionMs(m.config(), n, reps);
      const double flops = 2 * 2 * static_cast<double>(n) * (n + 1) / 2 *
                           m.config().num_attention_heads * m.config().head_dim;
      std::printf("%7lld %16.2f %12.2f %9.2f %12.1f\n", (long long)n, old_ms, new_ms,
                  old_ms / new_ms, flops / (new_ms * 1e6));
    }
    Model::SetBlockedAttentionMinPairs(attention == "materialised"
                                           ? std::numeric_limits<int64_t>::max()
                                           : int64_t{64} * 64);
  }

  // One whole prefill of `tokens` tokens, in ms (sections 1 and 1b).
  const auto prompt = Ids(tokens, 1, vocab);
  auto prefill_once = [&] {
    const double t0 = NowMs();
    KvCache cache(m.n_layers());
    PrefillTokens(m, prompt, 0, &cache);
    WaitFor(cache.values(m.n_layers() - 1));
    return NowMs() - t0;
  };

  if (prefill_child) {
    // The child of section 1c: one whole prefill per line on stdin, its time
    // on stdout as "ms <value>"; EOF ends it.
    char line[64];
    while (std::fgets(line, sizeof line, stdin) != nullptr) {
      std::printf("ms %.3f\n", prefill_once());
      std::fflush(stdout);
    }
    return 0;
  }

  if (listed(sections, "prefill")) {
  // 1. Prefill throughput vs matmul peak.
  {
    KvCache warm(m.n_layers());
    PrefillTokens(m, Ids(64, 9, vocab), 0, &warm);
    WaitFor(warm.values(m.n_layers() - 1));
  }
  std::vector<double> runs_ms;
  for (int r = 0; r < reps; ++r) runs_ms.push_back(prefill_once());
  const double prefill_ms = bench::Median(runs_ms);
  const double flops = PrefillFlops(m.config(), tokens);
  const double gflops = flops / (prefill_ms * 1e6);
  std::printf("\nprefill %lld tokens: %.1f ms, %.0f tokens/s, %.1f GFLOP (%.1f GFLOP/s); "
              "matmul peak %.1f GFLOP/s; fraction of peak %.2f\n",
              (long long)tokens, prefill_ms, tokens / (prefill_ms / 1e3), flops / 1e9, gflops,
              peak, gflops / peak);
  // Every run, so that a spread within one process can be told from one
  // between processes (docs/BENCHMARKS.md, "16K").
  std::printf("  runs ms:");
  for (double ms : runs_ms) std::printf(" %.1f", ms);
  std::printf("\n");
  }

  if (listed(sections, "prefill_thread")) {
  // 1b. The same whole prefill on this (main) thread and on one long-lived
  // second thread, alternating: the server prefills on its scheduler's
  // thread, this bench and serve_bench's in-process side on the main thread
  // (a 16K gap between them: docs/BENCHMARKS.md, ttft7).
  std::mutex mu;
  std::condition_variable cv;
  int requested = 0, done = 0;
  bool stop = false;
  double worker_ms = 0;
  std::thread worker([&] {
    std::unique_lock<std::mutex> l(mu);
    while (true) {
      cv.wait(l, [&] { return stop || requested > done; });
      if (stop) return;
      l.unlock();
      const double ms = prefill_once();
      l.lock();
      worker_ms = ms;
      ++done;
      cv.notify_all();
    }
  });
  auto on_worker = [&] {
    std::unique_lock<std::mutex> l(mu);
    ++requested;
    cv.notify_all();
    cv.wait(l, [&] { return done == requested; });
    return worker_ms;
  };
  on_worker();  // warm-up on both threads
  prefill_once();
  std::vector<double> main_ms, second_ms;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      main_ms.push_back(prefill_once());
      second_ms.push_back(on_worker());
    } else {
      second_ms.push_back(on_worker());
      main_ms.push_back(prefill_once());
    }
  }
  {
    std::lock_guard<std::mutex> l(mu);
    stop = true;
  }
  cv.notify_all();
  worker.join();
  std::printf("\nprefill %lld tokens, median of %d: main thread %.1f ms, second thread %.1f ms "
              "(second / main %.3f)\n",
              (long long)tokens, reps, bench::Median(main_ms), bench::Median(second_ms),
              bench::Median(second_ms) / bench::Median(main_ms));
  }

  if (listed(sections, "prefill_child")) {
  // 1c. The same whole prefill in this process and in a child process (this
  // binary, same model and threads), alternating who goes first:
  // serve_bench's in-process side runs in the parent and the server in a
  // child, so this says how far two plain engine processes in those roles
  // differ with no server code in either (the 16K FULL gap of issue #27:
  // docs/BENCHMARKS.md).
  // Set after this process started, so only the child reads them at its start
  // (e.g. OPENBLAS_THREAD_TIMEOUT, MALLOC_ARENA_MAX): an A/B of one setting.
  for (const std::string& kv : child_env) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos) {
      std::fprintf(stderr, "--child-env wants NAME=VALUE, not %s\n", kv.c_str());
      return 2;
    }
    setenv(kv.substr(0, eq).c_str(), kv.substr(eq + 1).c_str(), 1);
    std::printf("child environment: %s\n", kv.c_str());
  }
  std::vector<std::string> child_flags = {"--model", dir, "--threads", std::to_string(threads),
                                          "--tokens", std::to_string(tokens), "--device", device,
                                          "--dtype", dtype};
  if (!attention.empty()) child_flags.insert(child_flags.end(), {"--attention", attention});
  ChildPrefill child = StartChildPrefill(child_flags);
  if (child.pid <= 0) {
    std::fprintf(stderr, "prefill_child: could not start the child\n");
    return 1;
  }
  child.Run();  // warm-up in both processes
  prefill_once();
  std::vector<double> parent_ms, child_ms, ratio;
  std::printf("\nprefill %lld tokens, parent and child process, alternating:\n",
              (long long)tokens);
  for (int r = 0; r < reps; ++r) {
    double p, c;
    if (r % 2 == 0) {
      p = prefill_once();
      c = child.Run();
    } else {
      c = child.Run();
      p = prefill_once();
    }
    parent_ms.push_back(p);
    child_ms.push_back(c);
    ratio.push_back(c / p);
    std::printf("  run %d: parent %.1f ms, child %.1f ms, child / parent %.3f\n", r, p, c, c / p);
    std::fflush(stdout);
  }
  child.Stop();
  double log_sum = 0;
  for (double x : ratio) log_sum += std::log(x);
  std::printf("prefill %lld tokens, median of %d: parent %.1f ms, child %.1f ms (child / parent "
              "%.3f; median per-run ratio %.3f, geometric mean %.3f)\n",
              (long long)tokens, reps, bench::Median(parent_ms), bench::Median(child_ms),
              bench::Median(child_ms) / bench::Median(parent_ms), bench::Median(ratio),
              std::exp(log_sum / reps));
  }

  if (run_methods || run_codecs) {

  // 2. Query-time cost per method at `context` tokens in `chunks` chunks.
  QueryInput in;
  in.prefix_ids = {static_cast<int32_t>(m.config().bos_token_id.value_or(0))};
  in.chunk_prefix_mode = PrefixMode::kBos;
  for (int c = 0; c < chunks; ++c) {
    auto kv = PrefillChunk(m, Ids(context / chunks, 100 + c, vocab), PrefixMode::kBos);
    if (!kv.ok()) return 1;
    in.chunks.push_back(std::make_shared<ChunkKv>(*std::move(kv)));
  }
  in.question_ids = Ids(24, 7, vocab);
  in.prompt_ids = in.question_ids;
  struct Row {
    const char* name;
    MethodOptions o;
  };
  std::vector<Row> rows;
  auto add = [&](const char* name, Method method, bool reorder = false, double ratio = 0.15) {
    MethodOptions o;
    o.method = method;
    o.ratio = ratio;
    o.reorder = reorder;
    rows.push_back({name, o});
  };
  add("FULL", Method::kFull);
  add("NONE", Method::kNone);
  add("INFOFLOW r=0.15", Method::kInfoFlow);
  add("INFOFLOW+reorder", Method::kInfoFlow, true);
  add("INFOFLOW_BLEND r=0.15", Method::kInfoFlowBlend);
  add("INFOFLOW_BLEND r=0.05 (dflt)", Method::kInfoFlowBlend, false, 0.05);
  add("CACHEBLEND r=0.15", Method::kCacheBlend);
  add("CACHEBLEND_PARTIAL r=0.15", Method::kCacheBlendPartial);
  add("EPIC k=4", Method::kEpic);
  add("RANDOM r=0.15", Method::kRandom);
  rows.erase(std::remove_if(rows.begin(), rows.end(),
                            [&](const Row& r) {
                              const std::string name = r.name;
                              return !listed(methods, name.substr(0, name.find(' ')));
                            }),
             rows.end());
  if (!run_methods) rows.clear();
  DecodeOptions one;
  one.max_new_tokens = 1;
  std::printf("\n%lld context tokens in %d chunks, question %zu tokens (median of %d)\n",
              (long long)context, chunks, in.question_ids.size(), reps);
  if (!rows.empty()) {
    std::printf("%-28s %9s %9s %8s %8s %10s %8s %10s %9s %9s %8s\n", "method", "TTFT ms",
                "vs FULL", "repos", "score", "recompute", "prompt", "recomputed", "rc/FULL",
                "rc GFLOP", "rc/peak");
  }
  double full_ttft = 0, full_build = 0;
  for (const Row& r : rows) {
    std::vector<QueryResult> results;
    const double ttft = MedianMs(reps, [&] {
      auto q = RunQuery(m, nullptr, in, r.o, one, nullptr);
      if (q.ok()) results.push_back(*std::move(q));
    });
    if (results.empty()) return 1;
    const RecomputePlan& plan = results.back().plan;
    const StageTimings& t = plan.timings;
    if (r.o.method == Method::kFull) full_ttft = ttft, full_build = t.recompute_ms;
    std::printf("%-28s %9.1f %9.3f %8.1f %8.1f %10.1f %8.1f %10zu %9.3f", r.name, ttft,
                ttft / full_ttft, t.reposition_ms, t.score_ms, t.recompute_ms, t.prompt_ms,
                plan.selected.size(), t.recompute_ms / full_build);
    // Achieved rate of the recompute stage where it is every layer of the
    // selected rows in place (FULL: the whole context's prefill).
    const int64_t n_prefix = static_cast<int64_t>(in.prefix_ids.size());
    double rc_flops = 0;
    if (r.o.method == Method::kFull) {
      rc_flops = PrefillFlops(m.config(), n_prefix + plan.context_tokens) -
                 2.0 * m.config().hidden_size * m.config().vocab_size;
    } else if ((r.o.method == Method::kInfoFlow && !r.o.reorder) ||
               r.o.method == Method::kRandom) {
      rc_flops = RecomputeFlops(m.config(), plan.selected, n_prefix);
    }
    if (rc_flops > 0 && t.recompute_ms > 0) {
      std::printf(" %9.1f %8.2f\n", rc_flops / 1e9,
                  rc_flops / (t.recompute_ms * 1e6) / peak);
    } else {
      std::printf(" %9s %8s\n", "-", "-");
    }
  }

  if (run_codecs) {
  // 3. Stored KV per codec (issue 19): record bytes per token, decode
  // (fetch-side) throughput in decoded bytes, and INFOFLOW r=0.15 TTFT over
  // chunks that went through a record of the codec.
  std::printf("\nstored KV per codec, %d chunks of %lld tokens (median of %d)\n", chunks,
              (long long)(context / chunks), reps);
  std::printf("%-10s %12s %8s %14s %16s %10s\n", "codec", "bytes/token", "vs raw",
              "decode ms", "decoded GB/s", "INFOFLOW ms");
  double raw_bytes_per_token = 0;
  for (const KvCodec& codec : {KvCodec{KvCodec::Kind::kRaw, 64}, KvCodec{KvCodec::Kind::kInt8, 64},
                               KvCodec{KvCodec::Kind::kInt4, 64}}) {
    std::vector<std::string> records;
    size_t record_bytes = 0;
    int64_t n_tokens = 0;
    for (const auto& kv : in.chunks) {
      absl::StatusOr<std::string> r = EncodeChunkRecord(m, *kv, PrefixMode::kBos, codec);
      if (!r.ok()) return 1;
      record_bytes += r->size();
      n_tokens += kv->size();
      records.push_back(*std::move(r));
    }
    QueryInput decoded = in;
    const double decode_ms = MedianMs(reps, [&] {
      decoded.chunks.clear();
      for (const std::string& r : records) {
        absl::StatusOr<store::KvRecord> rec = store::DecodeRecord(r);
        decoded.chunks.push_back(*DecodeChunkRecord(m, *rec, PrefixMode::kBos));
      }
    });
    const double decoded_bytes = KvBytesPerToken(m, KvCodec{}) * n_tokens;
    MethodOptions infoflow;
    infoflow.ratio = 0.15;
    const double ttft = MedianMs(reps, [&] { (void)RunQuery(m, nullptr, decoded, infoflow, one, nullptr); });
    const double per_token = static_cast<double>(record_bytes) / n_tokens;
    if (codec.kind == KvCodec::Kind::kRaw) raw_bytes_per_token = per_token;
    std::printf("%-10s %12.1f %8.3f %14.1f %16.2f %10.1f\n", KvCodecName(codec.kind), per_token,
                per_token / raw_bytes_per_token, decode_ms, decoded_bytes / (decode_ms * 1e6),
                ttft);
  }

  }  // run_codecs
  }  // run_methods || run_codecs

  if (!listed(sections, "decode")) return 0;

  // 4a. The decode-step matmuls x [B, in] @ w^T for each of one layer's four
  // weight shapes, summed: BLAS (at::linear, which packs w on every call)
  // against SmallBatchLinearCpu (reads w in place), where the CPU runs it.
  const at::Tensor probe = at::zeros({1, 8});
  if (m.device().is_cpu() && m.dtype() == at::kFloat &&
      SmallBatchLinearCpuSupports(probe, probe, {})) {
    const ModelConfig& c = m.config();
    const int64_t d = c.hidden_size, hd = c.head_dim, ff = c.intermediate_size;
    const std::vector<std::pair<int64_t, int64_t>> shapes = {
        {d, (c.num_attention_heads + 2 * c.num_key_value_heads) * hd},
        {c.num_attention_heads * hd, d},
        {d, 2 * ff},
        {ff, d}};
    std::printf("\ndecode matmuls of one layer (qkv, o, gate_up, down; median of %d)\n", 8 * reps);
    std::printf("%6s %10s %14s %9s\n", "batch", "BLAS ms", "in-place ms", "speedup");
    for (int64_t batch : {1, 4, 8, 16, 32, 48, 64, 96}) {
      double blas = 0, in_place = 0;
      for (auto [in, out] : shapes) {
        at::Tensor x = at::randn({batch, in}), w = at::randn({out, in});
        blas += MedianMs(8 * reps, [&] { (void)at::linear(x, w); });
        in_place += MedianMs(8 * reps, [&] { (void)SmallBatchLinearCpu(x, w, {}, MathThreads()); });
      }
      std::printf("%6lld %10.3f %14.3f %9.2f\n", (long long)batch, blas, in_place, blas / in_place);
    }
  }

  // 4. Batched decode step: each of B requests has its own `context`-token
  // cache. Weights are read once per step; every request's K/V is read once
  // per step, so the per-request cost falls only while weights dominate.
  if (decode_context > 0) context = decode_context;
  std::printf("\nbatched decode step over %lld-token caches (median of %d steps)\n",
              (long long)context, 8 * reps);
  std::printf("%6s %10s %12s %12s %16s\n", "batch", "step ms", "tokens/s", "vs batch 1",
              "MB read/step");
  KvCache base(m.n_layers());
  PrefillTokens(m, Ids(context, 3, vocab), 0, &base);
  const ModelConfig& c = m.config();
  const double weight_mb =
      (c.num_hidden_layers * (c.hidden_size * (c.num_attention_heads + 2 * c.num_key_value_heads) *
                                  c.head_dim +
                              c.num_attention_heads * c.head_dim * c.hidden_size +
                              3.0 * c.hidden_size * c.intermediate_size) +
       c.vocab_size * c.hidden_size) * 4 / 1e6;
  double one_row_tps = 0;
  for (int64_t batch : {1, 2, 4, 8, 16}) {
    std::vector<KvCache> caches;
    for (int64_t b = 0; b < batch; ++b) caches.push_back(base.Clone());
    std::vector<KvCache*> ptrs;
    for (KvCache& kc : caches) ptrs.push_back(&kc);
    int64_t position = context;
    auto step = [&] {
      at::Tensor ids = at::full({batch}, 5, at::kLong);
      at::Tensor pos = at::full({batch}, position++, at::kLong);
      (void)m.DecodeStep(ids, pos, ptrs);
    };
    step();  // warm up (cache growth)
    const double ms = MedianMs(8 * reps, step);
    const double tps = batch / (ms / 1e3);
    if (batch == 1) one_row_tps = tps;
    std::printf("%6lld %10.2f %12.1f %12.2f %16.1f\n", (long long)batch, ms, tps,
                tps / one_row_tps, weight_mb + batch * base.bytes() / 1e6);
  }
  return 0;
}

}  // namespace
}  // namespace infoflow

int main(int argc, char** argv) { return infoflow::Main(argc, argv); }
