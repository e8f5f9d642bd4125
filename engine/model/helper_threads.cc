#include "engine/model/helper_threads.h"

#include <immintrin.h>
#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace infoflow {
namespace {

using Clock = std::chrono::steady_clock;

// Polls `done` with pause instructions for up to kHelperSpinMicros; true if
// it became true in that time.
template <typename Pred>
bool SpinUntil(const Pred& done) {
  const Clock::time_point end = Clock::now() + std::chrono::microseconds(kHelperSpinMicros);
  for (int i = 0;; ++i) {
    if (done()) return true;
    _mm_pause();
    if ((i & 63) == 63 && Clock::now() >= end) return done();
  }
}

// One job at a time. Every helper acknowledges every job (those without a
// part too), and a job returns only after all have: so no helper can still
// read the previous job's fields when the next one is written.
class HelperPool {
 public:
  // Never destroyed: helpers live as long as the process (a static's
  // destructor would race threads still parked at exit). A child of fork()
  // has none of its parent's threads: it starts a pool of its own.
  static HelperPool& Get() {
    static std::once_flag once;
    std::call_once(once, [] {
      current = new HelperPool();
      pthread_atfork(nullptr, nullptr, [] { current = new HelperPool(); });
    });
    return *current;
  }

  bool TryRun(int parts, const std::function<void(int)>& part) {
    std::unique_lock<std::mutex> job(job_mu_, std::try_to_lock);
    if (!job.owns_lock()) return false;
    const uint64_t before = generation_.load(std::memory_order_relaxed);
    while (static_cast<int>(helpers_.size()) < parts - 1) {
      const int index = static_cast<int>(helpers_.size());
      helpers_.emplace_back([this, index, before] { HelperLoop(index, before); });
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      part_ = &part;
      parts_ = parts;
      pending_.store(static_cast<int>(helpers_.size()), std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      if (sleeping_ > 0) wake_.notify_all();
    }
    part(0);
    if (!SpinUntil([&] { return pending_.load(std::memory_order_acquire) == 0; })) {
      std::unique_lock<std::mutex> l(mu_);
      done_.wait(l, [&] { return pending_.load(std::memory_order_acquire) == 0; });
    }
    return true;
  }

 private:
  HelperPool() = default;

  // Helper `index` runs part index + 1 of each job after generation `seen`
  // that has one.
  void HelperLoop(int index, uint64_t seen) {
    while (true) {
      auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
      if (!SpinUntil(fresh)) {
        std::unique_lock<std::mutex> l(mu_);
        ++sleeping_;
        wake_.wait(l, fresh);
        --sleeping_;
      }
      seen = generation_.load(std::memory_order_acquire);
      if (index + 1 < parts_) (*part_)(index + 1);
      if (pending_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard<std::mutex> l(mu_);  // the caller may be between its check and its wait
        done_.notify_one();
      }
    }
  }

  std::mutex job_mu_;  // held by the caller for a whole job
  std::mutex mu_;      // guards sleeping_ and the hand-offs to sleepers
  std::condition_variable wake_, done_;
  int sleeping_ = 0;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_{0};
  // Written before generation_'s release increment, read after its acquire.
  const std::function<void(int)>* part_ = nullptr;
  int parts_ = 0;
  std::vector<std::thread> helpers_;
  static inline HelperPool* current = nullptr;
};

}  // namespace

void RunParts(int parts, const std::function<void(int)>& part) {
  if (parts <= 1) {
    part(0);
    return;
  }
  if (HelperPool::Get().TryRun(parts, part)) return;
  std::vector<std::thread> extra;
  for (int i = 1; i < parts; ++i) extra.emplace_back(part, i);
  part(0);
  for (std::thread& t : extra) t.join();
}

}  // namespace infoflow
