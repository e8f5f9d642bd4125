#include "server/metrics.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <malloc.h>
#include <netinet/in.h>
#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstddef>  // defines __GLIBC__
#include <utility>
#include <exception>
#include <limits>
#include <mutex>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cache_store/chunk_store.h"
#include "cache_store/record_buffers.h"
#include "engine/model/buffer_pool.h"
#include "server/idle_trimmer.h"

// Minimum stack for threads created with an explicit stack size. Why: the
// Exposer runs on civetweb, and Debian's libcivetweb.so.1 creates its threads
// with a fixed 100 KiB stack (pthread_attr_setstacksize(102400), civetweb's
// default CIVETWEB_THREAD_STACK_SIZE). glibc puts static TLS inside each
// thread's stack, and the libraries loaded with libtorch carry ~108 KB of it
// (OpenBLAS ~60 KiB, glog ~30 KiB, torch_cpu ~10 KiB), so pthread_create
// fails with EINVAL and civetweb reports "null context". This definition
// interposes glibc's for the whole process (the server's CMake target exports
// it with --export-dynamic-symbol): requests below 1 MiB are raised to 1 MiB,
// larger ones pass unchanged; it never lowers a request.
extern "C" int pthread_attr_setstacksize(pthread_attr_t* attr, size_t stacksize) {
  using SetStackSize = int (*)(pthread_attr_t*, size_t);
  static const SetStackSize real =
      reinterpret_cast<SetStackSize>(dlsym(RTLD_NEXT, "pthread_attr_setstacksize"));
  constexpr size_t kMinStack = size_t{1} << 20;
  if (real == nullptr) return EINVAL;
  return real(attr, stacksize < kMinStack ? kMinStack : stacksize);
}

namespace infoflow::server {
namespace {

// Exports values owned elsewhere (the store's counters, the admission
// queue) at scrape time: one source of truth, no gauge to keep in sync.
class LiveCollector : public prometheus::Collectable {
 public:
  LiveCollector(const store::StoreCounters* c, std::function<int()> queue_depth,
                std::function<int()> running)
      : c_(c), queue_depth_(std::move(queue_depth)), running_(std::move(running)) {}

  void SetGroupSource(std::function<Metrics::GroupGauges()> source) {
    std::lock_guard<std::mutex> l(group_mu_);
    group_ = std::move(source);
  }

