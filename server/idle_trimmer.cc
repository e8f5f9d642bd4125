#include "server/idle_trimmer.h"

#include <cstddef>  // defines __GLIBC__ (via <features.h>)

#if defined(__GLIBC__)
#include <malloc.h>
#endif

namespace infoflow::server {

IdleTrimmer::IdleTrimmer(std::function<bool()> idle, std::function<uint64_t()> activity,
                         std::chrono::milliseconds period, std::function<void()> before_trim,
                         std::function<bool()> worth_trimming)
    : idle_(std::move(idle)),
      activity_(std::move(activity)),
      before_trim_(std::move(before_trim)),
      worth_trimming_(std::move(worth_trimming)),
      period_(period),
      thread_([this] { Loop(); }) {}

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
  uint64_t seen = activity_();
  bool trimmed_this_spell = false;
  while (!cv_.wait_for(lock, period_, [this] { return stop_; })) {
    const uint64_t now = activity_();
    const bool quiet = now == seen && idle_();  // nothing ran for a whole period
    if (now != seen) trimmed_this_spell = false;
    seen = now;
    if (!quiet || trimmed_this_spell) continue;
    trimmed_this_spell = true;
    if (worth_trimming_ && !worth_trimming_()) continue;
    if (before_trim_) before_trim_();
#if defined(__GLIBC__)
    malloc_trim(0);
    trims_.fetch_add(1, std::memory_order_relaxed);
#endif
  }
}

uint64_t IdleTrimmer::HeapFreeBytes() {
#if defined(__GLIBC__)
  return mallinfo2().fordblks;
#else
  return 0;
#endif
}

}  // namespace infoflow::server
