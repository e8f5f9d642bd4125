#include "engine/model/yield_point.h"

#include <utility>

namespace infoflow {
namespace {

thread_local const YieldPolicy* g_policy = nullptr;

}  // namespace

ScopedYieldPolicy::ScopedYieldPolicy(YieldPolicy policy)
    : previous_(g_policy), policy_(std::move(policy)) {
  g_policy = &policy_;
}

ScopedYieldPolicy::~ScopedYieldPolicy() { g_policy = previous_; }

void YieldPoint() {
  if (g_policy != nullptr && g_policy->hook) g_policy->hook();
}

int64_t YieldMaxRows() { return g_policy != nullptr ? g_policy->max_rows : 0; }

}  // namespace infoflow