  std::vector<prometheus::MetricFamily> Collect() const override {
    auto load = [](const std::atomic<uint64_t>& a) {
      return static_cast<double>(a.load(std::memory_order_relaxed));
    };
    std::vector<prometheus::MetricFamily> out;
    auto counter = [&](const char* name, const char* help,
                       std::vector<std::pair<std::string, double>> by_tier) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = prometheus::MetricType::Counter;
      for (auto& [tier, v] : by_tier) {
        prometheus::ClientMetric m;
        if (!tier.empty()) m.label.push_back({"tier", tier});
        m.counter.value = v;
        f.metric.push_back(std::move(m));
      }
      out.push_back(std::move(f));
    };
    auto gauge = [&](const char* name, const char* help, double v) {
      prometheus::MetricFamily f;
      f.name = name;
      f.help = help;
      f.type = prometheus::MetricType::Gauge;
      prometheus::ClientMetric m;
      m.gauge.value = v;
      f.metric.push_back(std::move(m));
      out.push_back(std::move(f));
    };
    counter("infoflow_store_hits_total", "Chunk records served by the store.",
            {{"ram", load(c_->ram_hits)}, {"disk", load(c_->disk_hits)}});
    counter("infoflow_store_misses_total", "Chunk lookups that found no record.",
            {{"", load(c_->misses)}});
    counter("infoflow_store_corrupt_total", "Stored records that failed verification.",
            {{"", load(c_->corrupt)}});
    counter("infoflow_store_evictions_total", "Records evicted from the RAM tier or the store.",
            {{"ram", load(c_->ram_evictions)},
             {"capacity", load(c_->capacity_evictions)},
             {"ttl", load(c_->ttl_expirations)}});
    counter("infoflow_store_bytes_read_total", "Record bytes read from RocksDB.",
            {{"", load(c_->bytes_read)}});
    counter("infoflow_store_bytes_written_total", "Record bytes written to RocksDB.",
            {{"", load(c_->bytes_written)}});
    counter("infoflow_store_write_errors_total",
            "Store writes that failed (disk full, I/O error); the store resumes by itself.",
            {{"", load(c_->write_errors)}});
    gauge("infoflow_store_quarantined",
          "1 when this process moved a damaged store aside at start (--on-corrupt-store).",
          load(c_->quarantined));
    gauge("infoflow_store_records", "Records in the store.", load(c_->records));
    gauge("infoflow_store_bytes", "Sum of stored record sizes.", load(c_->bytes));
    AddRemote(&out);
    gauge("infoflow_queue_depth", "Requests waiting in the scheduler's queue.",
          static_cast<double>(queue_depth_()));
    gauge("infoflow_waiting_requests", "Requests waiting in the scheduler's queue.",
          static_cast<double>(queue_depth_()));
    gauge("infoflow_running_requests", "Requests past the queue: prefilling or decoding.",
          static_cast<double>(running_()));
    {
      std::lock_guard<std::mutex> l(group_mu_);
      if (group_) {
        const Metrics::GroupGauges g = group_();
        gauge("infoflow_group_world_size", "Ranks in this process's sequence-parallel group.",
              g.world_size);
        gauge("infoflow_group_rank", "This process's rank in its sequence-parallel group.",
              g.rank);
        gauge("infoflow_group_serving",
              "1 while the sequence-parallel group is complete (Health SERVING).",
              g.serving ? 1 : 0);
        gauge("infoflow_group_generation",
              "Times the group has formed (rank 0; grows after each rank failure).",
              static_cast<double>(g.generation));
        counter("infoflow_group_queries_total", "Queries run over the group by this rank.",
                {{"", static_cast<double>(g.queries)}});
        counter("infoflow_group_failures_total",
                "Queries that failed over the group (rank 0; UNAVAILABLE naming the rank).",
                {{"", static_cast<double>(g.failures)}});
      }
    }
#if defined(__GLIBC__)
    // What the allocator holds: in use by the program vs freed but still
    // mapped (RSS minus in_use is mostly this plus libraries). A leak grows
    // in_use; retained buffers grow free (returned while idle, see
    // server/idle_trimmer.h).
    const struct mallinfo2 mi = mallinfo2();
    prometheus::MetricFamily heap;
    heap.name = "infoflow_process_heap_bytes";
    heap.help =
        "glibc malloc heap bytes by state (in_use; free; trimmable: free and still resident, "
        "what the idle trim would return).";
    heap.type = prometheus::MetricType::Gauge;
    for (auto [state, v] :
         {std::pair<const char*, size_t>{"in_use", mi.uordblks + mi.hblkhd},
          std::pair<const char*, size_t>{"free", mi.fordblks},
          std::pair<const char*, size_t>{"trimmable", IdleTrimmer::HeapTrimmableBytes()}}) {
      prometheus::ClientMetric m;
      m.label.push_back({"state", state});
      m.gauge.value = static_cast<double>(v);
      heap.metric.push_back(std::move(m));
    }
    out.push_back(std::move(heap));
#endif
    AddBufferPool(&out);
    return out;
  }

 private:
  // One family of plain samples; a sample whose key is "" has no label, the
  // others `label`=key.
  static void AddFamily(std::vector<prometheus::MetricFamily>* out, const char* name,
                        const char* help, prometheus::MetricType type, const char* label,
                        std::vector<std::pair<std::string, double>> values) {
    prometheus::MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    for (auto& [key, v] : values) {
      prometheus::ClientMetric m;
      if (!key.empty()) m.label.push_back({label, key});
      if (type == prometheus::MetricType::Counter) m.counter.value = v;
      else m.gauge.value = v;
      f.metric.push_back(std::move(m));
    }
    out->push_back(std::move(f));
  }

