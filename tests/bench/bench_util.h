// Helpers shared by the benchmarks: timing statistics, list flags and the
// generated model they all measure when no --model is given.
#ifndef INFOFLOW_TESTS_BENCH_BENCH_UTIL_H_
#define INFOFLOW_TESTS_BENCH_BENCH_UTIL_H_

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/checkpoint/model_config.h"
#include "engine/model/test_model.h"

namespace infoflow::bench {

inline double Ms(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double, std::milli>(d).count();
}

// Linear interpolation between the two nearest ranks; NaN when empty.
inline double Quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  const double pos = q * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(pos);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (pos - static_cast<double>(lo));
}
inline double Median(const std::vector<double>& v) { return Quantile(v, 0.5); }

// Minor page faults of process `pid` so far (/proc/PID/stat field 10), -1
// when unreadable: the pages it touched for the first time since they were
// mapped or handed back (the idle trim), each zero-filled by the kernel.
inline int64_t MinorFaults(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = stat.rfind(')');  // the command name may hold spaces
  if (paren == std::string::npos) return -1;
  std::istringstream rest(stat.substr(paren + 2));
  std::string field;
  for (int i = 3; i <= 10 && rest >> field; ++i) {
    if (i == 10) return std::stoll(field);
  }
  return -1;
}

inline double NowMs() { return Ms(std::chrono::steady_clock::now().time_since_epoch()); }

// Median ms of `reps` calls of f().
template <typename F>
double MedianMs(int reps, F f) {
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const double s = NowMs();
    f();
    t.push_back(NowMs() - s);
  }
  return Median(t);
}

// n pseudo-random token ids in [4, vocab) (xorshift32; same seed => same ids).
inline std::vector<int32_t> Ids(int64_t n, uint32_t seed, int vocab) {
  std::vector<int32_t> ids;
  uint32_t x = 2463534242u + seed;
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    ids.push_back(static_cast<int32_t>(4 + x % (vocab - 4)));
  }
  return ids;
}

// Projection + MLP FLOPs of one token through one layer.
inline double TokenLayerFlops(const ModelConfig& c) {
  const double d = c.hidden_size, hd = c.head_dim, h = c.num_attention_heads,
               kv = c.num_key_value_heads, ff = c.intermediate_size;
  return 2 * (d * (h + 2 * kv) * hd + h * hd * d + 3 * d * ff);
}

// Matmul FLOPs of a prefill of n tokens: projections + MLP per token, QK^T and
// PV over the causal triangle (n(n+1)/2 scores per head; the engine skips
// keys past each query block), LM head for the last token.
inline double PrefillFlops(const ModelConfig& c, int64_t n) {
  const double attn =
      2 * 2 * static_cast<double>(n) * (n + 1) / 2 * c.num_attention_heads * c.head_dim;
  return c.num_hidden_layers * (n * TokenLayerFlops(c) + attn) +
         2.0 * c.hidden_size * c.vocab_size;
}

// "1,4,16" -> {1, 4, 16}; empty items are skipped.
inline std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    if (!item.empty()) out.push_back(std::atoll(item.c_str()));
  }
  return out;
}

// Plain English words the benchmarks build chunk text from.
inline const char* const kWords[] = {
    "the",     "river",   "lamp",    "garden",   "copper",  "window", "orange",  "street",
    "quiet",   "north",   "bridge",  "winter",   "letter",  "silver", "market",  "forest",
    "engine",  "paper",   "yellow",  "harbor",   "candle",  "stone",  "village", "morning",
    "teacher", "kitchen", "mountain", "story",   "little",  "green",  "happy",   "friend",
    "walked",  "found",   "under",   "between",  "and",     "a",      "of",      "with"};
inline constexpr size_t kNumWords = sizeof kWords / sizeof kWords[0];

// The benchmarks' model: a generated 6-layer, 512-wide LLaMA (GQA 8/4,
// SwiGLU 1408, vocab 2048, 32K positions), written once to `dir` (kept
// between runs; same spec => same bytes).
inline absl::Status EnsureBenchModel(const std::string& dir) {
  if (std::filesystem::exists(dir + "/model.safetensors")) return absl::OkStatus();
  TestModelSpec spec;
  spec.hidden_size = 512;
  spec.num_layers = 6;
  spec.num_heads = 8;
  spec.num_kv_heads = 4;
  spec.intermediate_size = 1408;
  spec.vocab_size = 2048;
  spec.max_position_embeddings = 32768;
  return WriteTestModel(dir, spec);
}

}  // namespace infoflow::bench

#endif  // INFOFLOW_TESTS_BENCH_BENCH_UTIL_H_
