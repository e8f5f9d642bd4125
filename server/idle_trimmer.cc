#include "server/idle_trimmer.h"

#include <cstddef>  // defines __GLIBC__ (via <features.h>)

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace infoflow::server {

IdleTrimmer::IdleTrimmer(std::function<bool()> idle, std::chrono::milliseconds period)
    : idle_(std::move(idle)), period_(period), thread_([this] { Loop(); }) {}

IdleTrimmer::~IdleTrimmer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IdleTrimmer::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
    if (!idle_()) continue;
#if defined(__GLIBC__)
    malloc_trim(0);
    trims_.fetch_add(1, std::memory_order_relaxed);
#endif
  }
}

}  // namespace infoflow::server
