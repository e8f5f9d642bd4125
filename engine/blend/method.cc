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
  }
  return "UNKNOWN";
}

bool ParseMethod(const std::string& name, Method* out) {
  std::string up;
  for (char ch : name) up.push_back(static_cast<char>(std::toupper(static_cast<unsigned char>(ch))));
  for (Method m : {Method::kFull, Method::kNone, Method::kInfoFlow, Method::kCacheBlend,
                   Method::kEpic, Method::kRandom}) {
    if (up == MethodName(m)) {
      *out = m;
      return true;
    }
  }
  return false;
}

}  // namespace infoflow
