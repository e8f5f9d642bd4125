// The engine's large-buffer pool (engine/model/buffer_pool.h): large tensors
// come from pooled blocks that are reused without a new mapping, small ones
// bypass it, the retain budget and Trim() return memory, and concurrent use
// balances. Also the fetch path's zero-copy decode (chunk_codec.h): a raw
// record's K/V tensors are views of the stored bytes, equal to a copy.
#include "engine/model/buffer_pool.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "cache_store/kv_record.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/chunk/chunk_prefill.h"
#include "tests/engine/test_util.h"

namespace infoflow {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

// The process-wide pool with a known budget and nothing cached; restores
// the budget afterwards.
class BufferPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = InstallLargeBufferPool();
    saved_retain_ = pool_->retain_bytes();
    pool_->set_retain_bytes(256 * kMiB);
    pool_->Trim(0);
  }
  void TearDown() override { pool_->set_retain_bytes(saved_retain_); }

  static at::Tensor Floats(size_t bytes) {
    return at::empty({static_cast<int64_t>(bytes / 4)}, at::kFloat);
  }

  LargeBufferPool* pool_ = nullptr;
  size_t saved_retain_ = 0;
};

TEST_F(BufferPoolTest, ALargeBufferIsReusedWithoutANewMapping) {
  const BufferPoolStats s0 = pool_->stats();
  void* first = nullptr;
  {
    at::Tensor a = Floats(8 * kMiB);
    first = a.data_ptr();
    a.fill_(1.5f);
    EXPECT_EQ(pool_->stats().in_use_bytes, s0.in_use_bytes + LargeBufferPool::BlockBytes(8 * kMiB));
  }
  const BufferPoolStats s1 = pool_->stats();
  EXPECT_EQ(s1.fresh_blocks, s0.fresh_blocks + 1);
  EXPECT_EQ(s1.cached_bytes, LargeBufferPool::BlockBytes(8 * kMiB));
  at::Tensor b = Floats(8 * kMiB - 4096);  // a similar shape fits the same block
  EXPECT_EQ(b.data_ptr(), first);
  const BufferPoolStats s2 = pool_->stats();
  EXPECT_EQ(s2.fresh_blocks, s1.fresh_blocks);
  EXPECT_EQ(s2.reused_blocks, s1.reused_blocks + 1);
  EXPECT_EQ(s2.cached_bytes, 0u);
  // 64-byte alignment, as torch's own CPU allocator gives.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data_ptr()) % 64, 0u);
}

TEST_F(BufferPoolTest, SmallTensorsBypassThePool) {
  const BufferPoolStats s0 = pool_->stats();
  at::Tensor t = at::ones({1000}, at::kFloat);
  const BufferPoolStats s1 = pool_->stats();
  EXPECT_GT(s1.small_allocations, s0.small_allocations);
  EXPECT_EQ(s1.in_use_bytes, s0.in_use_bytes);
  EXPECT_EQ(t.sum().item<float>(), 1000.0f);
}

// Among cached blocks of one size, the one freed last comes back first: it
// is the one still in the CPU's caches (a FIFO order made the pool's small
// blocks cache-cold, docs/DESIGN.md §15).
TEST_F(BufferPoolTest, TheBlockFreedLastIsReusedFirst) {
  void* a_ptr = nullptr;
  void* b_ptr = nullptr;
  {
    at::Tensor a = Floats(512 << 10), b = Floats(512 << 10);
    a_ptr = a.data_ptr();
    b_ptr = b.data_ptr();
    a.reset();  // freed first
  }             // b freed last
  at::Tensor c = Floats(512 << 10);
  EXPECT_EQ(c.data_ptr(), b_ptr);
  at::Tensor d = Floats(512 << 10);
  EXPECT_EQ(d.data_ptr(), a_ptr);
}

// The smallest pooled size: a short query's activations and per-chunk
// scratch are pooled (a trim of the heap leaves them resident).
TEST_F(BufferPoolTest, ShortQueryActivationsArePooled) {
  EXPECT_EQ(BufferPoolOptions{}.min_bytes, size_t{256} << 10);
  const BufferPoolStats s0 = pool_->stats();
  at::Tensor t = Floats(384 * 512 * 4);  // a 384-row recompute at width 512
  EXPECT_GT(pool_->stats().in_use_bytes, s0.in_use_bytes);
}

TEST_F(BufferPoolTest, ABlockFarLargerThanTheRequestIsNotHandedOut) {
  { at::Tensor big = Floats(64 * kMiB); }
  const BufferPoolStats s0 = pool_->stats();
  at::Tensor small = Floats(8 * kMiB);
  EXPECT_EQ(pool_->stats().fresh_blocks, s0.fresh_blocks + 1);
  EXPECT_EQ(pool_->stats().cached_bytes, s0.cached_bytes);
}

