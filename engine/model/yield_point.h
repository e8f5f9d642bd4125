// Cooperative preemption points inside long engine work.
//
// A serving loop that shares one device between a long prefill and short
// decode steps must not let the prefill hold the device for seconds. The
// engine stays free of any scheduler: a thread that runs preemptible work
// installs a YieldPolicy for a scope, and Model calls YieldPoint() between
// bounded pieces of work -- after each block of at most `max_rows` query rows
// of a layer's projections and MLP, after each block of attention query rows,
// and after each layer. The hook may block (e.g. hand the device to a decode
// step and wait for it back) and then returns; the work continues where it
// stopped, so results do not depend on whether or how often it yielded. Only
// max_rows changes numerics: a matmul over fewer rows may sum in another
// order (BLAS blocking), within 1e-4 (tests/engine/batch_decode_test.cc).
//
// Thread-safety: the policy is thread-local; other threads are unaffected.
#ifndef INFOFLOW_ENGINE_MODEL_YIELD_POINT_H_
#define INFOFLOW_ENGINE_MODEL_YIELD_POINT_H_

#include <cstdint>
#include <functional>

namespace infoflow {

struct YieldPolicy {
  std::function<void()> hook;  // called at each yield point; may block
  // Layer projections and MLP run in blocks of at most this many query rows
  // (0 = all rows at once), so one piece of work stays bounded.
  int64_t max_rows = 0;
};

// Installs `policy` on the calling thread until destroyed (restores the
// previous one). Not copyable.
class ScopedYieldPolicy {
 public:
  explicit ScopedYieldPolicy(YieldPolicy policy);
  ~ScopedYieldPolicy();
  ScopedYieldPolicy(const ScopedYieldPolicy&) = delete;
  ScopedYieldPolicy& operator=(const ScopedYieldPolicy&) = delete;

 private:
  const YieldPolicy* previous_;
  YieldPolicy policy_;
};

// Calls the calling thread's hook, if any.
void YieldPoint();
// The calling thread's max_rows (0 when no policy is installed).
int64_t YieldMaxRows();

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_YIELD_POINT_H_
