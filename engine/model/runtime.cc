#include "engine/model/runtime.h"

#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <thread>

#include "engine/model/buffer_pool.h"

namespace infoflow {

std::string LoadedBlasLibrary() {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    const size_t slash = line.find('/');
    if (slash == std::string::npos) continue;
    const std::string path = line.substr(slash);
    if (path.find("libblas.so") == std::string::npos) continue;
    std::error_code ec;
    std::filesystem::path real = std::filesystem::canonical(path, ec);
    return ec ? path : real.string();
  }
  return "";
}

bool UsingReferenceBlas() {
  const std::string blas = LoadedBlasLibrary();
  return !blas.empty() && blas.find("openblas") == std::string::npos &&
         blas.find("blis") == std::string::npos && blas.find("mkl") == std::string::npos;
}

bool SetBlasThreads(int threads) {
  using SetFn = void (*)(int);
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (set == nullptr || threads <= 0) return false;
  set(threads);
  return true;
}

int MathThreads() {
  using GetFn = int (*)();
  static const auto get = reinterpret_cast<GetFn>(dlsym(RTLD_DEFAULT, "openblas_get_num_threads"));
  return std::max(1, get != nullptr ? get() : at::get_num_threads());
}

bool ShortenBlasWorkerSpin() {
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") != nullptr) return false;
  // OpenBLAS reads its environment once, in its library constructor; these
  // exported entry points re-read it and stop the workers, which the next
  // threaded matmul starts again with the new timeout (what OpenBLAS itself
  // does after a fork).
  using VoidFn = void (*)();
  using IntFn = int (*)();
  const auto read_env = reinterpret_cast<VoidFn>(dlsym(RTLD_DEFAULT, "openblas_read_env"));
  const auto shutdown = reinterpret_cast<IntFn>(dlsym(RTLD_DEFAULT, "blas_thread_shutdown_"));
  if (read_env == nullptr || shutdown == nullptr) return false;
  if (setenv("OPENBLAS_THREAD_TIMEOUT", "4", 0) != 0) return false;
  read_env();
  shutdown();
  return true;
}

void InitTorchRuntime(int threads) {
  static std::once_flag once;
  std::call_once(once, [threads] {
    // OpenBLAS (pthread build) runs every matmul on its own spinning
    // threads; torch's OpenMP pool on the same cores then fights it. One
    // intra-op thread measured 1.75x faster prefill on 2 cores (engine_bench:
    // 1033 vs 1804 ms for 2048 tokens). So with OpenBLAS, `threads` cores
    // means: OpenBLAS gets `threads` threads (auto: its default, every core),
    // torch keeps one. Without OpenBLAS, torch gets them.
    const bool openblas = LoadedBlasLibrary().find("openblas") != std::string::npos;
    if (openblas) {
      // Threads first: OpenBLAS grows its pool in place, and the restart below
      // then stops and restarts the whole pool.
      if (threads > 0) SetBlasThreads(threads);
      ShortenBlasWorkerSpin();
      at::set_num_threads(1);
    } else {
      at::set_num_threads(threads > 0 ? threads
                                      : static_cast<int>(std::thread::hardware_concurrency()));
    }
    // Activations of tens of MB are allocated and freed per layer; by default
    // glibc serves them with fresh mmaps and returns them at once, and the
    // page faults cost more than the math (measured: several x on prefill).
    // Keep freed memory in the heap instead.
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
    // Tensors of BufferPoolOptions::min_bytes and more come from the buffer pool instead, which a
    // heap trim (the server's idle trimmer) leaves resident: see
    // buffer_pool.h.
    InstallLargeBufferPool();
    if (UsingReferenceBlas()) {
      std::fprintf(stderr,
                   "WARNING: libtorch is using the reference BLAS (%s), ~50x slower than "
                   "OpenBLAS. Install libopenblas0-pthread (deploy/install-deps.sh) or select it "
                   "with update-alternatives --config libblas.so.3-x86_64-linux-gnu.\n",
                   LoadedBlasLibrary().c_str());
    }
  });
}

}  // namespace infoflow
