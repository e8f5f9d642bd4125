// The process runtime (engine/model/runtime.h): OpenBLAS's idle workers are
// told to sleep at once unless the user chose otherwise, and restarting the
// worker pool for it leaves matmuls bit-identical and the thread count as set.
#include "engine/model/runtime.h"

#include <ATen/ATen.h>
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

namespace infoflow {
namespace {

bool OpenBlasCanRestart() {
  return LoadedBlasLibrary().find("openblas") != std::string::npos &&
         dlsym(RTLD_DEFAULT, "openblas_read_env") != nullptr &&
         dlsym(RTLD_DEFAULT, "blas_thread_shutdown_") != nullptr;
}

TEST(RuntimeTest, ShortBlasWaitIsSetAndMatmulsStayBitIdentical) {
  InitTorchRuntime(2);
  if (!OpenBlasCanRestart()) GTEST_SKIP() << "not OpenBLAS with its restart entry points";
  // Set by InitTorchRuntime, or by whoever runs the tests (then left alone).
  const char* at_start = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  ASSERT_NE(at_start, nullptr);
  const std::string saved = at_start;
  const int threads = MathThreads();

  at::manual_seed(3);
  // Large enough that OpenBLAS splits it over its workers.
  const at::Tensor a = at::randn({512, 384}), b = at::randn({384, 640});
  const at::Tensor before = at::mm(a, b);

  // Unset again: the pool restarts with the short wait.
  ASSERT_EQ(unsetenv("OPENBLAS_THREAD_TIMEOUT"), 0);
  EXPECT_TRUE(ShortenBlasWorkerSpin());
  ASSERT_NE(std::getenv("OPENBLAS_THREAD_TIMEOUT"), nullptr);
  EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "4");
  EXPECT_TRUE(at::equal(at::mm(a, b), before));
  EXPECT_EQ(MathThreads(), threads);
  EXPECT_TRUE(at::equal(at::mm(a, b), before));

  // A value the user set is left alone.
  ASSERT_EQ(setenv("OPENBLAS_THREAD_TIMEOUT", "28", 1), 0);
  EXPECT_FALSE(ShortenBlasWorkerSpin());
  EXPECT_STREQ(std::getenv("OPENBLAS_THREAD_TIMEOUT"), "28");
  ASSERT_EQ(setenv("OPENBLAS_THREAD_TIMEOUT", saved.c_str(), 1), 0);
}

}  // namespace
}  // namespace infoflow
