// RedisCluster (cache_store/redis_cluster.h) and ChunkStore's shared tier
// against a REAL Redis Cluster (3 masters + 3 replicas of redis-server on
// 127.0.0.1, tests/remote/redis_cluster_fixture.h). No mocks.
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cache_store/chunk_store.h"
#include "cache_store/record_buffers.h"
#include "cache_store/redis_cluster.h"
#include "gtest/gtest.h"
#include "tests/remote/redis_cluster_fixture.h"
#include "tests/store/store_test_util.h"
#include "tests/store/test_records.h"

namespace infoflow::store {
namespace {

using infoflow::testing::RedisClusterProcess;
using infoflow::testing::SharedCluster;
using infoflow::testing::SharedClusterTeardown;
using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

const auto* const kEnv = ::testing::AddGlobalTestEnvironment(new SharedClusterTeardown);

std::unique_ptr<RedisCluster> Connect(const std::vector<std::string>& seeds,
                                      RedisClusterOptions o = {}) {
  o.seeds = seeds;
  absl::StatusOr<std::unique_ptr<RedisCluster>> c = RedisCluster::Create(o);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

TEST(RedisClusterSlotTest, Crc16AndKeySlotVectors) {
  // The reference vector of CRC16/XMODEM and the Redis Cluster spec's.
  EXPECT_EQ(RedisCluster::Crc16("123456789"), 0x31C3);
  EXPECT_EQ(RedisCluster::KeySlot("123456789"), 12739);
  EXPECT_EQ(RedisCluster::Crc16(""), 0);
  // Hash tags: only the first {...} with something inside counts.
  EXPECT_EQ(RedisCluster::KeySlot("{user1000}.following"), RedisCluster::KeySlot("user1000"));
  EXPECT_EQ(RedisCluster::KeySlot("{user1000}.followers"), RedisCluster::KeySlot("user1000"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::Crc16("foo{}{bar}") & 16383);
  EXPECT_EQ(RedisCluster::KeySlot("foo{{bar}}zap"), RedisCluster::KeySlot("{bar"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{bar}{zap}"), RedisCluster::KeySlot("bar"));
  EXPECT_EQ(RedisCluster::KeySlot("no-open}brace{"), RedisCluster::Crc16("no-open}brace{") & 16383);
}

TEST(RedisClusterSlotTest, KeySlotAgreesWithTheServer) {
  RedisClusterProcess* cluster = SharedCluster();
  std::mt19937_64 rng(7);
  for (int i = 0; i < 40; ++i) {
    std::string key = "ifkv:";
    for (int j = 0; j < 32; ++j) key.push_back(static_cast<char>(rng() & 0xff));
    if (i % 4 == 0) key = "{tag" + std::to_string(i) + "}suffix" + std::to_string(i);
    const std::string server = cluster->Admin(0, {"CLUSTER", "KEYSLOT", key});
    ASSERT_EQ(std::to_string(RedisCluster::KeySlot(key)), server) << "key " << i;
  }
}

TEST(RedisClusterSeedsTest, ParseSeeds) {
  auto ok = ParseRedisSeeds("127.0.0.1:7000, redis-0.redis:6379");
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->size(), 2u);
  EXPECT_EQ((*ok)[1], "redis-0.redis:6379");
  for (const char* bad : {"", "host", "host:", ":7000", "h:0", "h:70000", "a:1,,b:2", "h:x"}) {
    EXPECT_FALSE(ParseRedisSeeds(bad).ok()) << bad;
  }
}

TEST(RedisClusterTest, SetGetAcrossAllMasters) {
  RedisClusterProcess* cluster = SharedCluster();
  auto c = Connect(cluster->Seeds());
  ASSERT_NE(c, nullptr);
  std::vector<std::string> keys;
  std::set<std::string> masters;
  for (int i = 0; i < 300; ++i) {
    keys.push_back("t1:key" + std::to_string(i));
    masters.insert(c->NodeForSlot(RedisCluster::KeySlot(keys.back())));
  }
  EXPECT_EQ(masters.size(), 3u) << "keys should span every master";
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(c->Set(keys[i], "value-" + std::to_string(i)).ok());
  }
  keys.push_back("t1:never-written");
  auto got = c->MultiGet(keys);
  ASSERT_EQ(got.size(), keys.size());
  for (size_t i = 0; i + 1 < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok()) << got[i].status();
    ASSERT_TRUE(got[i]->has_value()) << keys[i];
    EXPECT_EQ(**got[i], "value-" + std::to_string(i));
  }
  ASSERT_TRUE(got.back().ok());
  EXPECT_FALSE(got.back()->has_value());
  // Binary-safe keys and values, TTL, DEL.
  std::string bin_key("ifkv:\0\x01{\xff}", 10), bin_val("\0\r\n\xfe", 4);
  ASSERT_TRUE(c->Set(bin_key, bin_val, /*ttl_seconds=*/100).ok());
  auto g = c->Get(bin_key);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ(**g, bin_val);
  const int ttl = std::stoi(cluster->Admin(
      cluster->IndexOfPort(cluster->MasterPortForSlot(RedisCluster::KeySlot(bin_key))),
      {"TTL", bin_key}));
  EXPECT_GT(ttl, 90);
  EXPECT_LE(ttl, 100);
  EXPECT_TRUE(*c->Del(bin_key));
  EXPECT_FALSE(*c->Del(bin_key));
  EXPECT_EQ(c->counters().moved.load(), 0u);
}

// MultiGet's flow control (RedisClusterOptions::max_pipeline_depth,
// max_parallel_nodes): large replies one in flight, small ones pipelined,
// nodes read by a bounded number of workers. Whatever the window, every
// reply comes back whole and in request order, missing keys included.
TEST(RedisClusterTest, LargeAndSmallValuesInOnePipelineComeBackInOrder) {
  RedisClusterProcess* cluster = SharedCluster();
  std::mt19937 rng(7);
  std::vector<std::string> keys, values;
  for (int i = 0; i < 24; ++i) {
    // One hash tag for the first 16 (one node, one pipeline), then 8 spread
    // over the masters.
    keys.push_back(i < 16 ? "{t9}k" + std::to_string(i) : "t9:spread" + std::to_string(i));
    const size_t n = i % 3 == 0 ? (size_t{300} << 10) + static_cast<size_t>(i) * 4099
                                : static_cast<size_t>(1 + i * 7);
    std::string v(n, '\0');
    for (char& ch : v) ch = static_cast<char>(rng());
    values.push_back(std::move(v));
  }
  auto writer = Connect(cluster->Seeds());
  ASSERT_NE(writer, nullptr);
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i == 5 || i == 20) continue;  // missing: nil replies inside the window
    ASSERT_TRUE(writer->Set(keys[i], values[i]).ok());
  }
  for (const auto& [depth, nodes] : {std::pair<int, int>{16, 0}, {1, 1}, {2, 2}, {64, 1}}) {
    RedisClusterOptions o;
    o.max_pipeline_depth = depth;
    o.max_parallel_nodes = nodes;
    auto c = Connect(cluster->Seeds(), o);
    ASSERT_NE(c, nullptr);
    for (int round = 0; round < 2; ++round) {  // the second on pooled connections
      auto got = c->MultiGet(keys);
      ASSERT_EQ(got.size(), keys.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        ASSERT_TRUE(got[i].ok()) << keys[i] << ": " << got[i].status();
        if (i == 5 || i == 20) {
          EXPECT_FALSE(got[i]->has_value()) << keys[i];
          continue;
        }
        ASSERT_TRUE(got[i]->has_value()) << keys[i];
        EXPECT_EQ(**got[i], values[i]) << keys[i] << " depth " << depth << " nodes " << nodes;
      }
    }
    EXPECT_EQ(c->counters().io_failures.load(), 0u);
  }
  for (const std::string& k : keys) (void)writer->Del(k);
}

TEST(RedisClusterTest, ParallelCallersShareThePool) {
  RedisClusterProcess* cluster = SharedCluster();
  auto c = Connect(cluster->Seeds());
  ASSERT_NE(c, nullptr);
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const std::string k = "t2:" + std::to_string(t) + ":" + std::to_string(i);
        if (!c->Set(k, k + "!").ok()) wrong++;
        auto g = c->Get(k);
        if (!g.ok() || !g->has_value() || **g != k + "!") wrong++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_LE(c->counters().connects.load(), 3u * 8 + 6) << "connections are pooled per node";
}

// Moves `slot` from its master to another one the way redis-cli --cluster
// reshard does, stopping after `stage`: 1 = MIGRATING/IMPORTING set and
// the keys moved (ASK territory), 2 = ownership handed over (MOVED).
void MoveSlot(RedisClusterProcess* cluster, int slot, int stage, int* from_port, int* to_port) {
  const int src_port = cluster->MasterPortForSlot(slot);
  ASSERT_GT(src_port, 0);
  const int src = cluster->IndexOfPort(src_port);
  int dst = -1;
  for (size_t i = 0; i < cluster->nodes().size(); ++i) {
    if (static_cast<int>(i) == src || cluster->nodes()[i].pid <= 0) continue;
    if (cluster->Admin(i, {"INFO", "replication"}).find("role:master") != std::string::npos) {
      dst = static_cast<int>(i);
      break;
    }
  }
  ASSERT_GE(dst, 0);
  *from_port = src_port;
  *to_port = cluster->nodes()[dst].port;
  const std::string src_id = cluster->Admin(src, {"CLUSTER", "MYID"});
  const std::string dst_id = cluster->Admin(dst, {"CLUSTER", "MYID"});
  const std::string s = std::to_string(slot);
  ASSERT_EQ(cluster->Admin(dst, {"CLUSTER", "SETSLOT", s, "IMPORTING", src_id}), "OK");
  ASSERT_EQ(cluster->Admin(src, {"CLUSTER", "SETSLOT", s, "MIGRATING", dst_id}), "OK");
  const std::string keys = cluster->Admin(src, {"CLUSTER", "GETKEYSINSLOT", s, "1000"});
  size_t pos = 0;
  while (pos < keys.size()) {
    size_t nl = keys.find('\n', pos);
    if (nl == std::string::npos) nl = keys.size();
    const std::string k = keys.substr(pos, nl - pos);
    pos = nl + 1;
    if (k.empty()) continue;
    ASSERT_EQ(cluster->Admin(src, {"MIGRATE", "127.0.0.1", std::to_string(*to_port), k, "0",
                                   "5000"}),
              "OK");
  }
  if (stage < 2) return;
  for (size_t i = 0; i < cluster->nodes().size(); ++i) {
    if (cluster->nodes()[i].pid <= 0) continue;
    if (cluster->Admin(i, {"INFO", "replication"}).find("role:master") == std::string::npos) {
      continue;
    }
    ASSERT_EQ(cluster->Admin(i, {"CLUSTER", "SETSLOT", s, "NODE", dst_id}), "OK");
  }
}

TEST(RedisClusterTest, FollowsAskThenMovedDuringAReshard) {
  RedisClusterProcess* cluster = SharedCluster();
  auto c = Connect(cluster->Seeds());
  ASSERT_NE(c, nullptr);
  const std::string key = "{reshard}k";
  const int slot = RedisCluster::KeySlot(key);
  ASSERT_TRUE(c->Set(key, "before").ok());
  int from = 0, to = 0;
  ASSERT_NO_FATAL_FAILURE(MoveSlot(cluster, slot, 1, &from, &to));
  // Mid-migration: the key lives on the target already; the source answers
  // ASK and the client retries there with ASKING, keeping its slot map.
  auto g = c->Get(key);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_TRUE(g->has_value());
  EXPECT_EQ(**g, "before");
  EXPECT_GE(c->counters().ask.load(), 1u);
  EXPECT_EQ(c->NodeForSlot(slot), "127.0.0.1:" + std::to_string(from));
  // Ownership handed over: MOVED, the map is updated.
  ASSERT_NO_FATAL_FAILURE(MoveSlot(cluster, slot, 2, &from, &to));
  ASSERT_TRUE(c->Set(key, "after").ok());
  EXPECT_GE(c->counters().moved.load(), 1u);
  EXPECT_EQ(c->NodeForSlot(slot), "127.0.0.1:" + std::to_string(to));
  g = c->Get(key);
  ASSERT_TRUE(g.ok() && g->has_value());
  EXPECT_EQ(**g, "after");
}

TEST(RedisClusterTest, CircuitBreakerBoundsTheDelayOfADeadCluster) {
  // Nothing listens on these ports: connection refused.
  std::vector<int> ports = infoflow::testing::FreePorts(3);
  std::vector<std::string> seeds;
  for (int p : ports) seeds.push_back("127.0.0.1:" + std::to_string(p));
  RedisClusterOptions o;
  o.timeout = std::chrono::milliseconds(100);
  o.breaker_threshold = 3;
  o.breaker_cooldown = std::chrono::milliseconds(400);
  auto c = Connect(seeds, o);
  ASSERT_NE(c, nullptr);
  int failed = 0;
  for (int i = 0; i < 3 && !c->circuit_open(); ++i) {
    auto g = c->Get("k");
    EXPECT_FALSE(g.ok());
    EXPECT_STREQ(RedisErrorKind(g.status()), "connection") << g.status();
    ++failed;
  }
  EXPECT_TRUE(c->circuit_open()) << "after " << failed << " failed calls";
  const auto t0 = Clock::now();
  for (int i = 0; i < 100; ++i) {
    auto g = c->Get("k");
    ASSERT_FALSE(g.ok());
    EXPECT_STREQ(RedisErrorKind(g.status()), "circuit_open");
  }
  EXPECT_LT(MsSince(t0), 50) << "an open circuit fails at once";
  EXPECT_GE(c->counters().breaker_rejections.load(), 100u);
  std::this_thread::sleep_for(std::chrono::milliseconds(450));
  auto probe = c->Get("k");  // half-open: tried, fails, re-opens
  EXPECT_STREQ(RedisErrorKind(probe.status()), "connection");
  EXPECT_TRUE(c->circuit_open());
  EXPECT_GE(c->counters().breaker_opens.load(), 2u);
}

TEST(RedisClusterTest, TimeoutOnASilentNodeIsBounded) {
  // A socket that accepts (the kernel does, from the backlog) but never
  // answers: every command times out.
  const infoflow::testing::LoopbackSocket silent = infoflow::testing::BindLoopback(/*backlog=*/64);
  ASSERT_GE(silent.fd, 0);
  RedisClusterOptions o;
  o.timeout = std::chrono::milliseconds(100);
  o.max_attempts = 2;
  o.breaker_threshold = 2;
  o.breaker_cooldown = std::chrono::seconds(30);
  const auto t_create = Clock::now();
  auto c = Connect({silent.address()}, o);
  ASSERT_NE(c, nullptr);
  EXPECT_LT(MsSince(t_create), 400) << "the initial slot map load is bounded too";
  const auto t0 = Clock::now();
  auto g = c->Get("k");
  const double ms = MsSince(t0);
  EXPECT_FALSE(g.ok());
  EXPECT_STREQ(RedisErrorKind(g.status()), "timeout") << g.status();
  // max_attempts x (timeout) plus a slot-map refresh attempt in between.
  EXPECT_LT(ms, 4 * 100 + 150);
  EXPECT_TRUE(c->circuit_open());
  const auto t1 = Clock::now();
  EXPECT_FALSE(c->Get("k").ok());
  EXPECT_LT(MsSince(t1), 20);
  close(silent.fd);
}

TEST(RedisClusterTest, AuthFromOptions) {
  RedisClusterProcess cluster("auth");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 0, &error, 1000, "s3cret-pw")) << error;
  RedisClusterOptions o;
  o.breaker_threshold = 100;
  auto anon = Connect(cluster.Seeds(), o);
  ASSERT_NE(anon, nullptr);
  EXPECT_FALSE(anon->Set("a", "b").ok()) << "NOAUTH without a password";
  o.password = "s3cret-pw";
  auto authed = Connect(cluster.Seeds(), o);
  ASSERT_TRUE(authed->Set("a", "b").ok());
  o.user = "default";  // ACL form: AUTH user password
  auto acl = Connect(cluster.Seeds(), o);
  auto g = acl->Get("a");
  ASSERT_TRUE(g.ok() && g->has_value()) << g.status();
  EXPECT_EQ(**g, "b");
}

