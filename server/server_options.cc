#include "server/server_options.h"

#include <fstream>
#include <map>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cache_store/redis_cluster.h"
#include "engine/chunk/kv_codec.h"

namespace infoflow::server {

const char kServerUsage[] =
    "usage: infoflow-server [flags]\n"
    "  --model DIR             model directory (default: generate a test model into\n"
    "                          <data-dir>/../models/default)\n"
    "  --device auto|cpu|cuda  (default auto)\n"
    "  --data-dir DIR          RocksDB store (default ./data/kv)\n"
    "  --ram-bytes N           store RAM tier bytes (default 512 MiB)\n"
    "  --store-capacity-bytes N  stored record bytes at most: a write past it first evicts the\n"
    "                          least recently used records (default 0 = unbounded; a chunk\n"
    "                          evicted is NOT_FOUND by key until ingested again)\n"
    "  --store-ttl-s N         records older than N s read as missing and are removed\n"
    "                          (default 0 = never)\n"
    "  --listen HOST:PORT      gRPC address (default 127.0.0.1:50051; port 0 = ephemeral)\n"
    "  --metrics-listen H:P    Prometheus /metrics (default 127.0.0.1:9464; '' = off)\n"
    "  --max-context-tokens N  context tokens per query (default 8192)\n"
    "  --max-chunks N          chunks per request (default 256)\n"
    "  --max-chunk-tokens N    tokens per chunk (default 2048)\n"
    "  --max-prompt-tokens N   tokens of the rendered prompt and of the question (default 2048;\n"
    "                          a prompt without chunks adds what its prefix left of\n"
    "                          --max-context-tokens)\n"
    "  --max-prefix-tokens N   tokens of a query's prefix (system prompt + chat header; default\n"
    "                          2048; a prompt without chunks may add --max-context-tokens)\n"
    "  --max-new-tokens N      generated tokens per query (default 512)\n"
    "  --allow-beyond-model-positions true|false\n"
    "                          run queries that need more positions than the model's\n"
    "                          max_position_embeddings, flagged in the report (default false:\n"
    "                          refused with OUT_OF_RANGE)\n"
    "  --max-running N         requests running at once: prefilling, or decoding in the\n"
    "                          batch of the device's one engine loop (default 16)\n"
    "  --workers N             old name of --max-running (one engine loop computes for all;\n"
    "                          nothing runs side by side)\n"
    "  --queue-depth N         requests allowed to wait beyond --max-running; more are\n"
    "                          refused with RESOURCE_EXHAUSTED (default 16)\n"
    "  --max-kv-bytes N        KV cache bytes of running queries (default 4 GiB); a query that\n"
    "                          would exceed it waits its turn, one larger is refused\n"
    "                          (OUT_OF_RANGE)\n"
    "  --max-batch-tokens N    query rows per piece of prefill work between two decode steps\n"
    "                          (default 512): bounds the decode stall a long prefill causes\n"
    "  --prefill-slice-ms N    a prefill keeps the device at least N ms before a waiting\n"
    "                          decode step gets it (default 20; 0 = at every layer)\n"
    "  --threads N             torch CPU threads (default all cores)\n"
    "  --auth-token-file F     require 'authorization: Bearer <token in F>'\n"
    "  --tls-cert F --tls-key F  serve TLS\n"
    "  --store-sync true|false fsync each store write (default true)\n"
    "  --min-free-disk-bytes N refuse store writes (RESOURCE_EXHAUSTED, retryable) that would\n"
    "                          leave less free disk than N (default 64 MiB; 0 = off)\n"
    "  --on-corrupt-store refuse|quarantine\n"
    "                          damaged store files at start: exit (default), or move the\n"
    "                          store aside to <data-dir>.quarantined-<time> and start empty\n"
    "  --reflection true|false serve gRPC reflection (default true)\n"
    "  --grpc-max-threads N    gRPC calls handled at once, a thread each (default 512); past\n"
    "                          it a call is refused with RESOURCE_EXHAUSTED\n"
    "  --grpc-stream-idle-ms N a stream that has waited N ms on its client is cancelled,\n"
    "                          freeing its thread: an IngestStream whose client sends\n"
    "                          nothing, a Query whose client reads nothing (default 60000;\n"
    "                          0 = never)\n"
    "  --kv-codec raw|int8|int4 stored chunk K/V: the compute dtype (default, exact) or\n"
    "                          quantized in groups (keys per channel, values per token)\n"
    "  --kv-group-size N       elements per quantization group (default 64)\n"
    "  --idle-trim-ms N        return freed memory to the OS once the server has been idle\n"
    "                          for N ms (default 1000; 0 = never); the engine's buffer pool\n"
    "                          (--pool-retain-mb) stays resident\n"
    "  --idle-trim-min-free-mb N  the idle trim runs only when at least N MiB of the heap\n"
    "                          are free and still resident (default 64; 0 = always): below\n"
    "                          that the free heap is the small-object working set of the\n"
    "                          next query\n"
    "  --pool-retain-mb N      freed query buffers (K/V, activations) kept resident for the\n"
    "                          next query, at most N MiB (default 2048; 0 = none, every\n"
    "                          query maps and faults its buffers afresh)\n"
    "  --pool-idle-release-s N after N s without a request the pool returns its buffers\n"
    "                          to the OS too (default 300; 0 = never)\n"
    "  --record-buffer-retain-mb N\n"
    "                          buffers of chunk records read from the shared tier, kept\n"
    "                          resident for the next read, at most N MiB (default 512;\n"
    "                          0 = none); emptied with the pool after --pool-idle-release-s\n"
    "  --remote-redis H:P[,H:P...]\n"
    "                          shared chunk-KV tier: seed nodes of a Redis Cluster that every\n"
    "                          replica reads (after RAM and disk miss) and writes behind its\n"
    "                          local store (default '' = off). Cluster faults are misses,\n"
    "                          never errors; neither direction is on a request's path\n"
    "  --remote-key-prefix S   key prefix in the cluster (default 'ifkv:'); the key is\n"
    "                          S + the chunk's 32 raw key bytes\n"
    "  --remote-timeout-ms N   connect and per-operation timeout (default 250); after 3\n"
    "                          consecutive failures the tier is skipped for 2 s\n"
    "  --remote-ttl-s N        expiry of records written to the cluster (default 0 = none)\n"
    "  --remote-auth-file F    Redis AUTH: F holds 'password', or 'user' and 'password' lines\n"
    "  --http-listen H:P       OpenAI-compatible HTTP API (POST /v1/completions,\n"
    "                          /v1/chat/completions, GET /v1/models, /health) on H:P; shares\n"
    "                          the scheduler, limits, auth token and metrics with gRPC\n"
    "                          (default '' = off; port 0 = ephemeral)\n"
    "  --blend-separator S     splits an HTTP prompt (or last user message) into prefix,\n"
    "                          chunks and question, as LMCache's blend_special_str\n"
    "                          (default ' # # ')\n"
    "  --http-chat-format F    chat format of /v1/chat/completions: auto (the model's own\n"
    "                          chat template from tokenizer_config.json or chat_template.jinja,\n"
    "                          rendered; without one, a named format by its markers or\n"
    "                          model_type), template (the model's, required), qwen, llama3,\n"
    "                          mistral, glm4 or plain (default auto)\n"
    "  --http-max-body-bytes N larger HTTP request bodies are refused with 413 (default 16 MiB,\n"
    "                          at most 1 GiB)\n"
    "  --http-max-connections N\n"
    "                          HTTP connections served at once, a thread each, started as\n"
    "                          they arrive (default 512); as many more may wait, past that\n"
    "                          503 at once\n"
    "  --http-request-timeout-ms N\n"
    "                          an HTTP request's line, headers and body must arrive within N ms\n"
    "                          of its first byte, else the connection is closed and counted\n"
    "                          (infoflow_http_requests_dropped_total; default 30000, at most\n"
    "                          3600000)\n"
    "  --remote-fill-queue-bytes N\n"
    "                          a chunk fetched from the cluster is served at once and written\n"
    "                          to local disk by a background thread; at most N bytes wait\n"
    "                          (default 256 MiB), past that the local copy is skipped\n"
    "                          (infoflow_remote_fill_dropped_total)\n"
    "  --remote-write-queue-bytes N\n"
    "                          ingest stores locally and writes the cluster behind it; at most\n"
    "                          N bytes wait (default 256 MiB), past that a write is refused\n"
    "                          (infoflow_remote_writes_total{result=\"dropped\"}, reply FAILED)\n"
    "  --remote-write-attempts N  tries per cluster write, with backoff 0.1 s doubling to 5 s\n"
    "                          (default 10)\n"
    "  --remote-write-give-up-s N  a cluster write still failing N s after its first try is\n"
    "                          given up and logged (default 60)\n"
    "  --remote-drain-timeout-ms N  on shutdown, wait up to N ms for pending cluster writes\n"
    "                          (default 5000), then log each one not written\n"
    "  --world-size N          processes in a sequence-parallel group (default 1 = none):\n"
    "                          one query's chunks are split over N ranks, one per device,\n"
    "                          joined by c10d (Gloo); FULL runs as ring attention, INFOFLOW /\n"
    "                          INFOFLOW_BLEND / NONE score and recompute per rank\n"
    "  --rank R                this process's rank, 0..N-1; rank 0 serves the API (gRPC,\n"
    "                          HTTP), the others serve Health and /metrics only\n"
    "  --dist-init HOST:PORT   rank 0's control store: rank 0 binds PORT, the others connect\n"
    "                          to HOST:PORT (default 127.0.0.1:29500)\n"
    "  --dist-timeout-ms N     a rank silent this long fails the query in flight with\n"
    "                          UNAVAILABLE naming it, and the group re-forms when it is back\n"
    "                          (default 30000)\n"
    "  --dist-interface NAME   network interface for the group's data connections (default:\n"
    "                          the loopback address for a 127.x --dist-init, else the\n"
    "                          address of this machine's hostname)\n"
    "  --dist-backend B        the group's data plane: gloo, nccl (CUDA builds, ranks on GPUs)\n"
    "                          or auto (default: nccl when --device is a GPU and the build\n"
    "                          has NCCL, else gloo)\n"
    "  --config FILE           key=value lines with the flag names above\n";

namespace {

template <typename T>
bool ParseNum(const std::string& v, T* out) {
  return absl::SimpleAtoi(v, out);
}

absl::Status Apply(ServerOptions* o, const std::string& name, const std::string& value) {
  auto num = [&](auto* field, int64_t min) -> absl::Status {
    if (!ParseNum(value, field) || static_cast<int64_t>(*field) < min) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected an integer >= ", min, ", got '", value, "'"));
    }
    return absl::OkStatus();
  };
  auto boolean = [&](bool* field) -> absl::Status {
    if (value != "true" && value != "false") {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, ": expected true or false, got '", value, "'"));
    }
    *field = value == "true";
    return absl::OkStatus();
  };
  if (name == "model") o->model_dir = value;
  else if (name == "device") o->device = value;
  else if (name == "data-dir") o->data_dir = value;
  else if (name == "ram-bytes") return num(&o->ram_bytes, 0);
  else if (name == "store-capacity-bytes") return num(&o->store_capacity_bytes, 0);
  else if (name == "store-ttl-s") return num(&o->store_ttl_s, 0);
  else if (name == "listen") o->listen = value;
  else if (name == "metrics-listen") o->metrics_listen = value;
  else if (name == "max-context-tokens") return num(&o->max_context_tokens, 1);
  else if (name == "max-chunks") return num(&o->max_chunks, 1);
  else if (name == "max-chunk-tokens") return num(&o->max_chunk_tokens, 1);
  else if (name == "max-new-tokens") return num(&o->max_new_tokens, 1);
  else if (name == "workers" || name == "max-running") return num(&o->workers, 1);
  else if (name == "max-kv-bytes") return num(&o->max_kv_bytes, 1);
  else if (name == "max-batch-tokens") return num(&o->max_batch_tokens, 1);
  else if (name == "prefill-slice-ms") return num(&o->prefill_slice_ms, 0);
  else if (name == "queue-depth") return num(&o->queue_depth, 0);
  else if (name == "threads") return num(&o->threads, 0);
  else if (name == "auth-token-file") o->auth_token_file = value;
  else if (name == "tls-cert") o->tls_cert = value;
  else if (name == "tls-key") o->tls_key = value;
  else if (name == "kv-codec") o->kv_codec = value;  // checked with the group size below
  else if (name == "kv-group-size") return num(&o->kv_group_size, 1);
  else if (name == "idle-trim-ms") return num(&o->idle_trim_ms, 0);
  else if (name == "idle-trim-min-free-mb") return num(&o->idle_trim_min_free_mb, 0);
  else if (name == "pool-retain-mb") {
    // At most 1 TiB: the byte count (MiB << 20) must fit size_t.
    if (absl::Status st = num(&o->pool_retain_mb, 0); !st.ok()) return st;
    if (o->pool_retain_mb > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--pool-retain-mb: at most 1048576 (1 TiB), got ", value));
    }
  }
  else if (name == "pool-idle-release-s") return num(&o->pool_idle_release_s, 0);
  else if (name == "record-buffer-retain-mb") {
    if (absl::Status st = num(&o->record_buffer_retain_mb, 0); !st.ok()) return st;
    if (o->record_buffer_retain_mb > (int64_t{1} << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--record-buffer-retain-mb: at most 1048576 (1 TiB), got ", value));
    }
  }
  else if (name == "remote-redis") {
    if (!value.empty()) {
      if (absl::StatusOr<std::vector<std::string>> s = store::ParseRedisSeeds(value); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--remote-redis: ", s.status().message()));
      }
    }
    o->remote_redis = value;
  } else if (name == "remote-key-prefix") {
    if (value.size() > 256) {
      return absl::InvalidArgumentError("--remote-key-prefix: at most 256 bytes");
    }
    o->remote_key_prefix = value;
  }
  else if (name == "remote-timeout-ms") return num(&o->remote_timeout_ms, 1);
  else if (name == "remote-ttl-s") return num(&o->remote_ttl_s, 0);
  else if (name == "remote-auth-file") o->remote_auth_file = value;
  else if (name == "http-listen") o->http_listen = value;
  else if (name == "blend-separator") {
    if (value.empty()) return absl::InvalidArgumentError("--blend-separator: must not be empty");
    o->blend_separator = value;
  } else if (name == "http-chat-format") {
    if (value != "auto" && value != "template" && value != "qwen" && value != "llama3" &&
        value != "mistral" && value != "glm4" && value != "plain") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--http-chat-format: expected auto, template, qwen, llama3, mistral, glm4 or plain, "
          "got '", value, "'"));
    }
    o->http_chat_format = value;
  } else if (name == "http-max-body-bytes") {
    // At most 1 GiB: the listener's budget for bodies in flight is 16 times it.
    if (absl::Status st = num(&o->http_max_body_bytes, 1024); !st.ok()) return st;
    if (o->http_max_body_bytes > (uint64_t{1} << 30)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-max-body-bytes: at most 1073741824 (1 GiB), got ", value));
    }
  } else if (name == "http-max-connections") {
    if (absl::Status st = num(&o->http_max_connections, 2); !st.ok()) return st;
    if (o->http_max_connections > 65536) {
      return absl::InvalidArgumentError("--http-max-connections: at most 65536");
    }
  } else if (name == "grpc-max-threads") {
    if (absl::Status st = num(&o->grpc_max_threads, 8); !st.ok()) return st;
    if (o->grpc_max_threads > 65536) {
      return absl::InvalidArgumentError("--grpc-max-threads: at most 65536");
    }
  } else if (name == "grpc-stream-idle-ms") {
    if (absl::Status st = num(&o->grpc_stream_idle_ms, 0); !st.ok()) return st;
    if (o->grpc_stream_idle_ms > 86400000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--grpc-stream-idle-ms: at most 86400000 (1 day), got ", value));
    }
  } else if (name == "http-request-timeout-ms") {
    // At most an hour: a deadline is now + this, which must not overflow.
    if (absl::Status st = num(&o->http_request_timeout_ms, 100); !st.ok()) return st;
    if (o->http_request_timeout_ms > 3600000) {
      return absl::InvalidArgumentError(
          absl::StrCat("--http-request-timeout-ms: at most 3600000 (1 h), got ", value));
    }
  } else if (name == "remote-fill-queue-bytes")
    return num(&o->remote_fill_queue_bytes, 0);
  else if (name == "remote-write-queue-bytes") return num(&o->remote_write_queue_bytes, 0);
  else if (name == "remote-write-attempts") return num(&o->remote_write_attempts, 1);
  else if (name == "remote-write-give-up-s") return num(&o->remote_write_give_up_s, 0);
  else if (name == "remote-drain-timeout-ms") return num(&o->remote_drain_timeout_ms, 0);
  else if (name == "min-free-disk-bytes") return num(&o->min_free_disk_bytes, 0);
  else if (name == "world-size") {
    if (absl::Status st = num(&o->world_size, 1); !st.ok()) return st;
    if (o->world_size > 1024) return absl::InvalidArgumentError("--world-size: at most 1024");
  }
  else if (name == "rank") return num(&o->rank, 0);
  else if (name == "dist-init") o->dist_init = value;
  else if (name == "dist-timeout-ms") return num(&o->dist_timeout_ms, 100);
  else if (name == "dist-interface") o->dist_interface = value;
  else if (name == "dist-backend") {
    if (value != "auto" && value != "gloo" && value != "nccl") {
      return absl::InvalidArgumentError(
          absl::StrCat("--dist-backend: expected auto, gloo or nccl, got '", value, "'"));
    }
    o->dist_backend = value;
  }
  else if (name == "max-prompt-tokens") return num(&o->max_prompt_tokens, 1);
  else if (name == "max-prefix-tokens") return num(&o->max_prefix_tokens, 1);
  else if (name == "store-sync") return boolean(&o->store_sync);
  else if (name == "allow-beyond-model-positions") return boolean(&o->allow_beyond_model_positions);
  else if (name == "reflection") return boolean(&o->reflection);
  else if (name == "on-corrupt-store") {
    if (value != "refuse" && value != "quarantine") {
      return absl::InvalidArgumentError(
          absl::StrCat("--on-corrupt-store: expected refuse or quarantine, got '", value, "'"));
    }
    o->on_corrupt_store = value;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::pair<std::string, int>> ParseDistInit(const std::string& value) {
  const size_t colon = value.rfind(':');
  int port = -1;
  if (colon == std::string::npos || colon == 0 ||
      !absl::SimpleAtoi(value.substr(colon + 1), &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("--dist-init: expected HOST:PORT, got '", value, "'"));
  }
  return std::make_pair(value.substr(0, colon), port);
}

absl::StatusOr<ServerOptions> ParseServerFlags(int argc, char** argv, bool* help) {
  *help = false;
  std::vector<std::pair<std::string, std::string>> flags;
  std::string config_file;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      *help = true;
      return ServerOptions{};
    }
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name, value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      name = std::string(arg.substr(0, eq));
      value = std::string(arg.substr(eq + 1));
    } else {
      name = std::string(arg);
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      value = argv[++i];
    }
    if (name == "config") config_file = value;
    else flags.emplace_back(name, value);
  }
  ServerOptions options;
  if (!config_file.empty()) {
    std::ifstream in(config_file);
    if (!in) return absl::InvalidArgumentError(absl::StrCat("--config: cannot read ", config_file));
    std::string line;
    int lineno = 0;
    while (std::getline(in, line)) {
      ++lineno;
      absl::string_view l = absl::StripAsciiWhitespace(line);
      if (l.empty() || l[0] == '#') continue;
      size_t eq = l.find('=');
      if (eq == absl::string_view::npos) {
        return absl::InvalidArgumentError(
            absl::StrCat(config_file, ":", lineno, ": expected key=value"));
      }
      absl::string_view key_view = absl::StripAsciiWhitespace(l.substr(0, eq));
      absl::ConsumePrefix(&key_view, "--");
      std::string key(key_view);
      absl::Status s =
          Apply(&options, key, std::string(absl::StripAsciiWhitespace(l.substr(eq + 1))));
      if (!s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(config_file, ":", lineno, ": ", s.message()));
      }
    }
  }
  for (const auto& [name, value] : flags) {
    if (absl::Status s = Apply(&options, name, value); !s.ok()) return s;
  }
  if (options.tls_cert.empty() != options.tls_key.empty()) {
    return absl::InvalidArgumentError("--tls-cert and --tls-key go together");
  }
  if (absl::StatusOr<KvCodec> c = ParseKvCodec(options.kv_codec, options.kv_group_size); !c.ok()) {
    return c.status();
  }
  if (options.rank >= options.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--rank: ", options.rank,
                                                   " is not below --world-size ",
                                                   options.world_size));
  }
  if (options.world_size > 1) {
    if (absl::StatusOr<std::pair<std::string, int>> hp = ParseDistInit(options.dist_init);
        !hp.ok()) {
      return hp.status();
    } else if (hp->second == 0 && options.rank != 0) {
      return absl::InvalidArgumentError(
          "--dist-init: port 0 (ephemeral) only on rank 0; the other ranks need its real port");
    }
  }
  return options;
}

}  // namespace infoflow::server
