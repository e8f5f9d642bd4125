#include "server/server.h"

#include <ATen/ATen.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cache_store/chunk_store.h"
#include "cache_store/record_buffers.h"
#include "engine/chunk/chunk_codec.h"
#include "engine/model/buffer_pool.h"
#include "engine/model/model.h"
#include "engine/model/runtime.h"
#include "engine/model/test_model.h"
#include "engine/text/model_chat_template.h"
#include "engine/text/tokenizer.h"
#include "server/group/group_leader.h"
#include "server/group/group_worker.h"
#include "server/grpc_request_counter.h"
#include "server/http/http_frontend.h"
#include "server/idle_trimmer.h"
#include "server/services.h"

namespace infoflow::server {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* flag) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat(flag, ": cannot read ", path));
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

struct InfoflowServer::State {
  ServerOptions options;
  std::string model_dir;
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<store::ChunkStore> store;
  std::unique_ptr<ChunkResolver> resolver;
  std::unique_ptr<QueryRunner> runner;
  std::unique_ptr<Metrics> metrics;  // reads store and scheduler at scrape time
  // After metrics (it reports into them): goes first, once the gRPC server
  // has no call left.
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<IdleTrimmer> trimmer;  // after the scheduler: stops before it goes
  std::unique_ptr<IdleTrimmer> pool_releaser;
  // --world-size > 1: rank 0 leads the sequence-parallel group, the other
  // ranks serve it (server/group/); both null otherwise.
  std::unique_ptr<GroupLeader> group_leader;
  std::unique_ptr<GroupWorker> group_worker;
  // Before the services and the gRPC server: outlives every stream it watches.
  std::unique_ptr<IdleStreamReaper> stream_reaper;
  ServiceDeps deps;
  std::unique_ptr<IngestService> ingest;
  std::unique_ptr<QueryService> query;
  std::unique_ptr<AdminService> admin;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<http::HttpFrontend> http;  // --http-listen; null when off
  int port = 0;
  std::once_flag shutdown_once;
};

InfoflowServer::InfoflowServer(std::unique_ptr<State> state) : s_(std::move(state)) {}

InfoflowServer::~InfoflowServer() {
  Shutdown(std::chrono::milliseconds(2000));
  // The group members report to Health: they stop before the server goes.
  s_->group_worker.reset();
  if (s_->group_leader) s_->group_leader->SetServingCallback(nullptr);
  s_->server.reset();
  s_->http.reset();
  // No call is left: stop the engine threads before the metrics they report into go.
  s_->trimmer.reset();
  s_->pool_releaser.reset();
  s_->scheduler.reset();
  s_->group_leader.reset();  // after the scheduler: its last query ran on the group
}