TEST(RedisClusterFailoverTest, FollowsTheNewMasterAfterKill9) {
  RedisClusterProcess cluster("failover_client");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 1, &error, 1000)) << error;
  auto c = Connect(cluster.Seeds());
  ASSERT_NE(c, nullptr);
  const std::string key = "{fo}key";
  const int slot = RedisCluster::KeySlot(key);
  ASSERT_TRUE(c->Set(key, "v1").ok());
  // Wait until the replica has it (replication is asynchronous).
  const int master_port = cluster.MasterPortForSlot(slot);
  // (WAIT from another connection would not wait for this client's write:
  // poll the replica's key count instead.)
  const int master = cluster.IndexOfPort(master_port);
  ASSERT_TRUE(RedisClusterProcess::WaitFor(
      [&] {
        for (size_t i = 0; i < cluster.nodes().size(); ++i) {
          if (cluster.Admin(i, {"INFO", "replication"})
                  .find("master_port:" + std::to_string(master_port) + "\r") != std::string::npos) {
            return cluster.Admin(i, {"DBSIZE"}) == cluster.Admin(master, {"DBSIZE"});
          }
        }
        return false;
      },
      10))
      << "the replica never caught up";
  cluster.Kill(cluster.IndexOfPort(master_port));
  // Keep going until the replica has taken over; errors in between are
  // bounded, never wrong values.
  const auto t0 = Clock::now();
  int errors = 0;
  bool ok = false;
  while (MsSince(t0) < 15000) {
    auto g = c->Get(key);
    if (g.ok()) {
      ASSERT_TRUE(g->has_value());
      EXPECT_EQ(**g, "v1");
      ok = true;
      break;
    }
    ++errors;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(ok) << "no failover within 15 s";
  EXPECT_NE(c->NodeForSlot(slot), "127.0.0.1:" + std::to_string(master_port));
  EXPECT_EQ(c->NodeForSlot(slot), "127.0.0.1:" + std::to_string(cluster.MasterPortForSlot(slot)));
  EXPECT_GT(c->counters().slot_map_refreshes.load(), 1u);
  ASSERT_TRUE(c->Set(key, "v2").ok());
  std::printf("failover: %d failed reads over %.0f ms before the replica served\n", errors,
              MsSince(t0));
}

