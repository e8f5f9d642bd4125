// LargeBufferPool: torch's CPU allocator, keeping the large per-query
// buffers (K/V caches, repositioned keys, activations) resident between
// queries within a byte budget.
//
// Why: a query at 8K context allocates and frees hundreds of MB of tensors.
// From glibc's heap they are fast while the heap stays resident, but a server
// must hand memory back when idle, and malloc_trim(0) returns *every* free
// heap page: the next query then page-faults and zeroes all of it again
// (measured: +24-62% TTFT through gRPC at 8K, docs/DESIGN.md §15). This pool
// serves every allocation of at least `min_bytes` from its own anonymous
// mappings (transparent huge pages where the kernel allows, so a fault costs
// one 2 MiB page, not 512 small ones), which malloc_trim never touches, and
// keeps freed blocks for reuse up to `retain_bytes`. Blocks beyond the budget
// are unmapped at once, and Trim() returns what idle memory the caller chooses.
// Smaller allocations go to posix_memalign, as torch's own allocator does.
//
// Thread-safe. One process-wide instance (InstallLargeBufferPool): torch
// frees a tensor through a plain function pointer, so the deleter finds the
// pool through a global.
#ifndef INFOFLOW_ENGINE_MODEL_BUFFER_POOL_H_
#define INFOFLOW_ENGINE_MODEL_BUFFER_POOL_H_

#include <c10/core/Allocator.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <unordered_map>

namespace infoflow {

struct BufferPoolOptions {
  // Allocations of at least this many bytes come from pooled mappings. 256
  // KiB: below it live only per-row and per-head odds and ends (about 2-3
  // MiB of a query's pages, measured by serve_bench's page-fault line);
  // above it the activations of short queries (a 384-row recompute at 2K is
  // 768 KiB), per-chunk K/V slices and RoPE scratch, which a 1 MiB
  // threshold left on the heap for the idle trim to hand back (+8-14% TTFT
  // after idle at 2K, docs/DESIGN.md §15).
  size_t min_bytes = size_t{256} << 10;
  // Freed blocks kept for reuse, at most (0 = keep none: every large buffer
  // is mapped on allocation and unmapped on free).
  size_t retain_bytes = size_t{2} << 30;
  // madvise(MADV_HUGEPAGE) on blocks of 2 MiB and more.
  bool huge_pages = true;
};

// Counters since the pool was installed. "fresh" bytes were newly mapped
// (the kernel faults them in on first touch); "reused" bytes came from a
// block freed earlier (already resident, no fault).
struct BufferPoolStats {
  uint64_t fresh_blocks = 0, fresh_bytes = 0;
  uint64_t reused_blocks = 0, reused_bytes = 0;
  uint64_t unmapped_blocks = 0, unmapped_bytes = 0;  // returned to the OS
  uint64_t small_allocations = 0;                    // below min_bytes
  size_t in_use_bytes = 0;   // pooled blocks held by live tensors
  size_t cached_bytes = 0;   // pooled blocks free for reuse (resident)
  size_t peak_in_use_bytes = 0;  // since the last ResetPeak()
};

class LargeBufferPool;

// Installs one pool as torch's CPU allocator for this process (the first
// call wins; later calls return the same pool). Tensors allocated before it
// keep their own deleters. InitTorchRuntime calls it with the defaults.
LargeBufferPool* InstallLargeBufferPool(const BufferPoolOptions& options = {});

// The installed pool, or nullptr.
LargeBufferPool* ActiveBufferPool();

// Created only by InstallLargeBufferPool: a tensor's deleter finds its pool
// through the process-wide pointer, so a second instance could not free.
class LargeBufferPool final : public c10::Allocator {
 public:
  ~LargeBufferPool() override;  // unmaps cached blocks (live ones stay: see .cc)
  LargeBufferPool(const LargeBufferPool&) = delete;
  LargeBufferPool& operator=(const LargeBufferPool&) = delete;

  // c10::Allocator. 64-byte aligned, like torch's default CPU allocator;
  // contents are uninitialised. Throws c10::Error when the OS refuses memory.
  // libtorch 2.x made allocate non-const and added copy_data (a memcpy here);
  // CMake detects which interface the libtorch in use has.
#if INFOFLOW_TORCH_ALLOCATOR_V2
  c10::DataPtr allocate(size_t n) override;
  void copy_data(void* dest, const void* src, size_t count) const override;
#else
  c10::DataPtr allocate(size_t n) const override;
#endif
  c10::DeleterFnPtr raw_deleter() const override;

  // Unmaps cached blocks, least recently freed first, until at most `keep_bytes` stay
  // cached. Returns the bytes unmapped. Blocks in use are never touched.
  size_t Trim(size_t keep_bytes);

  // Changes the retain budget (cached blocks above it are unmapped now).
  void set_retain_bytes(size_t bytes);
  size_t retain_bytes() const;

  BufferPoolStats stats() const;
  // Starts a new peak_in_use_bytes window at the current in-use size.
  void ResetPeak();

  // The block size a request of n bytes is rounded to (for tests and docs).
  static size_t BlockBytes(size_t n);

 private:
  friend LargeBufferPool* InstallLargeBufferPool(const BufferPoolOptions& options);
  explicit LargeBufferPool(const BufferPoolOptions& options);

  struct Block {
    size_t bytes;
    uint64_t released_seq = 0;  // when it was last freed (eviction order)
  };
  void* MapBlock(size_t bytes) const;
  void Release(void* data);
  size_t EvictLocked(size_t keep_bytes);
  static void DeleteLarge(void* data);
  static void DeleteRaw(void* data);

  const BufferPoolOptions options_;
  mutable std::mutex mu_;
  size_t retain_bytes_;                                  // guarded by mu_
  mutable std::multimap<size_t, void*> free_;            // block bytes -> data
  mutable std::unordered_map<void*, Block> live_;        // every pooled block
  mutable BufferPoolStats stats_;                        // guarded by mu_
  uint64_t release_seq_ = 0;                             // guarded by mu_
  mutable std::atomic<uint64_t> small_allocations_{0};
};

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_BUFFER_POOL_H_
