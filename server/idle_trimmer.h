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
// malloc_trim(0) returns every free page; it runs only when no request is
// running or waiting, so it never adds to a request's latency.
//
// Thread-safe. The destructor stops the background thread.
#ifndef INFOFLOW_SERVER_IDLE_TRIMMER_H_
#define INFOFLOW_SERVER_IDLE_TRIMMER_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace infoflow::server {

class IdleTrimmer {
 public:
  // Every `period`, if `idle()` holds, trims the heap. A no-op thread on
  // non-glibc builds.
  IdleTrimmer(std::function<bool()> idle, std::chrono::milliseconds period);
  ~IdleTrimmer();
  IdleTrimmer(const IdleTrimmer&) = delete;
  IdleTrimmer& operator=(const IdleTrimmer&) = delete;

  // Trims performed so far.
  uint64_t trims() const { return trims_.load(std::memory_order_relaxed); }

 private:
  void Loop();

  std::function<bool()> idle_;
  const std::chrono::milliseconds period_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<uint64_t> trims_{0};
  std::thread thread_;  // last: starts after the members it uses
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_IDLE_TRIMMER_H_
