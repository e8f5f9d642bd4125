// RedisCluster: a small Redis Cluster client over hiredis's synchronous API
// (hiredis 0.14 has no cluster support, so the cluster side is here).
//
// What it does, so callers never see the cluster:
//  * Keeps a slot map (16384 slots -> master "host:port") loaded with
//    CLUSTER SLOTS from the seed nodes or any master it has seen.
//  * Routes each key by its slot: CRC16/XMODEM of the key, or of its
//    {hash tag} when the key has a non-empty one, modulo 16384.
//  * Follows MOVED (updates the slot, refreshes the map, retries) and ASK
//    (ASKING + the command on the importing node, map unchanged) redirects,
//    at most options.max_redirects per command.
//  * Pools connections per node (at most options.max_idle_per_node idle ones
//    kept); a connection that saw an I/O error is dropped, a fresh one is
//    opened on the next use (reconnect).
//  * Connect and command timeouts (options.timeout). A refused or reset
//    connection is retried (options.max_attempts in all, the slot map
//    refreshed in between so a failover is followed); a timeout is not (the
//    node is there but slow: a retry would only double the delay).
//  * Optional AUTH (user + password, or password alone).
//  * A circuit breaker: after options.breaker_threshold consecutive failed
//    network attempts (a failed slot-map load counts) it stops trying for
//    options.breaker_cooldown and fails calls at once (FailedPrecondition);
//    then one probe call is let through (after reloading the slot map) and
//    its outcome closes or re-opens it. So a dead cluster costs a request
//    at most a few timeouts until the breaker opens, one probe per
//    cool-down after that, and nothing in between.
//  * Execute/MultiGet run one pipeline per node, the nodes in parallel.
//
// Errors are absl statuses whose code says the kind (ErrorKind()):
//   DeadlineExceeded  timeout               Unavailable  connection failed
//   Aborted           redirects exhausted   FailedPrecondition circuit open
//   Internal          error reply / protocol
//
// Thread-safe: any number of threads may call any method at once.
#ifndef INFOFLOW_CACHE_STORE_REDIS_CLUSTER_H_
#define INFOFLOW_CACHE_STORE_REDIS_CLUSTER_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace infoflow::store {

inline constexpr int kRedisClusterSlots = 16384;

struct RedisClusterOptions {
  // Seed nodes, "host:port" each; any reachable node of the cluster will do.
  std::vector<std::string> seeds;
  // Connect timeout and per-socket-operation command timeout.
  std::chrono::milliseconds timeout{250};
  // Redirects (MOVED/ASK) followed per command before Aborted.
  int max_redirects = 5;
  // Network attempts per command (connect or I/O failure, CLUSTERDOWN,
  // TRYAGAIN); the slot map is refreshed between attempts.
  int max_attempts = 2;
  // AUTH: password empty = none; user empty = the default user.
  std::string user;
  std::string password;
  // Consecutive failed network attempts that open the circuit, and how long
  // it stays open before a probe.
  int breaker_threshold = 3;
  std::chrono::milliseconds breaker_cooldown{2000};
  int max_idle_per_node = 8;
  // Nodes read at once by one call (one pipeline each; the calling thread
  // runs one of them). 0 = every node the call touches. On the 2-core VM
  // with 3 loopback masters, 8 records of 6 MiB: 2.8-3.8 GB/s all at once,
  // 2.3-2.7 GB/s one node after another (remote_bench prints both;
  // bench_out/final/remote5-7.txt).
  int max_parallel_nodes = 0;
  // Commands in flight on one connection: the first alone, then up to this
  // many while replies are small, and one at a time once a reply of
  // `large_reply_bytes` or more came back (the next command is sent as each
  // reply arrives). Redis 7.0 builds the replies of everything in flight
  // before it writes them; with two or more values of megabytes in flight
  // its throughput collapses (3 loopback masters, 8 records of 6 MiB: 0.67-
  // 0.75 GB/s as whole pipelines, 2.8-3.8 GB/s with this flow control;
  // bench_out/final/remote2,4 vs remote5-7.txt).
  int max_pipeline_depth = 16;
  size_t large_reply_bytes = size_t{256} << 10;
};

// Monotonic counters (relaxed atomics, readable at any time).
struct RedisClusterCounters {
  std::atomic<uint64_t> moved{0};          // MOVED redirects followed
  std::atomic<uint64_t> ask{0};            // ASK redirects followed
  std::atomic<uint64_t> slot_map_refreshes{0};
  std::atomic<uint64_t> connects{0};       // connections opened
  std::atomic<uint64_t> connect_failures{0};
  std::atomic<uint64_t> io_failures{0};    // commands that lost their connection or timed out
  std::atomic<uint64_t> breaker_opens{0};
  std::atomic<uint64_t> breaker_rejections{0};  // calls failed at once while open
  // 0 closed, 1 open, 2 half-open (a probe is out).
  std::atomic<int> breaker_state{0};
};

// A reply to one command, owned.
struct RedisReply {
  enum class Type { kString, kNil, kStatus, kInteger, kArray, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  long long integer = 0;
};

// One command; args[key_index] is the key it is routed by.
struct RedisCommand {
  std::vector<std::string_view> args;
  size_t key_index = 1;
};

class RedisCluster {
 public:
  // Validates the options (InvalidArgument naming the bad seed) and tries to
  // load the slot map; an unreachable cluster is not an error here (the
  // first commands fail and trip the breaker; the map loads once it is up).
  // `counters` (may be null) must outlive the client.
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Create(
      RedisClusterOptions options, RedisClusterCounters* counters = nullptr);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // Runs `commands` (each routed by its key, redirects followed), one
  // pipeline per node, the nodes in parallel. Replies in input order; an
  // error reply of the server (other than redirects) is a kError reply, not
  // a status. The string_views must stay valid during the call.
  std::vector<absl::StatusOr<RedisReply>> Execute(absl::Span<const RedisCommand> commands);

  // GET: the value, or nullopt when the key does not exist.
  absl::StatusOr<std::optional<std::string>> Get(std::string_view key);
  std::vector<absl::StatusOr<std::optional<std::string>>> MultiGet(
      absl::Span<const std::string> keys);
  // SET with an expiry in seconds (0 = none).
  absl::Status Set(std::string_view key, std::string_view value, int64_t ttl_seconds = 0);
  // DEL; true if the key existed.
  absl::StatusOr<bool> Del(std::string_view key);

  // Reloads the slot map now from a known master or a seed.
  absl::Status RefreshSlotMap();
  // The master currently mapped for `slot` ("" if unknown).
  std::string NodeForSlot(int slot) const;
  bool circuit_open() const;

  const RedisClusterCounters& counters() const { return *counters_; }

  // CRC16/XMODEM (poly 0x1021, init 0), as Redis Cluster uses it.
  static uint16_t Crc16(std::string_view bytes);
  // The cluster slot of `key` (hash tags honoured).
  static int KeySlot(std::string_view key);

 private:
  class Impl;
  RedisCluster(std::unique_ptr<Impl> impl, RedisClusterCounters* counters);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<RedisClusterCounters> own_counters_;
  RedisClusterCounters* counters_;
};

// The kind of a status returned by RedisCluster, for metrics labels:
// "timeout", "connection", "redirect_exhausted", "circuit_open", "server".
const char* RedisErrorKind(const absl::Status& status);

// Parses "host:port[,host:port...]". InvalidArgument naming the bad entry.
absl::StatusOr<std::vector<std::string>> ParseRedisSeeds(std::string_view list);

}  // namespace infoflow::store

#endif  // INFOFLOW_CACHE_STORE_REDIS_CLUSTER_H_