absl::StatusOr<std::unique_ptr<InfoflowServer>> InfoflowServer::Start(const ServerOptions& options) {
  auto s = std::make_unique<State>();
  s->options = options;
  InitTorchRuntime(options.threads);

  s->model_dir = options.model_dir;
  if (s->model_dir.empty()) {
    // No model given: a deterministic tiny model, generated once.
    s->model_dir = (std::filesystem::path(options.data_dir).parent_path() / "models" / "default")
                       .lexically_normal()
                       .string();
    if (!std::filesystem::exists(s->model_dir + "/config.json")) {
      std::fprintf(stderr, "no --model: generating a test model into %s\n", s->model_dir.c_str());
      if (absl::Status st = WriteTestModel(s->model_dir, TestModelSpec{}); !st.ok()) return st;
    }
  }
  LoadOptions load;
  load.device = options.device;
  absl::StatusOr<std::unique_ptr<Model>> model = Model::Load(s->model_dir, load);
  if (!model.ok()) return model.status();
  s->model = *std::move(model);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromFile(s->model_dir + "/tokenizer.json");
  if (!tok.ok()) return tok.status();
  s->tokenizer = *std::move(tok);

  store::ChunkStoreOptions so;
  so.path = options.data_dir;
  so.ram_tier_bytes = options.ram_bytes;
  so.capacity_bytes = options.store_capacity_bytes;
  so.ttl_seconds = options.store_ttl_s;
  so.sync = options.store_sync;
  so.quarantine_if_damaged = options.on_corrupt_store == "quarantine";
  so.min_free_disk_bytes = options.min_free_disk_bytes;
  if (!options.remote_redis.empty()) {
    absl::StatusOr<std::vector<std::string>> seeds = store::ParseRedisSeeds(options.remote_redis);
    if (!seeds.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--remote-redis: ", seeds.status().message()));
    }
    so.remote.cluster.seeds = *std::move(seeds);
    so.remote.cluster.timeout = std::chrono::milliseconds(options.remote_timeout_ms);
    so.remote.key_prefix = options.remote_key_prefix;
    so.remote.ttl_seconds = options.remote_ttl_s;
    so.remote.model_fingerprint = s->model->fingerprint();
    so.remote.fill_queue_bytes = options.remote_fill_queue_bytes;
    so.remote.write_queue_bytes = options.remote_write_queue_bytes;
    so.remote.write_max_attempts = options.remote_write_attempts;
    so.remote.write_give_up_after = std::chrono::seconds(options.remote_write_give_up_s);
    if (!options.remote_auth_file.empty()) {
      absl::StatusOr<std::string> auth = ReadFile(options.remote_auth_file, "--remote-auth-file");
      if (!auth.ok()) return auth.status();
      std::vector<std::string> lines;
      for (absl::string_view l : absl::StrSplit(*auth, '\n')) {
        l = absl::StripAsciiWhitespace(l);
        if (!l.empty()) lines.emplace_back(l);
      }
      if (lines.empty() || lines.size() > 2) {
        return absl::InvalidArgumentError(
            "--remote-auth-file: expected one line (password) or two (user, password)");
      }
      so.remote.cluster.password = lines.back();
      if (lines.size() == 2) so.remote.cluster.user = lines[0];
    }
  }
  absl::StatusOr<std::unique_ptr<store::ChunkStore>> st = store::ChunkStore::Open(so);
  if (!st.ok()) {
    if (absl::IsDataLoss(st.status())) {
      return absl::DataLossError(absl::StrCat(
          st.status().message(),
          " (the store is damaged; --on-corrupt-store=quarantine moves it aside and starts empty)"));
    }
    return st.status();
  }
  s->store = *std::move(st);
  if (store::RedisCluster* remote = s->store->remote_cluster()) {
    std::fprintf(stderr, "shared tier: redis cluster %s prefix=%s timeout_ms=%d ttl_s=%lld (%s)\n",
                 options.remote_redis.c_str(), options.remote_key_prefix.c_str(),
                 options.remote_timeout_ms, static_cast<long long>(options.remote_ttl_s),
                 remote->NodeForSlot(0).empty() && remote->NodeForSlot(16383).empty()
                     ? "unreachable now: serving from local tiers until it answers"
                     : "slot map loaded");
  }
  if (!s->store->quarantined_path().empty()) {
    std::fprintf(stderr,
                 "event=store_quarantined data_dir=%s moved_to=%s reason=\"%s\" "
                 "(started with an empty store)\n",
                 options.data_dir.c_str(), s->store->quarantined_path().c_str(),
                 s->store->quarantine_reason().c_str());
  }

  absl::StatusOr<KvCodec> codec = ParseKvCodec(options.kv_codec, options.kv_group_size);
  if (!codec.ok()) return codec.status();
  if (options.store_capacity_bytes > 0) {
    // A record larger than the whole store could never be written: every
    // ingest of a long chunk would fail. Refused here instead (K/V bytes of
    // the longest chunk or prefix, at least; the record adds its token ids).
    const int64_t longest = std::max(options.max_chunk_tokens, options.max_prefix_tokens);
    const double kv = std::max(KvBytesPerToken(*s->model, *codec),
                               KvBytesPerToken(*s->model, KvCodec{}));  // prefixes are raw
    const auto need = static_cast<uint64_t>(static_cast<double>(longest) * (kv + 4));
    if (options.store_capacity_bytes < need) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--store-capacity-bytes: ", options.store_capacity_bytes, " cannot hold one record of ",
          longest, " tokens (--max-chunk-tokens / --max-prefix-tokens), about ", need,
          " bytes for this model"));
    }
  }
  s->resolver = std::make_unique<ChunkResolver>(s->model.get(), s->tokenizer.get(), s->store.get(),
                                                options.max_chunk_tokens, *codec);
  QueryLimits limits;
  limits.max_context_tokens = options.max_context_tokens;
  limits.max_prompt_tokens = options.max_prompt_tokens;
  limits.max_prefix_tokens = options.max_prefix_tokens;
  limits.max_positions = s->model->config().max_position_embeddings;
  limits.allow_beyond_model_positions = options.allow_beyond_model_positions;
  s->runner = std::make_unique<QueryRunner>(s->model.get(), s->tokenizer.get(), s->resolver.get(),
                                            limits);
  const std::string model_name =
      std::filesystem::path(s->model_dir).lexically_normal().filename().string();
  if (!options.metrics_listen.empty()) {
    State* st_ptr = s.get();
    absl::StatusOr<std::unique_ptr<Metrics>> m = Metrics::Start(
        options.metrics_listen, &s->store->counters(),
        [st_ptr] { return st_ptr->scheduler ? st_ptr->scheduler->waiting() : 0; },
        [st_ptr] { return st_ptr->scheduler ? st_ptr->scheduler->running() : 0; }, model_name);
    if (!m.ok()) return m.status();
    s->metrics = *std::move(m);
    s->metrics->SetKvBytesPerToken(KvCodecName(codec->kind), KvBytesPerToken(*s->model, *codec));
  }
  SchedulerOptions so_sched;
  so_sched.max_running = options.workers;
  so_sched.queue_depth = options.queue_depth;
  so_sched.max_kv_bytes = options.max_kv_bytes;
  so_sched.max_batch_tokens = options.max_batch_tokens;
  so_sched.prefill_slice_ms = options.prefill_slice_ms;
  s->scheduler =
      std::make_unique<Scheduler>(s->model.get(), s->runner.get(), s->metrics.get(), so_sched);
  LargeBufferPool* pool = ActiveBufferPool();  // installed by InitTorchRuntime
  if (pool != nullptr) pool->set_retain_bytes(static_cast<size_t>(options.pool_retain_mb) << 20);
  Scheduler* sched = s->scheduler.get();
  if (options.idle_trim_ms > 0) {
    // Idle: the heap gives every free page back; the pool's blocks (at most
    // --pool-retain-mb) stay resident, so the next query does not fault its
    // buffers in again (docs/DESIGN.md §15).
    // Only when enough of the heap is free to be worth it: the next query
    // would fault a small trimmed heap in again for nothing.
    const uint64_t min_free = static_cast<uint64_t>(options.idle_trim_min_free_mb) << 20;
    s->trimmer = std::make_unique<IdleTrimmer>(
        [sched] { return sched->idle(); }, [sched] { return sched->admitted(); },
        std::chrono::milliseconds(options.idle_trim_ms), nullptr,
        [min_free] { return IdleTrimmer::HeapTrimmableBytes() >= min_free; });
  }
  store::RecordBuffers::Default().set_retain_bytes(
      static_cast<size_t>(options.record_buffer_retain_mb) << 20);
  if (options.pool_idle_release_s > 0) {
    // A long idle spell: the pool and the kept record buffers go back too.
    s->pool_releaser = std::make_unique<IdleTrimmer>(
        [sched] { return sched->idle(); }, [sched] { return sched->admitted(); },
        std::chrono::seconds(options.pool_idle_release_s), [pool] {
          if (pool != nullptr) pool->Trim(0);
          store::RecordBuffers::Default().Trim(0);
        });
  }

  GroupConfig group;
  if (options.world_size > 1) {
    absl::StatusOr<std::pair<std::string, int>> hp = ParseDistInit(options.dist_init);
    if (!hp.ok()) return hp.status();
    group.world_size = options.world_size;
    group.rank = options.rank;
    group.host = hp->first;
    group.port = hp->second;
    group.timeout = std::chrono::milliseconds(options.dist_timeout_ms);
    group.interface = options.dist_interface;
    group.device = s->model->device().str();
    group.backend = options.dist_backend;
    if (group.backend == "auto") {
      group.backend = s->model->device().is_cuda() && DistHasNccl() ? "nccl" : "gloo";
    }
    if (options.rank == 0) {
      absl::StatusOr<std::unique_ptr<GroupLeader>> leader =
          GroupLeader::Start(group, s->model.get(), s->tokenizer.get(), s->store.get());
      if (!leader.ok()) return leader.status();
      s->group_leader = *std::move(leader);
    }
  }

  ServiceDeps& d = s->deps;
  d.group = s->group_leader.get();
  d.group_rank = options.world_size > 1 ? options.rank : -1;
  d.model = s->model.get();
  d.model_name = model_name;
  d.store = s->store.get();
  d.resolver = s->resolver.get();
  d.runner = s->runner.get();
  d.metrics = s->metrics.get();
  d.scheduler = s->scheduler.get();
  d.options = &s->options;
  d.kv_codec = *codec;
  // A template we cannot parse is reported and left out: the named chat
  // formats still serve (--http-chat-format auto falls back to them).
  if (absl::StatusOr<std::optional<ModelChatTemplate>> t = LoadModelChatTemplate(s->model_dir);
      !t.ok()) {
    std::fprintf(stderr, "chat template not used: %s\n", std::string(t.status().message()).c_str());
  } else if (t->has_value()) {
    d.chat_template = std::make_shared<const ModelChatTemplate>(**std::move(t));
  }
  if (!options.auth_token_file.empty()) {
    absl::StatusOr<std::string> token = ReadFile(options.auth_token_file, "--auth-token-file");
    if (!token.ok()) return token.status();
    d.auth_token = std::string(absl::StripAsciiWhitespace(*token));
    if (d.auth_token.empty()) return absl::InvalidArgumentError("--auth-token-file: empty token");
  }
  s->stream_reaper =
      std::make_unique<IdleStreamReaper>(std::chrono::milliseconds(options.grpc_stream_idle_ms));
  s->deps.stream_reaper = s->stream_reaper.get();
  s->ingest = std::make_unique<IngestService>(&s->deps);
  s->query = std::make_unique<QueryService>(&s->deps);
  s->admin = std::make_unique<AdminService>(&s->deps);

  std::shared_ptr<grpc::ServerCredentials> creds = grpc::InsecureServerCredentials();
  if (!options.tls_cert.empty()) {
    absl::StatusOr<std::string> cert = ReadFile(options.tls_cert, "--tls-cert");
    if (!cert.ok()) return cert.status();
    absl::StatusOr<std::string> key = ReadFile(options.tls_key, "--tls-key");
    if (!key.ok()) return key.status();
    grpc::SslServerCredentialsOptions ssl;
    ssl.pem_key_cert_pairs.push_back({*key, *cert});
    creds = grpc::SslServerCredentials(ssl);
  }
  grpc::EnableDefaultHealthCheckService(true);
  if (options.reflection) grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, creds, &s->port);
  builder.RegisterService(s->ingest.get());
  builder.RegisterService(s->query.get());
  builder.RegisterService(s->admin.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  // Each call in a handler holds a thread (sync API); without a cap a flood of
  // held streams starts one thread each until the process runs out.
  grpc::ResourceQuota quota("infoflow-grpc");
  quota.SetMaxThreads(options.grpc_max_threads);
  builder.SetResourceQuota(quota);
  if (s->metrics) {
    std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> counters;
    counters.push_back(MakeGrpcRequestCounter(s->metrics.get()));
    builder.experimental().SetInterceptorCreators(std::move(counters));
  }
  s->server = builder.BuildAndStart();
  if (!s->server || s->port == 0) {
    return absl::UnavailableError(absl::StrCat("--listen ", options.listen, ": cannot bind"));
  }
  if (options.world_size > 1) {
    // Health follows the group: NOT_SERVING until it is complete, again
    // while a lost rank is away (rank 0), or while this rank is out of it.
    grpc::HealthCheckServiceInterface* health = s->server->GetHealthCheckService();
    auto set_health = [health](bool serving) {
      if (health != nullptr) health->SetServingStatus(serving);
    };
    set_health(false);
    if (s->group_leader) {
      s->group_leader->SetServingCallback(set_health);
    } else {
      s->group_worker = std::make_unique<GroupWorker>(group, s->model.get(), s->tokenizer.get(),
                                                      s->store.get(), set_health);
    }
    if (s->metrics) {
      GroupLeader* leader = s->group_leader.get();
      GroupWorker* worker = s->group_worker.get();
      s->metrics->SetGroupSource([leader, worker, group] {
        Metrics::GroupGauges g;
        g.world_size = group.world_size;
        g.rank = group.rank;
        if (leader != nullptr) {
          g.serving = leader->ready();
          g.generation = leader->generation();
          g.queries = leader->queries();
          g.failures = leader->failures();
        } else if (worker != nullptr) {
          g.serving = worker->serving();
          g.queries = worker->queries();
        }
        return g;
      });
    }
  }
  if (!options.http_listen.empty() && options.world_size > 1 && options.rank > 0) {
    std::fprintf(stderr, "--http-listen ignored: rank %d of a group serves no API (rank 0 does)\n",
                 options.rank);
  } else if (!options.http_listen.empty()) {
    http::HttpFrontendOptions ho;
    ho.listen = options.http_listen;
    ho.blend_separator = options.blend_separator;
    ho.chat_format = options.http_chat_format;
    ho.model_dir = s->model_dir;
    ho.max_body_bytes = options.http_max_body_bytes;
    // The scheduler's limits, not the listener, decide which query waits:
    // past --max-running + --queue-depth a query is refused (429) at once.
    ho.max_connections = options.http_max_connections;
    ho.request_timeout_ms = options.http_request_timeout_ms;
    absl::StatusOr<std::unique_ptr<http::HttpFrontend>> h = http::HttpFrontend::Start(&s->deps, ho);
    if (!h.ok()) {
      s->server->Shutdown();
      return h.status();
    }
    s->http = *std::move(h);
  }
  const std::string host = options.listen.substr(0, options.listen.rfind(':'));
  std::fprintf(stderr, "model %s fingerprint=%s device=%s\n", s->model_dir.c_str(),
               s->model->fingerprint().substr(0, 16).c_str(), s->model->device().str().c_str());
  std::fprintf(stderr, "listening on %s:%d%s\n", host.c_str(), s->port,
               options.tls_cert.empty() ? "" : " (tls)");
  if (s->http) {
    const std::string hhost = options.http_listen.substr(0, options.http_listen.rfind(':'));
    std::fprintf(stderr, "http on http://%s:%d (OpenAI API; chat format %s, blend separator \"%s\")\n",
                 hhost.c_str(), s->http->port(), s->http->chat_format().c_str(),
                 options.blend_separator.c_str());
  }
  if (options.world_size > 1) {
    std::fprintf(stderr,
                 "sequence-parallel group: rank %d of %d, control store %s:%d%s\n",
                 options.rank, options.world_size, group.host.c_str(),
                 s->group_leader ? s->group_leader->port() : group.port,
                 options.rank == 0 ? " (Health NOT_SERVING until every rank has joined)"
                                   : " (serves Health and /metrics only; send requests to rank 0)");
  }
  if (s->metrics) {
    const std::string mhost = options.metrics_listen.substr(0, options.metrics_listen.rfind(':'));
    std::fprintf(stderr, "metrics on http://%s:%d/metrics\n", mhost.c_str(), s->metrics->port());
  }
  return std::unique_ptr<InfoflowServer>(new InfoflowServer(std::move(s)));
}