// ---- ChunkStore's shared tier ----

using testing::MakeRecord;
using testing::TempDir;

ChunkStoreOptions RemoteStoreOptions(const std::string& path, const std::string& prefix) {
  ChunkStoreOptions o;
  o.path = path;
  o.sync = false;
  o.remote.cluster.seeds = SharedCluster()->Seeds();
  o.remote.key_prefix = prefix;
  o.remote.model_fingerprint = "test-model";
  return o;
}

TEST(SharedTierTest, OffByDefault) {
  TempDir dir;
  ChunkStoreOptions o;
  o.path = dir.path();
  auto s = ChunkStore::Open(o);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->remote_cluster(), nullptr);
  EXPECT_EQ((*s)->counters().remote_enabled.load(), 0u);
}

TEST(SharedTierTest, ReplicaBReadsWhatReplicaAWrote) {
  TempDir da, db;
  auto a = ChunkStore::Open(RemoteStoreOptions(da.path(), "st1:"));
  auto b = ChunkStore::Open(RemoteStoreOptions(db.path(), "st1:"));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<testing::TestRecord> recs;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 12; ++i) {
    recs.push_back(MakeRecord(1000 + i));
    keys.push_back(recs.back().key);
    ASSERT_EQ(*(*a)->Put(recs.back().key, recs.back().bytes), PutResult::kStored);
  }
  EXPECT_TRUE((*a)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  EXPECT_EQ((*a)->counters().remote_writes.load(), 12u);
  auto got = (*b)->MultiGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok());
    ASSERT_EQ(got[i]->status, GetStatus::kFound) << i;
    EXPECT_TRUE(got[i]->from_remote);
    EXPECT_EQ(got[i]->value->bytes(), recs[i].bytes);
  }
  EXPECT_EQ((*b)->counters().remote_hits.load(), 12u);
  EXPECT_EQ((*b)->counters().misses.load(), 0u);
  // Filled locally (in the background): the next read is local (disk after
  // the RAM tier is dropped), with no trip to the cluster.
  ASSERT_TRUE((*b)->WaitForLocalFills(std::chrono::seconds(20)));
  EXPECT_EQ((*b)->counters().remote_fills.load(), 12u);
  (*b)->ClearRamTierForTesting();
  auto again = (*b)->Get(keys[0]);
  ASSERT_EQ(again->status, GetStatus::kFound);
  EXPECT_FALSE(again->from_remote);
  EXPECT_EQ((*b)->counters().disk_hits.load(), 1u);
  EXPECT_EQ((*b)->counters().remote_hits.load(), 12u);
  EXPECT_GT((*b)->counters().remote_fetch_count.load(), 0u);
  // Unknown everywhere: a miss.
  auto none = (*b)->Get(MakeRecord(99999).key);
  EXPECT_EQ(none->status, GetStatus::kNotFound);
  EXPECT_EQ((*b)->counters().remote_misses.load(), 1u);
}

