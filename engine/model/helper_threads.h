// Kept helper threads for the CPU kernels' work splits.
//
// The decode step's kernels (SmallBatchLinearCpu, DecodeAttentionCpu) split
// each call over MathThreads() threads, about 37 calls a step. Starting a
// std::thread and joining it costs ~50 us on the 2-core VM, ~2 ms of a
// 13 ms step; a kept helper that waits briefly for the next part costs a
// few. Helpers spin for kHelperSpinMicros after each job (a decode step's next
// call follows within that) and then sleep on a condition variable, so an
// idle process does not burn a core (the lesson of OpenBLAS's spinning
// workers, docs/BENCHMARKS.md).
#ifndef INFOFLOW_ENGINE_MODEL_HELPER_THREADS_H_
#define INFOFLOW_ENGINE_MODEL_HELPER_THREADS_H_

#include <functional>

namespace infoflow {

// How long a helper polls for the next job before it sleeps.
inline constexpr int kHelperSpinMicros = 50;

// Runs part(0) .. part(parts - 1) and returns when all have returned: part 0
// on the calling thread, the others on the process's kept helpers. When
// another caller holds the helpers (two threads computing at once) the
// extra parts run on fresh std::threads instead, as before the pool: the
// result is the same either way; `part` must be safe to run concurrently
// for different indices. parts <= 1 runs part(0) inline.
void RunParts(int parts, const std::function<void(int)>& part);

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_HELPER_THREADS_H_
