#include "server/metrics.h"

#include <prometheus/collectable.h>
#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <poll.h>

#include <atomic>
#include <cerrno>
#include <functional>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "cache_store/chunk_store.h"

namespace infoflow::server {
namespace {

// Exports the store's live counters at scrape time.
class StoreCollector : public prometheus::Collectable {
 public:
  explicit StoreCollector(const store::StoreCounters* c) : c_(c) {}

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
    gauge("infoflow_store_records", "Records in the store.", load(c_->records));
    gauge("infoflow_store_bytes", "Sum of stored record sizes.", load(c_->bytes));
    return out;
  }

 private:
  const store::StoreCounters* c_;
};

// A minimal HTTP/1.0 endpoint for GET /metrics. Why not prometheus-cpp's
// civetweb Exposer: in a process that links libtorch_cpu, civetweb's
// mg_start fails ("null context when constructing CivetServer") although the
// same Exposer works in a process without torch (measured with a 10-line
// program linked with and without -ltorch_cpu). The exposition text itself
// is still prometheus-cpp's TextSerializer over the registry.
class HttpEndpoint {
 public:
  using Body = std::function<std::string()>;

  static absl::StatusOr<std::unique_ptr<HttpEndpoint>> Bind(const std::string& listen, Body body) {
    const size_t colon = listen.rfind(':');
    std::string host = colon == std::string::npos ? "" : listen.substr(0, colon);
    const std::string port_str = colon == std::string::npos ? listen : listen.substr(colon + 1);
    int port = 0;
    if (!absl::SimpleAtoi(port_str, &port) || port < 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", listen, ": bad port"));
    }
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    if (host.empty() || host == "0.0.0.0") {
      addr.sin_addr.s_addr = htonl(INADDR_ANY);
    } else if (host == "localhost") {
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    } else if (inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
      return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", listen, ": bad IPv4 host"));
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    socklen_t len = sizeof addr;
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
        ::listen(fd, 64) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      const std::string err = std::strerror(errno);
      if (fd >= 0) close(fd);
      return absl::UnavailableError(absl::StrCat("--metrics-listen ", listen, ": ", err));
    }
    return std::unique_ptr<HttpEndpoint>(new HttpEndpoint(fd, ntohs(addr.sin_port), std::move(body)));
  }

  ~HttpEndpoint() {
    stop_ = true;
    thread_.join();
    close(fd_);
  }

  int port() const { return port_; }

 private:
  HttpEndpoint(int fd, int port, Body body)
      : fd_(fd), port_(port), body_(std::move(body)), thread_([this] { Loop(); }) {}

  void Loop() {
    while (!stop_) {
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, 100) <= 0) continue;
      int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) continue;
      Serve(c);
      close(c);
    }
  }

  // One request per connection, answered and closed (what Prometheus needs).
  void Serve(int c) {
    std::string req;
    char buf[2048];
    while (req.find("\r\n\r\n") == std::string::npos && req.size() < 16384) {
      pollfd p{c, POLLIN, 0};
      if (poll(&p, 1, 2000) <= 0) return;
      ssize_t n = recv(c, buf, sizeof buf, 0);
      if (n <= 0) return;
      req.append(buf, static_cast<size_t>(n));
    }
    std::string status = "200 OK", body, type = "text/plain; version=0.0.4; charset=utf-8";
    if (req.rfind("GET /metrics ", 0) == 0 || req.rfind("GET /metrics?", 0) == 0) {
      body = body_();
    } else {
      status = "404 Not Found";
      body = "not found; try /metrics\n";
      type = "text/plain";
    }
    const std::string out = absl::StrCat("HTTP/1.0 ", status, "\r\nContent-Type: ", type,
                                         "\r\nContent-Length: ", body.size(),
                                         "\r\nConnection: close\r\n\r\n", body);
    size_t off = 0;
    while (off < out.size()) {
      ssize_t n = send(c, out.data() + off, out.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;
      off += static_cast<size_t>(n);
    }
  }

  int fd_;
  int port_;
  Body body_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

prometheus::Histogram::BucketBoundaries SecondsBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
}

}  // namespace

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<StoreCollector> store;
  prometheus::Family<prometheus::Histogram>* ttft = nullptr;
  prometheus::Family<prometheus::Histogram>* stage = nullptr;
  prometheus::Histogram* recompute_ratio = nullptr;
  prometheus::Counter* generated = nullptr;
  prometheus::Counter* ingest_tokens = nullptr;
  prometheus::Gauge* inflight = nullptr;
  prometheus::Gauge* queue_depth = nullptr;
  std::unique_ptr<HttpEndpoint> http;  // last: stops serving before the rest goes
};

Metrics::Metrics(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Metrics::~Metrics() = default;

absl::StatusOr<std::unique_ptr<Metrics>> Metrics::Start(const std::string& listen,
                                                        const store::StoreCounters* counters,
                                                        const std::string& model_name) {
  auto impl = std::make_unique<Impl>();
  prometheus::Registry& r = *impl->registry;
  impl->ttft = &prometheus::BuildHistogram()
                    .Name("infoflow_query_ttft_seconds")
                    .Help("Time to first token of a query, chunk fetch included.")
                    .Register(r);
  impl->stage = &prometheus::BuildHistogram()
                     .Name("infoflow_stage_duration_seconds")
                     .Help("Duration of each query stage (DESIGN.md section 2).")
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
  impl->inflight = &prometheus::BuildGauge()
                        .Name("infoflow_inflight_streams")
                        .Help("Query streams being served.")
                        .Register(r)
                        .Add({});
  impl->queue_depth = &prometheus::BuildGauge()
                           .Name("infoflow_queue_depth")
                           .Help("Queries waiting for a worker.")
                           .Register(r)
                           .Add({});
  prometheus::BuildGauge()
      .Name("infoflow_build_info")
      .Help("Constant 1, labelled with the server version and model.")
      .Register(r)
      .Add({{"version", "0.1.0"}, {"model", model_name}})
      .Set(1);
  impl->store = std::make_shared<StoreCollector>(counters);
  Impl* raw = impl.get();
  absl::StatusOr<std::unique_ptr<HttpEndpoint>> http = HttpEndpoint::Bind(listen, [raw] {
    std::vector<prometheus::MetricFamily> families = raw->registry->Collect();
    std::vector<prometheus::MetricFamily> store = raw->store->Collect();
    families.insert(families.end(), store.begin(), store.end());
    return prometheus::TextSerializer().Serialize(families);
  });
  if (!http.ok()) return http.status();
  impl->http = *std::move(http);
  return std::unique_ptr<Metrics>(new Metrics(std::move(impl)));
}

int Metrics::port() const {
  return impl_->http->port();
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
void Metrics::AddInflightStreams(int delta) { impl_->inflight->Increment(delta); }
void Metrics::SetQueueDepth(int depth) { impl_->queue_depth->Set(depth); }

}  // namespace infoflow::server