// A record read from the cluster lands in a kept buffer (RecordBuffers) and
// hands it back when the last reader lets go, so the next cluster read of a
// similar size neither allocates nor faults.
TEST(SharedTierTest, ClusterReadsRecycleTheirBuffers) {
  TempDir da, db;
  auto a = ChunkStore::Open(RemoteStoreOptions(da.path(), "st9:"));
  ChunkStoreOptions ob = RemoteStoreOptions(db.path(), "st9:");
  ob.ram_tier_bytes = 0;  // nothing holds a record after its read
  auto b = ChunkStore::Open(ob);
  ASSERT_TRUE(a.ok() && b.ok());
  testing::RecordShape big;
  big.n_layers = 4;
  big.n_kv_heads = 4;
  big.head_dim = 64;
  big.n_tokens = 128;  // 512 KiB: over RecordBuffers::kMinBytes
  std::vector<testing::TestRecord> recs;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 4; ++i) {
    recs.push_back(MakeRecord(7000 + i, big));
    keys.push_back(recs.back().key);
    ASSERT_EQ(*(*a)->Put(recs.back().key, recs.back().bytes), PutResult::kStored);
  }
  EXPECT_TRUE((*a)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  RecordBuffers::Default().Trim(0);
  std::set<const char*> first;
  {
    auto got = (*b)->MultiGet(keys);
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_TRUE(got[i].ok() && got[i]->status == GetStatus::kFound) << i;
      ASSERT_TRUE(got[i]->from_remote);
      EXPECT_EQ(got[i]->value->bytes(), recs[i].bytes);
      first.insert(got[i]->value->bytes().data());
    }
  }
  // The local fills hold the records until written (the fill thread lets go
  // of its last one just after the queue is empty); then they go back.
  ASSERT_TRUE((*b)->WaitForLocalFills(std::chrono::seconds(20)));
  for (auto until = Clock::now() + std::chrono::seconds(10);
       RecordBuffers::Default().stats().cached_buffers < keys.size() && Clock::now() < until;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(RecordBuffers::Default().stats().cached_buffers, keys.size());
  for (const ChunkKey& k : keys) ASSERT_TRUE((*b)->Delete(k).ok());  // local copies only
  const uint64_t reused0 = RecordBuffers::Default().stats().reused;
  auto again = (*b)->MultiGet(keys);
  EXPECT_EQ(RecordBuffers::Default().stats().reused - reused0, keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(again[i].ok() && again[i]->status == GetStatus::kFound) << i;
    ASSERT_TRUE(again[i]->from_remote);
    EXPECT_EQ(again[i]->value->bytes(), recs[i].bytes);
    EXPECT_EQ(first.count(again[i]->value->bytes().data()), 1u) << "record " << i;
  }
}