  // The engine's large-buffer pool (engine/model/buffer_pool.h) and the
  // process's resident set: the pool keeps query buffers resident within
  // --pool-retain-mb, the idle trim returns the rest (docs/DESIGN.md §15).
  static void AddBufferPool(std::vector<prometheus::MetricFamily>* out) {
    auto family = [&](const char* name, const char* help, prometheus::MetricType type,
                      std::vector<std::pair<std::string, double>> values) {
      AddFamily(out, name, help, type, "state", std::move(values));
    };
    using T = prometheus::MetricType;
    if (const LargeBufferPool* pool = ActiveBufferPool()) {
      const BufferPoolStats st = pool->stats();
      family("infoflow_buffer_pool_bytes",
             "Engine buffer pool: bytes held by live tensors (in_use) and freed but kept "
             "resident for reuse (cached).",
             T::Gauge,
             {{"in_use", static_cast<double>(st.in_use_bytes)},
              {"cached", static_cast<double>(st.cached_bytes)}});
      family("infoflow_buffer_pool_alloc_bytes_total",
             "Engine buffer pool: bytes handed out from newly mapped blocks (fresh: page "
             "faults on first touch) or from reused resident blocks (reused).",
             T::Counter,
             {{"fresh", static_cast<double>(st.fresh_bytes)},
              {"reused", static_cast<double>(st.reused_bytes)}});
      family("infoflow_buffer_pool_unmapped_bytes_total",
             "Engine buffer pool: bytes returned to the OS (over the retain budget, or trimmed "
             "while idle).",
             T::Counter, {{"", static_cast<double>(st.unmapped_bytes)}});
    }
    const store::RecordBufferStats rb = store::RecordBuffers::Default().stats();
    family("infoflow_record_buffers_cached_bytes",
           "Buffers of chunk records read earlier, kept resident for the next read "
           "(--record-buffer-retain-mb).",
           T::Gauge, {{"", static_cast<double>(rb.cached_bytes)}});
    AddFamily(out, "infoflow_record_buffers_taken_bytes_total",
              "Record bytes read into a kept buffer (reused: no allocation, no page faults) or "
              "a new one (fresh).",
              T::Counter, "result",
              {{"reused", static_cast<double>(rb.reused_bytes)},
               {"fresh", static_cast<double>(rb.fresh_bytes)}});
    long pages = 0, resident = 0;
    if (FILE* f = std::fopen("/proc/self/statm", "r")) {
      if (std::fscanf(f, "%ld %ld", &pages, &resident) != 2) resident = 0;
      std::fclose(f);
    }
    family("infoflow_process_resident_bytes", "Resident set size of the server process.",
           T::Gauge, {{"", static_cast<double>(resident) * static_cast<double>(getpagesize())}});
  }

