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
// CPU allocator (buffer_pool.h, default options). Idempotent (the first call
// wins).
void InitTorchRuntime(int threads = 0);

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
