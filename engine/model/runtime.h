// Process-wide torch setup: CPU threads and a check that BLAS is OpenBLAS.
#ifndef INFOFLOW_ENGINE_MODEL_RUNTIME_H_
#define INFOFLOW_ENGINE_MODEL_RUNTIME_H_

#include <string>

namespace infoflow {

// Sets how many CPU cores the math uses (0 = all). With OpenBLAS loaded its
// threads do the matmuls on `threads` cores and torch's intra-op pool keeps
// one thread (the two pools on the same cores fight); otherwise torch's pool
// gets `threads`. Must run before the first oneDNN op: raising it later
// leaves bf16 kernels slow. Also installs the large-buffer pool as torch's
// CPU allocator (buffer_pool.h, default options), and makes OpenBLAS's idle
// workers sleep at once instead of spinning (ShortenBlasWorkerSpin).
// Idempotent (the first call wins).
void InitTorchRuntime(int threads = 0);

// When OpenBLAS is loaded and OPENBLAS_THREAD_TIMEOUT is not set: sets it to
// 4 (OpenBLAS's minimum: its workers wait 2^4 cycles for new work, then
// sleep) and restarts OpenBLAS's worker threads so they read it. By default
// a worker spins on sched_yield for 2^28 cycles (about 0.1 s) after every
// matmul, holding a core our own attention and decode threads need: measured
// on 2 cores, batched decode steps of 8-16 requests 20-30% faster without the
// spin, a 16K prefill 0-3% (docs/BENCHMARKS.md). Numerics are unchanged. A
// value the user set (e.g. OPENBLAS_THREAD_TIMEOUT=28, OpenBLAS's default) is
// left alone. Returns true when it changed the setting. Call before other
// threads run matmuls, and after SetBlasThreads (InitTorchRuntime does both).
bool ShortenBlasWorkerSpin();

// openblas_set_num_threads(threads) when OpenBLAS is loaded; false (and
// nothing done) otherwise or for threads <= 0.
bool SetBlasThreads(int threads);

// How many cores the math runs on now: OpenBLAS's thread count when it is
// loaded (InitTorchRuntime gives it the cores), else torch's intra-op
// thread count. Plain C++ kernels (decode_attention.h) split work this wide.
int MathThreads();

// Path of the libblas.so.3 this process really loaded (symlinks resolved),
// or "" if none is mapped.
std::string LoadedBlasLibrary();

// True when the loaded BLAS is Debian's reference BLAS (~50x slower than
// OpenBLAS). InitTorchRuntime prints a loud warning to stderr in that case.
bool UsingReferenceBlas();

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_MODEL_RUNTIME_H_
