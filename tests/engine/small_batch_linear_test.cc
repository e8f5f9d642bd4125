// SmallBatchLinearCpu (engine/model/small_batch_linear.h) and the kept
// helper threads it splits over (engine/model/helper_threads.h).
#include "engine/model/small_batch_linear.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/model/helper_threads.h"

namespace infoflow {
namespace {

bool BitEqual(const at::Tensor& a, const at::Tensor& b) {
  return a.sizes() == b.sizes() && at::equal(a.contiguous(), b.contiguous());
}

// Within float summation-order error of at::linear, for row counts on both
// sides of the 8- and 16-lane passes, widths that leave partial tiles, a
// bias, and x rows with a stride (a narrow of a wider tensor).
TEST(SmallBatchLinear, EqualsAtLinearUpToSummationOrder) {
  at::manual_seed(1);
  for (int64_t rows : {1, 3, 8, 9, 16, 17, 40}) {
    for (auto [in, out] :
         std::vector<std::pair<int64_t, int64_t>>{{64, 12}, {37, 29}, {512, 1024}}) {
      at::Tensor wide = at::randn({rows, in + 5});
      at::Tensor x = wide.narrow(1, 2, in);  // row stride in + 5
      at::Tensor w = at::randn({out, in}), b = at::randn({out});
      ASSERT_TRUE(SmallBatchLinearCpuSupports(x, w, b));
      for (int threads : {1, 2, 3}) {
        at::Tensor got = SmallBatchLinearCpu(x, w, b, threads);
        at::Tensor want = at::linear(x, w, b);
        const double tol = 1e-5 * std::sqrt(static_cast<double>(in)) * 4;
        EXPECT_LE((got - want).abs().max().item<double>(), tol)
            << rows << " rows, " << in << " -> " << out << ", " << threads << " threads";
        at::Tensor no_bias = SmallBatchLinearCpu(x, w, {}, threads);
        EXPECT_LE((no_bias - at::linear(x, w)).abs().max().item<double>(), tol);
      }
    }
  }
}

// A row's result does not depend on the rows beside it, the row count (8-
// or 16-lane passes, one pass or several) or the thread split: bit for bit.
TEST(SmallBatchLinear, EachRowIsBitIdenticalWhateverItsBatch) {
  at::manual_seed(2);
  const int64_t in = 300, out = 257;
  at::Tensor w = at::randn({out, in}), b = at::randn({out});
  at::Tensor x = at::randn({40, in});
  at::Tensor alone = SmallBatchLinearCpu(x.narrow(0, 5, 1), w, b, 1);
  for (int64_t rows : {6, 9, 16, 33, 40}) {
    for (int threads : {1, 2, 4}) {
      at::Tensor all = SmallBatchLinearCpu(x.narrow(0, 0, rows), w, b, threads);
      EXPECT_TRUE(BitEqual(all.narrow(0, 5, 1), alone)) << rows << " rows, " << threads;
    }
  }
  // The same row among other values in other places of the batch.
  at::Tensor shuffled = at::randn({12, in});
  shuffled[11] = x[5];
  EXPECT_TRUE(BitEqual(SmallBatchLinearCpu(shuffled, w, b, 2).narrow(0, 11, 1), alone));
}

TEST(SmallBatchLinear, SupportsOnlyWhatItRuns) {
  at::Tensor x = at::randn({4, 8}), w = at::randn({6, 8});
  EXPECT_TRUE(SmallBatchLinearCpuSupports(x, w, {}));
  EXPECT_FALSE(SmallBatchLinearCpuSupports(x.to(at::kDouble), w.to(at::kDouble), {}));
  EXPECT_FALSE(SmallBatchLinearCpuSupports(x, w.to(at::kBFloat16), {}));
  EXPECT_FALSE(SmallBatchLinearCpuSupports(x.t(), w, {}));  // inner stride 4
  EXPECT_FALSE(SmallBatchLinearCpuSupports(x, at::randn({6, 7}), {}));
  EXPECT_FALSE(SmallBatchLinearCpuSupports(x, w, at::randn({5})));
  EXPECT_FALSE(SmallBatchLinearCpuSupports(x.unsqueeze(0), w, {}));
}

TEST(HelperThreads, RunsEveryPartOnceAcrossManyJobs) {
  for (int parts : {1, 2, 3, 5}) {
    for (int job = 0; job < 2000; ++job) {
      std::vector<std::atomic<int>> runs(parts);
      RunParts(parts, [&](int p) { runs[p].fetch_add(1); });
      for (int p = 0; p < parts; ++p)
        ASSERT_EQ(runs[p].load(), 1) << parts << " parts, job " << job;
    }
  }
}

// After the helpers have gone to sleep (past their spin) a job still runs
// every part: the wake-up path.
TEST(HelperThreads, WakesSleepingHelpers) {
  for (int round = 0; round < 5; ++round) {
    std::this_thread::sleep_for(std::chrono::microseconds(20 * kHelperSpinMicros));
    std::atomic<int> sum{0};
    RunParts(3, [&](int p) { sum.fetch_add(p + 1); });
    EXPECT_EQ(sum.load(), 6);
  }
}

// Callers on several threads at once: one holds the helpers, the others
// run their extra parts on fresh threads; every job completes exactly.
TEST(HelperThreads, ConcurrentCallersEachGetAllTheirParts) {
  std::atomic<int> bad{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int job = 0; job < 300; ++job) {
        const int parts = 2 + (c + job) % 3;
        std::vector<std::atomic<int>> runs(parts);
        RunParts(parts, [&](int p) { runs[p].fetch_add(1); });
        for (int p = 0; p < parts; ++p) bad += runs[p].load() != 1;
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace infoflow
