#include "engine/model/buffer_pool.h"

#include <c10/core/CPUAllocator.h>
#include <c10/util/Exception.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <vector>

namespace infoflow {
namespace {

constexpr size_t kAlignment = 64;  // torch's gAlignment
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kSmallGranule = size_t{64} << 10;

// The process's pool; set once by InstallLargeBufferPool, never freed
// (tensors in static storage may be released after any destructor ran).
std::atomic<LargeBufferPool*> g_pool{nullptr};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

LargeBufferPool::LargeBufferPool(const BufferPoolOptions& options)
    : options_(options), retain_bytes_(options.retain_bytes) {}

LargeBufferPool::~LargeBufferPool() {
  // Never runs for the process-wide pool (it lives until exit). Blocks still
  // held by tensors would stay mapped: freeing them would leave them dangling.
  for (const auto& [bytes, data] : free_) munmap(data, bytes);
}

size_t LargeBufferPool::BlockBytes(size_t n) {
  // Huge-page multiples above 4 MiB: the same request size (a tensor shape
  // seen again) lands on the same block, and a block of a similar shape is
  // close enough to reuse. Below, 64 KiB steps keep the waste small.
  return n >= 2 * kHugePage ? RoundUp(n, kHugePage) : RoundUp(n, kSmallGranule);
}

void* LargeBufferPool::MapBlock(size_t bytes) const {
  const bool huge = options_.huge_pages && bytes >= kHugePage;
  // For a huge-page block, over-map by one huge page and cut the mapping to
  // a 2 MiB-aligned start: THP only backs aligned 2 MiB ranges.
  const size_t span = huge ? bytes + kHugePage : bytes;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  if (!huge) return raw;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);
  const size_t tail = start + span - (aligned + bytes);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes), tail);
  void* block = reinterpret_cast<void*>(aligned);
  madvise(block, bytes, MADV_HUGEPAGE);  // advice: failure only costs speed
  return block;
}

#if INFOFLOW_TORCH_ALLOCATOR_V2
void LargeBufferPool::copy_data(void* dest, const void* src, size_t count) const {
  default_copy_data(dest, src, count);
}

c10::DataPtr LargeBufferPool::allocate(size_t n) {
#else
c10::DataPtr LargeBufferPool::allocate(size_t n) const {
#endif
  const c10::Device cpu(c10::DeviceType::CPU);
  if (n == 0) return {nullptr, nullptr, &DeleteRaw, cpu};
  if (n < options_.min_bytes) {
    void* p = nullptr;
    if (posix_memalign(&p, kAlignment, n) != 0 || p == nullptr) {
      TORCH_CHECK(false, "LargeBufferPool: out of memory allocating ", n, " bytes");
    }
    small_allocations_.fetch_add(1, std::memory_order_relaxed);
    return {p, p, &std::free, cpu};
  }
  const size_t want = BlockBytes(n);
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The smallest cached block that fits, if it wastes at most a quarter.
    auto it = free_.lower_bound(want);
    if (it != free_.end() && it->first <= want + want / 4) {
      const size_t bytes = it->first;
      void* data = it->second;
      free_.erase(it);
      stats_.cached_bytes -= bytes;
      stats_.in_use_bytes += bytes;
      stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
      ++stats_.reused_blocks;
      stats_.reused_bytes += bytes;
      return {data, data, &DeleteLarge, cpu};
    }
  }
  void* data = MapBlock(want);
  if (data == nullptr) {
    TORCH_CHECK(false, "LargeBufferPool: out of memory mapping ", want, " bytes");
  }
  std::lock_guard<std::mutex> lock(mu_);
  live_[data] = Block{want};
  stats_.in_use_bytes += want;
  stats_.peak_in_use_bytes = std::max(stats_.peak_in_use_bytes, stats_.in_use_bytes);
  ++stats_.fresh_blocks;
  stats_.fresh_bytes += want;
  return {data, data, &DeleteLarge, cpu};
}

c10::DeleterFnPtr LargeBufferPool::raw_deleter() const { return &DeleteRaw; }

void LargeBufferPool::Release(void* data) {
  size_t unmap_bytes = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(data);
    if (it == live_.end()) return;  // not ours: cannot happen for DeleteLarge
    const size_t bytes = it->second.bytes;
    stats_.in_use_bytes -= bytes;
    if (stats_.cached_bytes + bytes <= retain_bytes_) {
      it->second.released_seq = ++release_seq_;
      // First among blocks of its size: the next request for that size
      // gets the block freed last (cache-warm), as glibc's bins would.
      free_.emplace_hint(free_.lower_bound(bytes), bytes, data);
      stats_.cached_bytes += bytes;
      return;
    }
    live_.erase(it);
    ++stats_.unmapped_blocks;
    stats_.unmapped_bytes += bytes;
    unmap_bytes = bytes;
  }
  munmap(data, unmap_bytes);  // outside the lock: it can take a while
}

size_t LargeBufferPool::EvictLocked(size_t keep_bytes) {
  size_t freed = 0;
  while (stats_.cached_bytes > keep_bytes && !free_.empty()) {
    // Least recently released first: what the last query freed at its end
    // (its K/V cache) is what the next one most likely asks for again.
    auto it = free_.begin();
    for (auto j = free_.begin(); j != free_.end(); ++j) {
      if (live_[j->second].released_seq < live_[it->second].released_seq) it = j;
    }
    const size_t bytes = it->first;
    void* data = it->second;
    free_.erase(it);
    live_.erase(data);
    stats_.cached_bytes -= bytes;
    ++stats_.unmapped_blocks;
    stats_.unmapped_bytes += bytes;
    freed += bytes;
    munmap(data, bytes);
  }
  return freed;
}

size_t LargeBufferPool::Trim(size_t keep_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  return EvictLocked(keep_bytes);
}

void LargeBufferPool::set_retain_bytes(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  retain_bytes_ = bytes;
  EvictLocked(bytes);
}

size_t LargeBufferPool::retain_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return retain_bytes_;
}

BufferPoolStats LargeBufferPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  BufferPoolStats s = stats_;
  s.small_allocations = small_allocations_.load(std::memory_order_relaxed);
  return s;
}

void LargeBufferPool::ResetPeak() {
  std::lock_guard<std::mutex> lock(mu_);
  stats_.peak_in_use_bytes = stats_.in_use_bytes;
}

void LargeBufferPool::DeleteLarge(void* data) {
  LargeBufferPool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr) pool->Release(data);
}

void LargeBufferPool::DeleteRaw(void* data) {
  if (data == nullptr) return;
  LargeBufferPool* pool = g_pool.load(std::memory_order_acquire);
  if (pool != nullptr) {
    bool pooled = false;
    {
      std::lock_guard<std::mutex> lock(pool->mu_);
      pooled = pool->live_.count(data) > 0;
    }
    if (pooled) {
      pool->Release(data);
      return;
    }
  }
  std::free(data);
}

LargeBufferPool* InstallLargeBufferPool(const BufferPoolOptions& options) {
  static std::once_flag once;
  std::call_once(once, [&options] {
    auto* pool = new LargeBufferPool(options);
    g_pool.store(pool, std::memory_order_release);
    // Priority 1 beats torch's default CPU allocator (registered at 0).
    c10::SetCPUAllocator(pool, /*priority=*/1);
  });
  return g_pool.load(std::memory_order_acquire);
}

LargeBufferPool* ActiveBufferPool() { return g_pool.load(std::memory_order_acquire); }

}  // namespace infoflow
