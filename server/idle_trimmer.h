// IdleTrimmer: hands freed heap memory back to the OS while the server is
// idle.
//
// Why: requests move large transient buffers (a 64 MiB gRPC message being
// refused, multi-MiB KV records, prefill activations). glibc raises its mmap
// threshold after such a buffer is freed, so later ones come from the heap,
// and free heap pages stay resident until something trims them: RSS then
// ratchets up to the high-water mark of the largest requests seen and stays
// there (measured: 194 -> 308 MiB over a table of bad requests with two
// 65 MiB messages, flat from then on; allocator retention, not a leak).
// malloc_trim(0) returns every free page. It runs once per idle spell: when
// no request has run or waited for a whole period. The engine's large
// buffers live outside the heap, in its buffer pool
// (engine/model/buffer_pool.h), which the trim does not touch, so the next
// query finds its buffers resident (docs/DESIGN.md §15); a second trimmer
// with a long period empties the pool through `before_trim`. A server serving
// back-to-back requests never trims, so their buffers are not faulted in
// again (page faults are expensive on small VMs; see server/main.cc). The
// server trims only when at least --idle-trim-min-free-mb of the heap is
// free (`worth_trimming`): a trim hands back every free page, and the few
// MiB a query's small objects leave free are faulted in again by the next
// query (measured 2-3 MiB, 500-700 faults, per query after idle at 2K-16K).
//
// Thread-safe. The destructor stops the background thread.
#ifndef INFOFLOW_SERVER_IDLE_TRIMMER_H_
#define INFOFLOW_SERVER_IDLE_TRIMMER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace infoflow::server {

class IdleTrimmer {
 public:
  // Checks every `period`: trims the heap when `idle()` holds and
  // `activity()` (a counter of admitted requests) did not move since the
  // previous check, at most once per value of `activity()`, and
  // `worth_trimming()` (when given) holds then. `before_trim` (may be empty)
  // runs right before each trim. The heap trim is a no-op on non-glibc
  // builds.
  IdleTrimmer(std::function<bool()> idle, std::function<uint64_t()> activity,
              std::chrono::milliseconds period, std::function<void()> before_trim = {},
              std::function<bool()> worth_trimming = {});

  // Free bytes of the malloc heap that are still resident: what a trim
  // would hand back now. With one malloc arena (the server's default) these
  // are the main heap's resident pages (mincore over [heap]) minus the bytes
  // in use, so pages an earlier trim already returned do not count again;
  // glibc's own free count (mallinfo2 fordblks) keeps counting them, and a
  // gate on it trimmed after every idle spell once the heap had ever held
  // that much free (docs/DESIGN.md §15). With more arenas, or where the heap
  // cannot be inspected, every free byte (fordblks). 0 on non-glibc builds.
  static uint64_t HeapTrimmableBytes();
  ~IdleTrimmer();
  IdleTrimmer(const IdleTrimmer&) = delete;
  IdleTrimmer& operator=(const IdleTrimmer&) = delete;

  // Trims performed so far.
  uint64_t trims() const { return trims_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  std::function<bool()> idle_;
  std::function<uint64_t()> activity_;
  std::function<void()> before_trim_;
  std::function<bool()> worth_trimming_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> trims_{0};
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_IDLE_TRIMMER_H_
