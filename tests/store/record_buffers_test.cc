// RecordBuffers (cache_store/record_buffers.h): kept buffers are reused
// without a new allocation, the budget and the size rules hold, and a
// recycling ChunkValue hands its buffer back.
#include "cache_store/record_buffers.h"

#include <cstring>
#include <string>
#include <vector>

#include "cache_store/chunk_store.h"
#include "gtest/gtest.h"
#include "tests/store/test_records.h"

namespace infoflow::store {
namespace {

using testing::MakeRecord;
using testing::RecordShape;
using testing::TestRecord;

constexpr size_t kMiB = size_t{1} << 20;

TEST(RecordBuffersTest, AKeptBufferIsReusedWithoutANewAllocation) {
  RecordBuffers rb(16 * kMiB);
  std::string a = rb.Take(kMiB);
  EXPECT_EQ(a.size(), kMiB);
  EXPECT_EQ(rb.stats().fresh, 1u);
  const char* p = a.data();
  rb.Give(std::move(a));
  EXPECT_GE(rb.stats().cached_bytes, kMiB);
  EXPECT_EQ(rb.stats().cached_buffers, 1u);
  std::string b = rb.Take(kMiB - 1000);  // within a quarter: fits
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.size(), kMiB - 1000);
  EXPECT_EQ(rb.stats().reused, 1u);
  EXPECT_EQ(rb.stats().cached_bytes, 0u);
  b[0] = 'x';  // writable to its full size
  b[b.size() - 1] = 'y';
}

TEST(RecordBuffersTest, SizeRulesAndBudget) {
  RecordBuffers rb(3 * kMiB);
  rb.Give(std::string(1000, 'a'));  // below kMinBytes: freed
  EXPECT_EQ(rb.stats().cached_buffers, 0u);
  rb.Give(rb.Take(2 * kMiB));
  EXPECT_EQ(rb.stats().cached_buffers, 1u);
  rb.Give(rb.Take(kMiB + kMiB / 2));  // a fresh one: 2 MiB kept is more than a quarter over
  EXPECT_EQ(rb.stats().fresh, 2u);
  EXPECT_EQ(rb.stats().cached_buffers, 1u) << "over the 3 MiB budget: freed, not kept";
  // A request larger than every kept buffer allocates.
  std::string big = rb.Take(4 * kMiB);
  EXPECT_EQ(big.size(), 4 * kMiB);
  EXPECT_EQ(rb.stats().fresh, 3u);
  EXPECT_EQ(big.find_first_not_of('\0'), std::string::npos) << "fresh buffers are zeroed";
}

TEST(RecordBuffersTest, TrimAndRetainFreeTheLargestFirst) {
  RecordBuffers rb(64 * kMiB);
  for (size_t mib : {1, 2, 4, 8}) rb.Give(rb.Take(mib * kMiB));
  EXPECT_EQ(rb.stats().cached_buffers, 4u);
  EXPECT_GE(rb.Trim(8 * kMiB), 7 * kMiB);  // the 8 MiB buffer
  EXPECT_EQ(rb.stats().cached_buffers, 3u);
  rb.set_retain_bytes(2 * kMiB);  // 4 MiB and 2 MiB go, 1 MiB stays
  EXPECT_EQ(rb.stats().cached_buffers, 1u);
  EXPECT_LE(rb.stats().cached_bytes, 2 * kMiB);
  rb.set_retain_bytes(0);
  EXPECT_EQ(rb.stats().cached_bytes, 0u);
  rb.Give(rb.Take(kMiB));
  EXPECT_EQ(rb.stats().cached_buffers, 0u) << "budget 0 keeps nothing";
}

// A value made by CreateRecycling hands its buffer back when it goes; one
// made by Create (a RocksDB read, an ingest) leaves it to the heap. The
// shared-tier path end to end: SharedTierTest.ClusterReadsRecycleTheirBuffers.
TEST(RecordBuffersTest, OnlyRecyclingValuesHandTheirBytesBack) {
  RecordShape big;
  big.n_layers = 4;
  big.n_kv_heads = 4;
  big.head_dim = 64;
  big.n_tokens = 128;  // 512 KiB payload: over kMinBytes
  const TestRecord rec = MakeRecord(300, big);
  RecordBuffers::Default().Trim(0);
  {
    auto plain = ChunkValue::Create(rec.bytes);
    ASSERT_TRUE(plain.ok()) << plain.status();
  }
  EXPECT_EQ(RecordBuffers::Default().stats().cached_buffers, 0u);
  const char* data = nullptr;
  {
    std::string buffer = RecordBuffers::Default().Take(rec.bytes.size());
    std::memcpy(buffer.data(), rec.bytes.data(), rec.bytes.size());
    data = buffer.data();
    auto recycling = ChunkValue::CreateRecycling(std::move(buffer));
    ASSERT_TRUE(recycling.ok()) << recycling.status();
    EXPECT_EQ((*recycling)->bytes(), rec.bytes);
    EXPECT_EQ((*recycling)->bytes().data(), data) << "moved, not copied";
  }
  EXPECT_EQ(RecordBuffers::Default().stats().cached_buffers, 1u);
  std::string again = RecordBuffers::Default().Take(rec.bytes.size());
  EXPECT_EQ(again.data(), data);
}

}  // namespace
}  // namespace infoflow::store