TEST(SharedTierTest, CorruptAndForeignValuesAreMissesAndGetOverwritten) {
  TempDir da, db;
  auto a = ChunkStore::Open(RemoteStoreOptions(da.path(), "st2:"));
  auto b = ChunkStore::Open(RemoteStoreOptions(db.path(), "st2:"));
  ASSERT_TRUE(a.ok() && b.ok());
  RedisCluster* cl = (*a)->remote_cluster();
  const auto rec = MakeRecord(7);
  ASSERT_EQ(*(*a)->Put(rec.key, rec.bytes), PutResult::kStored);
  ASSERT_TRUE((*a)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  // Flip one payload byte in the cluster.
  std::string bad = rec.bytes;
  bad[bad.size() - 5] ^= 0x20;
  ASSERT_TRUE(cl->Set((*a)->RemoteKey(rec.key), bad).ok());
  auto got = (*b)->Get(rec.key);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->status, GetStatus::kCorrupt);
  EXPECT_EQ((*b)->counters().remote_corrupt.load(), 1u);
  // Re-prefill (compute) writes the good record over the bad one.
  auto fixed = (*b)->GetOrCompute(rec.key, [&] { return absl::StatusOr<std::string>(rec.bytes); });
  ASSERT_TRUE(fixed.ok());
  EXPECT_TRUE(fixed->computed);
  ASSERT_TRUE((*b)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  auto now_there = cl->Get((*a)->RemoteKey(rec.key));
  ASSERT_TRUE(now_there.ok() && now_there->has_value());
  EXPECT_EQ(**now_there, rec.bytes);
  // Get and GetOrCompute's own lookup: two trips, none from the leader's
  // re-check after joining the compute.
  EXPECT_EQ((*b)->counters().remote_corrupt.load(), 2u);

  // A valid record of another model stored under our key: wrong_model.
  const auto other = MakeRecord(8, {}, "other-model");
  const auto mine = MakeRecord(9);
  ASSERT_TRUE(cl->Set((*a)->RemoteKey(mine.key), other.bytes).ok());
  auto w = (*b)->Get(mine.key);
  EXPECT_EQ(w->status, GetStatus::kCorrupt);
  EXPECT_EQ((*b)->counters().remote_wrong_model.load(), 1u);
  // Garbage (not a record at all).
  ASSERT_TRUE(cl->Set((*a)->RemoteKey(mine.key), "garbage").ok());
  EXPECT_EQ((*b)->Get(mine.key)->status, GetStatus::kCorrupt);
  EXPECT_EQ((*b)->counters().remote_corrupt.load(), 3u);
  EXPECT_EQ((*b)->counters().remote_hits.load(), 0u);
}

TEST(SharedTierTest, DeadClusterIsAMissAndWritesDoNotFail) {
  TempDir d;
  ChunkStoreOptions o;
  o.path = d.path();
  o.sync = false;
  for (int p : infoflow::testing::FreePorts(2)) {
    o.remote.cluster.seeds.push_back("127.0.0.1:" + std::to_string(p));
  }
  o.remote.cluster.timeout = std::chrono::milliseconds(100);
  auto s = ChunkStore::Open(o);
  ASSERT_TRUE(s.ok()) << s.status();
  const auto rec = MakeRecord(11);
  auto put = (*s)->Put(rec.key, rec.bytes);
  ASSERT_TRUE(put.ok()) << put.status();
  EXPECT_EQ(*put, PutResult::kStored);
  EXPECT_EQ((*s)->Get(rec.key)->status, GetStatus::kFound);
  // The write-behind retries (10 tries over > 20 s by default); a drain
  // that gives up reports the record and counts it failed.
  const std::vector<UnwrittenRecord> left = (*s)->DrainRemoteWrites(std::chrono::milliseconds(300));
  ASSERT_EQ(left.size(), 1u);
  EXPECT_EQ(left[0].key, rec.key);
  EXPECT_EQ(left[0].bytes, rec.bytes.size());
  EXPECT_EQ((*s)->counters().remote_write_failed.load(), 1u);
  EXPECT_EQ((*s)->RemoteState(rec.key), RemoteWriteState::kFailed);
  EXPECT_EQ((*s)->counters().remote_pending_writes.load(), 0u);
  const auto t0 = Clock::now();
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ((*s)->Get(MakeRecord(100 + i).key)->status, GetStatus::kNotFound);
  }
  EXPECT_LT(MsSince(t0), 1000);
  EXPECT_EQ((*s)->counters().redis.breaker_state.load(), 1);
  EXPECT_GT((*s)->counters().remote_errors_circuit_open.load(), 0u);
}