int InfoflowServer::port() const { return s_->port; }
int InfoflowServer::http_port() const { return s_->http ? s_->http->port() : 0; }
int InfoflowServer::metrics_port() const { return s_->metrics ? s_->metrics->port() : 0; }
const std::string& InfoflowServer::model_dir() const { return s_->model_dir; }

void InfoflowServer::Shutdown(std::chrono::milliseconds grace) {
  std::call_once(s_->shutdown_once, [&] {
    // One grace for both front ends: HTTP refuses new requests at once, and
    // its running ones get what is left once gRPC's have finished.
    const auto deadline = std::chrono::steady_clock::now() + grace;
    if (s_->http) s_->http->BeginShutdown();
    if (auto* health = s_->server->GetHealthCheckService()) health->Shutdown();
    s_->server->Shutdown(std::chrono::system_clock::now() + grace);
    if (s_->http) s_->http->FinishShutdown(deadline);
    // No call is left to Put: hand the shared tier what it is still owed.
    DrainRemoteWrites();
  });
}

void InfoflowServer::DrainRemoteWrites() {
  if (s_->store->remote_cluster() == nullptr) return;
  const auto t0 = std::chrono::steady_clock::now();
  const store::StoreCounters& c = s_->store->counters();
  const uint64_t pending = c.remote_pending_writes.load();
  const uint64_t written_before = c.remote_writes.load();
  const std::vector<store::UnwrittenRecord> left = s_->store->DrainRemoteWrites(
      std::chrono::milliseconds(s_->options.remote_drain_timeout_ms));
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  uint64_t bytes = 0;
  for (const store::UnwrittenRecord& r : left) {
    bytes += r.bytes;
    std::fprintf(stderr, "event=remote_write_unwritten key=%s bytes=%llu\n", r.key.Hex().c_str(),
                 static_cast<unsigned long long>(r.bytes));
  }
  std::fprintf(stderr,
               "event=remote_write_drain pending=%llu written=%llu unwritten=%zu "
               "unwritten_bytes=%llu ms=%.0f timeout_ms=%d%s\n",
               static_cast<unsigned long long>(pending),
               static_cast<unsigned long long>(c.remote_writes.load() - written_before),
               left.size(), static_cast<unsigned long long>(bytes), ms,
               s_->options.remote_drain_timeout_ms,
               left.empty() ? "" : " (not in the shared tier; the local copies are intact)");
}

void InfoflowServer::Wait() { s_->server->Wait(); }

}  // namespace infoflow::server
