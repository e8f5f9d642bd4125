// Configuration of infoflow-server: flags and the equivalent --config file.
#ifndef INFOFLOW_SERVER_SERVER_OPTIONS_H_
#define INFOFLOW_SERVER_SERVER_OPTIONS_H_

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

namespace infoflow::server {

struct ServerOptions {
  // Model directory. Empty: a small test model is generated on first start
  // into <data_dir>/../models/default and served from there.
  std::string model_dir;
  std::string device = "auto";
  std::string data_dir = "./data/kv";
  uint64_t ram_bytes = uint64_t{512} << 20;  // store RAM tier
  // Stored record bytes at most; past it a write first evicts the least
  // recently used records (0 = unbounded, nothing is ever evicted).
  uint64_t store_capacity_bytes = 0;
  // Records older than this read as missing and are removed (0 = never).
  int64_t store_ttl_s = 0;
  std::string listen = "127.0.0.1:50051";    // port 0 = ephemeral
  std::string metrics_listen = "127.0.0.1:9464";  // "" = no /metrics
  int64_t max_context_tokens = 8192;
  int max_chunks = 256;
  int64_t max_chunk_tokens = 2048;
  int max_new_tokens = 512;
  // Tokens of the rendered prompt (template + question), and of the
  // question alone (it is also what INFOFLOW scores with).
  int64_t max_prompt_tokens = 2048;
  // Tokens of QueryRequest.prefix (system prompt + chat header).
  int64_t max_prefix_tokens = 2048;
  // false: a query whose prefix + context + prompt + max_new_tokens needs
  // more positions than the model's max_position_embeddings is refused
  // (OUT_OF_RANGE). true: it runs, and its report says so.
  bool allow_beyond_model_positions = false;
  // Scheduler (server/scheduler.h): one engine loop for the device.
  // Requests past the queue at once (prefilling or decoding in the batch):
  // --max-running, or --workers, its old name (kept so existing configs and
  // deploy files work; nothing computes side by side any more).
  int workers = 16;
  int queue_depth = 16;  // requests waiting beyond max_running; more = RESOURCE_EXHAUSTED
  // KV cache bytes of running queries; a query that would exceed it waits
  // (FIFO), one larger than it is refused (OUT_OF_RANGE).
  int64_t max_kv_bytes = int64_t{4} << 30;
  // Query rows per piece of prefill work between decode steps.
  int64_t max_batch_tokens = 512;
  // A prefill keeps the device this long before a waiting decode step gets
  // it (server/scheduler.h); 0 = at every yield point.
  int prefill_slice_ms = 20;
  int threads = 0;       // torch intra-op threads, 0 = all cores
  std::string auth_token_file;  // non-empty: require "authorization: Bearer <token>"
  std::string tls_cert;         // PEM files; both or neither
  std::string tls_key;
  bool store_sync = true;  // fsync the store's WAL on each write
  // Writes that would leave less free disk than this are refused
  // (RESOURCE_EXHAUSTED) before RocksDB runs out of space.
  uint64_t min_free_disk_bytes = uint64_t{64} << 20;
  // What to do when the store cannot be opened because its files are
  // damaged: "refuse" (exit with DATA_LOSS) or "quarantine" (move the store
  // aside to <data_dir>.quarantined-<time>, start empty, count it).
  std::string on_corrupt_store = "refuse";
  bool reflection = true;  // serve gRPC server reflection
  // gRPC handler threads at most (grpc::ResourceQuota::SetMaxThreads): past
  // it a new call is refused with RESOURCE_EXHAUSTED instead of starting a
  // thread. A client stream that has sent nothing for grpc_stream_idle_ms is
  // cancelled (IdleStreamReaper); 0 = never.
  int grpc_max_threads = 512;
  int64_t grpc_stream_idle_ms = 60000;
  // How chunk K/V is stored: "raw" (the compute dtype, bit-exact), "int8" or
  // "int4" (group-wise quantized, engine/chunk/kv_quant.h).
  std::string kv_codec = "raw";
  int kv_group_size = 64;
  // Return freed heap memory to the OS once no request has run or waited
  // for this long (server/idle_trimmer.h); 0 = never.
  int idle_trim_ms = 1000;
  // ...and only when at least this many MiB of the heap are free and still
  // resident (IdleTrimmer::HeapTrimmableBytes): a trim returns every free
  // page, and a small free heap is the next query's.
  int64_t idle_trim_min_free_mb = 64;
  // The engine's large-buffer pool keeps at most this many MiB of freed query
  // buffers resident for the next query, through idle trims too
  // (engine/model/buffer_pool.h, docs/DESIGN.md §15); 0 = keep none.
  int64_t pool_retain_mb = 2048;
  // After this long without a request the pool returns its cached blocks
  // too (the next query then maps and faults its buffers afresh); 0 = never.
  int pool_idle_release_s = 300;
  // Buffers of chunk records read from the shared tier, kept for the
  // next read when their last reader lets go, at most this many MiB
  // (cache_store/record_buffers.h); emptied with the pool after
  // pool_idle_release_s. 0 = keep none.
  int64_t record_buffer_retain_mb = 512;
  // Shared chunk-KV tier on a Redis Cluster (docs/DESIGN.md §13): seed
  // nodes "host:port[,host:port...]"; empty = off (local tiers only).
  std::string remote_redis;
  std::string remote_key_prefix = "ifkv:";
  int remote_timeout_ms = 250;  // connect and per-operation timeout
  int64_t remote_ttl_s = 0;     // expiry of written records; 0 = none
  // Redis AUTH: one line "password", or two lines "user" then "password".
  std::string remote_auth_file;
  // OpenAI-compatible HTTP front end (server/http/http_frontend.h):
  // "host:port", port 0 = ephemeral; "" = off.
  std::string http_listen;
  // Splits an HTTP prompt into prefix, chunks and question (LMCache's
  // blend_special_str).
  std::string blend_separator = " # # ";
  // Chat format of /v1/chat/completions: auto (the model's chat template,
  // else detected), template, or qwen | llama3 | mistral | glm4 | plain.
  std::string http_chat_format = "auto";
  uint64_t http_max_body_bytes = uint64_t{16} << 20;  // larger: 413
  // HTTP connections served at once (a thread each, started on demand) and
  // how long a request may take to arrive whole (server/http/http_listener.h).
  int http_max_connections = 512;
  int64_t http_request_timeout_ms = 30000;
  // Records fetched from the cluster wait for their local write in a queue
  // of at most this many bytes; past it the fill is dropped (counted).
  uint64_t remote_fill_queue_bytes = uint64_t{256} << 20;
  // Write-behind to the cluster: queue bound in bytes (past it a write is
  // refused, counted, and the ingest reply says FAILED), tries per record,
  // and how long after its first try a record is given up.
  uint64_t remote_write_queue_bytes = uint64_t{256} << 20;
  int remote_write_attempts = 10;
  int remote_write_give_up_s = 60;
  // Graceful shutdown waits this long for the write-behind queue to empty,
  // then logs each record it could not write (event=remote_write_unwritten).
  int remote_drain_timeout_ms = 5000;
  // Sequence-parallel group (server/group/, docs/DESIGN.md §16): one query's
  // context split over world_size processes. Rank 0 serves the API; the
  // others serve Health and /metrics only. dist_init is rank 0's control
  // store "host:port" (rank 0 binds the port; 0 = ephemeral, for tests).
  int world_size = 1;
  int rank = 0;
  std::string dist_init = "127.0.0.1:29500";
  int dist_timeout_ms = 30000;
  std::string dist_interface;  // Gloo's network interface; "" = automatic
  // "auto" (NCCL when the model is on a GPU and the build has it, else
  // Gloo), "gloo" or "nccl".
  std::string dist_backend = "auto";
};

// Parses `argv` (argv[0] is the program). `--config FILE` reads key=value
// lines (same names as the flags, '#' comments) first; flags given on the
// command line override the file. InvalidArgument names the bad flag.
// `*help` is set when --help was given.
absl::StatusOr<ServerOptions> ParseServerFlags(int argc, char** argv, bool* help);

extern const char kServerUsage[];

// --dist-init's HOST and PORT. InvalidArgument naming the flag.
absl::StatusOr<std::pair<std::string, int>> ParseDistInit(const std::string& value);

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_SERVER_OPTIONS_H_