  // The shared tier (Redis Cluster): exported only when configured.
  void AddRemote(std::vector<prometheus::MetricFamily>* out) const {
    auto load = [](const auto& a) { return static_cast<double>(a.load(std::memory_order_relaxed)); };
    auto family = [&](const char* name, const char* help, prometheus::MetricType type,
                      const char* label, std::vector<std::pair<std::string, double>> values) {
      AddFamily(out, name, help, type, label, std::move(values));
    };
    using T = prometheus::MetricType;
    family("infoflow_remote_enabled", "1 when the shared tier (--remote-redis) is configured.",
           T::Gauge, "", {{"", load(c_->remote_enabled)}});
    if (c_->remote_enabled.load(std::memory_order_relaxed) == 0) return;
    family("infoflow_remote_hits_total",
           "Chunk records fetched from the shared tier and verified (local tiers had missed).",
           T::Counter, "", {{"", load(c_->remote_hits)}});
    family("infoflow_remote_misses_total", "Shared-tier lookups of keys the cluster does not hold.",
           T::Counter, "", {{"", load(c_->remote_misses)}});
    family("infoflow_remote_errors_total",
           "Shared-tier faults by kind; each is a miss (recompute), never a failed request.",
           T::Counter, "kind",
           {{"timeout", load(c_->remote_errors_timeout)},
            {"connection", load(c_->remote_errors_connection)},
            {"redirect_exhausted", load(c_->remote_errors_redirect)},
            {"circuit_open", load(c_->remote_errors_circuit_open)},
            {"server", load(c_->remote_errors_server)},
            {"corrupt", load(c_->remote_corrupt)},
            {"wrong_model", load(c_->remote_wrong_model)}});
    family("infoflow_remote_bytes_total", "Record bytes moved to/from the shared tier.",
           T::Counter, "direction",
           {{"read", load(c_->remote_bytes_read)}, {"written", load(c_->remote_bytes_written)}});
    family("infoflow_remote_writes_total",
           "Write-behind records by outcome: ok (in the cluster), failed (given up after "
           "retries, or not written by shutdown), dropped (refused: the queue was full).",
           T::Counter, "result",
           {{"ok", load(c_->remote_writes)},
            {"failed", load(c_->remote_write_failed)},
            {"dropped", load(c_->remote_write_dropped)}});
    family("infoflow_remote_write_errors_total",
           "Failed cluster SET attempts of the write-behind (each retry counts).", T::Counter, "",
           {{"", load(c_->remote_write_errors)}});
    family("infoflow_remote_pending_bytes",
           "Record bytes queued for the cluster (write-behind backlog, retries included).",
           T::Gauge, "", {{"", load(c_->remote_pending_bytes)}});
    family("infoflow_remote_pending_writes", "Records queued for the cluster.", T::Gauge, "",
           {{"", load(c_->remote_pending_writes)}});
    family("infoflow_remote_fills_total",
           "Records fetched from the cluster and then written to local disk in the background.",
           T::Counter, "", {{"", load(c_->remote_fills)}});
    family("infoflow_remote_fill_dropped_total",
           "Fetched records not written to local disk because the fill queue was full (still "
           "served, and kept in the RAM tier while they fit).",
           T::Counter, "", {{"", load(c_->remote_fill_dropped)}});
    family("infoflow_remote_fill_queue_bytes",
           "Record bytes of fetched records waiting for their local write.", T::Gauge, "",
           {{"", load(c_->remote_fill_queue_bytes)}});
    family("infoflow_remote_redirects_total", "Cluster redirects the client followed.", T::Counter,
           "type", {{"moved", load(c_->redis.moved)}, {"ask", load(c_->redis.ask)}});
    family("infoflow_remote_slot_map_refreshes_total", "CLUSTER SLOTS reloads.", T::Counter, "",
           {{"", load(c_->redis.slot_map_refreshes)}});
    family("infoflow_remote_circuit_state",
           "Shared-tier circuit breaker: 0 closed, 1 open (tier skipped), 2 half-open (probing).",
           T::Gauge, "", {{"", load(c_->redis.breaker_state)}});
    family("infoflow_remote_circuit_opens_total", "Times the circuit breaker opened.", T::Counter,
           "", {{"", load(c_->redis.breaker_opens)}});
    prometheus::MetricFamily h;
    h.name = "infoflow_remote_fetch_seconds";
    h.help = "Latency of one batched shared-tier fetch (a lookup's missing keys, in parallel).";
    h.type = T::Histogram;
    prometheus::ClientMetric m;
    uint64_t cumulative = 0;
    for (size_t i = 0; i <= store::StoreCounters::kRemoteFetchBuckets; ++i) {
      cumulative += c_->remote_fetch_bucket[i].load(std::memory_order_relaxed);
      prometheus::ClientMetric::Bucket b;
      b.cumulative_count = cumulative;
      b.upper_bound = i < store::StoreCounters::kRemoteFetchBuckets
                          ? store::StoreCounters::kRemoteFetchBucketsMs[i] / 1000.0
                          : std::numeric_limits<double>::infinity();
      m.histogram.bucket.push_back(b);
    }
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = load(c_->remote_fetch_sum_us) / 1e6;
    h.metric.push_back(std::move(m));
    out->push_back(std::move(h));
  }

