// RecentKeys, the memory behind PrefixStorePolicy::kRepeated.

#include "server/recent_keys.h"

#include <gtest/gtest.h>

#include <string>

namespace infoflow::server {
namespace {

TEST(RecentKeys, ASecondMissIsSeenOnceThenForgotten) {
  RecentKeys recent(4);
  EXPECT_FALSE(recent.SeenBefore("a"));
  EXPECT_TRUE(recent.SeenBefore("a"));
  EXPECT_EQ(recent.size(), 0u);
  EXPECT_FALSE(recent.SeenBefore("a"));  // a first miss again
  EXPECT_EQ(recent.size(), 1u);
}

TEST(RecentKeys, TheOldestGoesPastTheCapacity) {
  RecentKeys recent(3);
  for (const char* k : {"a", "b", "c", "d"}) EXPECT_FALSE(recent.SeenBefore(k)) << k;
  EXPECT_EQ(recent.size(), 3u);
  EXPECT_TRUE(recent.SeenBefore("d"));
  EXPECT_TRUE(recent.SeenBefore("c"));
  EXPECT_TRUE(recent.SeenBefore("b"));
  EXPECT_FALSE(recent.SeenBefore("a"));  // dropped for d
}

// A key taken back out and missed again is dropped when its new miss is the
// oldest, not when its first, already answered, miss would have been.
TEST(RecentKeys, AnAnsweredMissLeavesNoTrace) {
  RecentKeys recent(3);
  EXPECT_FALSE(recent.SeenBefore("a"));
  EXPECT_TRUE(recent.SeenBefore("a"));
  EXPECT_FALSE(recent.SeenBefore("a"));
  EXPECT_FALSE(recent.SeenBefore("b"));
  EXPECT_FALSE(recent.SeenBefore("c"));
  EXPECT_EQ(recent.size(), 3u);
  EXPECT_TRUE(recent.SeenBefore("a"));
  EXPECT_TRUE(recent.SeenBefore("b"));
  EXPECT_TRUE(recent.SeenBefore("c"));
}

// A conversation's prefix misses twice and is stored: the pattern kRepeated
// sees most. Its answered misses must not pile up behind an old key that
// stays.
TEST(RecentKeys, TheQueueStaysBounded) {
  const size_t capacity = 4;
  RecentKeys recent(capacity);
  EXPECT_FALSE(recent.SeenBefore("old"));
  for (int i = 0; i < 1000; ++i) {
    const std::string k = "turn" + std::to_string(i);
    ASSERT_FALSE(recent.SeenBefore(k));
    ASSERT_TRUE(recent.SeenBefore(k));
    ASSERT_LE(recent.size(), 2u) << i;  // "old" and at most this turn's key
  }
  EXPECT_EQ(recent.size(), 1u);
  EXPECT_TRUE(recent.SeenBefore("old"));
}

TEST(RecentKeys, CapacityZeroRemembersNothing) {
  RecentKeys recent(0);
  EXPECT_FALSE(recent.SeenBefore("a"));
  EXPECT_FALSE(recent.SeenBefore("a"));
  EXPECT_EQ(recent.size(), 0u);
}

}  // namespace
}  // namespace infoflow::server
