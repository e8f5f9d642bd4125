#include "server/idle_trimmer.h"

#include <cstddef>  // defines __GLIBC__ (via <features.h>)

#if defined(__GLIBC__)
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include <cstdio>
#include <cstring>
#include <vector>

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

uint64_t IdleTrimmer::HeapTrimmableBytes() {
#if defined(__GLIBC__)
  const struct mallinfo2 mi = mallinfo2();
  uintptr_t lo = 0, hi = 0;
  if (FILE* f = std::fopen("/proc/self/maps", "r")) {
    char line[512];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      if (std::strstr(line, "[heap]") == nullptr) continue;
      unsigned long a = 0, b = 0;
      if (std::sscanf(line, "%lx-%lx", &a, &b) == 2) lo = a, hi = b;
      break;
    }
    std::fclose(f);
  }
  const size_t heap = hi - lo;
  // mi.arena sums every arena's heap: more than [heap] means other arenas
  // hold memory this count cannot see.
  if (heap == 0 || mi.arena > heap + (size_t{1} << 20)) return mi.fordblks;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((heap + page - 1) / page);
  if (mincore(reinterpret_cast<void*>(lo), heap, resident.data()) != 0) return mi.fordblks;
  uint64_t bytes = 0;
  for (unsigned char r : resident) bytes += (r & 1) != 0 ? page : 0;
  return bytes > mi.uordblks ? bytes - mi.uordblks : 0;
#else
  return 0;
#endif
}

}  // namespace infoflow::server