// ---- The shared tier off the query and ingest paths ----

// Polls `f` for up to `seconds`: a bound on waiting, never a pass/fail time.
template <typename F>
bool Eventually(F f, int seconds = 30) {
  return RedisClusterProcess::WaitFor(f, seconds);
}

TEST(SharedTierAsyncTest, LocalFillIsQueuedDroppedWhenFullAndNeverBlocksTheRead) {
  TempDir da, db;
  auto a = ChunkStore::Open(RemoteStoreOptions(da.path(), "fq:"));
  ASSERT_TRUE(a.ok());
  std::vector<testing::TestRecord> recs;
  std::vector<ChunkKey> keys;
  for (int i = 0; i < 4; ++i) {
    recs.push_back(MakeRecord(3000 + i));
    keys.push_back(recs.back().key);
    ASSERT_EQ(*(*a)->Put(recs.back().key, recs.back().bytes), PutResult::kStored);
  }
  ASSERT_TRUE((*a)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  const uint64_t size = recs[0].bytes.size();
  ChunkStoreOptions ob = RemoteStoreOptions(db.path(), "fq:");
  ob.remote.fill_queue_bytes = 2 * size + size / 2;  // room for two records
  auto b = ChunkStore::Open(ob);
  ASSERT_TRUE(b.ok());
  // The fill thread held: if the read waited for its local fill, it would
  // never return.
  (*b)->PauseLocalFillsForTesting(true);
  auto got = (*b)->MultiGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_TRUE(got[i].ok());
    ASSERT_EQ(got[i]->status, GetStatus::kFound) << i;
    EXPECT_TRUE(got[i]->from_remote);
    EXPECT_EQ(got[i]->value->bytes(), recs[i].bytes);
  }
  const StoreCounters& c = (*b)->counters();
  EXPECT_EQ(c.remote_hits.load(), 4u);
  EXPECT_EQ(c.remote_fill_dropped.load(), 2u) << "two fit, two are dropped";
  EXPECT_EQ(c.remote_fill_queue_bytes.load(), 2 * size);
  EXPECT_EQ(c.records.load(), 0u) << "nothing written locally on the read's path";
  EXPECT_EQ((*b)->Stats().remote_fill_dropped, 2u);
  // Meanwhile every record is served from RAM, pending fill or dropped.
  auto again = (*b)->MultiGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(again[i]->status, GetStatus::kFound);
    EXPECT_TRUE(again[i]->from_ram) << i;
  }
  EXPECT_EQ(c.remote_hits.load(), 4u);

  (*b)->PauseLocalFillsForTesting(false);
  ASSERT_TRUE((*b)->WaitForLocalFills(std::chrono::seconds(20)));
  EXPECT_EQ(c.remote_fills.load(), 2u);
  EXPECT_EQ(c.records.load(), 2u);
  EXPECT_EQ(c.remote_fill_queue_bytes.load(), 0u);
  EXPECT_EQ(c.remote_writes.load(), 0u) << "a fetched record is not written back";
  // From disk: the two that were filled; from the cluster again: the two
  // that were dropped (and are now queued for their fill).
  (*b)->ClearRamTierForTesting();
  auto later = (*b)->MultiGet(keys);
  int from_disk = 0, from_remote = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(later[i]->status, GetStatus::kFound);
    from_remote += later[i]->from_remote;
    from_disk += !later[i]->from_remote && !later[i]->from_ram;
  }
  EXPECT_EQ(from_disk, 2);
  EXPECT_EQ(from_remote, 2);
  EXPECT_EQ(c.disk_hits.load(), 2u);
  ASSERT_TRUE((*b)->WaitForLocalFills(std::chrono::seconds(20)));
  EXPECT_EQ(c.records.load(), 4u);
}