  const store::StoreCounters* c_;
  std::function<int()> queue_depth_;
  std::function<int()> running_;
  mutable std::mutex group_mu_;
  std::function<Metrics::GroupGauges()> group_;
};

// civetweb's "listening_ports" for `listen` ("host:port", "port", or
// "localhost:port"); InvalidArgument names the flag.
absl::StatusOr<std::string> CivetListeningPort(const std::string& listen) {
  const size_t colon = listen.rfind(':');
  std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
  const std::string port_str = colon == std::string::npos ? listen : listen.substr(colon + 1);
  int port = 0;
  if (!absl::SimpleAtoi(port_str, &port) || port < 0 || port > 65535) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", listen, ": bad port"));
  }
  if (host == "localhost") host = "127.0.0.1";
  in_addr addr{};
  if (!host.empty() && inet_pton(AF_INET, host.c_str(), &addr) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen ", listen, ": host must be an IPv4 address"));
  }
  return host.empty() ? port_str : absl::StrCat(host, ":", port);
}

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<LiveCollector> live;
  prometheus::Family<prometheus::Histogram>* ttft = nullptr;
  prometheus::Family<prometheus::Histogram>* stage = nullptr;
  prometheus::Histogram* recompute_ratio = nullptr;
  prometheus::Counter* generated = nullptr;
  prometheus::Counter* ingest_tokens = nullptr;
  prometheus::Counter* prefix_prefilled = nullptr;
  prometheus::Counter* prefix_cached = nullptr;
  prometheus::Counter* prefix_prefilled_tokens = nullptr;
  prometheus::Family<prometheus::Counter>* http_dropped = nullptr;
  prometheus::Family<prometheus::Counter>* grpc_requests = nullptr;
  prometheus::Family<prometheus::Counter>* http_responses = nullptr;
  prometheus::Gauge* inflight = nullptr;
  prometheus::Histogram* batch_size = nullptr;
  prometheus::Histogram* queue_wait = nullptr;
  prometheus::Histogram* inter_token = nullptr;
  std::unique_ptr<prometheus::Exposer> exposer;  // last: stops serving before the rest goes
};

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        const store::StoreCounters* counters,
                                                        std::function<int()> queue_depth,
                                                        std::function<int()> running,
                                                        const std::string& model_name) {
  auto impl = std::make_unique<Impl>();
  prometheus::Registry& r = *impl->registry;
  impl->ttft = &prometheus::BuildHistogram()
                    .Name("infoflow_query_ttft_seconds")
                    .Help("Time to first token of a query, chunk fetch included.")
                    .Register(r);
  impl->stage = &prometheus::BuildHistogram()
                     .Name("infoflow_stage_duration_seconds")
                     .Help("Duration of each query stage (docs/DESIGN.md section 2).")
                     .Register(r);
  impl->recompute_ratio = &prometheus::BuildHistogram()
                               .Name("infoflow_recompute_ratio")
                               .Help("Recomputed context tokens / context tokens per query.")
                               .Register(r)
                               .Add({}, prometheus::Histogram::BucketBoundaries{
                                            0, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1});
  impl->generated = &prometheus::BuildCounter()
                         .Name("infoflow_generated_tokens_total")
                         .Help("Tokens generated by queries.")
                         .Register(r)
                         .Add({});
  impl->ingest_tokens = &prometheus::BuildCounter()
                             .Name("infoflow_ingest_tokens_total")
                             .Help("Chunk tokens prefilled and stored by ingest and write-through.")
                             .Register(r)
                             .Add({});
  auto& prefixes = prometheus::BuildCounter()
                       .Name("infoflow_prefix_queries_total")
                       .Help("Queries with a text prefix, by where its KV came from: "
                             "source=prefilled (now; stored per prefix_store) or source=store.")
                       .Register(r);
  impl->prefix_prefilled = &prefixes.Add({{"source", "prefilled"}});
  impl->prefix_cached = &prefixes.Add({{"source", "store"}});
  impl->prefix_prefilled_tokens = &prometheus::BuildCounter()
                                       .Name("infoflow_prefix_prefilled_tokens_total")
                                       .Help("Prefix tokens prefilled (a prefix served by the "
                                             "store adds nothing).")
                                       .Register(r)
                                       .Add({});
  impl->http_dropped = &prometheus::BuildCounter()
                            .Name("infoflow_http_requests_dropped_total")
                            .Help(
                                "HTTP connections closed for how their request arrived: "
                                "reason=deadline (not whole within --http-request-timeout-ms), "
                                "head_too_large (request line and headers over 64 KiB), "
                                "body_too_large (a chunked body over --http-max-body-bytes), "
                                "bodies_budget (bodies in flight over 16 x that), "
                                "listener_full (no thread and no room to wait: 503).")
                            .Register(r);
  for (const char* reason :
       {"deadline", "head_too_large", "body_too_large", "bodies_budget", "listener_full"}) {
    impl->http_dropped->Add({{"reason", reason}});
  }
  impl->grpc_requests = &prometheus::BuildCounter()
                             .Name("infoflow_grpc_requests_total")
                             .Help(
                                 "Finished gRPC calls of the API, by method and status code "
                                 "(RESOURCE_EXHAUSTED: refused, queue full).")
                             .Register(r);
  impl->http_responses = &prometheus::BuildCounter()
                              .Name("infoflow_http_responses_total")
                              .Help(
                                  "HTTP API responses, by route (other: any other path) and "
                                  "status (429: refused, queue full).")
                              .Register(r);
  impl->inflight = &prometheus::BuildGauge()
                        .Name("infoflow_inflight_streams")
                        .Help("Query streams being served.")
                        .Register(r)
                        .Add({});
  impl->batch_size = &prometheus::BuildHistogram()
                          .Name("infoflow_batch_size")
                          .Help("Requests advanced by one batched decode step.")
                          .Register(r)
                          .Add({}, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64});
  impl->queue_wait = &prometheus::BuildHistogram()
                          .Name("infoflow_queue_wait_seconds")
                          .Help("Time a request waited in the scheduler's queue.")
                          .Register(r)
                          .Add({}, SecondsBuckets());
  impl->inter_token = &prometheus::BuildHistogram()
                           .Name("infoflow_inter_token_seconds")
                           .Help("Time between consecutive generated tokens of a query.")
                           .Register(r)
                           .Add({}, SecondsBuckets());
  prometheus::BuildGauge()
      .Name("infoflow_build_info")
      .Help("Constant 1, labelled with the server version and model.")
      .Register(r)
      .Add({{"version", "0.1.0"}, {"model", model_name}})
      .Set(1);
  impl->live = std::make_shared<LiveCollector>(counters, std::move(queue_depth),
                                               std::move(running));
  absl::StatusOr<std::string> port = CivetListeningPort(listen);
  if (!port.ok()) return port.status();
  // Several threads and a read/write timeout: a client that trickles its
  // request holds one civetweb thread, never the endpoint.
  try {
    impl->exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", *port, "num_threads", "4", "request_timeout_ms", "5000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics-listen ", listen, ": ", e.what()));
  }
  impl->exposer->RegisterCollectable(impl->registry);
  impl->exposer->RegisterCollectable(impl->live);
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

