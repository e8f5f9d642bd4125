// Prometheus metrics of infoflow-server, served by prometheus-cpp's pull
// Exposer on their own HTTP port (/metrics). Store counters are read from
// the store's atomics at scrape time, so the store needs no metrics code.
//
// Thread-safe: every method may be called from any request thread.
#ifndef INFOFLOW_SERVER_METRICS_H_
#define INFOFLOW_SERVER_METRICS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace infoflow::store {
struct StoreCounters;
}

namespace infoflow::server {

// Per-stage durations of one query, in milliseconds (names as in the Report).
struct StageSample {
  const char* stage;
  double ms;
};

class Metrics {
 public:
  // Binds `listen` ("host:port", port 0 = ephemeral). `counters` must
  // outlive the Metrics; `queue_depth` (requests waiting in the scheduler's
  // queue) and `running` (requests prefilling or decoding) are called at
  // scrape time, so the gauges are always the live values.
  // InvalidArgument for a malformed address, Unavailable when the port
  // cannot be bound.
  static absl::StatusOr<std::unique_ptr<Metrics>> Start(const std::string& listen,
                                                        const store::StoreCounters* counters,
                                                        std::function<int()> queue_depth,
                                                        std::function<int()> running,
                                                        const std::string& model_name);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The bound /metrics port.
  int port() const;

  void ObserveQuery(const std::string& method, double ttft_seconds,
                    const std::vector<StageSample>& stages, double recompute_ratio,
                    int64_t generated_tokens);
  void AddIngestTokens(int64_t n);
  void AddInflightStreams(int delta);
  // An HTTP connection closed for how its request arrived: `reason` is
  // "deadline" (--http-request-timeout-ms), "head_too_large",
  // "body_too_large", "bodies_budget" or "listener_full".
  void AddHttpRequestDropped(const std::string& reason);
  // A finished call of the API: gRPC `method` ("Query", "Ingest", ...) with
  // its status code's name ("OK", "RESOURCE_EXHAUSTED", ...), and an HTTP
  // response: `path` (one of the API's routes, else "other") with its
  // status. Refused and failed requests count too: the query histograms
  // observe only successful queries.
  void CountGrpcRequest(const std::string& method, const std::string& code);
  void CountHttpResponse(const std::string& path, int status);
  // Scheduler (server/scheduler.h): requests per batched decode step, time
  // a request waited in the queue, time between consecutive tokens of a
  // request.
  void ObserveBatchSize(int requests);
  void ObserveQueueWait(double seconds);
  void ObserveInterToken(double seconds);
  // A query with a text prefix: its KV came from the store (`cached`) or was
  // prefilled now; `tokens` is its length.
  void AddPrefix(bool cached, int64_t tokens);
  // Bytes per token of stored chunk K/V under the server's --kv-codec.
  void SetKvBytesPerToken(const std::string& codec, double bytes);

  // A sequence-parallel group member (server/group/): read at scrape time.
  struct GroupGauges {
    int world_size = 1;
    int rank = 0;
    bool serving = false;     // in a complete group
    int64_t generation = 0;   // rank 0: how many times the group has (re)formed
    uint64_t queries = 0;     // run over the group by this rank
    uint64_t failures = 0;    // rank 0: queries that failed over the group
  };
  void SetGroupSource(std::function<GroupGauges()> source);

 private:
  struct Impl;
  explicit Metrics(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace infoflow::server

#endif  // INFOFLOW_SERVER_METRICS_H_