TEST_F(BufferPoolTest, OverTheRetainBudgetBlocksGoBackToTheOs) {
  pool_->set_retain_bytes(0);
  const BufferPoolStats s0 = pool_->stats();
  { at::Tensor a = Floats(8 * kMiB); }
  const BufferPoolStats s1 = pool_->stats();
  EXPECT_EQ(s1.cached_bytes, 0u);
  EXPECT_EQ(s1.unmapped_bytes, s0.unmapped_bytes + LargeBufferPool::BlockBytes(8 * kMiB));
}

TEST_F(BufferPoolTest, TrimReturnsTheLeastRecentlyFreedFirst) {
  void* newer = nullptr;
  { at::Tensor a = Floats(8 * kMiB); }
  {
    at::Tensor b = Floats(16 * kMiB);
    newer = b.data_ptr();
  }
  const size_t b_bytes = LargeBufferPool::BlockBytes(16 * kMiB);
  EXPECT_EQ(pool_->stats().cached_bytes, b_bytes + LargeBufferPool::BlockBytes(8 * kMiB));
  EXPECT_EQ(pool_->Trim(b_bytes), LargeBufferPool::BlockBytes(8 * kMiB));
  EXPECT_EQ(pool_->stats().cached_bytes, b_bytes);
  at::Tensor again = Floats(16 * kMiB);
  EXPECT_EQ(again.data_ptr(), newer);
}

TEST_F(BufferPoolTest, PeakTracksTheLargestInUseSinceReset) {
  pool_->ResetPeak();
  const size_t base = pool_->stats().in_use_bytes;
  {
    at::Tensor a = Floats(8 * kMiB), b = Floats(8 * kMiB);
  }
  EXPECT_EQ(pool_->stats().peak_in_use_bytes, base + 2 * LargeBufferPool::BlockBytes(8 * kMiB));
  pool_->ResetPeak();
  EXPECT_EQ(pool_->stats().peak_in_use_bytes, base);
}

TEST_F(BufferPoolTest, ConcurrentUseBalances) {
  const size_t base = pool_->stats().in_use_bytes;
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 50; ++i) {
        at::Tensor x = at::full({static_cast<int64_t>((1 + (i + t) % 5) * kMiB / 4)}, 2.0f);
        ASSERT_EQ(x.sum().item<float>(), 2.0f * x.numel());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(pool_->stats().in_use_bytes, base);
  EXPECT_LE(pool_->stats().cached_bytes, 256 * kMiB);
}

// The fetch path: DecodeChunkRecord with the record's owner gives views of
// the stored bytes (no copy), equal to the copying decode.
TEST(ZeroCopyDecode, RawRecordTensorsAreViewsOfTheStoredBytes) {
  std::unique_ptr<Model> model = testing::LoadOrDie(testing::GeneratedModelDir("llama"));
  ASSERT_NE(model, nullptr);
  const std::vector<int32_t> ids = testing::Ids(40, 3, model->config().vocab_size);
  absl::StatusOr<ChunkKv> kv = PrefillChunk(*model, ids, PrefixMode::kBos);
  ASSERT_TRUE(kv.ok());
  absl::StatusOr<std::string> bytes = EncodeChunkRecord(*model, *kv, PrefixMode::kBos);
  ASSERT_TRUE(bytes.ok());
  // What the store hands out: shared, immutable bytes (ChunkValue).
  auto stored_ptr = std::make_shared<const std::string>(*std::move(bytes));
  const std::string& stored = *stored_ptr;
  absl::StatusOr<store::KvRecord> record = store::DecodeRecord(stored);
  ASSERT_TRUE(record.ok());
  auto inside = [&](const at::Tensor& t) {
    const char* p = static_cast<const char*>(t.data_ptr());
    return p >= stored.data() && p + t.nbytes() <= stored.data() + stored.size();
  };
  absl::StatusOr<std::shared_ptr<const ChunkKv>> view =
      DecodeChunkRecord(*model, *record, PrefixMode::kBos, stored_ptr);
  absl::StatusOr<std::shared_ptr<const ChunkKv>> copy =
      DecodeChunkRecord(*model, *record, PrefixMode::kBos);
  ASSERT_TRUE(view.ok());
  ASSERT_TRUE(copy.ok());
  std::weak_ptr<const std::string> watch = stored_ptr;
  stored_ptr.reset();  // the views alone keep the bytes alive
  ASSERT_FALSE(watch.expired());
  for (int l = 0; l < model->n_layers(); ++l) {
    EXPECT_TRUE(inside((*view)->k[l])) << "layer " << l;
    EXPECT_TRUE(inside((*view)->v[l])) << "layer " << l;
    EXPECT_FALSE(inside((*copy)->k[l])) << "layer " << l;
    EXPECT_TRUE(at::equal((*view)->k[l], (*copy)->k[l])) << "layer " << l;
    EXPECT_TRUE(at::equal((*view)->v[l], (*copy)->v[l])) << "layer " << l;
    EXPECT_TRUE(at::equal((*view)->k[l], kv->k[l])) << "layer " << l;
  }
  view->reset();
  EXPECT_TRUE(watch.expired());
}

}  // namespace
}  // namespace infoflow