void Metrics::SetGroupSource(std::function<GroupGauges()> source) {
  impl_->live->SetGroupSource(std::move(source));
}

int Metrics::port() const {
  const std::vector<int> ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void Metrics::ObserveQuery(const std::string& method, double ttft_seconds,
                           const std::vector<StageSample>& stages, double recompute_ratio,
                           int64_t generated_tokens) {
  impl_->ttft->Add({{"method", method}}, SecondsBuckets()).Observe(ttft_seconds);
  for (const StageSample& s : stages) {
    impl_->stage->Add({{"stage", s.stage}, {"method", method}}, SecondsBuckets())
        .Observe(s.ms / 1000.0);
  }
  impl_->recompute_ratio->Observe(recompute_ratio);
  impl_->generated->Increment(static_cast<double>(generated_tokens));
}

void Metrics::AddIngestTokens(int64_t n) { impl_->ingest_tokens->Increment(static_cast<double>(n)); }
void Metrics::AddHttpRequestDropped(const std::string& reason) {
  impl_->http_dropped->Add({{"reason", reason}}).Increment();
}
void Metrics::CountGrpcRequest(const std::string& method, const std::string& code) {
  impl_->grpc_requests->Add({{"method", method}, {"code", code}}).Increment();
}
void Metrics::CountHttpResponse(const std::string& path, int status) {
  impl_->http_responses->Add({{"path", path}, {"status", std::to_string(status)}}).Increment();
}
void Metrics::AddInflightStreams(int delta) { impl_->inflight->Increment(delta); }
void Metrics::ObserveBatchSize(int requests) { impl_->batch_size->Observe(requests); }
void Metrics::ObserveQueueWait(double seconds) { impl_->queue_wait->Observe(seconds); }
void Metrics::ObserveInterToken(double seconds) { impl_->inter_token->Observe(seconds); }

void Metrics::AddPrefix(bool cached, int64_t tokens) {
  if (cached) {
    impl_->prefix_cached->Increment();
  } else {
    impl_->prefix_prefilled->Increment();
    impl_->prefix_prefilled_tokens->Increment(static_cast<double>(tokens));
  }
}

void Metrics::SetKvBytesPerToken(const std::string& codec, double bytes) {
  prometheus::BuildGauge()
      .Name("infoflow_kv_bytes_per_token")
      .Help("Bytes per token of a stored chunk's K/V under the server's --kv-codec.")
      .Register(*impl_->registry)
      .Add({{"codec", codec}})
      .Set(bytes);
}

}  // namespace infoflow::server
