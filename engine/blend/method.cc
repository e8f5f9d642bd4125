#include "engine/blend/method.h"

#include <cctype>

namespace infoflow {

const char* MethodName(Method m) {
  switch (m) {
    case Method::kFull: return "FULL";
    case Method::kNone: return "NONE";
    case Method::kInfoFlow: return "INFOFLOW";
    case Method::kCacheBlend: return "CACHEBLEND";
    case Method::kEpic: return "EPIC";
    case Method::kRandom: return "RANDOM";
    case Method::kCacheBlendPartial: return "CACHEBLEND_PARTIAL";
    case Method::kInfoFlowBlend: return "INFOFLOW_BLEND";
  }
  return "UNKNOWN";
}

bool ParseMethod(const std::string& name, Method* out) {
  std::string up;
  for (char ch : name) up.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  for (Method m : {Method::kFull, Method::kNone, Method::kInfoFlow, Method::kCacheBlend,
                   Method::kEpic, Method::kRandom, Method::kCacheBlendPartial,
                   Method::kInfoFlowBlend}) {
    if (up == MethodName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

double DefaultRatio(Method m) { return m == Method::kInfoFlowBlend ? 0.05 : 0.15; }

bool MethodUsesRatio(Method m) {
  switch (m) {
    case Method::kInfoFlow:
    case Method::kCacheBlend:
    case Method::kCacheBlendPartial:
    case Method::kRandom:
    case Method::kInfoFlowBlend: return true;
    case Method::kFull:
    case Method::kNone:
    case Method::kEpic: return false;
  }
  return false;
}

const char* DeviationName(Deviation d) { return d == Deviation::kK ? "K" : "V"; }

bool ParseDeviation(const std::string& name, Deviation* out) {
  if (name == "v" || name == "V") {
    *out = Deviation::kV;
    return true;
  }
  if (name == "k" || name == "K") {
    *out = Deviation::kK;
    return true;
  }
  return false;
}

}  // namespace infoflow
