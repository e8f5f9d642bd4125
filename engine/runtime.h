// Process-wide torch setup: CPU threads and a check that BLAS is OpenBLAS.
#ifndef INFOFLOW_ENGINE_RUNTIME_H_
#define INFOFLOW_ENGINE_RUNTIME_H_

#include <string>

namespace infoflow {

// Sets torch's intra-op CPU threads (0 = auto: 1 when the loaded BLAS is
// OpenBLAS, whose own threads already use every core for the matmuls; else
// all cores). Must run before the
// first oneDNN op: raising it later leaves bf16 kernels slow. Idempotent.
void InitTorchRuntime(int threads = 0);

// Path of the libblas.so.3 this process really loaded (symlinks resolved),
// or "" if none is mapped.
std::string LoadedBlasLibrary();

// True when the loaded BLAS is Debian's reference BLAS (~50x slower than
// OpenBLAS). InitTorchRuntime prints a loud warning to stderr in that case.
bool UsingReferenceBlas();

}  // namespace infoflow

#endif  // INFOFLOW_ENGINE_RUNTIME_H_