TEST(SharedTierAsyncTest, DeleteCancelsAQueuedFill) {
  TempDir da, db;
  auto a = ChunkStore::Open(RemoteStoreOptions(da.path(), "fd:"));
  auto b = ChunkStore::Open(RemoteStoreOptions(db.path(), "fd:"));
  ASSERT_TRUE(a.ok() && b.ok());
  const auto rec = MakeRecord(3100);
  ASSERT_EQ(*(*a)->Put(rec.key, rec.bytes), PutResult::kStored);
  ASSERT_TRUE((*a)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  (*b)->PauseLocalFillsForTesting(true);
  ASSERT_TRUE((*b)->Get(rec.key)->from_remote);
  EXPECT_TRUE(*(*b)->Delete(rec.key)) << "a queued fill counts as present";
  (*b)->PauseLocalFillsForTesting(false);
  ASSERT_TRUE((*b)->WaitForLocalFills(std::chrono::seconds(20)));
  EXPECT_EQ((*b)->counters().remote_fills.load(), 0u);
  EXPECT_EQ((*b)->counters().records.load(), 0u) << "the fill did not bring it back";
}

TEST(SharedTierAsyncTest, WriteBehindReturnsAtOnceAndDrainsToTheCluster) {
  TempDir da, db;
  auto a = ChunkStore::Open(RemoteStoreOptions(da.path(), "wb:"));
  auto b = ChunkStore::Open(RemoteStoreOptions(db.path(), "wb:"));
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<testing::TestRecord> recs;
  std::vector<ChunkKey> keys;
  uint64_t bytes = 0;
  for (int i = 0; i < 8; ++i) {
    recs.push_back(MakeRecord(3200 + i));
    keys.push_back(recs.back().key);
    bytes += recs.back().bytes.size();
    ASSERT_EQ(*(*a)->Put(recs.back().key, recs.back().bytes), PutResult::kStored);
    const RemoteWriteState st = (*a)->RemoteState(keys.back());
    EXPECT_TRUE(st == RemoteWriteState::kPending || st == RemoteWriteState::kWritten);
  }
  ASSERT_TRUE((*a)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  const StoreCounters& c = (*a)->counters();
  EXPECT_EQ(c.remote_writes.load(), 8u);
  EXPECT_EQ(c.remote_bytes_written.load(), bytes);
  EXPECT_EQ(c.remote_pending_bytes.load(), 0u);
  EXPECT_EQ(c.remote_pending_writes.load(), 0u);
  EXPECT_EQ(c.remote_write_failed.load() + c.remote_write_dropped.load(), 0u);
  for (const ChunkKey& k : keys) EXPECT_EQ((*a)->RemoteState(k), RemoteWriteState::kWritten);
  auto got = (*b)->MultiGet(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_EQ(got[i]->status, GetStatus::kFound) << i;
    EXPECT_TRUE(got[i]->from_remote);
  }
  // A record computed on the fly goes the same way.
  const auto computed = MakeRecord(3300);
  auto r = (*b)->GetOrCompute(computed.key,
                              [&] { return absl::StatusOr<std::string>(computed.bytes); });
  ASSERT_TRUE(r.ok() && r->computed);
  ASSERT_TRUE((*b)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  EXPECT_EQ((*b)->RemoteState(computed.key), RemoteWriteState::kWritten);
  auto on_a = (*a)->Get(computed.key);
  ASSERT_EQ(on_a->status, GetStatus::kFound);
  EXPECT_TRUE(on_a->from_remote);
  // Off: no state to report.
  TempDir dl;
  ChunkStoreOptions local;
  local.path = dl.path();
  auto l = ChunkStore::Open(local);
  EXPECT_EQ((*l)->RemoteState(computed.key), RemoteWriteState::kNotConfigured);
  EXPECT_TRUE((*l)->DrainRemoteWrites(std::chrono::seconds(1)).empty());
}

TEST(SharedTierAsyncTest, WriteBehindQueueFullRefusesAndCounts) {
  RedisClusterProcess cluster("wb_full");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 0, &error)) << error;
  TempDir d;
  ChunkStoreOptions o = RemoteStoreOptions(d.path(), "wf:");
  o.remote.cluster.seeds = cluster.Seeds();
  o.remote.cluster.timeout = std::chrono::milliseconds(100);
  const auto first = MakeRecord(3400);
  o.remote.write_queue_bytes = first.bytes.size() * 3;
  auto s = ChunkStore::Open(o);
  ASSERT_TRUE(s.ok());
  cluster.PauseAll();  // nothing leaves the queue
  for (int i = 0; i < 5; ++i) {
    const auto rec = MakeRecord(3400 + i);
    ASSERT_EQ(*(*s)->Put(rec.key, rec.bytes), PutResult::kStored);
    EXPECT_EQ((*s)->RemoteState(rec.key),
              i < 3 ? RemoteWriteState::kPending : RemoteWriteState::kFailed) << i;
  }
  EXPECT_EQ((*s)->counters().remote_write_dropped.load(), 2u);
  EXPECT_EQ((*s)->counters().remote_pending_writes.load(), 3u);
  cluster.ResumeAll();
  ASSERT_TRUE(Eventually([&] { return (*s)->counters().remote_pending_writes.load() == 0; }));
  EXPECT_EQ((*s)->counters().remote_writes.load(), 3u);
}

TEST(SharedTierAsyncTest, SigstoppedClusterBacklogsThenDrainsAfterSigcont) {
  RedisClusterProcess cluster("wb_stop");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 0, &error)) << error;
  TempDir d;
  ChunkStoreOptions o = RemoteStoreOptions(d.path(), "ws:");
  o.remote.cluster.seeds = cluster.Seeds();
  o.remote.cluster.timeout = std::chrono::milliseconds(100);
  auto s = ChunkStore::Open(o);
  ASSERT_TRUE(s.ok());
  cluster.PauseAll();
  std::vector<testing::TestRecord> recs;
  uint64_t bytes = 0;
  const auto t0 = Clock::now();
  for (int i = 0; i < 5; ++i) {
    recs.push_back(MakeRecord(3500 + i));
    bytes += recs.back().bytes.size();
    auto put = (*s)->Put(recs.back().key, recs.back().bytes);
    ASSERT_TRUE(put.ok()) << put.status();
    EXPECT_EQ(*put, PutResult::kStored);
  }
  std::printf("5 puts with the cluster SIGSTOPped: %.1f ms\n", MsSince(t0));
  const StoreCounters& c = (*s)->counters();
  for (const auto& r : recs) {
    auto g = (*s)->Get(r.key);
    ASSERT_EQ(g->status, GetStatus::kFound) << "the local copy is authoritative";
    EXPECT_FALSE(g->from_remote);
    EXPECT_EQ((*s)->RemoteState(r.key), RemoteWriteState::kPending);
  }
  EXPECT_EQ(c.remote_pending_writes.load(), 5u);
  EXPECT_EQ(c.remote_pending_bytes.load(), bytes);
  EXPECT_EQ(c.remote_writes.load(), 0u);
  // Some attempt has failed (timed out or the breaker refused) by the time
  // a fresh lookup has found the cluster silent too.
  EXPECT_EQ((*s)->Get(MakeRecord(3599).key)->status, GetStatus::kNotFound);
  ASSERT_TRUE(Eventually([&] { return c.remote_write_errors.load() > 0; }));

  cluster.ResumeAll();
  ASSERT_TRUE(Eventually([&] { return c.remote_pending_writes.load() == 0; }))
      << "pending " << c.remote_pending_writes.load();
  EXPECT_EQ(c.remote_writes.load(), 5u);
  EXPECT_EQ(c.remote_write_failed.load(), 0u);
  EXPECT_EQ(c.remote_pending_bytes.load(), 0u);
  auto reader = Connect(cluster.Seeds());
  for (const auto& r : recs) {
    auto g = reader->Get((*s)->RemoteKey(r.key));
    ASSERT_TRUE(g.ok() && g->has_value()) << g.status();
    EXPECT_EQ(**g, r.bytes);
  }
}

