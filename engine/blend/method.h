// The blending methods and their knobs, used by every stage of blend/
// (docs/DESIGN.md §3).
#ifndef INFOFLOW_ENGINE_BLEND_METHOD_H_
#define INFOFLOW_ENGINE_BLEND_METHOD_H_

#include <cstdint>
#include <string>
#include <vector>

namespace infoflow {

// kCacheBlend is the original CacheBlend (fresh layer-0/1 K/V for every
// context token, then the top-k by layer-1 deviation recomputed from layer
// 2 on); kCacheBlendPartial is LMCache's variant (fresh layer-1 K/V kept for
// the top-k only, so r = 0 is NONE). kInfoFlowBlend is INFOFLOW's relevance
// combined with CACHEBLEND's layer-1 deviation measured at one layer's cost
// (DESIGN.md §3).
enum class Method {
  kFull,
  kNone,
  kInfoFlow,
  kCacheBlend,
  kEpic,
  kRandom,
  kCacheBlendPartial,
  kInfoFlowBlend
};
const char* MethodName(Method m);  // "FULL", "NONE", "INFOFLOW", "CACHEBLEND_PARTIAL", ...
bool ParseMethod(const std::string& name, Method* out);  // case-insensitive
// Whether the method's recompute budget depends on MethodOptions::ratio.
bool MethodUsesRatio(Method m);

// What a request that names no method gets (the server's
// METHOD_UNSPECIFIED): INFOFLOW_BLEND, whose EM-vs-TTFT curve lies above
// INFOFLOW's and CACHEBLEND's on the held-out sets of
// models/infoflow-tiny/MODEL_CARD.md ("Which method is the server default").
inline constexpr Method kDefaultMethod = Method::kInfoFlowBlend;
// r when a request gives none: 0.05 for INFOFLOW_BLEND (cheaper than
// INFOFLOW at 0.15 on the shipped model, and about twice its EM on split),
// 0.15 for every other method.
double DefaultRatio(Method m);

enum class ScoreVariant { kL2, kSum, kVNorm };
enum class Deviation { kV, kK };  // which layer-1 state CacheBlend compares
const char* DeviationName(Deviation d);  // "V", "K"
bool ParseDeviation(const std::string& name, Deviation* out);  // "v"/"k", case-insensitive

struct MethodOptions {
  Method method = Method::kInfoFlow;
  double ratio = 0.15;   // r: recompute floor(r * context tokens)
  bool reorder = false;  // INFOFLOW only: the request allows moving chunks
  std::vector<int> scoring_layers;  // empty = DefaultScoringLayers(model)
  ScoreVariant variant = ScoreVariant::kL2;
  Deviation deviation = Deviation::kV;  // CACHEBLEND*, INFOFLOW_BLEND
  // INFOFLOW_BLEND: the share of the budget that goes to the tokens with
  // the largest layer-1 deviation before attention-norm relevance fills the
  // rest.
  double stale_share = 0.5;
  // INFOFLOW_BLEND: the deviation is measured on the probe_factor x (stale
  // share of the budget) most relevant tokens, a cost that scales with r;
  // 0 = on every eligible token (a fixed layer-0 pass, better from ~0.35 x
  // FULL TTFT up on the shipped model; MODEL_CARD.md).
  double probe_factor = 16.0;
  int lego_k = 4;     // EPIC: tokens recomputed at the start of every chunk
  uint64_t seed = 0;  // RANDOM
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_METHOD_H_
