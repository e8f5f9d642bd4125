// The blending methods and their knobs, used by every stage of blend/
// (docs/DESIGN.md §3).
#ifndef INFOFLOW_ENGINE_BLEND_METHOD_H_
#define INFOFLOW_ENGINE_BLEND_METHOD_H_

#include <cstdint>
#include <string>
#include <vector>

namespace infoflow {

enum class Method { kFull, kNone, kInfoFlow, kCacheBlend, kEpic, kRandom };
const char* MethodName(Method m);  // "FULL", "NONE", "INFOFLOW", ...
bool ParseMethod(const std::string& name, Method* out);  // case-insensitive

enum class ScoreVariant { kL2, kSum, kVNorm };
enum class Deviation { kV, kK };  // which layer-1 state CacheBlend compares

struct MethodOptions {
  Method method = Method::kInfoFlow;
  double ratio = 0.15;   // r: recompute floor(r * context tokens)
  bool reorder = false;  // INFOFLOW only: the request allows moving chunks
  std::vector<int> scoring_layers;  // empty = DefaultScoringLayers(model)
  ScoreVariant variant = ScoreVariant::kL2;
  Deviation deviation = Deviation::kV;
  int lego_k = 4;     // EPIC: tokens recomputed at the start of every chunk
  uint64_t seed = 0;  // RANDOM
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_BLEND_METHOD_H_