TEST(SharedTierAsyncTest, DrainWithTheClusterDownReturnsWhatWasNotWritten) {
  RedisClusterProcess cluster("wb_drain");
  std::string error;
  ASSERT_TRUE(cluster.Start(3, 0, &error)) << error;
  TempDir d;
  ChunkStoreOptions o = RemoteStoreOptions(d.path(), "wd:");
  o.remote.cluster.seeds = cluster.Seeds();
  o.remote.cluster.timeout = std::chrono::milliseconds(100);
  auto s = ChunkStore::Open(o);
  ASSERT_TRUE(s.ok());
  const auto written = MakeRecord(3600);
  ASSERT_EQ(*(*s)->Put(written.key, written.bytes), PutResult::kStored);
  ASSERT_TRUE((*s)->DrainRemoteWrites(std::chrono::seconds(20)).empty());
  cluster.PauseAll();
  std::vector<ChunkKey> stuck;
  for (int i = 1; i <= 3; ++i) {
    const auto rec = MakeRecord(3600 + i);
    ASSERT_EQ(*(*s)->Put(rec.key, rec.bytes), PutResult::kStored);
    stuck.push_back(rec.key);
  }
  const auto t0 = Clock::now();
  const std::vector<UnwrittenRecord> left = (*s)->DrainRemoteWrites(std::chrono::milliseconds(500));
  std::printf("drain with the cluster SIGSTOPped: %.0f ms (timeout 500)\n", MsSince(t0));
  ASSERT_EQ(left.size(), 3u);
  for (size_t i = 0; i < left.size(); ++i) EXPECT_EQ(left[i].key, stuck[i]) << "oldest first";
  EXPECT_EQ((*s)->counters().remote_write_failed.load(), 3u);
  EXPECT_EQ((*s)->counters().remote_pending_writes.load(), 0u);
  EXPECT_EQ((*s)->RemoteState(written.key), RemoteWriteState::kWritten);
  for (const ChunkKey& k : stuck) {
    EXPECT_EQ((*s)->RemoteState(k), RemoteWriteState::kFailed);
    EXPECT_EQ((*s)->Get(k)->status, GetStatus::kFound);
  }
  cluster.ResumeAll();
}

}  // namespace
}  // namespace infoflow::store
